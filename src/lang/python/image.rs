//! The pre-initialised image: the shipped snapshot instantiated under wizer, the prologue and the
//! configured imports run, snapshotted and cached under a key of everything that determines its
//! bytes, so that a new runtime artifact, prologue or import list rebuilds it by itself.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Module};

use super::turn::{PROLOGUE, call, literal, prologue, run_turn};
use super::{Error, PythonPaths, Result, base_env};
use crate::engine::cache::{ModuleCache, Origin};
use crate::engine::preinit;
use crate::engine::threads::on_guest_stack;
use crate::lang::guest::{Guest, GuestSpec, engine_err};
use crate::lang::host_call::linker;

/// The code run during the image's warm-up, after the prologue.
fn warmup_code(preimport: &[String]) -> String {
    let mut code = String::from("import os\nos.environ['MPLBACKEND'] = 'Agg'\n");
    for m in preimport {
        code.push_str(&format!("import {m}\n"));
    }
    // One pass through `run` with the base environment, as a ready instance's would be: the
    // image is then ready as it is, and instances need no warm-up turn (see `FastReady`).
    code.push_str(&format!(
        "import _wasmbox\n_wasmbox.run(\"print('', end='')\", False, 0, {}, '/workspace')\n",
        literal(&base_env())
    ));
    // Everything imported so far lives as long as the image: keep the cyclic GC from walking
    // (and so copying on write) the whole heap in every sandbox.
    code.push_str("import gc\ngc.collect()\ngc.freeze()\n");
    code
}

/// What determines the image's bytes: the module, the stdlib zip, our prologue and the imports.
/// Any change gives another key, so a new runtime artifact rebuilds the image by itself.
pub fn image_key(module_sha: &str, stdlib_sha: &str, preimport: &[String]) -> String {
    let mut d = Sha256::new();
    for part in [
        "wasmbox-python-image-v5",
        preinit::IMAGE_FORMAT,
        module_sha,
        stdlib_sha,
        PROLOGUE,
        &warmup_code(preimport),
    ] {
        d.update(part.as_bytes());
        d.update([0]);
    }
    hex::encode(d.finalize())
}

pub(super) fn load_image(
    engine: &Engine,
    cache: &ModuleCache,
    paths: &PythonPaths,
    preimport: &[String],
) -> Result<((Module, Origin), String)> {
    if preimport.iter().any(|m| {
        m.is_empty()
            || !m
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    }) {
        return Err(Error::InvalidArgument(format!(
            "pre-import list {preimport:?}: module names may contain only letters, digits, _ and ."
        )));
    }
    let key = image_key(
        &cache.file_sha256(&paths.module)?,
        &cache.file_sha256(&paths.stdlib_dir.join("python315.zip"))?,
        preimport,
    );
    let loaded = cache.load_compiled(engine, &key, "python image", || {
        tracing::info!(
            "python: building the pre-initialised image (imports {}); this happens once",
            preimport.join(", ")
        );
        crate::engine::progress::stage(
            "building the pre-initialised python image (once; it takes minutes)",
        );
        build_image(paths, preimport)
    })?;
    Ok((loaded, key))
}

/// Instantiates the shipped snapshot under wizer, runs the prologue and the imports with the
/// production imports and preopens, snapshots the result and compiles it.
fn build_image(paths: &PythonPaths, preimport: &[String]) -> Result<Vec<u8>> {
    let wasm = std::fs::read(&paths.module).map_err(|e| Error::io(&paths.module, e))?;
    let code = warmup_code(preimport);
    let started = std::time::Instant::now();
    // The warm-up needs a guest thread's stack, like every wasm run.
    on_guest_stack("image warm-up", || {
        preinit::build_compiled(&wasm, "python image", |module| {
            let linker = linker(module.engine())?;
            // The slots only: the image's preopen table is every server's, whatever it lends.
            let spec = GuestSpec {
                mounts: crate::lang::mounts::none(),
                ..paths.spec()
            };
            let mut guest = Guest::unarmed(module.engine(), &spec, &BTreeMap::new())?;
            let instance = linker
                .instantiate(&mut guest.store, module)
                .map_err(engine_err)?;
            prologue(&mut guest.store, &instance)
                .and_then(|()| run_turn(&mut guest.store, &instance, &call(("script", &code))))
                .map_err(|e| {
                    Error::wasm(format!(
                        "the image warm-up failed: {e:#}: {}",
                        guest.take_stderr()
                    ))
                })?;
            tracing::info!(
                "python image: imports done in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            Ok(guest.into_parts(instance))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lang::python::DEFAULT_PREIMPORT;

    #[test]
    fn image_key_follows_every_input() {
        let pre: Vec<String> = DEFAULT_PREIMPORT.iter().map(|s| s.to_string()).collect();
        let base = image_key("aa", "bb", &pre);
        assert_eq!(base, image_key("aa", "bb", &pre));
        assert_ne!(
            base,
            image_key("ab", "bb", &pre),
            "a new runtime module rebuilds"
        );
        assert_ne!(base, image_key("aa", "bc", &pre), "a new stdlib rebuilds");
        assert_ne!(
            base,
            image_key("aa", "bb", &pre[..2]),
            "other imports rebuild"
        );
    }
}

//! The JavaScript runtime, built from pinned sources: QuickJS-NG from its crates.io crate, zig
//! from PyPI, with our entry and prelude.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};

use super::fetch::{check_sha, inside, part, sha256_file, swap_in, unpack_zip};
use super::{Entry, Setup, log, pins};

const QJS_PINS: &str = include_str!("../../runtimes/quickjs/pins.env");
const QJS_ENTRY: &str = include_str!("../../runtimes/quickjs/wasmbox_qjs.c");
const QJS_PRELUDE: &str = include_str!("../../runtimes/quickjs/prelude.js");

impl Setup {
    /// The JavaScript runtime, built from pinned sources (QuickJS-NG from crates.io) with our
    /// entry and prelude by this platform's pinned zig (PyPI); the build is reproducible, so its
    /// output is checked against the manifest like a download.
    pub(super) async fn quickjs(&mut self, name: &str, e: &Entry) -> Result<()> {
        let out = e.output.as_deref().unwrap_or("quickjs/qjs.wasm");
        let want = e.sha256()?.to_string();
        if self.stamps.ok(out, &want) {
            log(format_args!("{name}: present and verified"));
            return Ok(());
        }
        let pins: BTreeMap<&str, &str> = QJS_PINS
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim(), v.trim()))
            .collect();
        let pin = |k: &str| {
            pins.get(k)
                .copied()
                .ok_or_else(|| anyhow!("pins.env has no {k}"))
        };
        let cache = self.opts.cache.clone();
        fs::create_dir_all(cache.join("downloads"))?;

        // zig, from this platform's PyPI wheel (the binary inside; no Python needed to run it).
        let zig = e
            .zig
            .as_ref()
            .ok_or_else(|| anyhow!("a build entry needs its zig"))?;
        let zv = &zig.version;
        let here = pins::here();
        let zpin = pins::pick("zig", &zig.platforms, &here).map_err(|none| {
            anyhow!(
                "{none}. Build {out} on a pinned platform (or by hand from runtimes/quickjs/, \
                 with zig {zv}: see its README) and copy it to {}: setup takes it when its \
                 SHA-256 is the pinned one",
                self.opts.dir.join(out).display()
            )
        })?;
        let zig_dir = cache.join(format!("ziglang-{zv}-{}", &zpin.sha256[..12]));
        if !zig_dir.join(".ok").is_file() {
            let url = self.wheel_url(&zig.package, zv, &zpin.wheel).await?;
            let whl = cache.join("downloads").join(inside(&zpin.wheel)?);
            let have = whl.is_file() && sha256_file(&whl)? == zpin.sha256;
            if !have {
                let sha = self.download(&url, &whl, &zpin.wheel).await?;
                check_sha(&sha, &zpin.sha256, &zpin.wheel)?;
            }
            let to = zig_dir.clone();
            tokio::task::spawn_blocking(move || -> Result<()> {
                unpack_zip(&mut zip::ZipArchive::new(File::open(&whl)?)?, &to)?;
                fs::write(to.join(".ok"), b"")?;
                Ok(())
            })
            .await??;
        }

        // QuickJS-NG's sources, as vendored in the rquickjs-sys crate.
        let (qv, qsha) = (
            pin("RQUICKJS_SYS_VERSION")?,
            pin("RQUICKJS_SYS_CRATE_SHA256")?,
        );
        let qjs_dir = cache.join(format!("rquickjs-sys-{qv}-{}", &qsha[..12]));
        if !qjs_dir.join(".ok").is_file() {
            let file = format!("rquickjs-sys-{qv}.crate");
            let crate_path = cache.join("downloads").join(&file);
            let have = crate_path.is_file() && sha256_file(&crate_path)? == qsha;
            if !have {
                let url = format!(
                    "{}/rquickjs-sys/{file}",
                    self.opts.crates.trim_end_matches('/')
                );
                let sha = self.download(&url, &crate_path, &file).await?;
                check_sha(&sha, qsha, &file)?;
            }
            let (to, prefix) = (qjs_dir.clone(), format!("rquickjs-sys-{qv}/quickjs/"));
            tokio::task::spawn_blocking(move || untar_sources(&crate_path, &prefix, &to)).await??;
        }

        let dest = self.opts.dir.join(inside(out)?);
        let zig = zig_dir.join(inside(&zpin.binary)?);
        let (stack, js_stack) = (pin("WB_STACK_SIZE")?, pin("WB_JS_STACK_SIZE")?);
        let (stack, js_stack) = (stack.to_string(), js_stack.to_string());
        let stamp = want.clone();
        log(format_args!(
            "{name}: compiling QuickJS-NG (rquickjs-sys {qv}) with zig {zv}; about a minute"
        ));
        tokio::task::spawn_blocking(move || {
            build_qjs(&zig, &qjs_dir, &cache, &stack, &js_stack, &dest, &want)
        })
        .await??;
        self.stamps.record(out, &stamp);
        Ok(())
    }
}

/// The `quickjs/` folder of a (hash-checked) crate, into `to/quickjs`.
fn untar_sources(crate_path: &Path, prefix: &str, to: &Path) -> Result<()> {
    let tmp = part(to);
    let _ = fs::remove_dir_all(&tmp);
    let gz = flate2::read::GzDecoder::new(File::open(crate_path)?);
    let mut tar = tar::Archive::new(gz);
    for entry in tar.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.to_string_lossy().into_owned();
        let Some(rest) = path.strip_prefix(prefix) else {
            continue;
        };
        if !entry.header().entry_type().is_file() || rest.is_empty() {
            continue;
        }
        let target = tmp.join("quickjs").join(inside(rest)?);
        if let Some(p) = target.parent() {
            fs::create_dir_all(p)?;
        }
        let mut out = File::create(&target)?;
        std::io::copy(&mut entry, &mut out)?;
    }
    if !tmp.join("quickjs/quickjs.c").is_file() {
        bail!("{} has no {prefix}quickjs.c", crate_path.display());
    }
    fs::write(tmp.join(".ok"), b"")?;
    swap_in(&tmp, to)
}

/// `prelude.js` as a C string of 64-byte lines (octal escapes for what C would not take).
fn prelude_header(src: &[u8]) -> String {
    let mut s = String::from(
        "/* generated by wasmbox setup from prelude.js */\nstatic const char wb_prelude_js[] =\n",
    );
    let lines: Vec<String> = src
        .chunks(64)
        .map(|c| {
            let mut l = String::from("\"");
            for &b in c {
                if !(32..=126).contains(&b) || b"\"\\?".contains(&b) {
                    l.push_str(&format!("\\{b:03o}"));
                } else {
                    l.push(b as char);
                }
            }
            l.push('"');
            l
        })
        .collect();
    if lines.is_empty() {
        s.push_str("\"\"");
    } else {
        s.push_str(&lines.join("\n"));
    }
    s.push_str(";\n");
    s
}

fn build_qjs(
    zig: &Path,
    sources: &Path,
    cache: &Path,
    stack: &str,
    js_stack: &str,
    dest: &Path,
    want: &str,
) -> Result<()> {
    let build = tempfile::tempdir()?;
    let b = build.path();
    for e in fs::read_dir(sources.join("quickjs"))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "c" || x == "h") {
            fs::copy(&p, b.join(p.file_name().unwrap_or_default()))?;
        }
    }
    fs::write(b.join("wasmbox_qjs.c"), QJS_ENTRY)?;
    // QuickJS-NG disables its native stack-overflow check on WASI; our stack size is known, so
    // it is enabled again (deep recursion then ends in a RangeError, not a trap).
    let qc = fs::read_to_string(b.join("quickjs.c"))?;
    let old = "static void update_stack_limit(JSRuntime *rt)\n{\n#if defined(__wasi__)\n";
    let new = "static void update_stack_limit(JSRuntime *rt)\n{\n#if 0 /* wasmbox: stack limit enabled on WASI */\n";
    if qc.matches(old).count() != 1 {
        bail!("quickjs.c's stack-limit patch does not apply");
    }
    fs::write(b.join("quickjs.c"), qc.replace(old, new))?;
    fs::write(
        b.join("wasmbox_prelude.h"),
        prelude_header(QJS_PRELUDE.as_bytes()),
    )?;
    let t = Instant::now();
    let st = std::process::Command::new(zig)
        .current_dir(b)
        .env("ZIG_GLOBAL_CACHE_DIR", cache.join("zig"))
        .env("ZIG_LOCAL_CACHE_DIR", cache.join("zig-local"))
        .args([
            "cc",
            "-target",
            "wasm32-wasi",
            "-mexec-model=reactor",
            "-O2",
            "-s",
            "-D_GNU_SOURCE",
            "-DQJS_BUILD_LIBC",
            "-D_WASI_EMULATED_PROCESS_CLOCKS",
            "-D_WASI_EMULATED_SIGNAL",
            &format!("-DWB_JS_STACK_SIZE={js_stack}"),
            "-I.",
            "dtoa.c",
            "libregexp.c",
            "libunicode.c",
            "quickjs.c",
            "quickjs-libc.c",
            "wasmbox_qjs.c",
            "-lwasi-emulated-process-clocks",
            "-lwasi-emulated-signal",
            &format!("-Wl,-z,stack-size={stack}"),
            "-o",
            "qjs.wasm",
        ])
        .stdin(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {}", zig.display()))?;
    if !st.success() {
        bail!("zig cc failed ({st})");
    }
    let built = b.join("qjs.wasm");
    check_sha(&sha256_file(&built)?, want, "the built quickjs/qjs.wasm")?;
    log(format_args!(
        "quickjs: compiled in {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    if let Some(p) = dest.parent() {
        fs::create_dir_all(p)?;
    }
    let tmp = part(dest);
    fs::copy(&built, &tmp)?;
    fs::rename(&tmp, dest)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prelude_header_escapes_what_c_would_not_take() {
        let h = prelude_header(b"a\"b\\c?\n\xc3\xa9");
        assert!(h.contains(r#""a\042b\134c\077\012\303\251";"#), "{h}");
    }
}

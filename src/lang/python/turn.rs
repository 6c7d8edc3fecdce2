//! Turns: how the host talks to the interpreter. The reactor's `turn` export runs Python text;
//! the first turn (the prologue, in `prologue.py`) defines the `_wasmbox` module and takes the
//! reactor's turns over, so every later turn is a call of one of its functions as JSON.

use wasmtime::{Instance, Store};

use super::base_env;
use crate::lang::ExecRequest;
use crate::lang::guest::{GuestState, WORKSPACE_GUEST, copy_in};

/// The first turn of every instance (baked into the image when there is one): defines
/// `_wasmbox.run`, which runs the caller's code the way `python -c` would — no echo of a final
/// expression unless asked, tracebacks that show the caller's own lines as `<code>` without a
/// frame of ours — after applying the call's environment and working directory, which a
/// snapshot would otherwise have frozen, and, when asked, hands the figures left open (or
/// shown) to the host through `host.call` as PNG before the turn ends. It then takes over the
/// reactor's turns: every later turn is a call of ours as JSON (see [`call`]).
pub(super) const PROLOGUE: &str = concat!(
    include_str!("prologue.py"),
    include_str!("net.py"),
    include_str!("tools.py")
);

/// The turn that readies an instance: `_wasmbox.warm` (reseeds the random generators, sets the
/// base environment and goes once through `run`).
pub(super) static WARM_TURN: std::sync::LazyLock<String> =
    // The base environment, so that a one-shot that brings none needs no env of its own.
    std::sync::LazyLock::new(|| call(("warm", base_env())));

pub(super) fn prologue(store: &mut Store<GuestState>, instance: &Instance) -> wasmtime::Result<()> {
    if let Ok(init) = instance.get_typed_func::<(), ()>(&mut *store, "_initialize") {
        init.call(&mut *store, ())?;
    }
    run_turn(store, instance, PROLOGUE)
}

/// A turn of our own code, which must succeed.
pub(super) fn run_turn(
    store: &mut Store<GuestState>,
    instance: &Instance,
    code: &str,
) -> wasmtime::Result<()> {
    match turn(store, instance, code)? {
        0 => Ok(()),
        status => wasmtime::bail!("status {status}"),
    }
}

/// The user turn: the caller's code, run by the prologue's `_wasmbox.run` with the call's
/// environment.
pub(super) fn user_turn(req: &ExecRequest) -> String {
    let images = req.images.map_or(0, |b| b.max_images);
    if req.place.is_none() && req.env.is_empty() {
        // A fresh instance from the pool already has the base env (its warm-up turn set it), so
        // the turn skips rewriting the environment.
        if req.packages.is_empty() {
            return call(("run", &req.code, req.echo, images));
        }
        let none: Option<()> = None;
        return call((
            "run",
            &req.code,
            req.echo,
            images,
            none,
            none,
            &req.packages,
        ));
    }
    let cwd = req
        .place
        .as_ref()
        .map_or(WORKSPACE_GUEST, |p| p.cwd.as_str());
    let mut full = base_env();
    full.insert("PWD", cwd);
    for (k, v) in &req.env {
        full.insert(k, v);
    }
    if req.packages.is_empty() {
        return call(("run", &req.code, req.echo, images, full, cwd));
    }
    call(("run", &req.code, req.echo, images, full, cwd, &req.packages))
}

/// A turn after the prologue: a call of one of its `_wasmbox` functions, as the JSON array
/// `[name, *args]` that its `turn` reads.
pub(super) fn call(args: impl serde::Serialize) -> String {
    literal(&args)
}

/// JSON text of a string, or a list or map of strings, which is also a Python literal of it.
pub fn literal<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).expect("strings and maps always serialise")
}

/// One `turn`: the code is copied into memory from the guest's own allocator; a null pointer
/// (allocation failed) makes the guest raise MemoryError.
pub(super) fn turn(
    store: &mut Store<GuestState>,
    instance: &Instance,
    code: &str,
) -> wasmtime::Result<i32> {
    let ptr = copy_in(store, instance, "host_alloc", code.as_bytes())?;
    let turn = instance.get_typed_func::<(i32, i32), i32>(&mut *store, "turn")?;
    let len = if ptr == 0 { 0 } else { code.len() as i32 };
    turn.call(&mut *store, (ptr, len))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::lang::Language;

    #[test]
    fn env_json_is_a_python_dict_literal() {
        let mut env = BTreeMap::new();
        env.insert("A".to_string(), "x\"y\n".to_string());
        let req = ExecRequest {
            language: Language::Python,
            code: "print(1)".into(),
            env,
            timeout: std::time::Duration::from_secs(1),
            memory_bytes: 1 << 20,
            output_bytes: 1 << 20,
            echo: false,
            place: None,
            scratch_quota: crate::engine::disk::Quota {
                max_bytes: 1 << 20,
                max_entries: 10,
            },
            cancel: None,
            progress: None,
            images: None,
            owner: "local".into(),
            reach: None,
            packages: Vec::new(),
            audit: None,
        };
        let t = user_turn(&req);
        assert!(t.contains(r#""A":"x\"y\n""#), "{t}");
        assert!(t.contains(r#""HOME":"/tmp""#), "{t}");
    }
}

//! The door: the one host function a Python guest has beyond WASI, `_host.call(frame)`, through
//! which a turn hands its figures over as PNG (never through stdout or stderr, which the
//! caller's code writes too), bounded by the call's image budget.

use wasmtime::{Caller, Engine, Linker};

use super::Result;
use crate::lang::guest::{GuestState, engine_err, wasi_linker};

/// The WASI linker with the door added: what every Python instance, and the image build, links.
pub(super) fn linker(engine: &Engine) -> Result<Linker<GuestState>> {
    let mut linker = wasi_linker(engine)?;
    // The door (`_host.call(frame)`): it takes the figures a turn hands over, while the call
    // asked for images; for anything else -1 makes `_host.call` raise ConnectionRefusedError,
    // as when no host is bound.
    linker.func_wrap("host", "call", door).map_err(engine_err)?;
    Ok(linker)
}

/// `host.call(req_ptr, req_len, out_ptr_ptr, out_len_ptr) -> i32`: 0 with a one-byte answer
/// when the frame was a figure's, -1 when it is not ours (or no images were asked for).
fn door(
    mut caller: Caller<'_, GuestState>,
    ptr: i32,
    len: i32,
    out_ptr: i32,
    out_len: i32,
) -> wasmtime::Result<i32> {
    let Some(budget) = caller.data().images.budget().copied() else {
        return Ok(-1);
    };
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    let Some(memory) = caller.get_export("memory").and_then(|e| e.into_memory()) else {
        return Ok(-2);
    };
    let (data, state) = memory.data_and_store_mut(&mut caller);
    let Some(frame) = data.get(ptr..ptr.saturating_add(len)) else {
        return Ok(-2);
    };
    // A frame past the largest image the budget could take is counted by its head, not read.
    let taken = if len > crate::lang::images::max_frame(&budget) {
        state.images.offer_oversized(frame)
    } else {
        state.images.offer(frame)
    };
    if !taken {
        return Ok(-1);
    }
    // The answer, in memory the guest's allocator gives (the guest frees it).
    let alloc = caller
        .get_export("host_alloc")
        .and_then(|e| e.into_func())
        .ok_or_else(|| wasmtime::format_err!("the module exports no host_alloc"))?
        .typed::<i32, i32>(&caller)?;
    let answer = alloc.call(&mut caller, 1)?;
    if answer == 0 {
        return Ok(-2);
    }
    let written = [
        (answer, &b"1"[..]),
        (out_ptr, &answer.to_le_bytes()[..]),
        (out_len, &1u32.to_le_bytes()[..]),
    ]
    .into_iter()
    .try_for_each(|(at, bytes)| memory.write(&mut caller, at as u32 as usize, bytes));
    Ok(if written.is_ok() { 0 } else { -2 })
}

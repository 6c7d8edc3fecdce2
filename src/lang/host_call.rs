//! The one host function guests have beyond WASI, `host.call(frame)`. Through it a
//! Python turn hands its figures over as PNG (never through stdout or stderr, which the caller's
//! code writes too), bounded by the call's image budget, and any guest makes its host calls
//! (`reach::calls`): an HTTP request to an allowed host, waited for as a sleep is. Go, which
//! cannot lend the host memory from inside an import, has the same call in two steps
//! (`wasmbox.call`, `wasmbox.take`).

use wasmtime::{Caller, Engine, Linker, Memory};

use super::Result;
use super::guest::{GuestState, engine_err, wasi_linker};
use crate::reach::calls::{HostCalls, Started};

/// The WASI linker with `host.call` added: what every guest (and the image builds) links.
pub fn linker(engine: &Engine) -> Result<Linker<GuestState>> {
    let mut linker = wasi_linker(engine)?;
    linker
        .func_wrap("host", "call", call_import)
        .map_err(engine_err)?;
    linker
        .func_wrap("wasmbox", "call", call)
        .map_err(engine_err)?;
    linker
        .func_wrap("wasmbox", "take", take)
        .map_err(engine_err)?;
    Ok(linker)
}

/// `wasmbox.call(req_ptr, req_len) -> i32`: the same host call for a guest that cannot give the
/// host memory from inside the import (Go): the answer is held, its length returned (-2 when
/// the frame is not in memory), and [`take`] copies it out.
fn call(mut caller: Caller<'_, GuestState>, ptr: i32, len: i32) -> wasmtime::Result<i32> {
    let Some((_, frame, state)) = lent_frame(&mut caller, ptr, len) else {
        return Ok(-2);
    };
    let answer = host_call(state, frame)?;
    let Ok(n) = i32::try_from(answer.len()) else {
        return Ok(-2);
    };
    state.held = Some(answer);
    Ok(n)
}

/// `wasmbox.take(buf_ptr, buf_len) -> i32`: copies the held answer out (as much as fits) and
/// forgets it; the bytes copied, or -2.
fn take(mut caller: Caller<'_, GuestState>, ptr: i32, len: i32) -> wasmtime::Result<i32> {
    let Some(memory) = caller.get_export("memory").and_then(|e| e.into_memory()) else {
        return Ok(-2);
    };
    let Some(answer) = caller.data_mut().held.take() else {
        return Ok(0);
    };
    let n = answer.len().min(len as u32 as usize);
    Ok(
        match memory.write(&mut caller, ptr as u32 as usize, &answer[..n]) {
            Ok(()) => n as i32,
            Err(_) => -2,
        },
    )
}

/// Makes the host call `frame` asks for and waits for its answer as a sleep is waited for.
fn host_call(state: &mut GuestState, frame: &[u8]) -> wasmtime::Result<Vec<u8>> {
    let started = if frame.len() > state.calls.max_frame() {
        Started::Now(state.calls.oversized(frame.len()))
    } else {
        state.calls.start(frame)
    };
    Ok(match started {
        Started::Now(a) => a,
        Started::Later(pending) => {
            let a = state.watch.wait_for(|wait| pending.poll(wait))?;
            state.calls.deliver(a, pending.id())
        }
    })
}

/// `host.call(req_ptr, req_len, out_ptr_ptr, out_len_ptr) -> i32`: 0 with an answer in memory
/// the guest's `host_alloc` gave (the guest frees it); -1 when the frame is not ours (or a
/// figure when no images were asked for), which makes Python's `_host.call` raise
/// ConnectionRefusedError, as when no host is bound; -2 when the frame or answer does not fit.
fn call_import(
    mut caller: Caller<'_, GuestState>,
    ptr: i32,
    len: i32,
    out_ptr: i32,
    out_len: i32,
) -> wasmtime::Result<i32> {
    let Some((memory, frame, state)) = lent_frame(&mut caller, ptr, len) else {
        return Ok(-2);
    };
    if HostCalls::is_call(&frame[..frame.len().min(64)]) {
        let answer = host_call(state, frame)?;
        return write_answer(&mut caller, memory, &answer, out_ptr, out_len);
    }
    let Some(budget) = state.images.budget().copied() else {
        return Ok(-1);
    };
    // A frame past the largest image the budget could take is counted by its head, not read.
    let taken = if frame.len() > super::images::max_frame(&budget) {
        state.images.offer_oversized(frame)
    } else {
        state.images.offer(frame)
    };
    if !taken {
        return Ok(-1);
    }
    write_answer(&mut caller, memory, b"1", out_ptr, out_len)
}

/// The guest's memory, the frame it lends at `ptr..ptr + len` and the call's state; `None` (the
/// guest's -2) when it exports no memory or the frame is not in it.
fn lent_frame<'a>(
    caller: &'a mut Caller<'_, GuestState>,
    ptr: i32,
    len: i32,
) -> Option<(Memory, &'a [u8], &'a mut GuestState)> {
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    let memory = caller.get_export("memory").and_then(|e| e.into_memory())?;
    let (data, state) = memory.data_and_store_mut(caller);
    Some((memory, data.get(ptr..ptr.saturating_add(len))?, state))
}

/// Writes `answer` into memory the guest's allocator gives and its place and length where the
/// guest asked: 0, or -2 when the guest has no room for it.
fn write_answer(
    caller: &mut Caller<'_, GuestState>,
    memory: Memory,
    answer: &[u8],
    out_ptr: i32,
    out_len: i32,
) -> wasmtime::Result<i32> {
    let Ok(size) = i32::try_from(answer.len()) else {
        return Ok(-2);
    };
    let alloc = caller
        .get_export("host_alloc")
        .and_then(|e| e.into_func())
        .ok_or_else(|| wasmtime::format_err!("the module exports no host_alloc"))?
        .typed::<i32, i32>(&*caller)?;
    let at = alloc.call(&mut *caller, size.max(1))?;
    if at == 0 {
        return Ok(-2);
    }
    let written = [
        (at, answer),
        (out_ptr, &at.to_le_bytes()[..]),
        (out_len, &(size as u32).to_le_bytes()[..]),
    ]
    .into_iter()
    .try_for_each(|(to, bytes)| memory.write(&mut *caller, to as u32 as usize, bytes));
    Ok(if written.is_ok() { 0 } else { -2 })
}

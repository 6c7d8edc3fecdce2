//! Instances made ahead of time for sessions that are restored or copied (a resume, a swap-in,
//! a fork): grown to the memory size of the last such session and holding private copies of
//! the pages it held, so that writing a session's pages into one is a copy with no page faults.
//!
//! Without one, each page a session brings is a copy-on-write fault in the new instance: the
//! kernel allocates a page, copies the image's page into it and maps it, and only then is the
//! session's page copied over it. For a fork of a pandas session holding a DataFrame (1,731
//! pages) that was half the fork. A spare takes those faults on a background thread, before
//! the request. Sessions of one image resemble each other (the same interpreter and libraries,
//! used the same way), so the last session's pages are the guess: a page guessed wrong is
//! faulted in as before, and a page made ahead that the session does not hold reads as the
//! image's, unchanged.
//!
//! There is one spare per runtime, made only once a session has been restored or copied.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use wasmtime::Instance;

use super::guest::{Guest, GuestSpec, engine_err};
use super::{LangError as Error, Place, Result};
use crate::engine::pool::{Pool, PoolStats};
use crate::engine::state::InstanceState;

const PAGE: usize = 4096;

/// Most a spare holds made ahead: a bigger session's other pages fault in on its path.
const MAX_AHEAD_BYTES: usize = 32 << 20;
/// How long a restore waits for a spare being made: made beside the restore, its page faults
/// contend with the restore's own (forks back to back took 6-14 ms so, against 9 without
/// spares), and one takes a few milliseconds.
const WAIT: Duration = Duration::from_millis(20);
/// Most of the image a spare maps ahead (no copies: the image's own pages).
const MAX_MAPPED_BYTES: usize = 64 << 20;

/// What the next spare is made to: the last restored or copied session's memory size (wasm
/// pages), its pages (byte runs, at most [`MAX_AHEAD_BYTES`]) and, from the last copy, the
/// image's pages its source had mapped (at most [`MAX_MAPPED_BYTES`]).
#[derive(Clone, Default)]
struct Plan {
    memory_pages: u64,
    runs: Vec<Range<usize>>,
    reads: Vec<Range<usize>>,
}

/// `runs` (host page indices) as byte runs, cut off after `max` bytes.
fn capped(runs: &[Range<u64>], max: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut left = max;
    for r in runs {
        let run = r.start as usize * PAGE..r.end as usize * PAGE;
        if run.len() > left {
            out.push(run.start..run.start + left);
            break;
        }
        left -= run.len();
        out.push(run);
    }
    out
}

/// An instance made ahead, not run, its memory's size and the host pages made its own.
struct Spare {
    guest: Guest,
    instance: Instance,
    memory_pages: u64,
    ahead: Vec<Range<u64>>,
}

/// A fresh instance for a session's state, and the host pages already its own (none unless
/// it is a spare): [`crate::engine::state::restore`]'s `ahead`.
pub struct FreshInstance {
    pub guest: Guest,
    pub instance: Instance,
    pub ahead: Vec<Range<u64>>,
}

type Make = dyn Fn() -> Result<(Guest, Instance)> + Send + Sync;
type Rebind = dyn Fn(&mut Guest, Option<&Place>, Duration) -> Result<()> + Send + Sync;

/// A runtime's spare, kept by a pool of one that starts with the first session restored or
/// copied.
pub struct Spares {
    name: String,
    plan: Arc<Mutex<Plan>>,
    make: Arc<Make>,
    rebind: Box<Rebind>,
    pool: OnceLock<Pool<Spare, Error>>,
}

impl Spares {
    /// `make` gives a fresh instance of the image, not run, in scratch directories; `rebind`
    /// moves one into a session's place with its clock ([`Guest::rebind`]).
    pub fn new(
        name: &str,
        make: impl Fn() -> Result<(Guest, Instance)> + Send + Sync + 'static,
        rebind: impl Fn(&mut Guest, Option<&Place>, Duration) -> Result<()> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            plan: Default::default(),
            make: Arc::new(make),
            rebind: Box::new(rebind),
            pool: OnceLock::new(),
        }
    }

    /// The spare, moved into `place` with its clock reading `clock`, when there is one whose
    /// memory is no bigger than `memory_pages` (the state it is for; memory cannot shrink).
    pub fn take(
        &self,
        place: Option<&Place>,
        clock: Duration,
        memory_pages: u64,
    ) -> Option<FreshInstance> {
        let pool = self.pool.get()?;
        let mut spare = pool.take_within(WAIT)?;
        pool.refill();
        if spare.memory_pages > memory_pages {
            crate::engine::threads::drop_later(spare);
            return None;
        }
        match (self.rebind)(&mut spare.guest, place, clock) {
            Ok(()) => Some(FreshInstance {
                guest: spare.guest,
                instance: spare.instance,
                ahead: spare.ahead,
            }),
            Err(e) => {
                tracing::warn!("{}: a spare instance could not be used: {e}", self.name);
                None
            }
        }
    }

    /// The pool's counters, once it has started.
    pub fn stats(&self) -> Option<PoolStats> {
        self.pool.get().map(Pool::stats)
    }

    /// Waits until the spare is made, or `timeout` passes; false when there is none to wait
    /// for (no session restored or copied yet). For benches, which measure with it ready.
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        self.pool.get().is_some_and(|p| p.wait_full(timeout))
    }

    /// Makes the next spare to `state`'s measure (a session just restored or copied), and
    /// with the image's pages in `mapped` mapped (a copy's source had them mapped; a restore
    /// does not know, and keeps the last copy's), starting the pool that keeps one the first
    /// time.
    pub fn learn(&self, state: &InstanceState, mapped: Option<&[Range<u64>]>) {
        {
            let mut plan = self.plan.lock().unwrap();
            plan.memory_pages = state.memory_pages();
            plan.runs = capped(state.runs(), MAX_AHEAD_BYTES);
            if let Some(mapped) = mapped {
                plan.reads = capped(mapped, MAX_MAPPED_BYTES);
            }
        }
        self.pool.get_or_init(|| {
            let (make, plan) = (self.make.clone(), self.plan.clone());
            Pool::new(&self.name, 1, 1, move || made_ahead(&*make, &plan), None)
        });
    }
}

/// A fresh instance grown and faulted in to `plan`.
fn made_ahead(make: &Make, plan: &Mutex<Plan>) -> Result<Spare> {
    let plan = plan.lock().unwrap().clone();
    let (mut guest, instance) = make()?;
    let memory = super::live::exported_memory(&mut guest, &instance)?;
    let now = memory.size(&guest.store);
    if plan.memory_pages > now {
        memory
            .grow(&mut guest.store, plan.memory_pages - now)
            .map_err(engine_err)?;
    }
    let mem = memory.data_mut(&mut guest.store);
    // SAFETY: the instance's own memory, borrowed mutably; a write population makes private
    // copies of its pages without changing what they read (runs past its end are cut off).
    unsafe {
        use crate::platform::memory::{Populate, populate};
        let (base, len) = (mem.as_mut_ptr(), mem.len());
        populate(&plan.runs, base, len, Populate::Write);
        populate(&plan.reads, base, len, Populate::Read);
    }
    let memory_pages = memory.size(&guest.store);
    let ahead = plan
        .runs
        .iter()
        .map(|r| (r.start / PAGE) as u64..r.end.div_ceil(PAGE) as u64)
        .collect();
    Ok(Spare {
        guest,
        instance,
        memory_pages,
        ahead,
    })
}

/// [`Guest::rebind`] with a runtime's spec and no environment of its own (a session's env is
/// applied per call).
pub fn rebind_with(
    spec: &GuestSpec<'_>,
    guest: &mut Guest,
    place: Option<&Place>,
    clock: Duration,
) -> Result<()> {
    guest.rebind(spec, &BTreeMap::new(), place, clock)
}

//! The host interface every guest gets: wasmtime-wasi's preview 1, with the one call that can
//! block, `poll_oneoff`, replaced by a wait that ends at the guest's deadline and stop flag.
//!
//! wasmtime's epoch checks run only while wasm executes. With `allow_blocking_current_thread`
//! a clock subscription in wasmtime-wasi 48 is an uninterruptible `std::thread::sleep`, so a
//! guest sleeping in `time.sleep(60)`, `os.sleep` or Go's `time.Sleep` kept its thread, ignored
//! its deadline, kill and sandbox deletion, and held a CPU slot while doing nothing. Here the
//! wait is cut into slices that look at the guest's [`Watch`] (kept in the store, where the
//! epoch callback looks too), and the guest's CPU slot is given back for the length of the wait.
//! Subscriptions on descriptors go to wasmtime-wasi's own `poll_oneoff`: guests have only files,
//! an empty stdin and captured output streams, which are always ready, so it never blocks.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use wasmtime::{Caller, Engine, Extern, Linker, Trap, TypedFunc};
use wasmtime_wasi::clocks::HostMonotonicClock;

use super::guest::GuestState;
use crate::engine::cpu;
use crate::engine::limits::{Stop, StopReason, Stopped};
use crate::error::Result;

/// Longest a waiting guest goes without looking at its deadline and stop flag.
const SLICE: Duration = Duration::from_millis(10);
/// How often a sandboxed guest's workspace is measured against its quota while it runs.
const QUOTA_EVERY: Duration = Duration::from_millis(500);

const MODULE: &str = "wasi_snapshot_preview1";
const ERRNO_SUCCESS: i32 = 0;
const ERRNO_FAULT: i32 = 21;
const ERRNO_INVAL: i32 = 28;
const SUBSCRIPTION_SIZE: usize = 48;
const EVENT_SIZE: usize = 32;
const TAG_CLOCK: u8 = 0;
const CLOCK_REALTIME: u32 = 0;
const CLOCK_MONOTONIC: u32 = 1;
const SUBSCRIPTION_CLOCK_ABSTIME: u16 = 1;

type QuotaProbe = Arc<dyn Fn() -> bool + Send + Sync>;

/// What ends a guest's call from outside its own code: the deadline, the stop flag (kill,
/// sandbox deleted or expired) and, in a sandbox, the disk quota. Kept in the store so that the
/// epoch callback and every waiting host call look at the same values.
pub struct Watch {
    deadline: Instant,
    timeout: Duration,
    stop: Arc<Stop>,
    over_quota: Option<QuotaProbe>,
    last_quota: Instant,
    /// Zero of the guest's monotonic clock, for absolute clock subscriptions.
    origin: Instant,
}

impl Watch {
    pub fn new(timeout: Duration, origin: Instant) -> Self {
        let now = Instant::now();
        Self {
            deadline: now + timeout,
            timeout,
            stop: Arc::new(Stop::default()),
            over_quota: None,
            last_quota: now,
            origin,
        }
    }

    /// Starts a call: `timeout` from now, the given stop flag (a fresh one when `None`) and
    /// quota probe.
    pub fn arm(
        &mut self,
        timeout: Duration,
        stop: Option<Arc<Stop>>,
        over_quota: Option<QuotaProbe>,
    ) {
        let now = Instant::now();
        self.deadline = now + timeout;
        self.timeout = timeout;
        self.stop = stop.unwrap_or_default();
        self.over_quota = over_quota;
        self.last_quota = now;
    }

    /// A new deadline for the same call's settings.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.deadline = Instant::now() + timeout;
        self.timeout = timeout;
    }

    /// The deadline a timeout note names, when the call's covers more than this guest's run.
    pub fn report_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The error that ends the guest now, if anything should.
    pub fn check(&mut self, now: Instant) -> wasmtime::Result<()> {
        if let Some(why) = self.stop.reason() {
            return Err(Stopped(why).into());
        }
        if now >= self.deadline {
            return Err(Trap::Interrupt.into());
        }
        if let Some(over) = &self.over_quota
            && now.duration_since(self.last_quota) >= QUOTA_EVERY
        {
            self.last_quota = now;
            if over() {
                // Not raised on the shared flag: freeing space lets the next run go on.
                return Err(Stopped(StopReason::DiskQuota).into());
            }
        }
        Ok(())
    }

    /// Waits until `wake` (forever: `None`) without holding a CPU slot, in slices that end
    /// the wait with the guest's deadline, stop flag or quota. The slot is taken back before
    /// returning `Ok`.
    pub fn wait(&mut self, wake: Option<Instant>) -> wasmtime::Result<()> {
        let mut released = cpu::release();
        loop {
            let now = Instant::now();
            self.check(now)?;
            if wake.is_some_and(|w| now >= w) {
                break;
            }
            let mut until = (now + SLICE).min(self.deadline);
            if let Some(w) = wake {
                until = until.min(w);
            }
            std::thread::sleep(until.saturating_duration_since(now));
        }
        // Waiting for a slot is waiting too: the deadline and stop flag still apply.
        while !released.reacquire(SLICE) {
            self.check(Instant::now())?;
        }
        Ok(())
    }
}

/// The guest's monotonic clock: nanoseconds since its [`Watch`]'s origin.
struct GuestClock(Instant);

impl HostMonotonicClock for GuestClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        self.0.elapsed().as_nanos().try_into().unwrap_or(u64::MAX)
    }
}

/// A monotonic clock for a new guest and the [`Watch`] that converts its absolute times.
pub fn clock(timeout: Duration) -> (impl HostMonotonicClock + 'static, Watch) {
    let origin = Instant::now();
    (GuestClock(origin), Watch::new(timeout, origin))
}

/// A linker with WASI preview 1 and the interruptible `poll_oneoff`.
pub fn linker(engine: &Engine) -> Result<Linker<GuestState>> {
    fn wasi(s: &mut GuestState) -> &mut wasmtime_wasi::p1::WasiP1Ctx {
        &mut s.wasi
    }
    let mut original: Linker<GuestState> = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut original, wasi).map_err(super::guest::engine_err)?;
    let original = Arc::new(original);
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, wasi).map_err(super::guest::engine_err)?;
    linker.allow_shadowing(true);
    linker
        .func_wrap(
            MODULE,
            "poll_oneoff",
            move |mut caller: Caller<'_, GuestState>,
                  subs: i32,
                  events: i32,
                  n: i32,
                  nevents: i32|
                  -> wasmtime::Result<i32> {
                match poll_clocks(&mut caller, subs, events, n, nevents)? {
                    Some(errno) => Ok(errno),
                    None => {
                        let f = match caller.data().original_poll.clone() {
                            Some(f) => f,
                            None => {
                                let f = original
                                    .get(&mut caller, MODULE, "poll_oneoff")?
                                    .into_func()
                                    .ok_or_else(|| {
                                        wasmtime::format_err!("poll_oneoff is not a function")
                                    })?
                                    .typed::<(i32, i32, i32, i32), i32>(&caller)?;
                                caller.data_mut().original_poll = Some(f.clone());
                                f
                            }
                        };
                        f.call(&mut caller, (subs, events, n, nevents))
                    }
                }
            },
        )
        .map_err(super::guest::engine_err)?;
    linker.allow_shadowing(false);
    Ok(linker)
}

/// The original `poll_oneoff`, cached per store (looking it up makes a function in the store).
pub type OriginalPoll = TypedFunc<(i32, i32, i32, i32), i32>;

/// `poll_oneoff` for subscriptions that are all clocks: waits for the first to expire and
/// reports every one that has. `None` when any subscription is on a descriptor.
fn poll_clocks(
    caller: &mut Caller<'_, GuestState>,
    subs: i32,
    events: i32,
    n: i32,
    nevents: i32,
) -> wasmtime::Result<Option<i32>> {
    let Some(Extern::Memory(memory)) = caller.get_export("memory") else {
        return Ok(None);
    };
    let n = n as u32 as usize;
    if n == 0 {
        // Sleeping forever is not a thing in preview 1.
        return Ok(Some(ERRNO_INVAL));
    }
    let (subs, events, nevents) = (
        subs as u32 as usize,
        events as u32 as usize,
        nevents as u32 as usize,
    );
    let data = memory.data(&caller);
    let in_bounds =
        |at: usize, len: usize| at.checked_add(len).is_some_and(|end| end <= data.len());
    let Some(subs_len) = n.checked_mul(SUBSCRIPTION_SIZE) else {
        return Ok(Some(ERRNO_FAULT));
    };
    if !in_bounds(subs, subs_len) || !in_bounds(events, n * EVENT_SIZE) || !in_bounds(nevents, 4) {
        return Ok(Some(ERRNO_FAULT));
    }
    let origin = caller.data().watch.origin;
    let now = Instant::now();
    // (userdata, when it fires; `None`: never within this process's clock range)
    let mut clocks = Vec::with_capacity(n);
    for i in 0..n {
        let s = &data[subs + i * SUBSCRIPTION_SIZE..][..SUBSCRIPTION_SIZE];
        if s[8] != TAG_CLOCK {
            return Ok(None);
        }
        let userdata = u64::from_le_bytes(s[0..8].try_into().unwrap());
        let id = u32::from_le_bytes(s[16..20].try_into().unwrap());
        let timeout = u64::from_le_bytes(s[24..32].try_into().unwrap());
        let flags = u16::from_le_bytes(s[40..42].try_into().unwrap());
        let absolute = flags & SUBSCRIPTION_CLOCK_ABSTIME != 0;
        let fires = match (id, absolute) {
            (CLOCK_MONOTONIC | CLOCK_REALTIME, false) => {
                now.checked_add(Duration::from_nanos(timeout))
            }
            (CLOCK_MONOTONIC, true) => origin.checked_add(Duration::from_nanos(timeout)),
            (CLOCK_REALTIME, true) => {
                let wall = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos().try_into().unwrap_or(u64::MAX));
                now.checked_add(Duration::from_nanos(timeout.saturating_sub(wall)))
            }
            _ => return Ok(Some(ERRNO_INVAL)),
        };
        clocks.push((userdata, fires));
    }
    let first = clocks.iter().filter_map(|c| c.1).min();
    caller.data_mut().watch.wait(first)?;
    let now = Instant::now();
    let data = memory.data_mut(&mut *caller);
    let mut count = 0usize;
    for (userdata, fires) in clocks {
        if fires.is_none_or(|f| f > now) {
            continue;
        }
        let e = &mut data[events + count * EVENT_SIZE..][..EVENT_SIZE];
        e.fill(0);
        e[0..8].copy_from_slice(&userdata.to_le_bytes());
        // error 0 (success), type 0 (clock), no bytes or flags.
        count += 1;
    }
    data[nevents..nevents + 4].copy_from_slice(&(count as u32).to_le_bytes());
    Ok(Some(ERRNO_SUCCESS))
}

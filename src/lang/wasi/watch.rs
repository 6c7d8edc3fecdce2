//! What ends a guest's call from outside its own code, and the waits that watch it.

use super::*;

/// What ends a guest's call from outside its own code: the deadline, the stop flag (kill,
/// sandbox deleted or expired) and, in a sandbox, the disk quota. Kept in the store so that the
/// epoch callback and every waiting host call look at the same values.
pub struct Watch {
    pub(super) deadline: Instant,
    pub(super) timeout: Duration,
    pub(super) stop: Arc<Stop>,
    /// The call's own flag: raised when its client gives up on it.
    pub(super) cancel: Option<Arc<Stop>>,
    /// What the guest may hold on disk (its sandbox's, or its one-shot scratch dirs').
    pub(super) disk: Option<Arc<DiskBudget>>,
    /// Why the disk limit stopped the guest, for its result's note.
    pub(super) disk_over: Option<Over>,
    pub(super) last_quota: Instant,
    /// Zero of the guest's monotonic clock, for absolute clock subscriptions.
    pub(super) origin: Instant,
    /// The call's running reports, when its caller wants them.
    pub(super) ticker: Option<crate::engine::progress::Ticker>,
}

impl Watch {
    /// What the guest's disk calls are counted against.
    pub fn disk(&self) -> Option<&Arc<DiskBudget>> {
        self.disk.as_ref()
    }

    pub fn new(timeout: Duration, origin: Instant) -> Self {
        let now = Instant::now();
        Self {
            deadline: now + timeout,
            timeout,
            stop: Arc::new(Stop::default()),
            cancel: None,
            disk: None,
            disk_over: None,
            last_quota: now,
            origin,
            ticker: None,
        }
    }

    /// Starts a call: `timeout` from now, the given stop flag (a fresh one when `None`) and
    /// disk budget.
    pub fn arm(
        &mut self,
        timeout: Duration,
        stop: Option<Arc<Stop>>,
        cancel: Option<Arc<Stop>>,
        disk: Option<Arc<DiskBudget>>,
        ticker: Option<crate::engine::progress::Ticker>,
    ) {
        let now = Instant::now();
        self.deadline = now + timeout;
        self.timeout = timeout;
        self.stop = stop.unwrap_or_default();
        self.cancel = cancel;
        self.disk = disk;
        self.disk_over = None;
        self.last_quota = now;
        self.ticker = ticker;
    }

    /// Ends the call's running reports (a session's guest outlives its calls).
    pub fn end_reports(&mut self) {
        self.ticker = None;
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

    /// The guest's monotonic clock now, in nanoseconds.
    pub fn clock_ns(&self) -> u64 {
        self.origin
            .elapsed()
            .as_nanos()
            .try_into()
            .unwrap_or(u64::MAX)
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The error that ends the guest now, if anything should.
    pub fn check(&mut self, now: Instant) -> wasmtime::Result<()> {
        let cancelled = || self.cancel.as_deref().and_then(Stop::reason);
        if let Some(why) = self.stop.reason().or_else(cancelled) {
            return Err(Stopped(why).into());
        }
        if now >= self.deadline {
            return Err(Trap::Interrupt.into());
        }
        if let Some(disk) = &self.disk
            && now.duration_since(self.last_quota) >= QUOTA_EVERY
        {
            self.last_quota = now;
            if let Some(over) = disk.over_quota() {
                return Err(self.disk_full(over));
            }
        }
        if let Some(t) = &mut self.ticker {
            t.tick(now);
        }
        Ok(())
    }

    /// Stops the guest for the disk limit. Not raised on the shared flag: freeing space lets
    /// the next run go on.
    pub(super) fn disk_full(&mut self, over: Over) -> wasmtime::Error {
        self.disk_over = Some(over);
        Stopped(StopReason::DiskQuota).into()
    }

    /// What the disk limit stopped the guest at, once.
    pub fn take_disk_over(&mut self) -> Option<Over> {
        self.disk_over.take()
    }

    /// Waits until `wake` (forever: `None`) without holding a CPU slot, in slices that end
    /// the wait with the guest's deadline, stop flag or quota. The slot is taken back before
    /// returning `Ok`.
    pub fn wait(&mut self, wake: Option<Instant>) -> wasmtime::Result<()> {
        let released = cpu::release();
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
        self.retake(released)
    }

    /// Waits for `poll` to give an answer (it waits up to the time it is given), without
    /// holding a CPU slot, in slices that end the wait with the guest's deadline, stop flag or
    /// quota, as [`Watch::wait`] does.
    pub fn wait_for<T>(
        &mut self,
        mut poll: impl FnMut(Duration) -> Option<T>,
    ) -> wasmtime::Result<T> {
        let released = cpu::release();
        loop {
            let now = Instant::now();
            self.check(now)?;
            let until = (now + SLICE).min(self.deadline);
            if let Some(answer) = poll(until.saturating_duration_since(now)) {
                self.retake(released)?;
                return Ok(answer);
            }
        }
    }

    /// Gives this guest's CPU slot to another owner's waiting call when its owner holds more
    /// than its share (`engine::cpu`), then waits for a slot again.
    pub fn share_slot(&mut self) -> wasmtime::Result<()> {
        match cpu::yield_over_share() {
            Some(released) => self.retake(released),
            None => Ok(()),
        }
    }

    /// Takes a CPU slot back. Waiting for one is waiting too: the deadline and stop flag still
    /// apply.
    fn retake(&mut self, mut released: cpu::Released) -> wasmtime::Result<()> {
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

/// A monotonic clock for a new guest that reads `start` now (a restored session's clock goes on
/// from where it was saved), and the [`Watch`] that converts its absolute times.
pub fn clock(timeout: Duration, start: Duration) -> (impl HostMonotonicClock + 'static, Watch) {
    let now = Instant::now();
    // An origin before this boot cannot be an Instant: such a clock restarts from zero.
    let origin = now.checked_sub(start).unwrap_or(now);
    (GuestClock(origin), Watch::new(timeout, origin))
}

/// `poll_oneoff` for subscriptions that are all clocks: waits for the first to expire and
/// reports every one that has. `None` when any subscription is on a descriptor.
pub(super) fn poll_clocks(
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

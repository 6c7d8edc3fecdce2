//! CPU slots: how many guests execute wasm at once, as opposed to how many are alive.
//!
//! A guest holds a slot while it computes and gives it back while it waits in a host call (a
//! sleep), so guests that sleep cannot keep everyone else's code from running. Background work
//! (jobs, async executions) may hold only `total - reserved` slots, so a plain call always finds
//! one within a slice of a foreground call's run time, whatever background work is doing.
//!
//! Slots are shared between owners (a token over HTTP, the local user over stdio), so that one
//! client's spinning calls cannot lock the others out:
//! - while another owner waits for a slot it could take, an owner holds at most
//!   `max(1, total - 1)` slots, and at most `max(1, b - 1)` of the `b` background slots while
//!   another owner waits for one of those;
//! - a guest whose owner holds more than that, or holds every slot of its class (one slot: the
//!   owners take turns), gives its slot back at its next epoch check ([`yield_over_share`])
//!   and queues for one like any caller;
//! - a freed slot goes to a waiting foreground call before background work, then to the owner
//!   holding fewest slots, then to the owner whose last grant is oldest, then to the longest
//!   waiting: owners take turns, even when one owner has many old waiters.
//!
//! Free slots are handed to waiters under the lock ([`CpuSlots::grant`]), so a caller arriving
//! as a slot frees cannot take it from under an owner whose turn it is.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Who a slot is for: a token's fingerprint over HTTP, the local user over stdio.
pub type Owner = Arc<str>;

/// The owner of sandboxes created over stdio (one local user).
pub const LOCAL_OWNER: &str = "local";

/// Who asks for a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// A call whose client waits for the answer.
    Foreground,
    /// Jobs and async executions: nobody waits on them interactively.
    Background,
}

/// The counted slots, shared by every guest of a [`crate::Wasmbox`].
#[derive(Debug)]
pub struct CpuSlots {
    state: Mutex<State>,
    /// Raised when slots are granted: each waiter looks whether it got one.
    granted: Condvar,
    /// Whether a caller waits without a slot: running guests read it, without the lock, at
    /// every epoch check.
    contended: AtomicBool,
    total: usize,
    /// Slots background work may never take.
    reserved: usize,
}

#[derive(Debug, Default)]
struct State {
    busy: usize,
    background: usize,
    held: HashMap<Owner, Held>,
    waiters: Vec<Waiter>,
    next_ticket: u64,
    /// When (by grant count) each owner holding or waiting for a slot was last granted one.
    turns: HashMap<Owner, u64>,
    grants: u64,
}

/// The slots one owner holds.
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    all: usize,
    background: usize,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    owner: Owner,
    class: Class,
    /// When it first asked: its place in the queue, kept across retries.
    since: Instant,
    /// A slot was handed to it (and counted) while it waited.
    granted: bool,
}

impl State {
    fn held(&self, owner: &str) -> Held {
        self.held.get(owner).copied().unwrap_or_default()
    }

    fn take(&mut self, owner: &Owner, class: Class) {
        let h = self.held.entry(owner.clone()).or_default();
        h.all += 1;
        self.busy += 1;
        if class == Class::Background {
            h.background += 1;
            self.background += 1;
        }
    }

    fn give_back(&mut self, owner: &Owner, class: Class) {
        self.busy -= 1;
        if class == Class::Background {
            self.background -= 1;
        }
        if let Some(h) = self.held.get_mut(owner) {
            h.all -= 1;
            if class == Class::Background {
                h.background -= 1;
            }
            if h.all == 0 {
                self.held.remove(owner);
            }
        }
    }

    /// Whether an owner other than `owner` waits with `wants` true of its call.
    fn other_waits(&self, owner: &str, wants: impl Fn(&Waiter) -> bool) -> bool {
        self.waiters
            .iter()
            .any(|w| !w.granted && *w.owner != *owner && wants(w))
    }
}

/// A slot held by the current thread's guest; given back when dropped.
#[derive(Debug)]
pub struct Permit {
    slots: Arc<CpuSlots>,
    owner: Owner,
    class: Class,
    /// False once the slot was given back some other way (a yield).
    counted: bool,
}

thread_local! {
    /// The slot this thread's running guest holds: a wait inside a host call gives it back.
    static HELD: RefCell<Option<Permit>> = const { RefCell::new(None) };
}

impl CpuSlots {
    /// `total` slots, `reserved` of them for foreground calls only (at least one slot always
    /// remains for background work).
    pub fn new(total: usize, reserved: usize) -> Arc<Self> {
        let total = total.max(1);
        Arc::new(Self {
            state: Mutex::new(State::default()),
            granted: Condvar::new(),
            contended: AtomicBool::new(false),
            total,
            reserved: reserved.min(total - 1),
        })
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// The most slots one owner holds while another owner waits for one.
    pub fn share(&self) -> usize {
        (self.total - 1).max(1)
    }

    fn background_cap(&self) -> usize {
        self.total - self.reserved
    }

    fn background_share(&self) -> usize {
        (self.background_cap() - 1).max(1)
    }

    /// Slots `owner` holds now.
    pub fn held_by(&self, owner: &str) -> usize {
        self.state.lock().unwrap().held(owner).all
    }

    /// Slots in use now (all classes) and by background work.
    pub fn busy(&self) -> (usize, usize) {
        let st = self.state.lock().unwrap();
        (st.busy, st.background)
    }

    /// Callers waiting for a slot now: foreground and background.
    pub fn waiting(&self) -> (usize, usize) {
        let st = self.state.lock().unwrap();
        let fg = st
            .waiters
            .iter()
            .filter(|w| !w.granted && w.class == Class::Foreground)
            .count();
        let bg = st.waiters.iter().filter(|w| !w.granted).count() - fg;
        (fg, bg)
    }

    /// Whether `owner` may take a `class` slot now (the turn among waiters aside).
    fn may_take(&self, st: &State, owner: &str, class: Class) -> bool {
        let background_room = st.background < self.background_cap();
        if st.busy >= self.total || (class == Class::Background && !background_room) {
            return false;
        }
        let h = st.held(owner);
        let other_could_take = |w: &Waiter| w.class == Class::Foreground || background_room;
        if h.all >= self.share() && st.other_waits(owner, other_could_take) {
            return false;
        }
        !(class == Class::Background
            && h.background >= self.background_share()
            && st.other_waits(owner, |w| w.class == Class::Background))
    }

    /// Whether a slot `owner` holds for `class` should go to another owner's waiting call.
    fn over_share(&self, st: &State, owner: &str, class: Class) -> bool {
        let h = st.held(owner);
        let freed_background = usize::from(class == Class::Background);
        let background_room = st.background - freed_background < self.background_cap();
        let other_could_take = |w: &Waiter| w.class == Class::Foreground || background_room;
        let all = h.all > self.share() || h.all >= self.total;
        let background =
            h.background > self.background_share() || h.background >= self.background_cap();
        (all && st.other_waits(owner, other_could_take))
            || (class == Class::Background
                && background
                && st.other_waits(owner, |w| w.class == Class::Background))
    }

    /// Hands free slots to waiters in turn (see the module's doc); true if any got one.
    fn grant(&self, st: &mut State) -> bool {
        let mut any = false;
        loop {
            let next = st
                .waiters
                .iter()
                .enumerate()
                .filter(|(_, w)| !w.granted && self.may_take(st, &w.owner, w.class))
                .min_by_key(|(_, w)| {
                    (
                        w.class == Class::Background,
                        st.held(&w.owner).all,
                        st.turns.get(&w.owner).copied().unwrap_or(0),
                        w.since,
                        w.ticket,
                    )
                })
                .map(|(i, _)| i);
            let Some(i) = next else { break };
            let (owner, class) = (st.waiters[i].owner.clone(), st.waiters[i].class);
            st.waiters[i].granted = true;
            st.take(&owner, class);
            st.grants += 1;
            let turn = st.grants;
            st.turns.insert(owner, turn);
            any = true;
        }
        // Owners neither holding nor waiting go: they come back first in turn.
        let State {
            held,
            waiters,
            turns,
            ..
        } = st;
        turns.retain(|o, _| held.contains_key(o) || waiters.iter().any(|w| w.owner == *o));
        self.contended
            .store(st.waiters.iter().any(|w| !w.granted), Ordering::Relaxed);
        any
    }

    /// Gives a slot back and hands it on.
    fn put_back(&self, st: &mut State, owner: &Owner, class: Class) {
        st.give_back(owner, class);
        if self.grant(st) {
            self.granted.notify_all();
        }
    }

    /// Takes a slot for `owner`, waiting at most `wait`.
    pub fn acquire(
        self: &Arc<Self>,
        owner: &Owner,
        class: Class,
        wait: Duration,
    ) -> Option<Permit> {
        self.acquire_since(owner, class, Instant::now(), wait)
    }

    /// As [`CpuSlots::acquire`], for a caller that has wanted a slot since `since` and asks
    /// again (its place among the waiters is kept).
    pub fn acquire_since(
        self: &Arc<Self>,
        owner: &Owner,
        class: Class,
        since: Instant,
        wait: Duration,
    ) -> Option<Permit> {
        let until = Instant::now() + wait;
        let mut st = self.state.lock().unwrap();
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.waiters.push(Waiter {
            ticket,
            owner: owner.clone(),
            class,
            since,
            granted: false,
        });
        if self.grant(&mut st) {
            self.granted.notify_all();
        }
        loop {
            let i = st
                .waiters
                .iter()
                .position(|w| w.ticket == ticket)
                .expect("only its caller removes a waiter");
            if st.waiters[i].granted {
                st.waiters.swap_remove(i);
                return Some(Permit {
                    slots: self.clone(),
                    owner: owner.clone(),
                    class,
                    counted: true,
                });
            }
            let now = Instant::now();
            if now >= until {
                st.waiters.swap_remove(i);
                // Its wait may have kept another owner at its share.
                if self.grant(&mut st) {
                    self.granted.notify_all();
                }
                return None;
            }
            st = self.granted.wait_timeout(st, until - now).unwrap().0;
        }
    }

    /// Runs `f` on this thread holding `permit`, so that waits inside it can give it back.
    pub fn run_holding<R>(permit: Permit, f: impl FnOnce() -> R) -> R {
        struct Clear;
        impl Drop for Clear {
            fn drop(&mut self) {
                HELD.take();
            }
        }
        HELD.set(Some(permit));
        let _clear = Clear;
        f()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.counted {
            let mut st = self.slots.state.lock().unwrap();
            self.slots.put_back(&mut st, &self.owner, self.class);
        }
    }
}

/// What a waiting guest gave back: the slot to take again before it computes once more.
pub struct Released {
    slots: Option<(Arc<CpuSlots>, Owner, Class)>,
    /// When it first asked for the slot again.
    since: Option<Instant>,
}

/// Gives back the slot this thread's guest holds (if any), for the length of a wait.
pub fn release() -> Released {
    let slots = HELD
        .take()
        .map(|p| (p.slots.clone(), p.owner.clone(), p.class));
    Released { slots, since: None }
}

/// Gives back the slot this thread's guest holds when its owner holds more than its share and
/// another owner waits for a slot it could take (see the module's doc); the guest takes one
/// again through the [`Released`] before it computes on. Called at every epoch check of a
/// running guest: one atomic load while nobody waits.
pub fn yield_over_share() -> Option<Released> {
    let slots = HELD.with_borrow(|held| {
        held.as_ref()
            .filter(|p| p.slots.contended.load(Ordering::Relaxed))
            .map(|p| p.slots.clone())
    })?;
    let mut st = slots.state.lock().unwrap();
    let mut permit = HELD.take()?;
    if !slots.over_share(&st, &permit.owner, permit.class) {
        HELD.set(Some(permit));
        return None;
    }
    // Given back under the same lock that judged it, so two of the owner's guests cannot
    // both leave for one waiter.
    slots.put_back(&mut st, &permit.owner, permit.class);
    permit.counted = false;
    drop(st);
    Some(Released {
        slots: Some((slots, permit.owner.clone(), permit.class)),
        since: None,
    })
}

impl Released {
    /// Takes a slot again, trying for at most `wait`; false if none came free in time (the
    /// caller checks its deadline and stop flag, then tries again). The share rule applies as
    /// to any caller.
    pub fn reacquire(&mut self, wait: Duration) -> bool {
        let Some((slots, owner, class)) = &self.slots else {
            return true;
        };
        let since = *self.since.get_or_insert_with(Instant::now);
        match slots.acquire_since(owner, *class, since, wait) {
            Some(p) => {
                HELD.set(Some(p));
                self.slots = None;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(name: &str) -> Owner {
        name.into()
    }

    #[test]
    fn background_work_leaves_the_reserved_slots_to_foreground_calls() {
        let slots = CpuSlots::new(4, 1);
        let me = owner("local");
        let bg: Vec<_> = (0..3)
            .map(|_| {
                slots
                    .acquire(&me, Class::Background, Duration::ZERO)
                    .unwrap()
            })
            .collect();
        assert!(
            slots
                .acquire(&me, Class::Background, Duration::from_millis(20))
                .is_none()
        );
        let fg = slots
            .acquire(&me, Class::Foreground, Duration::ZERO)
            .unwrap();
        assert!(
            slots
                .acquire(&me, Class::Foreground, Duration::from_millis(20))
                .is_none()
        );
        drop(fg);
        drop(bg);
        assert_eq!(slots.busy(), (0, 0));
    }

    #[test]
    fn a_released_slot_serves_another_guest_and_comes_back() {
        let slots = CpuSlots::new(1, 0);
        let me = owner("local");
        let p = slots
            .acquire(&me, Class::Foreground, Duration::ZERO)
            .unwrap();
        CpuSlots::run_holding(p, || {
            let mut r = release();
            assert_eq!(slots.busy().0, 0, "a waiting guest holds no slot");
            let other = slots
                .acquire(&me, Class::Foreground, Duration::ZERO)
                .unwrap();
            assert!(!r.reacquire(Duration::from_millis(10)));
            drop(other);
            assert!(r.reacquire(Duration::from_millis(10)));
            assert_eq!(slots.busy().0, 1);
        });
        assert_eq!(slots.busy().0, 0, "the slot is given back after the run");
    }

    /// At its share, an owner's waiting call leaves a freed slot to another owner's waiting
    /// job, though calls otherwise go before background work.
    #[test]
    fn an_owner_at_its_share_leaves_a_freed_slot_to_another_owner() {
        let slots = CpuSlots::new(3, 1);
        let (a, b) = (owner("a"), owner("b"));
        let mut held: Vec<_> = (0..3)
            .map(|_| {
                slots
                    .acquire(&a, Class::Foreground, Duration::ZERO)
                    .unwrap()
            })
            .collect();
        let (s2, a2) = (slots.clone(), a.clone());
        let alice = std::thread::spawn(move || {
            s2.acquire(&a2, Class::Foreground, Duration::from_secs(30))
                .is_some()
        });
        wait_until(|| slots.state.lock().unwrap().waiters.len() == 1);
        let (s3, b2) = (slots.clone(), b.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let bob = std::thread::spawn(move || {
            let p = s3.acquire(&b2, Class::Background, Duration::from_secs(30));
            tx.send(p.is_some()).unwrap();
            p
        });
        wait_until(|| slots.state.lock().unwrap().waiters.len() == 2);
        drop(held.pop());
        assert!(
            rx.recv_timeout(Duration::from_secs(30)).unwrap(),
            "the freed slot goes to B's job"
        );
        assert_eq!(slots.held_by(&a), 2, "A stays at its share");
        // Once B no longer waits, A's call may have the slot B frees.
        drop(bob.join().unwrap());
        assert!(alice.join().unwrap());
        drop(held);
        assert_eq!(slots.busy(), (0, 0));
    }

    /// A guest of an owner over its share gives its slot to another owner's waiting call at its
    /// next check, and waits for one again under the same rule.
    #[test]
    fn a_guest_over_its_share_yields_to_another_owner() {
        let slots = CpuSlots::new(2, 1);
        let (a, b) = (owner("a"), owner("b"));
        let first = slots
            .acquire(&a, Class::Foreground, Duration::ZERO)
            .unwrap();
        let second = slots
            .acquire(&a, Class::Foreground, Duration::ZERO)
            .unwrap();
        CpuSlots::run_holding(second, || {
            assert!(yield_over_share().is_none(), "nobody waits: no yield");
            let (s2, b2) = (slots.clone(), b.clone());
            let bob = std::thread::spawn(move || {
                let p = s2.acquire(&b2, Class::Foreground, Duration::from_secs(30));
                let got = p.is_some();
                drop(p);
                got
            });
            wait_until(|| slots.contended.load(Ordering::Relaxed));
            let mut r = yield_over_share().expect("A holds both slots while B waits");
            assert!(bob.join().unwrap(), "B ran in the slot A gave up");
            assert!(r.reacquire(Duration::from_secs(30)));
            assert!(yield_over_share().is_none());
        });
        drop(first);
        assert_eq!(slots.busy(), (0, 0));
        assert!(slots.state.lock().unwrap().held.is_empty());
    }

    /// Background slots are shared too: while B's job waits, A's jobs keep `max(1, b - 1)` of
    /// the `b` background slots, and a job of A's over that yields.
    #[test]
    fn background_slots_are_shared_between_owners() {
        let slots = CpuSlots::new(3, 1);
        let (a, b) = (owner("a"), owner("b"));
        let keep = slots
            .acquire(&a, Class::Background, Duration::ZERO)
            .unwrap();
        let over = slots
            .acquire(&a, Class::Background, Duration::ZERO)
            .unwrap();
        CpuSlots::run_holding(over, || {
            let (s2, b2) = (slots.clone(), b.clone());
            let bob = std::thread::spawn(move || {
                s2.acquire(&b2, Class::Background, Duration::from_secs(30))
                    .is_some()
            });
            wait_until(|| slots.contended.load(Ordering::Relaxed));
            // A plain call of A's still finds the reserved slot.
            let fg = slots.acquire(&a, Class::Foreground, Duration::ZERO);
            assert!(fg.is_some(), "the reserved slot stays for calls");
            drop(fg);
            let mut r = yield_over_share().expect("A holds both background slots");
            assert!(bob.join().unwrap());
            assert!(r.reacquire(Duration::from_secs(30)));
        });
        drop(keep);
        assert_eq!(slots.busy(), (0, 0));
    }

    /// With one background slot, owners take turns in it: A's job holding it yields while B's
    /// job waits, and the slot goes to B rather than to A's older waiting job.
    #[test]
    fn owners_take_turns_in_a_single_background_slot() {
        let slots = CpuSlots::new(2, 1);
        let (a, b) = (owner("a"), owner("b"));
        let first = slots
            .acquire(&a, Class::Background, Duration::ZERO)
            .unwrap();
        CpuSlots::run_holding(first, || {
            assert!(
                yield_over_share().is_none(),
                "nobody else waits: A keeps it"
            );
            let (s2, a2) = (slots.clone(), a.clone());
            let (tx, rx) = std::sync::mpsc::channel();
            let alice = std::thread::spawn(move || {
                let p = s2.acquire(&a2, Class::Background, Duration::from_secs(30));
                tx.send(()).unwrap();
                p.is_some()
            });
            wait_until(|| slots.state.lock().unwrap().waiters.len() == 1);
            let (s3, b2) = (slots.clone(), b.clone());
            let bob = std::thread::spawn(move || {
                let p = s3.acquire(&b2, Class::Background, Duration::from_secs(30));
                (p.is_some(), s3.held_by("a"))
            });
            wait_until(|| slots.state.lock().unwrap().waiters.len() == 2);
            let mut r = yield_over_share().expect("A holds the only background slot");
            assert_eq!(bob.join().unwrap(), (true, 0), "B's job went before A's");
            // B's permit is dropped: A's older waiter goes, then A's guest again.
            rx.recv_timeout(Duration::from_secs(30)).unwrap();
            assert!(alice.join().unwrap());
            assert!(r.reacquire(Duration::from_secs(30)));
        });
        assert_eq!(slots.busy(), (0, 0));
        assert!(slots.state.lock().unwrap().turns.is_empty());
    }

    /// When slots free and several owners wait, the owner holding fewest goes next, whatever
    /// the order of asking: a busy owner's many calls cannot queue ahead of a quiet one.
    #[test]
    fn freed_slots_go_round_robin_by_owner() {
        let slots = CpuSlots::new(2, 0);
        let (a, b) = (owner("a"), owner("b"));
        let hold_a = slots
            .acquire(&a, Class::Foreground, Duration::ZERO)
            .unwrap();
        let hold_b = slots
            .acquire(&b, Class::Foreground, Duration::ZERO)
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut threads = Vec::new();
        // A asks three times first, then B once.
        for (i, who) in [&a, &a, &a, &b].into_iter().enumerate() {
            let (s, who, tx) = (slots.clone(), who.clone(), tx.clone());
            threads.push(std::thread::spawn(move || {
                let p = s.acquire(&who, Class::Foreground, Duration::from_secs(30));
                tx.send((who.to_string(), p.unwrap())).unwrap();
            }));
            wait_until(|| slots.state.lock().unwrap().waiters.len() == i + 1);
        }
        let next = || rx.recv_timeout(Duration::from_secs(30)).unwrap();
        // A's slot frees: A then holds none and B one, so A's oldest call goes; when B's frees,
        // A holds one and B none, so B's call goes before A's two older ones.
        drop(hold_a);
        let first = next();
        drop(hold_b);
        let second = next();
        assert_eq!([&*first.0, &*second.0], ["a", "b"], "B's call is not last");
        drop((first, second));
        for _ in 0..2 {
            let (who, p) = next();
            assert_eq!(who, "a");
            drop(p);
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(slots.busy(), (0, 0));
    }

    /// Polls `cond` for at most 30 s (a liveness bound, not a timing).
    fn wait_until(cond: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(30);
        while !cond() {
            assert!(Instant::now() < until, "condition not reached in 30 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

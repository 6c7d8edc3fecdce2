//! CPU slots: how many guests execute wasm at once, as opposed to how many are alive.
//!
//! A guest holds a slot while it computes and gives it back while it waits in a host call (a
//! sleep), so guests that sleep cannot keep everyone else's code from running. Background work
//! (jobs, async executions) may hold only `total - reserved` slots, so a plain call always finds
//! one within a slice of a foreground call's run time, whatever background work is doing.

use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

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
    freed: Condvar,
    total: usize,
    /// Slots background work may never take.
    reserved: usize,
}

#[derive(Debug, Default)]
struct State {
    busy: usize,
    background: usize,
    /// Foreground callers waiting: background work does not take a slot from under them.
    foreground_waiting: usize,
}

/// A slot held by the current thread's guest; given back when dropped.
#[derive(Debug)]
pub struct Permit {
    slots: Arc<CpuSlots>,
    class: Class,
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
            freed: Condvar::new(),
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

    /// Slots in use now (all classes) and by background work.
    pub fn busy(&self) -> (usize, usize) {
        let st = self.state.lock().unwrap();
        (st.busy, st.background)
    }

    fn may_take(&self, st: &State, class: Class) -> bool {
        match class {
            Class::Foreground => st.busy < self.total,
            Class::Background => {
                st.busy + st.foreground_waiting < self.total
                    && st.background < self.total - self.reserved
            }
        }
    }

    /// Takes a slot, waiting at most `wait`.
    pub fn acquire(self: &Arc<Self>, class: Class, wait: Duration) -> Option<Permit> {
        let until = Instant::now() + wait;
        let mut st = self.state.lock().unwrap();
        let counted = class == Class::Foreground && !self.may_take(&st, class);
        if counted {
            st.foreground_waiting += 1;
        }
        loop {
            if self.may_take(&st, class) {
                st.busy += 1;
                if class == Class::Background {
                    st.background += 1;
                }
                if counted {
                    st.foreground_waiting -= 1;
                }
                return Some(Permit {
                    slots: self.clone(),
                    class,
                });
            }
            let now = Instant::now();
            if now >= until {
                if counted {
                    st.foreground_waiting -= 1;
                    // A background waiter may have been held back by this one.
                    self.freed.notify_all();
                }
                return None;
            }
            st = self.freed.wait_timeout(st, until - now).unwrap().0;
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
        let mut st = self.slots.state.lock().unwrap();
        st.busy -= 1;
        if self.class == Class::Background {
            st.background -= 1;
        }
        drop(st);
        self.slots.freed.notify_all();
    }
}

/// What a waiting guest gave back: the slot to take again before it computes once more.
pub struct Released {
    slots: Option<(Arc<CpuSlots>, Class)>,
}

/// Gives back the slot this thread's guest holds (if any), for the length of a wait.
pub fn release() -> Released {
    let slots = HELD.take().map(|p| (p.slots.clone(), p.class));
    Released { slots }
}

impl Released {
    /// Takes a slot again, trying for at most `wait`; false if none came free in time (the
    /// caller checks its deadline and stop flag, then tries again).
    pub fn reacquire(&mut self, wait: Duration) -> bool {
        let Some((slots, class)) = &self.slots else {
            return true;
        };
        match slots.acquire(*class, wait) {
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

    #[test]
    fn background_work_leaves_the_reserved_slots_to_foreground_calls() {
        let slots = CpuSlots::new(4, 1);
        let bg: Vec<_> = (0..3)
            .map(|_| slots.acquire(Class::Background, Duration::ZERO).unwrap())
            .collect();
        assert!(
            slots
                .acquire(Class::Background, Duration::from_millis(20))
                .is_none()
        );
        let fg = slots.acquire(Class::Foreground, Duration::ZERO).unwrap();
        assert!(
            slots
                .acquire(Class::Foreground, Duration::from_millis(20))
                .is_none()
        );
        drop(fg);
        drop(bg);
        assert_eq!(slots.busy(), (0, 0));
    }

    #[test]
    fn a_released_slot_serves_another_guest_and_comes_back() {
        let slots = CpuSlots::new(1, 0);
        let p = slots.acquire(Class::Foreground, Duration::ZERO).unwrap();
        CpuSlots::run_holding(p, || {
            let mut r = release();
            assert_eq!(slots.busy().0, 0, "a waiting guest holds no slot");
            let other = slots.acquire(Class::Foreground, Duration::ZERO).unwrap();
            assert!(!r.reacquire(Duration::from_millis(10)));
            drop(other);
            assert!(r.reacquire(Duration::from_millis(10)));
            assert_eq!(slots.busy().0, 1);
        });
        assert_eq!(slots.busy().0, 0, "the slot is given back after the run");
    }
}

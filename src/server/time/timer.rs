//! Deadlines on a hashed timing wheel: O(1) to arm, O(due) to expire, no
//! allocation per timer. A connection keeps its own deadline; the wheel
//! holds `(key, deadline)` entries that are checked against it when due, so
//! re-arming or closing needs no removal (stale entries are skipped).

use crate::server::key::ConnKey;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

/// A point in time in wheel ticks since the wheel started (never zero, so
/// `Option<Tick>` is four bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Tick(NonZeroU32);

impl Tick {
    /// A count of ticks, clamped to what a tick holds (tick 0 is tick 1).
    fn clamped(ticks: u128) -> Tick {
        let ticks = ticks.clamp(1, u32::MAX as u128) as u32;
        Tick(NonZeroU32::new(ticks).expect("clamped to at least 1"))
    }
}

/// Entries a slot keeps room for once emptied; more is freed.
const SLOT_KEEP: usize = 64;

/// The timing wheel.
#[derive(Debug)]
pub struct TimerWheel {
    slots: Box<[Vec<(ConnKey, Tick)>]>,
    resolution: Duration,
    start: Instant,
    /// The next tick whose slot has not been expired yet.
    next: u32,
    /// Live deadlines (see [`Deadline`]); stale entries do not count, so an
    /// idle loop with none sets no poll timeout at all.
    armed: usize,
}

impl TimerWheel {
    /// A wheel of `slots` slots, each `resolution` long, starting at `now`.
    pub fn new(resolution: Duration, slots: usize, now: Instant) -> TimerWheel {
        TimerWheel {
            slots: (0..slots.max(1)).map(|_| Vec::new()).collect(),
            resolution,
            start: now,
            next: 1,
            armed: 0,
        }
    }

    /// The first tick at or after `at`: an entry due then never expires
    /// before `at` (for a deadline that must have passed, as a timeout's).
    pub fn tick_at(&self, at: Instant) -> Tick {
        Tick::clamped(self.ticks_to(at))
    }

    /// The last tick that begins before `at`: an entry due then expires
    /// before `at` if the loop is awake, whatever the resolution (for a
    /// point not to pass, as a token's end). If that tick has begun
    /// already, the entry is due at once (the next tick).
    pub fn tick_before(&self, at: Instant) -> Tick {
        Tick::clamped(self.ticks_to(at).saturating_sub(1))
    }

    /// Ticks from the start to `at`, rounded up.
    fn ticks_to(&self, at: Instant) -> u128 {
        let elapsed = at.saturating_duration_since(self.start).as_nanos();
        elapsed.div_ceil(self.resolution.as_nanos())
    }

    /// Arms an entry for `key` at `deadline`.
    pub fn schedule(&mut self, key: ConnKey, deadline: Tick) {
        let deadline = deadline.max(Tick(NonZeroU32::new(self.next).expect("next starts at 1")));
        let slot = deadline.0.get() as usize % self.slots.len();
        self.slots[slot].push((key, deadline));
    }

    /// Moves every entry due at `now` (deadline tick at or before the
    /// current one) into `due`.
    pub fn expire(&mut self, now: Instant, due: &mut Vec<(ConnKey, Tick)>) {
        if now < self.tick_start(self.next) {
            return; // The common case, without a division.
        }
        let elapsed =
            now.saturating_duration_since(self.start).as_nanos() / self.resolution.as_nanos();
        let current = elapsed.min(u32::MAX as u128 - 1) as u32;
        let last = current.min(self.next.saturating_add(self.slots.len() as u32 - 1));
        for tick in self.next..=last {
            let slot = &mut self.slots[tick as usize % self.slots.len()];
            slot.retain(|&(key, deadline)| {
                let is_due = deadline.0.get() <= current;
                if is_due {
                    due.push((key, deadline));
                }
                !is_due
            });
            if slot.is_empty() && slot.capacity() > SLOT_KEEP {
                // A burst (thousands of handshakes in one tick) is over:
                // give its memory back rather than keep it for good.
                *slot = Vec::new();
            }
        }
        self.next = current + 1;
    }

    /// When the next unexpired tick begins, for the loop's alarm; `None`
    /// when no deadline is armed.
    pub fn next_at(&self) -> Option<Instant> {
        (self.armed > 0).then(|| self.tick_start(self.next))
    }

    fn tick_start(&self, tick: u32) -> Instant {
        self.start + self.resolution * tick
    }
}

/// One owner's deadline: at most one live entry in the wheel, counted
/// while armed. Entries left behind by re-arming or clearing are stale and
/// skipped when their slot comes up ([`Deadline::is`] tells).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(Option<Tick>);

impl Deadline {
    /// Arms (or moves) the deadline to `at` for the owner `key`.
    pub fn arm(&mut self, wheel: &mut TimerWheel, key: ConnKey, at: Tick) {
        if self.0.is_none() {
            wheel.armed += 1;
        }
        self.0 = Some(at);
        wheel.schedule(key, at);
    }

    /// When it is due, if armed: the start of its tick.
    pub fn at(&self, wheel: &TimerWheel) -> Option<Instant> {
        let tick = self.0?;
        Some(wheel.start + wheel.resolution * tick.0.get())
    }

    /// Clears the deadline.
    pub fn clear(&mut self, wheel: &mut TimerWheel) {
        if self.0.take().is_some() {
            wheel.armed -= 1;
        }
    }

    /// Whether a wheel entry due at `tick` is this deadline's (and not stale).
    pub fn is(&self, tick: Tick) -> bool {
        self.0 == Some(tick)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn expire(wheel: &mut TimerWheel, at: Instant) -> Vec<usize> {
        let mut due = Vec::new();
        wheel.expire(at, &mut due);
        due.into_iter().map(|(key, _)| key.0).collect()
    }

    #[test]
    fn entries_expire_once_their_tick_has_passed() {
        let t0 = Instant::now();
        let mut wheel = TimerWheel::new(10 * MS, 8, t0);
        let (mut one, mut two) = (Deadline::default(), Deadline::default());
        let (at_one, at_two) = (wheel.tick_at(t0 + 25 * MS), wheel.tick_at(t0 + 5 * MS));
        one.arm(&mut wheel, ConnKey(1), at_one);
        two.arm(&mut wheel, ConnKey(2), at_two);
        assert_eq!(expire(&mut wheel, t0 + 9 * MS), Vec::<usize>::new());
        assert_eq!(expire(&mut wheel, t0 + 15 * MS), vec![2]);
        two.clear(&mut wheel);
        assert_eq!(expire(&mut wheel, t0 + 29 * MS), Vec::<usize>::new());
        assert_eq!(expire(&mut wheel, t0 + 31 * MS), vec![1]);
        assert!(
            wheel.next_at().is_some(),
            "the owner has not cleared it yet"
        );
        one.clear(&mut wheel);
        assert_eq!(wheel.next_at(), None, "nothing armed");
    }

    #[test]
    fn a_deadline_not_to_pass_expires_on_the_tick_before_it() {
        let t0 = Instant::now();
        // Within a tick and on a tick's start alike, the tick before.
        for (at, due) in [(25, 20), (30, 20), (31, 30)] {
            let mut wheel = TimerWheel::new(10 * MS, 8, t0);
            let tick = wheel.tick_before(t0 + at as u32 * MS);
            Deadline::default().arm(&mut wheel, ConnKey(at), tick);
            assert!(expire(&mut wheel, t0 + (due - 1) * MS).is_empty(), "{at}");
            assert_eq!(expire(&mut wheel, t0 + due * MS), vec![at], "{at}");
        }
        // As against a timeout's, which never expires before its point.
        let mut wheel = TimerWheel::new(10 * MS, 8, t0);
        let tick = wheel.tick_at(t0 + 25 * MS);
        Deadline::default().arm(&mut wheel, ConnKey(1), tick);
        assert!(expire(&mut wheel, t0 + 29 * MS).is_empty());
        assert_eq!(expire(&mut wheel, t0 + 30 * MS), vec![1]);
        // A point within the current tick: due at once, on the next one.
        let tick = wheel.tick_before(t0 + 32 * MS);
        Deadline::default().arm(&mut wheel, ConnKey(2), tick);
        assert!(expire(&mut wheel, t0 + 39 * MS).is_empty());
        assert_eq!(expire(&mut wheel, t0 + 40 * MS), vec![2]);
    }

    #[test]
    fn deadlines_beyond_one_rotation_wait_for_their_own_turn() {
        let t0 = Instant::now();
        let mut wheel = TimerWheel::new(10 * MS, 4, t0);
        wheel.schedule(ConnKey(7), wheel.tick_at(t0 + 100 * MS));
        for step in 1..10 {
            assert!(
                expire(&mut wheel, t0 + step * 10 * MS).is_empty(),
                "step {step}"
            );
        }
        assert_eq!(expire(&mut wheel, t0 + 111 * MS), vec![7]);
    }

    #[test]
    fn a_late_expiry_catches_up_on_every_slot() {
        let t0 = Instant::now();
        let mut wheel = TimerWheel::new(10 * MS, 4, t0);
        for key in 0..10 {
            wheel.schedule(ConnKey(key), wheel.tick_at(t0 + (key as u32 * 10 + 5) * MS));
        }
        let mut keys = expire(&mut wheel, t0 + 500 * MS);
        keys.sort();
        assert_eq!(keys, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn stale_entries_set_no_timeout_and_are_told_apart() {
        let t0 = Instant::now();
        let mut wheel = TimerWheel::new(10 * MS, 8, t0);
        let mut deadline = Deadline::default();
        let first = wheel.tick_at(t0 + 20 * MS);
        deadline.arm(&mut wheel, ConnKey(7), first);
        let second = wheel.tick_at(t0 + 50 * MS);
        deadline.arm(&mut wheel, ConnKey(7), second);
        assert!(!deadline.is(first) && deadline.is(second));
        deadline.clear(&mut wheel);
        assert_eq!(wheel.next_at(), None, "two stale entries, nothing armed");
        assert_eq!(
            expire(&mut wheel, t0 + 100 * MS),
            vec![7, 7],
            "stale entries still come out, to be skipped"
        );
    }
}

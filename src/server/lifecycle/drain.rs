//! The pace of a drain: the connections open when accepting stopped are
//! closed evenly over the drain time, a few each step, so that their
//! clients come back spread over it instead of all in the same second.
//! Each client with positions is told, before its close, how long to wait
//! before it reconnects: a random delay that spreads the reconnections of
//! one step over the time to the next.

use std::time::{Duration, Instant};

/// The shortest time between two steps: closes due sooner wait for the
/// next step (at most this late), so a fast pace costs at most one wake-up
/// per step.
pub(crate) const STEP: Duration = Duration::from_millis(10);

/// The longest reconnect delay a hint gives (the pace itself spreads the
/// closes; the hint only smooths each step's).
pub(crate) const MAX_HINT: Duration = Duration::from_secs(1);

/// How far a drain's closing has come.
#[derive(Debug)]
pub(crate) struct Pace {
    /// When closing began.
    from: Instant,
    /// The drain time: the last close is due then.
    over: Duration,
    /// Connections open when closing began.
    total: usize,
    /// Connections closed so far by the pace.
    closed: usize,
    /// The walk's cursor ends the pace's round once it has travelled
    /// this far (see `walk::sweep`).
    until: u64,
    /// The state of the hints' random numbers (xorshift64).
    random: u64,
}

impl Pace {
    /// Closing `total` connections over `over`, from `now`, in one round
    /// of the walk's cursor: until it has travelled `until`; `seed` seeds
    /// the hints' delays (any value; 0 is taken as 1).
    pub(crate) fn new(
        now: Instant,
        over: Duration,
        (total, until): (usize, u64),
        seed: u64,
    ) -> Pace {
        Pace {
            from: now,
            over,
            total,
            closed: 0,
            until,
            random: seed.max(1),
        }
    }

    /// How many closes are due by `now` and not made yet: the share of
    /// `total` that the time passed stands for, less those made.
    pub(crate) fn due(&self, now: Instant) -> usize {
        let passed = now.saturating_duration_since(self.from);
        let share = if passed >= self.over {
            self.total
        } else {
            let part = passed.as_nanos() * self.total as u128 / self.over.as_nanos();
            part as usize
        };
        share.saturating_sub(self.closed)
    }

    /// When the next close is due: the time its share stands for, but not
    /// before [`STEP`] after `now`; `None` once every close was made.
    pub(crate) fn next_at(&self, now: Instant) -> Option<Instant> {
        if self.closed >= self.total {
            return None;
        }
        if self.due(now) > 0 {
            return Some(now);
        }
        let next = (self.closed + 1) as u128;
        let at = self.over.as_nanos() * next / self.total as u128;
        let at = self.from + Duration::from_nanos(at.min(u64::MAX as u128) as u64);
        Some(at.max(now + STEP))
    }

    /// How far the walk's cursor goes for the pace: one round.
    pub(crate) fn until(&self) -> u64 {
        self.until
    }

    /// A connection was closed by the pace.
    pub(crate) fn closed_one(&mut self) {
        self.closed += 1;
    }

    /// Connections open when closing began, not closed by the pace yet
    /// (some may have gone by themselves meanwhile).
    pub(crate) fn left(&self) -> usize {
        self.total.saturating_sub(self.closed)
    }

    /// A reconnect delay for a hint: uniform over the time to the next
    /// step, from zero to the drain time's share of one close or
    /// [`STEP`], whichever is longer, and at most [`MAX_HINT`].
    pub(crate) fn hint(&mut self) -> Duration {
        let per_close = self.over / self.total.max(1) as u32;
        let spread = per_close.max(STEP).min(MAX_HINT);
        let mut x = self.random;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random = x;
        Duration::from_nanos(x % spread.as_nanos() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps a pace through its drain time the way the loop does (each
    /// wake-up at `next_at`, every due close made), returning how many
    /// closes each second of it made.
    fn closes_per_second(total: usize, over: Duration) -> Vec<usize> {
        let from = Instant::now();
        let mut pace = Pace::new(from, over, (total, 0), 7);
        let mut seconds = vec![0; over.as_secs() as usize + 1];
        let mut now = from;
        while let Some(at) = pace.next_at(now) {
            now = at;
            for _ in 0..pace.due(now) {
                pace.closed_one();
                seconds[(now - from).as_secs() as usize] += 1;
            }
        }
        seconds
    }

    #[test]
    fn closes_are_spread_evenly_over_the_drain_time() {
        let seconds = closes_per_second(15_000, Duration::from_secs(20));
        assert_eq!(seconds.iter().sum::<usize>(), 15_000);
        // 750 a second, give or take the closes of one step (10 ms: 7.5)
        // that fall on either side of a second's end.
        for (second, &n) in seconds[..20].iter().enumerate() {
            assert!((742..=758).contains(&n), "second {second}: {n}");
        }
        assert!(seconds[20] <= 8);
    }

    #[test]
    fn a_slow_pace_wakes_once_a_close_and_a_fast_one_once_a_step() {
        let from = Instant::now();
        let pace = Pace::new(from, Duration::from_secs(10), (5, 0), 1);
        assert_eq!(pace.due(from), 0);
        assert_eq!(pace.next_at(from), Some(from + Duration::from_secs(2)));
        assert_eq!(pace.due(from + Duration::from_secs(2)), 1);
        assert_eq!(pace.due(from + Duration::from_secs(60)), 5);

        let mut fast = Pace::new(from, Duration::from_secs(1), (100_000, 0), 1);
        let now = from + Duration::from_millis(1);
        fast.closed_one();
        let due = fast.due(now);
        assert_eq!(due, 99, "a millisecond's share, less the one made");
        (0..due).for_each(|_| fast.closed_one());
        assert_eq!(fast.next_at(now), Some(now + STEP));
        assert_eq!(fast.left(), 100_000 - 100);
    }

    #[test]
    fn once_every_close_is_made_nothing_is_due() {
        let from = Instant::now();
        let mut pace = Pace::new(from, Duration::from_secs(1), (2, 0), 1);
        let end = from + Duration::from_secs(1);
        assert_eq!(pace.due(end), 2);
        pace.closed_one();
        pace.closed_one();
        assert_eq!(
            (pace.due(end), pace.next_at(end), pace.left()),
            (0, None, 0)
        );
        let empty = Pace::new(from, Duration::from_secs(1), (0, 0), 1);
        assert_eq!(empty.next_at(from), None);
    }

    #[test]
    fn hints_cover_the_time_to_the_next_close_and_stay_short() {
        let from = Instant::now();
        // 100 closes over 10 s: one every 100 ms.
        let mut pace = Pace::new(from, Duration::from_secs(10), (100, 0), 42);
        let hints: Vec<_> = (0..10_000).map(|_| pace.hint()).collect();
        let limit = Duration::from_millis(100);
        assert!(hints.iter().all(|&h| h < limit));
        // Uniform: each tenth of the range holds about a tenth of them.
        let mut tenths = [0; 10];
        for h in &hints {
            tenths[(h.as_nanos() * 10 / limit.as_nanos()) as usize] += 1;
        }
        assert!(
            tenths.iter().all(|&n| (800..1200).contains(&n)),
            "{tenths:?}"
        );
        // Few connections over a long drain: never more than a second.
        let mut slow = Pace::new(from, Duration::from_secs(60), (3, 0), 42);
        assert!((0..1000).all(|_| slow.hint() < MAX_HINT));
    }
}

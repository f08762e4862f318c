//! Heartbeats: every open connection gets a ping once per ping interval,
//! and one silent for the idle timeout is closed.
//!
//! The bookkeeping is a schedule over the slab's keys: a pass of them in
//! slices, one slice per short period, so that each key comes up about
//! once per interval. The walk's cursor visits the keys a slice makes
//! due (see `walk::sweep`): O(connections due) per step, no timer per
//! connection, and the only per-connection state is two bytes of
//! [`Liveness`]. The ping is one frame encoded once, shared by every connection.
//!
//! Heartbeats yield to the loop's bulk work ([`Heartbeat::yield_to_work`]):
//! while it goes on, and for [`GRACE_SLICES`] slice periods after, the
//! whole schedule moves later, so no ping goes out beside it, as long as
//! the pass over the keys is less than one interval behind. Once the work
//! is over, the pass goes at twice its pace until it is on schedule again:
//! the pings held back go out between broadcasts, not beside the next one.
//! The next pass starts as late as this one was at its latest (and a slice
//! period more), so no key comes up again within less than an interval,
//! and none more than three apart.
//! - A broadcast on its way to every connection in any instance of the
//!   host (they share when one last was, see `host`). Each connection gets
//!   the broadcast meanwhile, so a proxy in front of it sees traffic all
//!   the same. Pings and their pongs beside a fan-out to a million
//!   connections cost as much CPU as the fan-out itself (bench/RESULTS.md).
//! - An accept storm: at least [`STORM_ACCEPTS`] connections accepted per
//!   slice period, as when a host's clients all come back at once. At a
//!   million connections, pings beside the setup halved its rate.
//!
//! Messages for some connections (a channel's, an id's) do not hold it
//! back: the others get no data meanwhile, and a proxy in front of them
//! sees only the pings.
//!
//! A slice left over by the loop's budget is finished in the next
//! iterations. While a drain paces its closes, the cursor goes at the
//! drain's pace, and the pings ride on it.

use std::time::{Duration, Instant};

use crate::config::MAX_SILENT_INTERVALS;
use crate::protocol::ws::OpCode;
use crate::server::frames::SharedFrames;

/// Slices per interval: the sweep runs this often per interval, but at
/// most every [`MIN_PERIOD`]. (A long interval means long sleeps: with
/// pings every hour, an idle instance wakes every 112 s.)
const SLICES: u32 = 32;
const MIN_PERIOD: Duration = Duration::from_millis(10);
/// Slice periods the sweep keeps yielding after the last delivery or
/// the last accept storm.
pub const GRACE_SLICES: u32 = 2;
/// Connections accepted per slice period that make an accept storm
/// (2,048 per interval).
pub const STORM_ACCEPTS: u32 = 64;

/// The most visits [`Liveness`] counts (15 bits): one more than the
/// longest idle timeout allows in intervals.
pub const MAX_SILENT_VISITS: u16 = MAX_SILENT_INTERVALS + 1;
const _: () = assert!(MAX_SILENT_VISITS == 0x7FFF, "Liveness keeps 15 bits");

/// The sweep's position and the shared ping.
#[derive(Debug)]
pub struct Heartbeat {
    interval: Duration,
    period: Duration,
    close_after: u16,
    /// When the current pass over the keys began.
    cycle_start: Instant,
    /// When the next slice falls due.
    next_at: Instant,
    /// How far the current pass is behind its schedule: postponed, and
    /// not caught up yet.
    behind: Duration,
    /// The most the current pass was behind: the next one starts that
    /// much late, so that no key comes up again within an interval.
    most_behind: Duration,
    /// Whether work was recent when a slice was last due (no catching up
    /// then).
    busy: bool,
    /// Until when the catching up was reckoned.
    caught_up_to: Instant,
    /// When the accepts last made a storm.
    last_storm: Option<Instant>,
    /// Connections accepted since `accepts_since`.
    accepted: u32,
    accepts_since: Instant,
    ping: SharedFrames,
}

impl Heartbeat {
    /// A sweep pinging every `interval` and closing connections silent for
    /// `idle_timeout` (at least `interval`), starting at `now`.
    pub fn new(interval: Duration, idle_timeout: Duration, now: Instant) -> Heartbeat {
        let period = (interval / SLICES).max(MIN_PERIOD);
        let intervals = idle_timeout.as_nanos().div_ceil(interval.as_nanos());
        Heartbeat {
            interval,
            period,
            close_after: u16::try_from(intervals + 1)
                .unwrap_or(MAX_SILENT_VISITS)
                .min(MAX_SILENT_VISITS),
            cycle_start: now,
            next_at: now + period,
            behind: Duration::ZERO,
            most_behind: Duration::ZERO,
            busy: false,
            caught_up_to: now,
            last_storm: None,
            accepted: 0,
            accepts_since: now,
            ping: SharedFrames::encode(OpCode::Ping, b""),
        }
    }

    /// When the next slice is due.
    pub fn next_at(&self) -> Instant {
        self.next_at
    }

    /// A connection was accepted.
    pub fn accepted(&mut self) {
        self.accepted = self.accepted.saturating_add(1);
    }

    /// Called when a slice is due: if a broadcast was under way (in any
    /// instance of the host) at `last_delivery`, or an accept storm was
    /// seen, less than [`GRACE_SLICES`] periods ago, moves the whole
    /// schedule later, to that much after it, and says so (`true`: the
    /// slice is not due any more). `false` if the slice is to run now: no
    /// such work is recent, or the current pass over the keys is one
    /// interval behind already.
    pub fn yield_to_work(&mut self, now: Instant, last_delivery: Option<Instant>) -> bool {
        self.count_accepts(now);
        let last = last_delivery.max(self.last_storm);
        let until = last.map(|last| last + self.period * GRACE_SLICES);
        self.busy = until.is_some_and(|until| now < until);
        let Some(until) = until.filter(|_| self.busy) else {
            return false;
        };
        let by = until.saturating_duration_since(self.next_at);
        if self.behind + by > self.interval {
            return false;
        }
        self.behind += by;
        self.most_behind = self.most_behind.max(self.behind);
        self.next_at += by;
        self.cycle_start += by;
        self.caught_up_to = self.next_at;
        true
    }

    /// Notes an accept storm at `now` if at least one slice period has
    /// been counted, at an average of [`STORM_ACCEPTS`] or more per period.
    fn count_accepts(&mut self, now: Instant) {
        let counted = now.saturating_duration_since(self.accepts_since);
        if counted < self.period {
            return;
        }
        let storm = u128::from(STORM_ACCEPTS) * counted.as_nanos();
        if u128::from(self.accepted) * self.period.as_nanos() >= storm {
            self.last_storm = Some(now);
        }
        self.accepted = 0;
        self.accepts_since = now;
    }

    /// The pre-encoded ping every connection is sent.
    pub fn ping(&self) -> &SharedFrames {
        &self.ping
    }

    /// The visit count at which a connection that has sent nothing since
    /// its first visit is closed: at the k-th visit without hearing from
    /// it, it has been silent for at least k − 1 intervals, so closing at
    /// `idle_timeout / interval + 1` (rounded up) never closes early and
    /// closes at most one interval late.
    pub fn close_after(&self) -> u16 {
        self.close_after
    }

    /// How far the current pass has come by `now`, over `bound` keys:
    /// the keys below it are due (the walk's cursor visits them, see
    /// `walk::sweep`; those it passed had theirs).
    pub fn reach(&mut self, now: Instant, bound: usize) -> usize {
        self.catch_up(now);
        let elapsed = now.saturating_duration_since(self.cycle_start);
        if elapsed >= self.interval {
            return bound;
        }
        let reached = (bound as u128 * elapsed.as_nanos()).div_ceil(self.interval.as_nanos());
        (reached as usize).min(bound)
    }

    /// Whether the current pass's time is over by `now`: once the cursor
    /// has visited every key, the next pass begins ([`Heartbeat::new_pass`]).
    pub fn pass_over(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.cycle_start) >= self.interval
    }

    /// The walk visited the keys due at `now` (`done`), or stopped short
    /// of them at the loop's budget: the next slice is due a period on,
    /// or still due.
    pub fn swept(&mut self, now: Instant, done: bool) {
        if done {
            self.next_at = now + self.period;
        }
    }

    /// The cursor went round at `now`: the next pass begins, skipping
    /// passes the loop slept through, as late as the one ended was at
    /// its latest (and a slice period more), so that no key comes up
    /// again within less than an interval. A pass ended before its time
    /// (a drain moved the cursor round) is followed by the next at its
    /// time.
    pub fn new_pass(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.cycle_start);
        let passes = ((elapsed.as_nanos() / self.interval.as_nanos()) as u32).max(1);
        // Visits lag the schedule by up to a slice period: a pass that
        // was behind may have visited a key that much late.
        let lag = if self.most_behind.is_zero() {
            Duration::ZERO
        } else {
            self.period
        };
        let late = self.most_behind - self.behind + lag;
        self.cycle_start += self.interval * passes + late;
        self.behind = Duration::ZERO;
        self.most_behind = Duration::ZERO;
    }

    /// While no work is recent, a pass that is behind goes at twice its
    /// pace until it is on schedule again: the pings held back go out
    /// between broadcasts, not beside the next one.
    fn catch_up(&mut self, now: Instant) {
        let since = now.saturating_duration_since(self.caught_up_to);
        self.caught_up_to = self.caught_up_to.max(now);
        if self.busy {
            return;
        }
        let by = since.min(self.behind);
        self.behind -= by;
        self.cycle_start -= by;
    }
}

/// What a heartbeat visit does to a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// Nothing: the first visit after the upgrade, which may come at once
    /// (the first ping comes one to two intervals after the upgrade).
    Skip,
    /// Send the ping.
    Ping,
    /// Close it: silent for the idle timeout.
    Close,
}

/// An open connection's heartbeat state in two bytes (they fit in the
/// connection's padding): the visits since the client last sent
/// anything, or since the upgrade, in the low 15 bits, and whether it was
/// ever visited in the top bit.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Liveness(u16);

impl Liveness {
    const VISITED: u16 = 1 << 15;

    /// Its state as bits, for another process to go on from.
    pub fn to_bits(self) -> u16 {
        self.0
    }

    /// The state [`Liveness::to_bits`] gave.
    pub fn from_bits(bits: u16) -> Liveness {
        Liveness(bits)
    }

    /// The client sent something (data, a pong, anything).
    pub fn heard(&mut self) {
        self.0 &= Liveness::VISITED;
    }

    /// Whether the client sent something since the last visit.
    pub fn heard_since_visit(&self) -> bool {
        self.0 & MAX_SILENT_VISITS == 0
    }

    /// A visit of the sweep; `close_after` is [`Heartbeat::close_after`].
    pub fn visit(&mut self, close_after: u16) -> Visit {
        let first = self.0 & Liveness::VISITED == 0;
        let silent = ((self.0 & MAX_SILENT_VISITS) + 1).min(MAX_SILENT_VISITS);
        self.0 = Liveness::VISITED | silent;
        if silent >= close_after {
            Visit::Close
        } else if first {
            Visit::Skip
        } else {
            Visit::Ping
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::{Deref, Range};

    const MS: Duration = Duration::from_millis(1);

    /// A heartbeat with a cursor that visits what it makes due, as the
    /// walk's does (see `walk::sweep`).
    struct Swept {
        hb: Heartbeat,
        cursor: usize,
    }

    impl Swept {
        fn new(interval: Duration, idle_timeout: Duration, now: Instant) -> Swept {
            let hb = Heartbeat::new(interval, idle_timeout, now);
            Swept { hb, cursor: 0 }
        }

        /// The keys out of `0..bound` the cursor visits at `now`, at most
        /// `max` of them; a pass it finished starts the next one.
        fn due(&mut self, now: Instant, bound: usize, max: usize) -> Range<usize> {
            let start = self.cursor;
            let reach = self.hb.reach(now, bound).max(start);
            let end = reach.min(start.saturating_add(max));
            self.cursor = end;
            let done = end == reach;
            self.hb.swept(now, done);
            if done && end >= bound && self.hb.pass_over(now) {
                self.hb.new_pass(now);
                self.cursor = 0;
            }
            start..end
        }

        fn yield_to_work(&mut self, now: Instant, last_delivery: Option<Instant>) -> bool {
            self.hb.yield_to_work(now, last_delivery)
        }

        fn accepted(&mut self) {
            self.hb.accepted();
        }
    }

    impl Deref for Swept {
        type Target = Heartbeat;
        fn deref(&self) -> &Heartbeat {
            &self.hb
        }
    }

    #[test]
    fn every_key_comes_up_once_per_interval() {
        let t0 = Instant::now();
        let mut hb = Swept::new(1000 * MS, 2000 * MS, t0);
        assert_eq!(hb.period, 31250 * Duration::from_micros(1));
        let mut visits = vec![0u32; 100];
        let mut at = t0;
        for _ in 0..64 {
            at = hb.next_at();
            for key in hb.due(at, visits.len(), usize::MAX) {
                visits[key] += 1;
            }
        }
        // 64 slices of 31.25 ms = 2 s: two passes.
        assert_eq!(at - t0, 2000 * MS);
        assert!(visits.iter().all(|&v| v == 2), "{visits:?}");
    }

    #[test]
    fn a_late_sweep_finishes_the_pass_and_skips_missed_ones() {
        let t0 = Instant::now();
        let mut hb = Swept::new(100 * MS, 100 * MS, t0);
        assert_eq!(hb.due(t0 + 50 * MS, 10, usize::MAX), 0..5);
        assert_eq!(
            hb.due(t0 + 1050 * MS, 10, usize::MAX),
            5..10,
            "the rest of the first pass"
        );
        assert_eq!(
            hb.due(t0 + 1050 * MS, 10, usize::MAX),
            0..5,
            "the pass now half way through"
        );
    }

    #[test]
    fn slices_follow_a_changing_key_bound() {
        let t0 = Instant::now();
        let mut hb = Swept::new(100 * MS, 100 * MS, t0);
        assert_eq!(hb.due(t0 + 50 * MS, 4, usize::MAX), 0..2);
        assert_eq!(
            hb.due(t0 + 60 * MS, 1, usize::MAX),
            2..2,
            "bound shrank below the position"
        );
        assert_eq!(hb.due(t0 + 75 * MS, 40, usize::MAX), 2..30);
        assert_eq!(hb.due(t0 + 100 * MS, 40, usize::MAX), 30..40);
    }

    #[test]
    fn deliveries_move_the_schedule_whole_then_it_catches_up() {
        let t0 = Instant::now();
        let mut hb = Swept::new(320 * MS, 320 * MS, t0);
        let grace = hb.period * GRACE_SLICES;
        assert_eq!(hb.due(t0 + 20 * MS, 32, usize::MAX), 0..2);
        assert!(!hb.yield_to_work(hb.next_at(), None), "no delivery yet");
        // A delivery from 25 ms to 60 ms: the slice due at 30 ms waits
        // until the grace after it, and the pass goes on that much later.
        let mut at = t0 + 25 * MS;
        while at <= t0 + 60 * MS {
            if at >= hb.next_at() {
                assert!(hb.yield_to_work(at, Some(at)));
                assert_eq!(hb.next_at(), at + grace);
            }
            at += MS;
        }
        // Due again at 70 ms: the last delivery was at 60 ms.
        let last = Some(t0 + 60 * MS);
        assert!(hb.yield_to_work(hb.next_at(), last));
        assert_eq!(hb.next_at(), t0 + 60 * MS + grace);
        assert!(!hb.yield_to_work(hb.next_at(), last), "the grace is over");
        // 50 ms behind: the pass catches up at twice its pace, two keys
        // (20 ms of it) a slice, until it is on schedule again.
        let slices: Vec<_> = (0..7)
            .map(|i| hb.due(t0 + (80 + 10 * i) * MS, 32, usize::MAX))
            .collect();
        assert_eq!(slices, [2..3, 3..5, 5..7, 7..9, 9..11, 11..13, 13..14]);
        // The pass ends on time; the next one starts as late as this one
        // was at its latest, and a slice more: no key comes up again
        // within an interval.
        assert_eq!(hb.due(t0 + 320 * MS, 32, usize::MAX), 14..32);
        assert_eq!(hb.due(t0 + 375 * MS, 32, usize::MAX), 0..0);
        assert_eq!(hb.due(t0 + 390 * MS, 32, usize::MAX), 0..1);
        // Held over one interval: the slices run beside the work.
        let long = hb.next_at() + 330 * MS;
        assert!(!hb.yield_to_work(long, Some(long)), "over one interval");
    }

    #[test]
    fn a_delivery_holds_the_sweep_until_its_grace_is_over() {
        let t0 = Instant::now();
        let mut hb = Swept::new(320 * MS, 320 * MS, t0);
        let grace = hb.period * GRACE_SLICES;
        let due = hb.next_at();
        let over = due.checked_sub(grace).unwrap();
        assert!(!hb.yield_to_work(due, Some(over)), "its grace is over");
        assert!(hb.yield_to_work(due, Some(due)), "one under way now");
        assert_eq!(hb.next_at(), due + grace);
        assert!(!hb.yield_to_work(hb.next_at(), Some(due)));
    }

    #[test]
    fn an_accept_storm_holds_the_sweep_while_it_lasts() {
        let t0 = Instant::now();
        let mut hb = Swept::new(320 * MS, 320 * MS, t0);
        let accept = |hb: &mut Swept, n| (0..n).for_each(|_| hb.accepted());
        // One short of a storm in the first period: the slice runs.
        accept(&mut hb, STORM_ACCEPTS - 1);
        assert!(!hb.yield_to_work(hb.next_at(), None));
        assert_eq!(hb.due(hb.next_at(), 32, usize::MAX), 0..1);
        // A storm for 100 ms: held a grace at a time while it lasts.
        let start = hb.next_at();
        let mut held = Duration::ZERO;
        while hb.next_at() < start + 100 * MS {
            let before = hb.next_at();
            accept(&mut hb, STORM_ACCEPTS * GRACE_SLICES);
            assert!(hb.yield_to_work(before, None));
            held += hb.next_at() - before;
        }
        assert!(held >= 100 * MS, "{held:?}");
        // Over: the next slice runs.
        accept(&mut hb, 1);
        assert!(!hb.yield_to_work(hb.next_at(), None));
    }

    /// The times the sweep visits each of 50 keys over 40 intervals of
    /// 320 ms, with deliveries and accept storms at pseudo-random times
    /// (from `seed`) and a budget of 7 keys a step.
    fn visits_under_random_work(mut seed: u64) -> Vec<Vec<Instant>> {
        let t0 = Instant::now();
        let interval = 320 * MS;
        let mut hb = Swept::new(interval, interval, t0);
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut visits: Vec<Vec<Instant>> = vec![Vec::new(); 50];
        let mut at = t0;
        let mut busy_until = t0;
        let mut last_delivery = None;
        while at < t0 + interval * 40 {
            if at >= busy_until && next() % 50 == 0 {
                busy_until = at + MS * (next() % 400) as u32;
            }
            if at < busy_until {
                match next() % 2 {
                    0 => last_delivery = Some(at),
                    _ => (0..4).for_each(|_| hb.accepted()),
                }
            }
            if at >= hb.next_at() && !hb.yield_to_work(at, last_delivery) {
                for key in hb.due(at, visits.len(), 7) {
                    visits[key].push(at);
                }
            }
            at += MS;
        }
        visits
    }

    #[test]
    fn held_by_any_work_no_key_is_visited_early_or_over_an_interval_late() {
        // Consecutive visits of a key are at least one interval apart
        // (silence is never judged early) and at most three (each of the
        // two passes they fall in held back one interval at most).
        let interval = 320 * MS;
        for seed in [7, 11, 42, 99, 1234] {
            let visits = visits_under_random_work(seed);
            for (key, times) in visits.iter().enumerate() {
                assert!(times.len() >= 19, "key {key}: {} visits", times.len());
                for pair in times.windows(2) {
                    let apart = pair[1] - pair[0];
                    let within = interval..=3 * interval + 10 * MS;
                    assert!(within.contains(&apart), "seed {seed}, key {key}: {apart:?}");
                }
            }
        }
    }

    #[test]
    fn keys_past_the_budget_stay_due_until_visited() {
        let t0 = Instant::now();
        let mut hb = Swept::new(100 * MS, 100 * MS, t0);
        let first_due = hb.next_at();
        let late = t0 + 55 * MS;
        assert_eq!(hb.due(late, 100, 25), 0..25);
        assert_eq!(hb.next_at(), first_due, "the rest is due still");
        assert_eq!(hb.due(late, 100, 25), 25..50);
        assert_eq!(hb.due(late, 100, 25), 50..55);
        assert_eq!(hb.next_at(), late + hb.period, "caught up");
        // A pass ended in a slice cut short: the next begins once it is done.
        let after = t0 + 130 * MS;
        assert_eq!(hb.due(after, 100, 30), 55..85);
        assert_eq!(hb.due(after, 100, 30), 85..100);
        assert_eq!(hb.due(after, 100, 30), 0..30, "the second pass");
    }

    #[test]
    fn a_silent_connection_is_pinged_then_closed_and_a_talking_one_never() {
        let mut silent = Liveness::default();
        let visits: Vec<Visit> = (0..3).map(|_| silent.visit(3)).collect();
        assert_eq!(visits, [Visit::Skip, Visit::Ping, Visit::Close]);

        let mut talking = Liveness::default();
        for _ in 0..100 {
            assert_ne!(talking.visit(3), Visit::Close);
            talking.heard();
        }
        assert_eq!(talking.visit(3), Visit::Ping);

        let mut long = Liveness::default();
        let last = (0..MAX_SILENT_VISITS + 10)
            .map(|_| long.visit(MAX_SILENT_VISITS))
            .last();
        assert_eq!(last, Some(Visit::Close), "the count saturates, not wraps");
        assert_eq!(std::mem::size_of::<Liveness>(), 2);
    }

    #[test]
    fn silence_is_counted_in_visits() {
        let t0 = Instant::now();
        let close_after = |ping, idle| Heartbeat::new(ping * MS, idle * MS, t0).close_after();
        assert_eq!(close_after(30_000, 60_000), 3);
        assert_eq!(close_after(30_000, 30_000), 2);
        assert_eq!(close_after(30_000, 45_000), 3);
        assert_eq!(close_after(1, 1_000_000), MAX_SILENT_VISITS);
        let hb = Heartbeat::new(MS, MS, t0);
        assert_eq!(hb.ping().bytes(), b"\x89\x00");
        assert_eq!(hb.period, MIN_PERIOD);
        let hourly = Heartbeat::new(3_600_000 * MS, 7_200_000 * MS, t0);
        assert_eq!(
            hourly.period,
            112_500 * MS,
            "no wake-ups sooner than needed"
        );
    }
}

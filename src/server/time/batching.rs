//! Gathering events into batches under load.
//!
//! A loop that polls as soon as it is done sleeps and wakes once per event
//! when events arrive a little slower than it handles them: at 20,000
//! echoed messages a second over 1,000 connections, wspush woke about
//! 14,000 times a second, and `perf` put 31% of its CPU in `epoll_wait`
//! and the context switches around it. When one poll returns several
//! events, they are arriving faster than the loop can sleep and wake for
//! each; the next poll then comes no sooner than a short delay after the
//! last one returned, so that it collects what arrives meanwhile (the way
//! a network card coalesces its interrupts). Handling the last batch counts
//! towards the delay: a loop that was busy for longer polls at once, as
//! events have gathered while it worked and waiting would only idle it.
//! A loop that sees one event at a time never waits, so light load keeps
//! its latency and pays nothing.

use std::time::Duration;

/// A poll that returns at least this many events marks the loop as busy.
const BUSY_EVENTS: usize = 2;

/// Whether the loop waits before its next poll, and how long.
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    delay: Duration,
    busy: bool,
}

impl Batching {
    /// Polls no sooner than `delay` after a busy poll returned; zero never
    /// waits.
    pub fn new(delay: Duration) -> Batching {
        Batching { delay, busy: false }
    }

    /// Records how many events the last poll returned.
    pub fn observe(&mut self, events: usize) {
        self.busy = events >= BUSY_EVENTS;
    }

    /// How long to wait before the next poll, which may itself wait at
    /// most `timeout` (`None`: without limit), when handling the last
    /// poll's events took `handled`: after a busy poll, what is left of the
    /// delay, never beyond the timeout; else zero.
    pub fn wait_before_poll(&self, timeout: Option<Duration>, handled: Duration) -> Duration {
        if !self.busy {
            return Duration::ZERO;
        }
        let left = self.delay.saturating_sub(handled);
        timeout.map_or(left, |t| t.min(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_micros(300);

    #[test]
    fn one_event_at_a_time_never_waits() {
        let mut batching = Batching::new(DELAY);
        assert_eq!(
            batching.wait_before_poll(None, Duration::ZERO),
            Duration::ZERO
        );
        for events in [0, 1] {
            batching.observe(events);
            assert_eq!(
                batching.wait_before_poll(None, Duration::ZERO),
                Duration::ZERO
            );
        }
    }

    #[test]
    fn several_events_wait_the_delay_until_a_poll_finds_fewer() {
        let mut batching = Batching::new(DELAY);
        batching.observe(2);
        assert_eq!(batching.wait_before_poll(None, Duration::ZERO), DELAY);
        batching.observe(40);
        assert_eq!(
            batching.wait_before_poll(Some(Duration::from_secs(1)), Duration::ZERO),
            DELAY
        );
        batching.observe(1);
        assert_eq!(
            batching.wait_before_poll(None, Duration::ZERO),
            Duration::ZERO
        );
    }

    #[test]
    fn the_wait_stays_within_the_poll_timeout() {
        let mut batching = Batching::new(DELAY);
        batching.observe(5);
        let short = Duration::from_micros(120);
        assert_eq!(
            batching.wait_before_poll(Some(short), Duration::ZERO),
            short
        );
        assert_eq!(
            batching.wait_before_poll(Some(Duration::ZERO), Duration::ZERO),
            Duration::ZERO
        );
    }

    #[test]
    fn time_spent_handling_the_last_batch_counts_towards_the_delay() {
        let mut batching = Batching::new(DELAY);
        batching.observe(30);
        let handled = Duration::from_micros(100);
        assert_eq!(batching.wait_before_poll(None, handled), DELAY - handled);
        assert_eq!(batching.wait_before_poll(None, DELAY), Duration::ZERO);
        assert_eq!(
            batching.wait_before_poll(None, Duration::from_millis(20)),
            Duration::ZERO
        );
    }

    #[test]
    fn a_zero_delay_turns_batching_off() {
        let mut batching = Batching::new(Duration::ZERO);
        batching.observe(100);
        assert_eq!(
            batching.wait_before_poll(None, Duration::ZERO),
            Duration::ZERO
        );
    }
}

//! The loop's time events: the alarm that ends a poll when one is due,
//! the connections' deadlines, the heartbeat sweep's schedule, and the
//! batching of polls under load.

pub(crate) mod alarm;
pub(crate) mod batching;
pub(crate) mod heartbeat;
pub(crate) mod host;
pub(crate) mod timer;

use std::io;
use std::time::{Duration, Instant};

use mio::Registry;

use crate::config::Config;
use crate::ops::metrics::Metrics;
use crate::ops::sys::SharedMemory;
use crate::server::key::ConnKey;
use crate::server::net::sockets::ALARM;
use crate::server::time::alarm::Alarm;
use crate::server::time::batching::Batching;
use crate::server::time::heartbeat::Heartbeat;
use crate::server::time::host::HostDelivery;
use crate::server::time::timer::{Tick, TimerWheel};

/// The time since the Unix epoch (zero on a clock set before it), for
/// what is dated in wall-clock seconds: signed tokens.
pub fn unix_now() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Timer wheel resolution and size (100 ms × 1024 = 102 s per rotation).
const TIMER_RESOLUTION: Duration = Duration::from_millis(100);
const TIMER_SLOTS: usize = 1024;

/// The time events the loop keeps and the alarm that rings for them.
#[derive(Debug)]
pub(super) struct Clock {
    /// Rings for the next time event.
    alarm: Alarm,
    /// Handshake and close deadlines.
    pub(super) timers: TimerWheel,
    /// Reused for the deadlines due.
    expired: Vec<(ConnKey, Tick)>,
    /// When the heartbeat visits which connections.
    pub(super) heartbeat: Heartbeat,
    /// When an instance of the host last had a broadcast under way.
    pub(super) host: HostDelivery,
    batching: Batching,
}

impl Clock {
    /// The clock for `config`'s intervals, its alarm registered in the
    /// poll, with the host's memory of shared words (see `host`).
    pub(super) fn new(
        config: &Config,
        registry: &Registry,
        host: SharedMemory,
        now: Instant,
    ) -> io::Result<Clock> {
        Ok(Clock {
            alarm: Alarm::new(registry, ALARM)?,
            timers: TimerWheel::new(TIMER_RESOLUTION, TIMER_SLOTS, now),
            expired: Vec::new(),
            heartbeat: Heartbeat::new(config.ping_interval, config.idle_timeout, now),
            host: HostDelivery::new(host),
            batching: Batching::new(config.batch_delay),
        })
    }

    /// The alarm rang.
    pub(super) fn rang(&mut self) {
        self.alarm.rang();
    }

    /// Sets the alarm for `at`, unless it rings earlier already.
    pub(super) fn ring_by(&mut self, at: Instant, now: Instant) -> io::Result<()> {
        self.alarm.ring_by(at, now)
    }

    /// Records how many events the last poll returned.
    pub(super) fn observe(&mut self, events: usize) {
        self.batching.observe(events);
    }

    /// After a poll that found several events, whose handling took
    /// `handled`, waits what is left of the batch delay (within `timeout`)
    /// so that the next poll collects what arrives meanwhile; returns what
    /// is left of `timeout`.
    pub(super) fn wait_for_batch(
        &self,
        timeout: Option<Duration>,
        handled: Duration,
        metrics: &Metrics,
    ) -> Option<Duration> {
        let wait = self.batching.wait_before_poll(timeout, handled);
        if wait.is_zero() {
            return timeout;
        }
        std::thread::sleep(wait);
        Metrics::incr(&metrics.loop_batch_waits);
        timeout.map(|t| t - wait)
    }

    /// The deadlines due at `now`, in a reused list (give it back with
    /// [`Clock::deadlines_done`]).
    pub(super) fn due_deadlines(&mut self, now: Instant) -> Vec<(ConnKey, Tick)> {
        let mut due = std::mem::take(&mut self.expired);
        self.timers.expire(now, &mut due);
        due
    }

    /// Takes back the emptied list of deadlines due.
    pub(super) fn deadlines_done(&mut self, due: Vec<(ConnKey, Tick)>) {
        self.expired = due;
    }

    /// Whether heartbeat visits are due now, if `sweeping` (the loop runs
    /// and holds connections).
    pub(super) fn heartbeat_due(&self, now: Instant, sweeping: bool) -> bool {
        sweeping && now >= self.heartbeat.next_at()
    }

    /// Whether the heartbeat's slice is due now, if `sweeping`, and
    /// runs: it does not yield to a broadcast of the host (whether one is
    /// under way here is `delivering`) or to an accept storm (see
    /// `heartbeat`).
    pub(super) fn pings_due(&mut self, now: Instant, sweeping: bool, delivering: bool) -> bool {
        if delivering {
            self.host.mark(now);
        }
        if !self.heartbeat_due(now, sweeping) {
            return false;
        }
        let last_delivery = self.host.last();
        !self.heartbeat.yield_to_work(now, last_delivery)
    }

    /// The earliest deadline, or heartbeat slice if `sweeping`.
    pub(super) fn next_at(&self, sweeping: bool) -> Option<Instant> {
        let heartbeat = sweeping.then(|| self.heartbeat.next_at());
        [self.timers.next_at(), heartbeat]
            .into_iter()
            .flatten()
            .min()
    }
}

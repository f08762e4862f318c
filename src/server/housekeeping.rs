//! The loop's time events and upkeep: connection deadlines, heartbeat
//! slices, the pool trim, the stats line and the iteration records.

use std::time::{Duration, Instant};

use crate::ops::metrics::{self, Metrics, MetricsSnapshot};
use crate::ops::sys;
use crate::server::key::ConnKey;
use crate::server::{Lifecycle, Server};

/// How often free pool buffers unused for that long are given back.
const POOL_TRIM_PERIOD: Duration = Duration::from_secs(1);
/// Buffers freed (2 MiB worth) before the allocator is asked to hand the
/// memory back to the kernel (see [`sys`]).
const RELEASE_AFTER_BUFFERS: u64 = 256;

/// The periodic info line with the key counters.
#[derive(Debug)]
pub(super) struct StatsLine {
    pub(super) every: Duration,
    pub(super) next_at: Instant,
    pub(super) last: MetricsSnapshot,
}

impl Server {
    pub(super) fn expire_deadlines(&mut self, now: Instant) {
        let mut due = std::mem::take(&mut self.expired);
        self.timers.expire(now, &mut due);
        for (key, tick) in due.drain(..) {
            let Some(conn) = self.conns.get_mut(key.0).filter(|conn| conn.is_due(tick)) else {
                continue; // Stale: re-armed, cleared, or the slot was reused.
            };
            let verdict = conn.on_deadline(&mut self.timers);
            self.settle(key, verdict);
        }
        self.expired = due;
    }

    /// Runs the heartbeat slice that is due (at most
    /// [`Config::fanout_budget`](crate::Config::fanout_budget) keys; the
    /// rest in the next iterations): pings, and closes connections silent
    /// for the idle timeout. While a broadcast is on its way to every
    /// connection (and a little after) the sweep is postponed instead, up
    /// to one interval a pass (see `heartbeat`). Messages for some
    /// connections do not postpone it: the others get no data meanwhile,
    /// and a proxy in front of them sees only the pings.
    pub(super) fn sweep_heartbeats(&mut self, now: Instant) {
        if self.stream.is_busy() {
            self.heartbeat.delivering(now);
        }
        if !self.heartbeat_due(now) || self.heartbeat.yield_to_deliveries(now) {
            return;
        }
        let budget = self.config.fanout_budget;
        let due = self.heartbeat.due(now, self.key_bound, budget);
        let ping = self.heartbeat.ping().clone();
        let close_after = self.heartbeat.close_after();
        for key in due {
            let parts = self.parts(now);
            let mut ctx = parts.ctx;
            let Some(conn) = parts.conns.get_mut(key) else {
                continue;
            };
            let verdict =
                conn.on_heartbeat(ConnKey(key), &ping, close_after, parts.scratch, &mut ctx);
            self.settle(ConnKey(key), verdict);
        }
    }

    /// Whether heartbeat visits are due now.
    pub(super) fn heartbeat_due(&self, now: Instant) -> bool {
        !self.conns.is_empty()
            && now >= self.heartbeat.next_at()
            && self.lifecycle == Lifecycle::Running
    }

    /// The end of every loop iteration: publish the metrics, give idle
    /// pool buffers back, and log the stats line when it is due.
    pub(super) fn housekeeping(&mut self, now: Instant) {
        self.trim_pool(now);
        self.history.evict(now);
        if self.routes.take_grown() {
            // A grown index left its old, smaller table free.
            sys::release_free_memory();
        }
        self.hand_over_upstream();
        self.publish_metrics(now);
        let metrics = &self.shared.metrics;
        if let Some(stats) = self.stats.as_mut().filter(|s| now >= s.next_at) {
            let current = metrics.snapshot();
            log::info!("{}", metrics::summary(&stats.last, &current, stats.every));
            stats.last = current;
            stats.next_at = now + stats.every;
        }
    }

    /// Publishes what the loop counts on its own (the [`Tally`](metrics::Tally)
    /// of the connections' work, the pool and broadcast-queue gauges) to
    /// the shared metrics: the one place they are published, at the end
    /// of every iteration and before `/metrics` is rendered.
    pub(super) fn publish_metrics(&mut self, now: Instant) {
        let metrics = &self.shared.metrics;
        metrics.publish(&mut self.tally);
        Metrics::set(&metrics.buffers_lent, self.pool.lent() as u64);
        Metrics::set(&metrics.buffers_idle, self.pool.idle() as u64);
        Metrics::set(&metrics.buffers_released, self.pool.released());
        Metrics::set(
            &metrics.broadcast_queue_bytes,
            self.shared.gate.bytes() as u64,
        );
        Metrics::set(
            &metrics.broadcast_producers_waiting,
            self.shared.gate.waiters() as u64,
        );
        Metrics::set(&metrics.channels, self.routes.channel_count() as u64);
        Metrics::set(
            &metrics.subscriptions,
            self.routes.subscription_count() as u64,
        );
        Metrics::set(&metrics.connections_with_id, self.routes.id_count() as u64);
        let (messages, bytes) = self.history.held();
        Metrics::set(&metrics.history_messages, messages);
        Metrics::set(&metrics.history_bytes, bytes);
        let age = self.feed.oldest_age(now).as_micros();
        Metrics::set(
            &metrics.broadcast_queue_age_us,
            age.try_into().unwrap_or(u64::MAX),
        );
    }

    /// Hands the iteration's upstream lines to the reader; once it has
    /// caught up, the connections that waited for it are read again.
    fn hand_over_upstream(&mut self) {
        if let Some(upstream) = &mut self.upstream {
            if upstream.hand_over() {
                // A connection may have waited from several events.
                self.upstream_waiting.sort_unstable();
                self.upstream_waiting.dedup();
                self.read_again.append(&mut self.upstream_waiting);
            }
        }
    }

    /// Once a second while the pool has surplus: frees the buffers unused
    /// for that long, and asks the allocator to return freed memory to the
    /// kernel once enough was freed.
    fn trim_pool(&mut self, now: Instant) {
        if self.next_trim.is_some_and(|at| now >= at) {
            self.pool.trim();
            self.next_trim = None;
            if self.unreturned_buffers() >= RELEASE_AFTER_BUFFERS {
                sys::release_free_memory();
                self.released_at_last_return = self.pool.released();
            }
        }
        if self.next_trim.is_none()
            && (self.pool.has_surplus() || self.unreturned_buffers() >= RELEASE_AFTER_BUFFERS)
        {
            self.next_trim = Some(now + POOL_TRIM_PERIOD);
        }
    }

    /// Buffers freed since the allocator last returned memory.
    pub(super) fn unreturned_buffers(&self) -> u64 {
        self.pool.released() - self.released_at_last_return
    }

    /// Counts the last loop iteration, busy from its poll's return until
    /// `now` (the next poll: one clock reading serves both); returns how
    /// long it was busy (zero before the first poll).
    pub(super) fn record_iteration(&mut self, now: Instant) -> Duration {
        let Some(started) = self.busy_since.take() else {
            return Duration::ZERO;
        };
        let busy = now.duration_since(started);
        let ns = u64::try_from(busy.as_nanos()).unwrap_or(u64::MAX);
        let metrics = &self.shared.metrics;
        Metrics::incr(&metrics.loop_iterations);
        Metrics::add(&metrics.loop_busy_ns, ns);
        self.shared.loop_histogram.record(ns);
        if let Some(max) = self.loop_max.record(ns, started) {
            Metrics::set(&metrics.loop_max_ns, max);
        }
        busy
    }
}

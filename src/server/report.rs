//! What the loop tells the outside: the state it shares with its handles
//! (the metrics among it), the counts of the iteration under way, the
//! iteration records, the periodic stats line and the `/metrics` page.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::ops::board::Board;
use crate::ops::metrics::{self, LoopMax, Metrics, MetricsSnapshot, Tally};
use crate::server::handle::Shared;
use crate::server::net::pool::BufferPool;
use crate::server::records::Records;

/// The periodic info line with the key counters.
#[derive(Debug)]
struct StatsLine {
    every: Duration,
    next_at: Instant,
    last: MetricsSnapshot,
}

/// The shared state and the loop's own counts, until they are published.
#[derive(Debug)]
pub(super) struct Report {
    /// The state shared with the handles: their queue's gate, the
    /// shutdown request, the metrics.
    pub(super) shared: Arc<Shared>,
    /// Counts of the connections' work in this iteration (see
    /// [`Ctx::tally`](crate::server::conn::Ctx::tally)).
    pub(super) tally: Tally,
    loop_max: LoopMax,
    /// When the last poll returned, until its iteration is counted.
    busy_since: Option<Instant>,
    stats: Option<StatsLine>,
    /// The body of the last `/metrics` answer, its capacity kept.
    pub(super) page: Vec<u8>,
    /// The host's metrics board, for `/metrics` on the main listener to
    /// answer the host's sums (and each instance's, if the flag is set),
    /// when the server's counters are on it and no metrics listener
    /// answers its own.
    pub(super) host: Option<(Board, bool)>,
}

impl Report {
    /// Nothing counted yet; the stats line, if `config` asks for it, first
    /// due an interval from `now`.
    pub(super) fn new(shared: Arc<Shared>, config: &Config, now: Instant) -> io::Result<Report> {
        let host = match (&config.metrics_board, config.metrics_listen) {
            (Some(board), None) => Some((Board::open(board.fd.try_clone()?)?, board.per_instance)),
            _ => None,
        };
        Ok(Report {
            shared,
            tally: Tally::default(),
            loop_max: LoopMax::default(),
            busy_since: None,
            stats: config.stats_interval.map(|every| StatsLine {
                every,
                next_at: now + every,
                last: MetricsSnapshot::default(),
            }),
            page: Vec::new(),
            host,
        })
    }

    /// The counters.
    pub(super) fn metrics(&self) -> &Metrics {
        &self.shared.counters.metrics
    }

    /// When the stats line is due, if it is logged.
    pub(super) fn stats_at(&self) -> Option<Instant> {
        self.stats.as_ref().map(|s| s.next_at)
    }

    /// A poll returned at `now`: the iteration is busy from then on.
    pub(super) fn busy_from(&mut self, now: Instant) {
        self.busy_since = Some(now);
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
        let metrics = &self.shared.counters.metrics;
        Metrics::incr(&metrics.loop_iterations);
        Metrics::add(&metrics.loop_busy_ns, ns);
        self.shared.counters.loop_histogram.record(ns);
        if let Some(max) = self.loop_max.record(ns, started) {
            Metrics::set(&metrics.loop_max_ns, max);
        }
        busy
    }

    /// Publishes what the loop counts on its own (the [`Tally`] of the
    /// connections' work, the pool, routes, history and broadcast-queue
    /// gauges, the oldest queued broadcast's `queue_age`) to the shared
    /// metrics: the one place they are published, at the end of every
    /// iteration and before `/metrics` is rendered.
    pub(super) fn publish(&mut self, pool: &BufferPool, records: &Records, queue_age: Duration) {
        let metrics = &self.shared.counters.metrics;
        metrics.publish(&mut self.tally);
        Metrics::set(&metrics.buffers_lent, pool.lent() as u64);
        Metrics::set(&metrics.buffers_idle, pool.idle() as u64);
        Metrics::set(&metrics.buffers_released, pool.released());
        Metrics::set(
            &metrics.broadcast_queue_bytes,
            self.shared.gate.bytes() as u64,
        );
        Metrics::set(
            &metrics.broadcast_producers_waiting,
            self.shared.gate.waiters() as u64,
        );
        records.publish(metrics);
        Metrics::set(
            &metrics.broadcast_queue_age_us,
            queue_age.as_micros().try_into().unwrap_or(u64::MAX),
        );
    }

    /// Logs the stats line when it is due.
    pub(super) fn log_stats(&mut self, now: Instant) {
        let metrics = &self.shared.counters.metrics;
        if let Some(stats) = self.stats.as_mut().filter(|s| now >= s.next_at) {
            let current = metrics.snapshot();
            log::info!("{}", metrics::summary(&stats.last, &current, stats.every));
            stats.last = current;
            stats.next_at = now + stats.every;
        }
    }
}

//! What a writer of the upstream lines outside the loop counts (the
//! binary's writer into a Redis stream): where the server counts, or, for
//! a supervisor that writes its instances' lines, in its own slot of the
//! host's metrics board.

use std::sync::Arc;
use std::time::Duration;

use crate::ops::metrics::{Counters, Metrics};
use crate::ops::sys::Placed;

/// What holds the counters a tally counts in.
pub(crate) trait Holds: std::fmt::Debug + Send + Sync {
    /// The counters.
    fn counters(&self) -> &Counters;
}

impl Holds for Placed<Counters> {
    fn counters(&self) -> &Counters {
        self
    }
}

/// Counts an upstream writer's work, in `/metrics`.
#[derive(Debug, Clone)]
pub struct UpstreamTally(Arc<dyn Holds>);

impl UpstreamTally {
    /// Counts in `placed`, a supervisor's own counters on the host's
    /// metrics board (see `Board::place_own`).
    pub fn on_board(placed: Placed<Counters>) -> UpstreamTally {
        UpstreamTally(Arc::new(placed))
    }

    /// Counts in what `home` holds (a server's counters).
    pub(crate) fn new(home: Arc<dyn Holds>) -> UpstreamTally {
        UpstreamTally(home)
    }

    fn counters(&self) -> &Counters {
        self.0.counters()
    }

    /// A batch of `entries` lines was written (`found`: sent again after
    /// its reply was lost, and found written already).
    pub fn batch(&self, entries: u64, found: bool) {
        let metrics = &self.counters().metrics;
        match found {
            true => Metrics::incr(&metrics.upstream_stream_found),
            false => Metrics::incr(&metrics.upstream_stream_written),
        }
        Metrics::add(&metrics.upstream_stream_entries, entries);
    }

    /// The destination was lost: one outage.
    pub fn lost(&self) {
        let metrics = &self.counters().metrics;
        Metrics::incr(&metrics.upstream_stream_outages);
        Metrics::set(&metrics.upstream_stream_down, 1);
    }

    /// The destination is back after `outage`.
    pub fn restored(&self, outage: Duration) {
        let metrics = &self.counters().metrics;
        Metrics::add(
            &metrics.upstream_stream_outage_ms,
            outage.as_millis() as u64,
        );
        Metrics::set(&metrics.upstream_stream_down, 0);
    }

    /// `lines` were dropped (counted in `upstream_dropped`): nothing is
    /// lost uncounted.
    pub fn dropped(&self, lines: u64) {
        Metrics::add(&self.counters().metrics.upstream_dropped, lines);
    }
}

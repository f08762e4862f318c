//! A latency distribution summarised in the reference format.

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::observe::format::{duration_us, us};

/// Quantiles at which the latency CDF is sampled for the plot: every
/// percent, then the tail.
const CDF_QUANTILES: [f64; 4] = [0.995, 0.999, 0.9999, 1.0];

/// Latency distribution in µs, in the reference format (count, min, max,
/// mean, standard deviation, median, 75/95/98/99/99.9th percentiles).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LatencyReport {
    /// Deliveries measured.
    pub count: u64,
    /// Smallest.
    pub min_us: f64,
    /// Largest.
    pub max_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// Standard deviation.
    pub stddev_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 75th percentile.
    pub p75_us: f64,
    /// 95th percentile.
    pub p95_us: f64,
    /// 98th percentile.
    pub p98_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// `(quantile, µs)` points of the distribution, for plotting.
    pub cdf: Vec<(f64, f64)>,
}

impl LatencyReport {
    /// Summarises a histogram of nanoseconds.
    pub fn from_histogram(h: &Histogram<u64>) -> LatencyReport {
        let q = |quantile: f64| us(h.value_at_quantile(quantile));
        let cdf = if h.is_empty() {
            Vec::new()
        } else {
            (0..=99)
                .map(|p| f64::from(p) / 100.0)
                .chain(CDF_QUANTILES)
                .map(|quantile| (quantile, q(quantile)))
                .collect()
        };
        LatencyReport {
            count: h.len(),
            min_us: us(h.min()),
            max_us: us(h.max()),
            mean_us: h.mean() / 1e3,
            stddev_us: h.stdev() / 1e3,
            p50_us: q(0.50),
            p75_us: q(0.75),
            p95_us: q(0.95),
            p98_us: q(0.98),
            p99_us: q(0.99),
            p999_us: q(0.999),
            cdf,
        }
    }

    /// The reference format on one line.
    pub fn render(&self) -> String {
        format!(
            "count {}  min {}  max {}  mean {}  stddev {}  median {}  75% {}  95% {}  98% {}  99% {}  99.9% {}",
            self.count,
            duration_us(self.min_us),
            duration_us(self.max_us),
            duration_us(self.mean_us),
            duration_us(self.stddev_us),
            duration_us(self.p50_us),
            duration_us(self.p75_us),
            duration_us(self.p95_us),
            duration_us(self.p98_us),
            duration_us(self.p99_us),
            duration_us(self.p999_us),
        )
    }
}

/// What the probes measured during one stream.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    /// From `connect()` to the whole 101 response of a new connection.
    pub upgrade: LatencyReport,
    /// From a ping written on a connected client to its pong read.
    pub ping: LatencyReport,
    /// Upgrades the server refused with a status (503 while full or
    /// draining): not samples.
    pub upgrades_refused: u64,
    /// Times the server closed the ping client, which dialed again.
    pub pings_redialed: u64,
    /// Why a probe stopped early (no answer within 30 s, or an error):
    /// the server did not answer it at all.
    pub stopped: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::stats::new_histogram;

    #[test]
    fn latency_cdf_is_monotonic_and_ends_at_the_maximum() {
        let mut h = new_histogram();
        for v in 1..=10_000u64 {
            h.record(v * 1_000).unwrap();
        }
        let report = LatencyReport::from_histogram(&h);
        assert_eq!(report.cdf.len(), 104);
        assert!(report
            .cdf
            .windows(2)
            .all(|w| w[0].1 <= w[1].1 && w[0].0 < w[1].0));
        assert_eq!(report.cdf.last().unwrap().1, report.max_us);
        assert!(LatencyReport::from_histogram(&new_histogram())
            .cdf
            .is_empty());
    }
}

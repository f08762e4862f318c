//! The server's own delivery latency (`wspush_delivery_latency_seconds`,
//! a histogram of the time from a batch's input to the write that hands
//! it to its last connection) against what the clients measured of the
//! same messages: each message's time from its send to its last receipt.
//!
//! The histogram is read from `/metrics` before and after the messages
//! sent one at a time; its difference holds those messages only. A
//! quantile of it is known to its bucket; the clients' is "within one
//! bucket" when it falls in that bucket or in one next to it.

use std::fmt::Write as _;

use serde::Serialize;

/// The WebSocket series' cumulative buckets, by bound in seconds (`+Inf`
/// as infinity), in order, from a `/metrics` page (the host's sums under
/// a supervisor: the rows without an `instance` label).
pub fn buckets(page: &str) -> Vec<(f64, u64)> {
    let prefix = "wspush_delivery_latency_seconds_bucket{transport=\"websocket\",le=\"";
    page.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(prefix)?;
            let (bound, rest) = rest.split_once('"')?;
            let count = rest.trim_start_matches('}').trim().parse::<f64>().ok()?;
            let bound = match bound {
                "+Inf" => f64::INFINITY,
                b => b.parse().ok()?,
            };
            Some((bound, count as u64))
        })
        .collect()
}

/// A quantile of the server's histogram, as its bucket, beside the
/// clients'.
#[derive(Debug, Clone, Serialize)]
pub struct QuantileCheck {
    /// The quantile (0.5, 0.99).
    pub quantile: f64,
    /// The server's bucket: above this, in seconds.
    pub server_above_secs: f64,
    /// Up to this (infinity: past the last bound).
    pub server_up_to_secs: f64,
    /// What the clients measured, in seconds.
    pub clients_secs: f64,
    /// The clients' value falls in the server's bucket or one next to it.
    pub within_one_bucket: bool,
}

/// The server's histogram over some messages against the clients'.
#[derive(Debug, Clone, Serialize)]
pub struct ServerLatencyReport {
    /// Observations (messages) in the server's histogram.
    pub server_messages: u64,
    /// Messages the clients timed.
    pub client_messages: usize,
    /// p50 and p99.
    pub quantiles: Vec<QuantileCheck>,
}

impl ServerLatencyReport {
    /// Compares the histogram between `before` and `after` (cumulative
    /// buckets, as [`buckets`] reads them) with `clients` (seconds, one
    /// per message); `None` without a histogram or a message.
    pub fn new(
        before: &[(f64, u64)],
        after: &[(f64, u64)],
        clients: &mut [f64],
    ) -> Option<ServerLatencyReport> {
        if after.is_empty() || clients.is_empty() {
            return None;
        }
        // Per bucket, not cumulative, the messages between the reads.
        let mut counts = Vec::with_capacity(after.len());
        let mut below = 0;
        for (i, &(bound, cumulative)) in after.iter().enumerate() {
            let earlier = before.get(i).filter(|b| b.0 == bound).map_or(0, |b| b.1);
            let delta = cumulative.saturating_sub(earlier);
            counts.push((bound, delta.saturating_sub(below)));
            below = delta;
        }
        let total: u64 = counts.iter().map(|c| c.1).sum();
        if total == 0 {
            return None;
        }
        clients.sort_by(f64::total_cmp);
        let quantiles = [0.5, 0.99]
            .into_iter()
            .map(|q| {
                let rank = ((q * total as f64).ceil() as u64).max(1);
                let mut seen = 0;
                let at = counts
                    .iter()
                    .position(|c| {
                        seen += c.1;
                        seen >= rank
                    })
                    .unwrap_or(counts.len() - 1);
                let bound = |i: usize| counts.get(i).map_or(f64::INFINITY, |c| c.0);
                let above = |i: usize| i.checked_sub(1).map_or(0.0, bound);
                let index = ((q * clients.len() as f64).ceil() as usize).clamp(1, clients.len());
                let client = clients[index - 1];
                let (lo, hi) = (above(at.saturating_sub(1)), bound(at + 1));
                QuantileCheck {
                    quantile: q,
                    server_above_secs: above(at),
                    server_up_to_secs: bound(at),
                    clients_secs: client,
                    within_one_bucket: client <= hi && (client > lo || at == 0),
                }
            })
            .collect();
        Some(ServerLatencyReport {
            server_messages: total,
            client_messages: clients.len(),
            quantiles,
        })
    }

    /// The report on one line.
    pub fn render(&self) -> String {
        let mut out = format!(
            "server histogram of {} messages against the clients' send-to-last-receipt of {}:",
            self.server_messages, self.client_messages
        );
        for q in &self.quantiles {
            let _ = write!(
                out,
                "  p{} server ({}, {}] s, clients {:.4} s ({})",
                q.quantile * 100.0,
                q.server_above_secs,
                q.server_up_to_secs,
                q.clients_secs,
                if q.within_one_bucket {
                    "within one bucket"
                } else {
                    "NOT within one bucket"
                }
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buckets_of_a_page_and_a_quantile_checked_against_the_clients() {
        let page = "\
wspush_delivery_latency_seconds_bucket{transport=\"websocket\",le=\"0.01\"} 1
wspush_delivery_latency_seconds_bucket{transport=\"websocket\",le=\"0.025\"} 5
wspush_delivery_latency_seconds_bucket{instance=\"1\",transport=\"websocket\",le=\"0.025\"} 99
wspush_delivery_latency_seconds_bucket{transport=\"event_stream\",le=\"0.025\"} 7
wspush_delivery_latency_seconds_bucket{transport=\"websocket\",le=\"+Inf\"} 6
";
        let after = buckets(page);
        assert_eq!(after, [(0.01, 1), (0.025, 5), (f64::INFINITY, 6)]);
        let before = [(0.01, 1), (0.025, 1), (f64::INFINITY, 1)];
        // Between the reads: 4 in (0.01, 0.025], 1 past it.
        let mut clients = vec![0.02, 0.021, 0.03, 0.024, 0.5];
        let report = ServerLatencyReport::new(&before, &after, &mut clients).unwrap();
        assert_eq!(report.server_messages, 5);
        let p50 = &report.quantiles[0];
        assert_eq!(
            (p50.server_above_secs, p50.server_up_to_secs),
            (0.01, 0.025)
        );
        assert!(p50.within_one_bucket);
        let p99 = &report.quantiles[1];
        assert_eq!(p99.server_up_to_secs, f64::INFINITY);
        assert!(p99.within_one_bucket);
        let mut far = vec![5.0; 5];
        let before_all = [(0.01, 0), (0.025, 0), (1.0, 0), (f64::INFINITY, 0)];
        let after_all = [(0.01, 1), (0.025, 5), (1.0, 5), (f64::INFINITY, 5)];
        let report = ServerLatencyReport::new(&before_all, &after_all, &mut far).unwrap();
        assert!(
            !report.quantiles[0].within_one_bucket,
            "{}",
            report.render()
        );
    }
}

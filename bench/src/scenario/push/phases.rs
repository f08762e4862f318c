//! The phases of a `push` run, in order: settling, the setup, the idle
//! time, the broadcasts one at a time (each awaited at every connection),
//! the streams, and the server's counts at the end.

use std::time::{Duration, Instant};

use super::run::{Run, CHECK_EVERY};
use super::streams::is_held;
use super::summary::Observations;
use crate::fleet::protocol::Report;
use crate::observe::cpu::CpuMark;
use crate::observe::scrape;
use crate::observe::server_latency::{self, ServerLatencyReport};
use crate::observe::sys;
use crate::wire::message::{self, Stamp};
use crate::Error;

/// Feeds of `--feed-secs` tried at most to hold the rate the search found
/// (each 10% below the one before).
const HOLD_TRIES: u32 = 3;

/// The server counts `--metrics-from` reads: what was encoded (once per
/// batch, per transport) and delivered.
const COUNTED: [&str; 6] = [
    "wspush_broadcasts_total",
    "wspush_broadcast_batches_total",
    "wspush_event_stream_batches_total",
    "wspush_broadcasts_compressed_total",
    "wspush_broadcast_deliveries_total",
    "wspush_event_stream_deliveries_total",
];

impl Run<'_> {
    /// The server's `/metrics` page, from `--metrics-from`; none without
    /// it, or (with a warning) if the server does not answer there (the
    /// floor of a comparison has none).
    fn server_page(&mut self) -> Option<String> {
        let addr = self.options.metrics_from?;
        match scrape::fetch_metrics(addr) {
            Ok(page) => Some(page),
            Err(e) => {
                let warning =
                    format!("no /metrics from {addr} ({e}): the server's counts are left out");
                if !self.warnings.contains(&warning) {
                    self.warnings.push(warning);
                }
                None
            }
        }
    }

    /// The phases of the run, in order.
    pub(super) fn observe(&mut self) -> Result<Observations, Error> {
        let o = self.options;
        let settle = Duration::from_millis(o.settle_ms);
        let baseline = self.settle(settle, "before the connections")?;

        let setup_start = self.target.usage()?;
        let setup_before = CpuMark::take(setup_start.cpu_ns, self.client_cpu_ns()?)?;
        let (setup, ramp) = self.open_connections()?;
        let setup_end = self.target.usage()?;
        let setup_after = CpuMark::take(setup_end.cpu_ns, self.client_cpu_ns()?)?;
        self.warn_if_busy(
            setup_after.others_since(&setup_before),
            "during the connection setup",
        );
        let counts = self.fleet.counts();
        eprintln!(
            "[{}] {} of {} connections open in {:.2} s ({} failed)",
            self.label,
            counts.open,
            o.conns,
            setup.as_secs_f64(),
            counts.failed
        );
        if counts.open == 0 {
            return Err("no connection opened".into());
        }

        let open = self.settle(settle, "with the connections idle")?;
        let client = self.client_usage()?;
        let idle = Duration::from_secs(o.idle_secs);
        let idle_end = self.settle(idle, "while the server was idle")?;

        // The server's latency histogram before and after the messages
        // sent one at a time: its difference holds them only.
        let histogram_before = self
            .server_page()
            .map_or_else(Vec::new, |p| server_latency::buckets(&p));
        let before = CpuMark::take(idle_end.cpu_ns, self.client_cpu_ns()?)?;
        let mut sent_ns = Vec::new();
        for seq in 1..=o.messages {
            sent_ns.push(self.broadcast(seq)?);
            if seq < o.messages {
                self.pump(Duration::from_millis(o.gap_ms))?;
            }
        }
        let end = self.target.usage()?;
        let after = CpuMark::take(end.cpu_ns, self.client_cpu_ns()?)?;
        self.warn_if_busy(after.others_since(&before), "during the broadcasts");
        let histogram_after = self
            .server_page()
            .map_or_else(Vec::new, |p| server_latency::buckets(&p));

        let mut first = o.messages + 1;
        let (mut streams, mut feed_search, mut max_feed_rate) = (Vec::new(), Vec::new(), None);
        if let Some(lines) = o.burst {
            self.pump(Duration::from_millis(o.gap_ms))?;
            streams.push(self.stream("burst", &mut first, lines, None)?);
        }
        if o.find_max_feed_rate {
            let (found, steps) = self.find_max_feed_rate(&mut first)?;
            feed_search = steps;
            // A rate that held for a short step may not hold for the whole
            // feed: then 10% less, at most HOLD_TRIES times.
            let mut rate = found;
            for _ in 0..HOLD_TRIES {
                let Some(r) = rate else { break };
                let held = self.feed(&mut first, r, o.feed_secs)?;
                let ok = is_held(&held, o.feed_max_p99_ms);
                streams.push(held);
                if ok {
                    max_feed_rate = Some(r);
                    break;
                }
                rate = Some((r * 0.9).floor()).filter(|&r| r >= 1.0);
            }
        } else if let Some(rate) = o.feed_rate {
            streams.push(self.feed(&mut first, rate, o.feed_secs)?);
        }
        let observed = self.fleet.finish()?;
        let mut completions: Vec<f64> = (observed.messages.iter())
            .zip(&sent_ns)
            .filter(|(m, _)| m.last_ns > 0)
            .map(|(m, &sent)| m.last_ns.saturating_sub(sent) as f64 / 1e9)
            .collect();
        let server_latency =
            ServerLatencyReport::new(&histogram_before, &histogram_after, &mut completions);
        let counted = match self.server_page() {
            Some(page) => COUNTED
                .iter()
                .filter_map(|&name| Some((name.to_string(), scrape::metric(&page, name)? as u64)))
                .collect(),
            None => Vec::new(),
        };

        Ok(Observations {
            baseline,
            setup_start,
            setup_end,
            open,
            idle_end,
            end,
            setup,
            client_setup_ns: setup_after.client_ns.saturating_sub(setup_before.client_ns),
            machine_setup_ns: setup_after
                .machine_ns
                .saturating_sub(setup_before.machine_ns),
            interrupts_setup_ns: setup_after
                .interrupts_ns
                .saturating_sub(setup_before.interrupts_ns),
            idle,
            open_conns: counts.open,
            ramp,
            sent_ns,
            broadcast_wall: after.at - before.at,
            client_broadcast_ns: after.client_ns.saturating_sub(before.client_ns),
            machine_broadcast_ns: after.machine_ns.saturating_sub(before.machine_ns),
            client,
            streams,
            feed_search,
            max_feed_rate,
            observed,
            counted,
            server_latency,
        })
    }

    /// Sends message `seq` and waits until every open connection has it,
    /// or the message timeout passes; returns its send time.
    fn broadcast(&mut self, seq: u32) -> Result<u64, Error> {
        let o = self.options;
        let nap_us = o.nap_us * self.fleet.len() as u64;
        let expected = self.fleet.arm(seq, nap_us)?;
        let sent_ns = sys::now_ns();
        let mut line = o.line_prefix();
        line.extend(
            message::encode_padded(Stamp { seq, sent_ns }, o.payload_bytes, o.padding)
                .expect("payload size checked up front"),
        );
        self.target.send_line(&line)?;
        let start = Instant::now();
        let deadline = start + o.message_timeout();
        let mut checked = start;
        // Workers without connections are done before it is sent.
        let mut done: Vec<bool> = expected.iter().map(|&e| e == 0).collect();
        let mut received = vec![0u32; self.fleet.len()];
        while !done.iter().all(|&d| d) {
            let now = Instant::now();
            if now >= deadline {
                eprintln!(
                    "[{}] message {seq}: {} received before the timeout",
                    self.label,
                    received.iter().sum::<u32>()
                );
                break;
            }
            if now >= checked + CHECK_EVERY {
                self.check()?;
                checked = now;
            }
            if let Some((
                index,
                Report::Received {
                    seq: s,
                    receipts,
                    done: d,
                },
            )) = self.fleet.next_report(CHECK_EVERY)?
            {
                if s == seq {
                    received[index] = receipts.received;
                    done[index] = d;
                }
            }
        }
        Ok(sent_ns)
    }
}

//! The streams of a `push` run after the broadcasts one at a time: a burst
//! of lines, a feed at a steady rate, and the search for the highest rate
//! a feed can have with its p99 latency under a limit.

use std::time::{Duration, Instant};

use super::run::{Run, CHECK_EVERY};
use crate::client::probe::Probes;
use crate::fleet::protocol::Report;
use crate::observe::cpu::CpuMark;
use crate::observe::format;
use crate::observe::latency::LatencyReport;
use crate::observe::sys;
use crate::report::StreamReport;
use crate::wire::message::{self, Stamp};
use crate::Error;

/// Steps of the feed rate search at most.
const MAX_SEARCH_STEPS: u32 = 12;

/// The search stops once the lowest failing rate is within this factor of
/// the highest passing one.
const SEARCH_PRECISION: f64 = 1.1;

impl Run<'_> {
    /// A feed of `rate` lines a second for `secs` seconds.
    pub(super) fn feed(
        &mut self,
        first: &mut u32,
        rate: f64,
        secs: u64,
    ) -> Result<StreamReport, Error> {
        self.pump(Duration::from_millis(self.options.gap_ms))?;
        let lines = (rate * secs as f64).round().max(1.0) as u32;
        self.stream("feed", first, lines, Some(rate))
    }

    /// Feeds at rising rates (doubling from `--feed-rate`, then halving
    /// the gap between the highest that held and the lowest that did not)
    /// until the two are within [`SEARCH_PRECISION`]; returns the highest
    /// rate that held and every step.
    pub(super) fn find_max_feed_rate(
        &mut self,
        first: &mut u32,
    ) -> Result<(Option<f64>, Vec<StreamReport>), Error> {
        let o = self.options;
        let mut rate = o.feed_rate.unwrap_or(100.0);
        let (mut held, mut failed): (Option<f64>, Option<f64>) = (None, None);
        let mut steps = Vec::new();
        for _ in 0..MAX_SEARCH_STEPS {
            let step = self.feed(first, rate, o.feed_search_secs)?;
            let ok = is_held(&step, o.feed_max_p99_ms);
            eprintln!(
                "[{}] feed search: {rate:.0} lines/s: p99 {}, {} of {} delivered: {}",
                self.label,
                format::duration_us(step.latency.p99_us),
                step.received,
                step.expected,
                if ok { "held" } else { "not held" }
            );
            steps.push(step);
            if ok {
                held = Some(rate);
            } else {
                failed = Some(rate);
            }
            rate = match (held, failed) {
                (Some(h), None) => h * 2.0,
                // Below a line a second there is nothing left to find.
                (None, Some(f)) if f / 2.0 < 1.0 => break,
                (None, Some(f)) => f / 2.0,
                (Some(h), Some(f)) if f / h > SEARCH_PRECISION => (h + f) / 2.0,
                _ => break,
            };
        }
        Ok((held, steps))
    }

    /// Sends `count` lines from sequence number `*first`, all at once
    /// (`rate` `None`) or paced at `rate` a second, and waits until every
    /// connection has every one of them or the message timeout passes
    /// after the last was sent; advances `*first` past them.
    pub(super) fn stream(
        &mut self,
        kind: &str,
        first: &mut u32,
        count: u32,
        rate: Option<f64>,
    ) -> Result<StreamReport, Error> {
        let o = self.options;
        let start_seq = *first;
        *first += count;
        let nap_us = o.nap_us * self.fleet.len() as u64;
        // With a deploy, the latency of the lines before its signal and of
        // those of the window after it are kept apart.
        // (A window with no line in it, at a slow feed, is left out.)
        let windows: Vec<(&str, (u32, u32))> = match (o.roll_at_secs, rate) {
            (Some(at), Some(rate)) => {
                let signal = start_seq + (at * rate) as u32;
                let after = signal + (o.roll_window_secs * rate) as u32;
                let end = start_seq + count;
                vec![
                    ("before the deploy", (start_seq, signal.min(end))),
                    ("the deploy's window", (signal.min(end), after.min(end))),
                ]
            }
            _ => Vec::new(),
        };
        let windows: Vec<_> = windows.into_iter().filter(|(_, (a, b))| a < b).collect();
        let ranges = windows.iter().map(|&(_, range)| range).collect();
        let expected = self.fleet.arm_stream((start_seq, count), nap_us, ranges)?;
        let connections: u64 = expected.iter().map(|&e| u64::from(e)).sum();
        let mut done: Vec<bool> = expected.iter().map(|&e| e == 0).collect();
        let probes = match o.probe_ms {
            Some(ms) => Some(Probes::start(self.addr, Duration::from_millis(ms))?),
            None => None,
        };
        let before = CpuMark::take(self.target.usage()?.cpu_ns, self.client_cpu_ns()?)?;
        let start = Instant::now();
        let start_ns = sys::now_ns();
        let mut sent = 0u32;
        let mut lines = Vec::new();
        let mut deadline = None;
        let mut checked = start;
        let mut complete = false;
        let mut storms: Vec<Duration> = o
            .storm_at_secs
            .iter()
            .map(|&s| Duration::from_secs_f64(s))
            .collect();
        storms.sort_unstable_by(|a, b| b.cmp(a));
        let mut kill = o.kill_instance_at_secs.map(Duration::from_secs_f64);
        let mut roll = o.roll_at_secs.map(Duration::from_secs_f64);
        let mut broker_down = o.broker_outage_at_secs.map(Duration::from_secs_f64);
        let mut broker_up =
            broker_down.map(|at| at + Duration::from_secs_f64(o.broker_outage_secs));
        loop {
            let now = Instant::now();
            if broker_down.is_some_and(|at| now >= start + at) {
                self.target.stop_broker()?;
                eprintln!("[{}] broker stopped", self.label);
                broker_down = None;
            } else if broker_down.is_none() && broker_up.is_some_and(|at| now >= start + at) {
                self.target.start_broker()?;
                eprintln!("[{}] broker started again", self.label);
                broker_up = None;
            }
            if roll.is_some_and(|at| now >= start + at) {
                let pid = self.target.roll(&o.roll_signal)?;
                eprintln!(
                    "[{}] rolling restart asked of process {pid} (SIG{})",
                    self.label, o.roll_signal
                );
                roll = None;
            }
            if kill.is_some_and(|at| now >= start + at) {
                let pid = self.target.kill_an_instance()?;
                eprintln!("[{}] killed instance process {pid} (SIGKILL)", self.label);
                kill = None;
            }
            if storms.last().is_some_and(|&at| now >= start + at) {
                eprintln!(
                    "[{}] reconnect storm: every connection dropped and dialed again",
                    self.label
                );
                self.fleet.storm(o.storm_within_ms)?;
                storms.pop();
            }
            let due = match rate {
                None => count,
                Some(r) => (((now - start).as_secs_f64() * r) as u32 + 1).min(count),
            };
            if sent < due {
                lines.clear();
                let sent_ns = sys::now_ns();
                for seq in start_seq + sent..start_seq + due {
                    let line =
                        message::encode_padded(Stamp { seq, sent_ns }, o.payload_bytes, o.padding)
                            .expect("payload size checked up front");
                    lines.extend_from_slice(&o.line_prefix());
                    lines.extend_from_slice(&line);
                    lines.push(b'\n');
                }
                self.target.send_lines(&lines)?;
                sent = due;
                if sent == count {
                    deadline = Some(Instant::now() + o.message_timeout());
                }
            }
            if sent == count && done.iter().all(|&d| d) {
                complete = true;
                break;
            }
            if deadline.is_some_and(|d| now >= d) {
                eprintln!(
                    "[{}] {kind} of {count} lines: not every connection had every line before the timeout",
                    self.label
                );
                break;
            }
            if now >= checked + CHECK_EVERY {
                self.check()?;
                checked = now;
            }
            let wait = match rate {
                Some(r) if sent < count => {
                    let next_due = start + Duration::from_secs_f64(f64::from(sent) / r);
                    next_due.saturating_duration_since(Instant::now())
                }
                _ => CHECK_EVERY,
            };
            if let Some((
                index,
                Report::StreamProgress {
                    first: f, done: d, ..
                },
            )) = self.fleet.next_report(wait)?
            {
                if f == start_seq && d {
                    done[index] = true;
                }
            }
        }
        let after = CpuMark::take(self.target.usage()?.cpu_ns, self.client_cpu_ns()?)?;
        let probes = probes.map(Probes::finish).transpose()?;
        self.warn_if_busy(after.others_since(&before), &format!("during the {kind}"));
        let receipts = self.fleet.end_stream(start_seq)?;
        let completion = receipts.last_ns.saturating_sub(start_ns) as f64 / 1e9;
        Ok(StreamReport {
            kind: kind.into(),
            lines: count,
            payload_bytes: o.payload_bytes,
            rate,
            connections,
            expected: connections * u64::from(count),
            received: receipts.received,
            complete,
            completion_secs: completion,
            deliveries_per_sec: receipts.received as f64 / completion.max(1e-9),
            latency: LatencyReport::from_histogram(&receipts.histogram()),
            windows: windows
                .into_iter()
                .enumerate()
                .filter_map(|(index, (what, (start, end)))| {
                    let histogram = receipts.window_histogram(index)?;
                    let what = format!(
                        "{what} (lines {} to {})",
                        start - start_seq + 1,
                        end - start_seq
                    );
                    Some((what, LatencyReport::from_histogram(&histogram)))
                })
                .collect(),
            server_cpu_secs: after.server_ns.saturating_sub(before.server_ns) as f64 / 1e9,
            client_cpu_secs: after.client_ns.saturating_sub(before.client_ns) as f64 / 1e9,
            machine_cpu_secs: after.machine_ns.saturating_sub(before.machine_ns) as f64 / 1e9,
            probes,
            redials: receipts.redial_peak().1,
            redials_peak_per_sec: receipts.redial_peak().0,
        })
    }
}

/// Whether a feed held: every line reached every connection, with p99
/// latency at most `max_p99_ms`.
pub(super) fn is_held(feed: &StreamReport, max_p99_ms: f64) -> bool {
    feed.complete && feed.received >= feed.expected && feed.latency.p99_us <= max_p99_ms * 1e3
}

//! The results of a run: summaries computed from what was observed, and
//! their rendering as text, as a comparison table, or as JSON (serde).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::stats::MessageProgress;

/// Everything measured for one server in one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Label of the server.
    pub server: String,
    /// Round of a comparison this run belongs to (from 1).
    pub round: u32,
    /// The shell command that started it.
    pub command: String,
    /// Connection setup.
    pub connections: ConnectionReport,
    /// Server memory.
    pub memory: MemoryReport,
    /// CPU time.
    pub cpu: CpuReport,
    /// Broadcast fan-out.
    pub broadcast: BroadcastReport,
    /// Send-to-receipt latency over all deliveries.
    pub latency: LatencyReport,
    /// Delivery anomalies.
    pub delivery: DeliveryReport,
    /// Conditions that make the numbers less trustworthy.
    pub warnings: Vec<String>,
}

/// Connection setup.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectionReport {
    /// Connections asked for.
    pub requested: u64,
    /// Connections upgraded and still open after setup.
    pub open: u64,
    /// Failures by kind, over the whole run.
    pub failures: BTreeMap<String, u64>,
    /// From the first connect to the last upgrade.
    pub setup_secs: f64,
    /// Upgraded connections per second of setup.
    pub setup_rate: f64,
}

/// Server memory (resident set, summed over its process tree).
#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    /// Before the first connection.
    pub baseline_rss_bytes: u64,
    /// With all connections open and idle.
    pub open_rss_bytes: u64,
    /// After the last broadcast.
    pub end_rss_bytes: u64,
    /// `(open - baseline) / open connections`.
    pub bytes_per_conn: f64,
}

/// CPU time in seconds.
#[derive(Debug, Clone, Serialize)]
pub struct CpuReport {
    /// Server, during connection setup.
    pub server_setup_secs: f64,
    /// Server, from the first broadcast to the end of the last.
    pub server_broadcast_secs: f64,
    /// `server_broadcast_secs` per expected delivery, in µs: the server's
    /// CPU cost of one message to one connection (all threads together).
    pub server_us_per_delivery: f64,
    /// This client, over the same broadcast span.
    pub client_broadcast_secs: f64,
    /// All CPUs of the machine, over the same span (server, client, softirq
    /// work not charged to them, and anything else that ran).
    pub machine_broadcast_secs: f64,
    /// Wall-clock length of the broadcast span.
    pub broadcast_wall_secs: f64,
}

/// Broadcast fan-out.
#[derive(Debug, Clone, Serialize)]
pub struct BroadcastReport {
    /// Messages sent.
    pub messages: u32,
    /// Payload size of each.
    pub payload_bytes: usize,
    /// Messages that reached every connection open when they were sent.
    pub complete: u32,
    /// Per-connection fan-out time over the complete messages, in µs.
    pub per_conn_us: Option<Spread>,
    /// Each message in order.
    pub per_message: Vec<MessageFanout>,
}

/// Fan-out of one message.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MessageFanout {
    /// Sequence number.
    pub seq: u32,
    /// Connections open when it was sent.
    pub expected: u32,
    /// Connections that received it.
    pub received: u32,
    /// From the write to the server's stdin to the first receipt, in µs.
    pub first_us: Option<f64>,
    /// From the write to the server's stdin to the last receipt, in µs.
    pub last_us: Option<f64>,
    /// `last_us / expected`, for a complete message.
    pub per_conn_us: Option<f64>,
}

/// Median, minimum and maximum of a set of values.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Spread {
    /// Median (mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

/// Latency distribution in µs.
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
    /// Percentiles: 50, 75, 95, 98, 99, 99.9.
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
}

/// Delivery anomalies over all connections and messages.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryReport {
    /// Expected deliveries that never happened.
    pub lost: u64,
    /// Messages a connection received again (or after a later one).
    pub duplicates: u64,
    /// Deliveries that jumped ahead of the next message in sequence.
    pub out_of_order: u64,
    /// Payloads that were not a valid message.
    pub corrupt: u64,
}

impl Spread {
    /// The spread of `values`; `None` if there are none.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => sorted[n / 2],
            _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        Some(Spread {
            median,
            min: sorted[0],
            max: sorted[n - 1],
        })
    }
}

impl MessageFanout {
    /// The fan-out of each message from its progress record.
    pub fn from_progress(messages: &[MessageProgress]) -> Vec<MessageFanout> {
        let since_send =
            |m: &MessageProgress, t: u64| (t != 0).then(|| us(t.saturating_sub(m.sent_ns)));
        messages
            .iter()
            .zip(1..)
            .map(|(m, seq)| {
                let last_us = since_send(m, m.last_ns);
                let complete = m.expected > 0 && m.received >= m.expected;
                MessageFanout {
                    seq,
                    expected: m.expected,
                    received: m.received,
                    first_us: since_send(m, m.first_ns),
                    last_us,
                    per_conn_us: last_us
                        .filter(|_| complete)
                        .map(|t| t / f64::from(m.expected)),
                }
            })
            .collect()
    }
}

impl BroadcastReport {
    /// Summarises the progress of `messages` of `payload_bytes` each.
    pub fn new(messages: &[MessageProgress], payload_bytes: usize) -> BroadcastReport {
        let per_message = MessageFanout::from_progress(messages);
        let per_conn: Vec<f64> = per_message.iter().filter_map(|m| m.per_conn_us).collect();
        BroadcastReport {
            messages: per_message.len() as u32,
            payload_bytes,
            complete: per_conn.len() as u32,
            per_conn_us: Spread::of(&per_conn),
            per_message,
        }
    }
}

impl LatencyReport {
    /// Summarises a histogram of nanoseconds.
    pub fn from_histogram(h: &Histogram<u64>) -> LatencyReport {
        let q = |quantile: f64| us(h.value_at_quantile(quantile));
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
        }
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// A byte count with a binary unit, e.g. `4.3 MiB`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A duration given in µs, in ms above 10 ms.
fn duration_us(value: f64) -> String {
    if value >= 10_000.0 {
        format!("{:.1} ms", value / 1e3)
    } else {
        format!("{value:.1} µs")
    }
}

fn failures(failures: &BTreeMap<String, u64>) -> String {
    if failures.is_empty() {
        return "none".into();
    }
    let parts: Vec<String> = failures
        .iter()
        .map(|(kind, n)| format!("{n} {kind}"))
        .collect();
    parts.join(", ")
}

impl RunReport {
    /// Multi-line human-readable report.
    pub fn render_text(&self) -> String {
        let c = &self.connections;
        let m = &self.memory;
        let b = &self.broadcast;
        let l = &self.latency;
        let d = &self.delivery;
        let cpu = &self.cpu;
        let mut out = String::new();
        let _ = writeln!(out, "server       {}  ({})", self.server, self.command);
        let _ = writeln!(
            out,
            "connections  {} open of {} in {:.2} s ({:.0}/s); failures: {}",
            c.open,
            c.requested,
            c.setup_secs,
            c.setup_rate,
            failures(&c.failures)
        );
        let _ = writeln!(
            out,
            "memory       baseline {}, open {}, end {}: {:.1} B per connection",
            bytes(m.baseline_rss_bytes),
            bytes(m.open_rss_bytes),
            bytes(m.end_rss_bytes),
            m.bytes_per_conn
        );
        let _ = write!(
            out,
            "fan-out      {}/{} messages of {} B complete",
            b.complete, b.messages, b.payload_bytes
        );
        match b.per_conn_us {
            Some(s) => {
                let _ = writeln!(
                    out,
                    "; per connection median {:.2} µs, min {:.2}, max {:.2}",
                    s.median, s.min, s.max
                );
            }
            None => out.push('\n'),
        }
        let _ = writeln!(
            out,
            "latency      n={} min {} p50 {} p75 {} p95 {} p98 {} p99 {} p99.9 {} max {} (mean {}, sd {})",
            l.count,
            duration_us(l.min_us),
            duration_us(l.p50_us),
            duration_us(l.p75_us),
            duration_us(l.p95_us),
            duration_us(l.p98_us),
            duration_us(l.p99_us),
            duration_us(l.p999_us),
            duration_us(l.max_us),
            duration_us(l.mean_us),
            duration_us(l.stddev_us)
        );
        let _ = writeln!(
            out,
            "delivery     lost {}, duplicates {}, out of order {}, corrupt {}",
            d.lost, d.duplicates, d.out_of_order, d.corrupt
        );
        let _ = writeln!(
            out,
            "cpu          server {:.2} s in setup; in {:.2} s of broadcasts: server {:.2} s ({:.2} µs per delivery), client {:.2} s, machine {:.2} s",
            cpu.server_setup_secs,
            cpu.broadcast_wall_secs,
            cpu.server_broadcast_secs,
            cpu.server_us_per_delivery,
            cpu.client_broadcast_secs,
            cpu.machine_broadcast_secs
        );
        for warning in &self.warnings {
            let _ = writeln!(out, "WARNING      {warning}");
        }
        out
    }
}

/// One table comparing runs; the `×base` column divides each run's median
/// fan-out per connection by that of the run of the server labelled
/// `baseline` in the same round.
pub fn render_table(runs: &[RunReport], baseline: &str) -> String {
    let rows: Vec<Vec<(&str, String)>> = runs
        .iter()
        .map(|run| table_row(run, runs, baseline))
        .collect();
    let Some(first) = rows.first() else {
        return String::new();
    };
    let header: Vec<(&str, String)> = first
        .iter()
        .map(|&(title, _)| (title, title.to_string()))
        .collect();
    let lines: Vec<&Vec<(&str, String)>> = std::iter::once(&header).chain(&rows).collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|col| {
            lines
                .iter()
                .map(|r| r[col].1.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in lines {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(col, ((_, cell), &w))| {
                let pad = " ".repeat(w - cell.chars().count());
                if col == 0 {
                    format!("{cell}{pad}")
                } else {
                    format!("{pad}{cell}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The cells of one run's table row, each with its column title.
fn table_row(run: &RunReport, runs: &[RunReport], baseline: &str) -> Vec<(&'static str, String)> {
    let spread = run.broadcast.per_conn_us;
    let cell = |f: fn(&Spread) -> f64| spread.map_or("-".into(), |s| format!("{:.2}", f(&s)));
    let base = runs
        .iter()
        .find(|r| r.server == baseline && r.round == run.round)
        .and_then(|r| r.broadcast.per_conn_us);
    let ratio = match (spread, base) {
        (Some(s), Some(b)) if b.median > 0.0 => format!("{:.2}", s.median / b.median),
        _ => "-".into(),
    };
    vec![
        ("server", run.server.clone()),
        ("round", run.round.to_string()),
        ("open", run.connections.open.to_string()),
        (
            "failed",
            run.connections.failures.values().sum::<u64>().to_string(),
        ),
        ("setup/s", format!("{:.0}", run.connections.setup_rate)),
        ("B/conn", format!("{:.1}", run.memory.bytes_per_conn)),
        ("fan-out µs/conn med", cell(|s| s.median)),
        ("min", cell(|s| s.min)),
        ("max", cell(|s| s.max)),
        ("×base", ratio),
        (
            "cpu µs/conn",
            format!("{:.2}", run.cpu.server_us_per_delivery),
        ),
        ("p50 ms", format!("{:.1}", run.latency.p50_us / 1e3)),
        ("p99 ms", format!("{:.1}", run.latency.p99_us / 1e3)),
        ("lost", run.delivery.lost.to_string()),
        ("dup", run.delivery.duplicates.to_string()),
        ("ooo", run.delivery.out_of_order.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(
        sent_ns: u64,
        expected: u32,
        received: u32,
        first: u64,
        last: u64,
    ) -> MessageProgress {
        MessageProgress {
            sent_ns,
            expected,
            received,
            first_ns: first,
            last_ns: last,
        }
    }

    fn sample(server: &str, round: u32, per_conn: [f64; 3]) -> RunReport {
        let messages: Vec<MessageProgress> = per_conn
            .iter()
            .map(|&p| progress(1_000, 100, 100, 2_000, 1_000 + (p * 100.0 * 1e3) as u64))
            .collect();
        let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        h.record(250_000_000).unwrap();
        RunReport {
            server: server.into(),
            round,
            command: format!("{server} {{port}}"),
            connections: ConnectionReport {
                requested: 100,
                open: 100,
                failures: BTreeMap::new(),
                setup_secs: 0.5,
                setup_rate: 200.0,
            },
            memory: MemoryReport {
                baseline_rss_bytes: 1 << 20,
                open_rss_bytes: (1 << 20) + 12_800,
                end_rss_bytes: 2 << 20,
                bytes_per_conn: 128.0,
            },
            cpu: CpuReport {
                server_setup_secs: 0.1,
                server_broadcast_secs: 0.2,
                server_us_per_delivery: 666.7,
                client_broadcast_secs: 0.3,
                machine_broadcast_secs: 0.6,
                broadcast_wall_secs: 1.0,
            },
            broadcast: BroadcastReport::new(&messages, 32),
            latency: LatencyReport::from_histogram(&h),
            delivery: DeliveryReport {
                lost: 0,
                duplicates: 0,
                out_of_order: 0,
                corrupt: 0,
            },
            warnings: vec!["machine busy".into()],
        }
    }

    #[test]
    fn spreads() {
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(
            Spread::of(&[3.0, 1.0, 2.0]),
            Some(Spread {
                median: 2.0,
                min: 1.0,
                max: 3.0
            })
        );
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
    }

    #[test]
    fn fanout_per_message() {
        let messages = [
            progress(1_000, 4, 4, 3_000, 9_000),
            progress(20_000, 4, 3, 21_000, 25_000),
            progress(30_000, 4, 0, 0, 0),
        ];
        let report = BroadcastReport::new(&messages, 32);
        assert_eq!(report.complete, 1);
        assert_eq!(
            report.per_conn_us,
            Some(Spread {
                median: 2.0,
                min: 2.0,
                max: 2.0
            })
        );
        let m = &report.per_message;
        assert_eq!(
            (m[0].first_us, m[0].last_us, m[0].per_conn_us),
            (Some(2.0), Some(8.0), Some(2.0))
        );
        assert_eq!((m[1].last_us, m[1].per_conn_us), (Some(5.0), None));
        assert_eq!((m[2].first_us, m[2].last_us), (None, None));
    }

    #[test]
    fn text_report_mentions_the_headline_numbers() {
        let text = sample("wspush", 1, [12.0, 13.0, 12.5]).render_text();
        assert!(text.contains("100 open of 100"), "{text}");
        assert!(text.contains("128.0 B per connection"), "{text}");
        assert!(text.contains("3/3 messages of 32 B complete; per connection median 12.50 µs, min 12.00, max 13.00"), "{text}");
        assert!(text.contains("min 250.0 ms p50 250.1 ms"), "{text}");
        assert!(text.contains("failures: none"), "{text}");
        assert!(
            text.contains("server 0.20 s (666.70 µs per delivery), client 0.30 s, machine 0.60 s"),
            "{text}"
        );
        assert!(text.ends_with("WARNING      machine busy\n"), "{text}");
    }

    #[test]
    fn table_ratios_use_the_baseline_of_the_same_round() {
        let runs = [
            sample("wspush", 1, [12.0, 12.0, 12.0]),
            sample("floor", 1, [10.0, 10.0, 10.0]),
            sample("wspush", 2, [30.0, 30.0, 30.0]),
            sample("floor", 2, [20.0, 20.0, 20.0]),
        ];
        let table = render_table(&runs, "floor");
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 5);
        assert!(
            lines[0].starts_with("server  round  open  failed"),
            "{table}"
        );
        let ratio = |line: &str| line.split_whitespace().nth(9).unwrap().to_string();
        assert_eq!(ratio(lines[1]), "1.20");
        assert_eq!(ratio(lines[2]), "1.00");
        assert_eq!(ratio(lines[3]), "1.50");
        assert_eq!(ratio(lines[4]), "1.00");
        assert_eq!(
            render_table(&runs[..1], "floor").lines().nth(1).map(ratio),
            Some("-".into())
        );
    }

    #[test]
    fn json_has_nested_sections() {
        let json = serde_json::to_value(sample("floor", 1, [1.0, 2.0, 3.0])).unwrap();
        assert_eq!(json["memory"]["bytes_per_conn"], 128.0);
        assert_eq!(json["broadcast"]["per_conn_us"]["median"], 2.0);
        assert_eq!(
            json["broadcast"]["per_message"].as_array().unwrap().len(),
            3
        );
    }

    #[test]
    fn units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 * 1024 / 2), "1.5 MiB");
        assert_eq!(duration_us(12.34), "12.3 µs");
        assert_eq!(duration_us(250_000.0), "250.0 ms");
    }
}

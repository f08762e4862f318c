//! The report: the results of a run, rendered as a human-readable table or
//! as JSON (serde), and as an SVG plot ([`plot`]). Built on
//! [`crate::observe`] only.

pub mod plot;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::observe::format::{bytes, duration_us, failures, grouped, render_columns, us};
use crate::observe::latency::LatencyReport;
use crate::observe::latency::ProbeReport;
use crate::observe::ramp::RampSummary;
use crate::observe::server_latency::ServerLatencyReport;
use crate::observe::stats::{Payloads, Receipts};

/// What a run is called in its report.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// Label of the server.
    pub server: String,
    /// The command that started it (or how it was reached).
    pub command: String,
    /// Round of a comparison (from 1).
    pub round: u32,
}

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
    /// Server (and client) memory.
    pub memory: MemoryReport,
    /// CPU time.
    pub cpu: CpuReport,
    /// Broadcast fan-out.
    pub broadcast: BroadcastReport,
    /// Send-to-receipt latency over all deliveries.
    pub latency: LatencyReport,
    /// Delivery anomalies (of every message, streams included).
    pub delivery: DeliveryReport,
    /// Streams after the broadcasts one at a time: a burst, a feed.
    pub streams: Vec<StreamReport>,
    /// The steps of the feed rate search.
    pub feed_search: Vec<StreamReport>,
    /// The highest feed rate whose p99 stayed under the limit, held for
    /// the whole feed (`None`: not searched, or nothing held).
    pub max_feed_rate: Option<f64>,
    /// The server's own counts at the end (`push --metrics-from`).
    pub counted: Vec<(String, u64)>,
    /// The server's latency histogram over the messages sent one at a
    /// time against the clients' (`push --metrics-from`).
    pub server_latency: Option<ServerLatencyReport>,
    /// Conditions that make the numbers less trustworthy.
    pub warnings: Vec<String>,
}

/// A stream of lines sent without waiting for each other: a burst written
/// at once, or a feed at a steady rate.
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    /// `burst` or `feed`.
    pub kind: String,
    /// Lines sent.
    pub lines: u32,
    /// Payload size of each.
    pub payload_bytes: usize,
    /// Lines per second offered (a feed), `None` for a burst.
    pub rate: Option<f64>,
    /// Connections open when it began (each expected every line).
    pub connections: u64,
    /// Deliveries expected: connections × lines.
    pub expected: u64,
    /// Deliveries made.
    pub received: u64,
    /// Every connection had every line before the message timeout.
    pub complete: bool,
    /// From the first line written to the last delivery, in seconds.
    pub completion_secs: f64,
    /// `received / completion_secs`.
    pub deliveries_per_sec: f64,
    /// Write-to-receipt latency of its deliveries.
    pub latency: LatencyReport,
    /// The same of some of its lines apart: what they were (e.g. `before
    /// the deploy`), and their latency.
    pub windows: Vec<(String, LatencyReport)>,
    /// Server CPU time over it, in seconds.
    pub server_cpu_secs: f64,
    /// The client's (this process and its workers) over it, in seconds.
    pub client_cpu_secs: f64,
    /// All CPUs of the machine over it, in seconds.
    pub machine_cpu_secs: f64,
    /// What the responsiveness probes measured meanwhile (`--probe-ms`).
    pub probes: Option<ProbeReport>,
    /// Dropped connections dialed again during it.
    pub redials: u64,
    /// The most of them in any one second (windows sliding by 100 ms).
    pub redials_peak_per_sec: u64,
}

impl StreamReport {
    /// One line: what was sent, how long it took, how fast, how late.
    pub fn render(&self) -> String {
        let what = match self.rate {
            Some(rate) => format!("feed of {rate:.0} lines/s"),
            None => "burst".to_string(),
        };
        let probes = self.probes.as_ref().map_or(String::new(), |p| {
            let stopped = if p.stopped.is_empty() {
                String::new()
            } else {
                format!(" (stopped: {})", p.stopped.join("; "))
            };
            let refused = match p.upgrades_refused {
                0 => String::new(),
                n => format!(", {n} refused"),
            };
            let redialed = match p.pings_redialed {
                0 => String::new(),
                n => format!(", closed {n}× and dialed again"),
            };
            format!(
                "; meanwhile upgrade p50 {} p99 {} ({} probes{refused}), ping p50 {} p99 {} ({} probes{redialed}){stopped}",
                duration_us(p.upgrade.p50_us),
                duration_us(p.upgrade.p99_us),
                p.upgrade.count,
                duration_us(p.ping.p50_us),
                duration_us(p.ping.p99_us),
                p.ping.count
            )
        });
        let windows: String = self
            .windows
            .iter()
            .map(|(what, l)| {
                format!(
                    "; {what}: latency p50 {} p99 {} max {} ({} deliveries)",
                    duration_us(l.p50_us),
                    duration_us(l.p99_us),
                    duration_us(l.max_us),
                    grouped(l.count)
                )
            })
            .collect();
        let redials = match self.redials {
            0 => String::new(),
            n => format!(
                "; {} redials, at most {} in a second",
                grouped(n),
                grouped(self.redials_peak_per_sec)
            ),
        };
        format!(
            "{what}: {} lines of {} B to {} connections, {} of {} delivered{} in {:.3} s, {}/s; latency p50 {} p99 {} max {}; CPU server {:.2} s, client {:.2} s, machine {:.2} s{windows}{probes}{redials}",
            grouped(self.lines.into()),
            self.payload_bytes,
            grouped(self.connections),
            grouped(self.received),
            grouped(self.expected),
            if self.complete { "" } else { " (timed out)" },
            self.completion_secs,
            grouped(self.deliveries_per_sec.round() as u64),
            duration_us(self.latency.p50_us),
            duration_us(self.latency.p99_us),
            duration_us(self.latency.max_us),
            self.server_cpu_secs,
            self.client_cpu_secs,
            self.machine_cpu_secs,
        )
    }
}

/// Connection setup.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectionReport {
    /// Connections asked for.
    pub requested: u64,
    /// Connections upgraded and still open after the setup.
    pub open: u64,
    /// Connections that failed, over the whole run.
    pub failed: u64,
    /// Failures by kind, over the whole run.
    pub failures: BTreeMap<String, u64>,
    /// What connections that asked for positions were told first, by
    /// status (with `--positions`).
    #[serde(default)]
    pub statuses: BTreeMap<String, u64>,
    /// From the first connect to the last upgrade.
    pub setup_secs: f64,
    /// Upgrades per second: average, slowest and fastest whole second.
    pub rate: RampSummary,
    /// Client worker processes (or threads).
    pub workers: usize,
    /// Source addresses used.
    pub sources: u8,
    /// `(seconds, connections opened)` through the setup.
    pub ramp: Vec<(f64, u64)>,
}

/// Resident (RSS) and proportional (PSS) memory, summed over processes.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Memory {
    /// Sum of RSS: shared pages counted once per process.
    pub rss_bytes: u64,
    /// Sum of PSS: shared pages split among the processes.
    pub pss_bytes: u64,
}

impl From<crate::observe::procfs::Usage> for Memory {
    fn from(u: crate::observe::procfs::Usage) -> Memory {
        Memory {
            rss_bytes: u.rss_bytes,
            pss_bytes: u.pss_bytes,
        }
    }
}

/// Server memory (summed over its process tree) and the client's.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    /// Processes in the server's tree (a supervisor and its instances).
    pub processes: u32,
    /// Listening sockets on the server's port (instances behind `SO_REUSEPORT`).
    pub listeners: usize,
    /// Before the first connection.
    pub baseline: Memory,
    /// With all connections open and idle.
    pub open: Memory,
    /// After the last broadcast.
    pub end: Memory,
    /// `open - baseline` RSS.
    pub rss_growth_bytes: i64,
    /// `open - baseline` PSS.
    pub pss_growth_bytes: i64,
    /// RSS growth per open connection.
    pub rss_per_conn: f64,
    /// PSS growth per open connection.
    pub pss_per_conn: f64,
    /// The client's worker processes with the connections open (none when
    /// the workers are threads).
    pub client: Option<Memory>,
}

/// CPU time, in seconds and as a share of one CPU (100% = one CPU busy).
#[derive(Debug, Clone, Serialize)]
pub struct CpuReport {
    /// Server, during the connection setup.
    pub server_setup_secs: f64,
    /// `server_setup_secs` over the setup time, in %.
    pub setup_percent: f64,
    /// Server CPU time during the setup per connection opened, in µs.
    pub server_setup_us_per_conn: f64,
    /// The client (this process and its workers) during the setup per
    /// connection opened, in µs.
    pub client_setup_us_per_conn: f64,
    /// Interrupt time (nearly all softirq: the loopback TCP work of both
    /// ends) during the setup per connection opened, in µs. Not a part of
    /// its own: without `CONFIG_IRQ_TIME_ACCOUNTING` it is included in the
    /// CPU time of the process it interrupted (or of `ksoftirqd`).
    pub interrupts_setup_us_per_conn: f64,
    /// All CPUs of the machine during the setup per connection opened, in
    /// µs: server, client, kernel work charged to neither, and anything
    /// else that ran. On loopback most of the TCP work of both ends runs in
    /// whichever process sends the packet.
    pub machine_setup_us_per_conn: f64,
    /// Server, during the idle period.
    pub server_idle_secs: f64,
    /// Length of the idle period.
    pub idle_wall_secs: f64,
    /// `server_idle_secs` over the idle period, in %.
    pub idle_percent: f64,
    /// Server, from the first broadcast to the end of the last.
    pub server_broadcast_secs: f64,
    /// Wall-clock length of the broadcast span (gaps included).
    pub broadcast_wall_secs: f64,
    /// `server_broadcast_secs` over the broadcast span, in %.
    pub broadcast_percent: f64,
    /// `server_broadcast_secs` per expected delivery, in µs: the server's
    /// CPU cost of one message to one connection (all processes together).
    pub server_us_per_delivery: f64,
    /// The client (this process and its workers), over the broadcast span.
    pub client_broadcast_secs: f64,
    /// All CPUs of the machine, over the same span (server, client, softirq
    /// work not charged to them, and anything else that ran).
    pub machine_broadcast_secs: f64,
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
    /// Time until the last connection had it, over the complete messages, in µs.
    pub completion_us: Option<Spread>,
    /// The same divided by the connections, in µs.
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
    /// From the write to the server to the first receipt, in µs.
    pub first_us: Option<f64>,
    /// From the write to the server to the last receipt, in µs.
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
    /// What the payloads came to on the wire and plain.
    pub payloads: Payloads,
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
    /// The fan-out of message `seq`, sent at `sent_ns`, from its receipts.
    pub fn new(seq: u32, sent_ns: u64, r: &Receipts) -> MessageFanout {
        let since_send = |t: u64| (t != 0).then(|| us(t.saturating_sub(sent_ns)));
        let last_us = since_send(r.last_ns);
        let complete = r.expected > 0 && r.received >= r.expected;
        MessageFanout {
            seq,
            expected: r.expected,
            received: r.received,
            first_us: since_send(r.first_ns),
            last_us,
            per_conn_us: last_us
                .filter(|_| complete)
                .map(|t| t / f64::from(r.expected)),
        }
    }
}

impl BroadcastReport {
    /// Summarises messages sent at `sent_ns[i]` with receipts `receipts[i]`.
    pub fn new(sent_ns: &[u64], receipts: &[Receipts], payload_bytes: usize) -> BroadcastReport {
        let per_message: Vec<MessageFanout> = sent_ns
            .iter()
            .zip(receipts)
            .zip(1..)
            .map(|((&sent, r), seq)| MessageFanout::new(seq, sent, r))
            .collect();
        let complete: Vec<&MessageFanout> = per_message
            .iter()
            .filter(|m| m.per_conn_us.is_some())
            .collect();
        let completion: Vec<f64> = complete.iter().filter_map(|m| m.last_us).collect();
        let per_conn: Vec<f64> = complete.iter().filter_map(|m| m.per_conn_us).collect();
        BroadcastReport {
            messages: sent_ns.len() as u32,
            payload_bytes,
            complete: complete.len() as u32,
            completion_us: Spread::of(&completion),
            per_conn_us: Spread::of(&per_conn),
            per_message,
        }
    }
}

impl RunReport {
    /// Multi-line human-readable report.
    pub fn render_text(&self) -> String {
        let c = &self.connections;
        let m = &self.memory;
        let b = &self.broadcast;
        let d = &self.delivery;
        let cpu = &self.cpu;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} (round {}): {}",
            self.server, self.round, self.command
        );
        let rate = &c.rate;
        let _ = writeln!(
            out,
            "  setup        {} of {} open in {:.2} s: {}/s average, slowest second {}, fastest {} ({} workers, {} source addresses)",
            grouped(c.open),
            grouped(c.requested),
            c.setup_secs,
            grouped(rate.average.round() as u64),
            rate.slowest_second.map_or("-".into(), grouped),
            rate.fastest_second.map_or("-".into(), grouped),
            c.workers,
            c.sources
        );
        let _ = writeln!(out, "  failures     {}", failures(&c.failures));
        if !c.statuses.is_empty() {
            let _ = writeln!(out, "  told first   {}", failures(&c.statuses));
        }
        let _ = writeln!(
            out,
            "  memory       {} server processes, {} listening sockets",
            m.processes, m.listeners
        );
        let row = |name: &str, pick: fn(&Memory) -> u64, growth: i64, per_conn: f64| {
            format!(
                "    {name}  baseline {:>10}  open {:>10}  end {:>10}  growth {:>10} = {per_conn:.1} B/conn\n",
                bytes(pick(&m.baseline) as i64),
                bytes(pick(&m.open) as i64),
                bytes(pick(&m.end) as i64),
                bytes(growth),
            )
        };
        out.push_str(&row(
            "RSS sum",
            |x| x.rss_bytes,
            m.rss_growth_bytes,
            m.rss_per_conn,
        ));
        out.push_str(&row(
            "PSS sum",
            |x| x.pss_bytes,
            m.pss_growth_bytes,
            m.pss_per_conn,
        ));
        if let Some(client) = m.client {
            let _ = writeln!(
                out,
                "  client       RSS {}, PSS {} ({} per connection)",
                bytes(client.rss_bytes as i64),
                bytes(client.pss_bytes as i64),
                bytes((client.pss_bytes as f64 / (c.open.max(1) as f64)) as i64)
            );
        }
        let _ = writeln!(
            out,
            "  server CPU   setup {:.1}%  idle {:.2}% (over {:.0} s)  broadcast {:.1}% ({:.3} µs per delivery)  [100% = one CPU]",
            cpu.setup_percent,
            cpu.idle_percent,
            cpu.idle_wall_secs,
            cpu.broadcast_percent,
            cpu.server_us_per_delivery
        );
        let _ = writeln!(
            out,
            "  setup CPU    per connection: server {:.1} µs, client {:.1} µs, whole machine {:.1} µs (of all that, in softirq {:.1} µs)",
            cpu.server_setup_us_per_conn,
            cpu.client_setup_us_per_conn,
            cpu.machine_setup_us_per_conn,
            cpu.interrupts_setup_us_per_conn
        );
        let _ = writeln!(
            out,
            "  other CPU    in {:.2} s of broadcasts: client {:.2} s, machine {:.2} s",
            cpu.broadcast_wall_secs, cpu.client_broadcast_secs, cpu.machine_broadcast_secs
        );
        let _ = write!(
            out,
            "  fan-out      {}/{} messages of {} B complete",
            b.complete, b.messages, b.payload_bytes
        );
        match (b.completion_us, b.per_conn_us) {
            (Some(t), Some(p)) => {
                let _ = writeln!(
                    out,
                    "; last delivery after median {} (min {}, max {}) = {:.2} µs per connection (min {:.2}, max {:.2})",
                    duration_us(t.median),
                    duration_us(t.min),
                    duration_us(t.max),
                    p.median,
                    p.min,
                    p.max
                );
            }
            _ => out.push('\n'),
        }
        let _ = writeln!(out, "  latency      {}", self.latency.render());
        let _ = writeln!(
            out,
            "  delivery     lost {}, duplicates {}, out of order {}, corrupt {}",
            d.lost, d.duplicates, d.out_of_order, d.corrupt
        );
        let p = d.payloads;
        if p.compressed > 0 {
            let _ = writeln!(
                out,
                "  deflate      {} of {} messages compressed; payload bytes on the wire {} of {} plain: ratio {:.3}",
                grouped(p.compressed),
                grouped(p.messages),
                grouped(p.wire_bytes),
                grouped(p.plain_bytes),
                p.ratio()
            );
        }
        let rows: Vec<Vec<(&str, String)>> = b
            .per_message
            .iter()
            .map(|f| {
                let time = |v: Option<f64>| v.map_or("-".into(), duration_us);
                vec![
                    ("  message", format!("  {}", f.seq)),
                    ("expected", grouped(f.expected.into())),
                    ("received", grouped(f.received.into())),
                    ("first", time(f.first_us)),
                    ("last (fan-out)", time(f.last_us)),
                    (
                        "µs/conn",
                        f.per_conn_us.map_or("-".into(), |v| format!("{v:.2}")),
                    ),
                ]
            })
            .collect();
        out.push_str(&render_columns(&rows));
        for stream in &self.streams {
            let _ = writeln!(out, "  stream       {}", stream.render());
        }
        for step in &self.feed_search {
            let _ = writeln!(out, "  search step  {}", step.render());
        }
        if !self.feed_search.is_empty() {
            let found = self
                .max_feed_rate
                .map_or("none held".into(), |r| format!("{r:.0} lines/s"));
            let _ = writeln!(out, "  max feed     {found}");
        }
        for (name, value) in &self.counted {
            let _ = writeln!(out, "  counted      {name} {value}");
        }
        if let Some(latency) = &self.server_latency {
            let _ = writeln!(out, "  server latency {}", latency.render());
        }
        for warning in &self.warnings {
            let _ = writeln!(out, "  WARNING      {warning}");
        }
        out
    }
}

/// A report of 100 connections whose three messages took `per_conn` µs
/// per connection each, for tests of what renders reports.
#[cfg(test)]
pub(crate) fn sample(server: &str, round: u32, per_conn: [f64; 3]) -> RunReport {
    let sent = [1_000, 1_000, 1_000];
    let messages: Vec<Receipts> = per_conn
        .iter()
        .map(|&p| receipts(100, 100, 2_000, 1_000 + (p * 100.0 * 1e3) as u64))
        .collect();
    let mut h = crate::observe::stats::new_histogram();
    h.record(250_000_000).unwrap();
    let memory = |rss, pss| Memory {
        rss_bytes: rss,
        pss_bytes: pss,
    };
    RunReport {
        server: server.into(),
        round,
        command: format!("{server} {{port}}"),
        connections: ConnectionReport {
            requested: 100,
            open: 100,
            failed: 0,
            failures: BTreeMap::new(),
            statuses: BTreeMap::new(),
            setup_secs: 0.5,
            rate: RampSummary {
                average: 200.0,
                slowest_second: None,
                fastest_second: None,
                per_second: vec![],
            },
            workers: 1,
            sources: 4,
            ramp: vec![(0.0, 0), (0.5, 100)],
        },
        memory: MemoryReport {
            processes: 1,
            listeners: 1,
            baseline: memory(1 << 20, 1 << 19),
            open: memory((1 << 20) + 12_800, (1 << 19) + 10_000),
            end: memory(2 << 20, 1 << 20),
            rss_growth_bytes: 12_800,
            pss_growth_bytes: 10_000,
            rss_per_conn: 128.0,
            pss_per_conn: 100.0,
            client: Some(memory(3 << 20, 3 << 20)),
        },
        cpu: CpuReport {
            server_setup_secs: 0.1,
            setup_percent: 20.0,
            server_setup_us_per_conn: 1000.0,
            client_setup_us_per_conn: 1500.0,
            interrupts_setup_us_per_conn: 400.0,
            machine_setup_us_per_conn: 3000.0,
            server_idle_secs: 0.001,
            idle_wall_secs: 10.0,
            idle_percent: 0.01,
            server_broadcast_secs: 0.2,
            broadcast_wall_secs: 1.0,
            broadcast_percent: 20.0,
            server_us_per_delivery: 666.7,
            client_broadcast_secs: 0.3,
            machine_broadcast_secs: 0.6,
        },
        broadcast: BroadcastReport::new(&sent, &messages, 32),
        latency: LatencyReport::from_histogram(&h),
        delivery: DeliveryReport {
            lost: 0,
            duplicates: 0,
            out_of_order: 0,
            corrupt: 0,
            payloads: Payloads::default(),
        },
        streams: vec![],
        feed_search: vec![],
        max_feed_rate: None,
        counted: vec![],
        server_latency: None,
        warnings: vec!["machine busy".into()],
    }
}

/// A stream of `lines` lines to 100 connections, done in `secs`, for tests.
#[cfg(test)]
pub(crate) fn sample_stream(kind: &str, lines: u32, secs: f64) -> StreamReport {
    let mut h = crate::observe::stats::new_histogram();
    h.record(20_000_000).unwrap();
    StreamReport {
        kind: kind.into(),
        lines,
        payload_bytes: 64,
        rate: (kind == "feed").then_some(100.0),
        connections: 100,
        expected: 100 * u64::from(lines),
        received: 100 * u64::from(lines),
        complete: true,
        completion_secs: secs,
        deliveries_per_sec: 100.0 * f64::from(lines) / secs,
        latency: LatencyReport::from_histogram(&h),
        windows: Vec::new(),
        server_cpu_secs: secs / 2.0,
        client_cpu_secs: secs / 2.0,
        machine_cpu_secs: secs,
        probes: None,
        redials: 0,
        redials_peak_per_sec: 0,
    }
}

#[cfg(test)]
fn receipts(expected: u32, received: u32, first: u64, last: u64) -> Receipts {
    Receipts {
        expected,
        received,
        first_ns: first,
        last_ns: last,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let sent = [1_000, 20_000, 30_000];
        let messages = [
            receipts(4, 4, 3_000, 9_000),
            receipts(4, 3, 21_000, 25_000),
            receipts(4, 0, 0, 0),
        ];
        let report = BroadcastReport::new(&sent, &messages, 32);
        assert_eq!(report.complete, 1);
        let one = Spread {
            median: 2.0,
            min: 2.0,
            max: 2.0,
        };
        assert_eq!(report.per_conn_us, Some(one));
        assert_eq!(report.completion_us.map(|s| s.median), Some(8.0));
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
        for needle in [
            "100 of 100 open in 0.50 s: 200/s average, slowest second -",
            "failures     none",
            "RSS sum  baseline    1.0 MiB",
            "growth   12.5 KiB = 128.0 B/conn",
            "= 100.0 B/conn",
            "client       RSS 3.0 MiB",
            "idle 0.01% (over 10 s)",
            "3/3 messages of 32 B complete; last delivery after median 1250.0 µs (min 1200.0 µs, max 1300.0 µs) = 12.50 µs per connection (min 12.00, max 13.00)",
            "count 1  min 250.0 ms  max 250.1 ms",
            "median 250.1 ms",
            "lost 0, duplicates 0, out of order 0, corrupt 0",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert!(text.ends_with("WARNING      machine busy\n"), "{text}");
        let table_header = text
            .lines()
            .find(|l| l.trim_start().starts_with("message"))
            .unwrap();
        assert!(table_header.contains("last (fan-out)  µs/conn"), "{text}");
    }

    #[test]
    fn json_has_nested_sections() {
        let json = serde_json::to_value(sample("floor", 1, [1.0, 2.0, 3.0])).unwrap();
        assert_eq!(json["memory"]["rss_per_conn"], 128.0);
        assert_eq!(json["memory"]["open"]["pss_bytes"], (1 << 19) + 10_000);
        assert_eq!(json["broadcast"]["per_conn_us"]["median"], 2.0);
        assert_eq!(json["connections"]["rate"]["average"], 200.0);
        assert_eq!(
            json["broadcast"]["per_message"].as_array().unwrap().len(),
            3
        );
    }
}

//! The `echo` measurement, like tcpkali: C connections each send M
//! messages per second of P bytes for T seconds; every echo is verified
//! and its round trip timed; the server's CPU time per echoed message is
//! the headline. `--find-max-rate` raises M until the p99 round trip
//! reaches a limit (or messages are lost) and reports the highest M that
//! stayed below it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::client::clients::Clients;
use crate::client::echoer::{self, Echo};
use crate::client::pacing::Schedule;
use crate::observe::format;
use crate::observe::latency::LatencyReport;
use crate::observe::procfs;
use crate::report::RunInfo;
use crate::target::server::ServerSpec;
use crate::target::{self, Target};
use crate::wire::message::{self, EchoStamp};
use crate::Error;

/// Descriptors this process needs besides one per connection.
const SPARE_FDS: usize = 64;

/// Longest wait in `epoll_wait` while requests are being paced.
const MAX_WAIT: Duration = Duration::from_millis(5);

/// A run whose client sent less than this share of the requested rate
/// measured the client, not the server.
const ACHIEVED_SHARE: f64 = 0.95;

/// Parameters of an `echo` run.
#[derive(Debug, Clone, clap::Args)]
pub struct EchoOptions {
    /// Connections.
    #[arg(long, default_value_t = 1000)]
    pub conns: usize,
    /// Messages per second each connection sends (the starting rate with
    /// `--find-max-rate`).
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1024)]
    pub payload_bytes: usize,
    /// The connections offer permessage-deflate (no context takeover either
    /// way) and fail if the server does not agree; every request is
    /// compressed (zlib level 1, its filler an order book in JSON), echoes
    /// are inflated if they come back compressed. The report adds how many
    /// did and the bytes each way.
    #[arg(long)]
    pub deflate: bool,
    /// Seconds of sending (per step with `--find-max-rate`).
    #[arg(long, default_value_t = 10)]
    pub secs: u64,
    /// Seconds to wait for the last echoes after the sending stopped.
    #[arg(long, default_value_t = 5)]
    pub drain_secs: u64,
    /// Seconds of unreported echo at the starting rate before measuring a
    /// spawned server (a JIT-compiled runtime is slow at first: Netty
    /// failed 20 msg/s cold and passed it warm).
    #[arg(long, default_value_t = 5)]
    pub warmup_secs: u64,
    /// Source addresses used in turn: 127.0.0.2, 127.0.0.3, ...
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=250))]
    pub sources: u8,
    /// Connection attempts started per second.
    #[arg(long, default_value_t = 10_000)]
    pub connect_rate: u32,
    /// Most connections connecting or upgrading at once.
    #[arg(long, default_value_t = 512)]
    pub max_in_flight: usize,
    /// Seconds the connection setup may take.
    #[arg(long, default_value_t = 60)]
    pub setup_timeout: u64,
    /// Raise the rate step by step (doubling, then bisecting) and report
    /// the highest one whose p99 round trip stayed under `--max-p99-ms`
    /// with nothing lost.
    #[arg(long)]
    pub find_max_rate: bool,
    /// The p99 round-trip limit of `--find-max-rate`, in ms.
    #[arg(long, default_value_t = 50.0)]
    pub max_p99_ms: f64,
    /// Bisection steps of `--find-max-rate` after the first failing rate.
    #[arg(long, default_value_t = 3)]
    pub refine: u32,
    /// Highest per-connection rate `--find-max-rate` tries.
    #[arg(long, default_value_t = 100_000.0)]
    pub rate_limit: f64,
    /// Server port (default: a free one).
    #[arg(long)]
    pub port: Option<u16>,
    /// Seconds the server gets to start listening.
    #[arg(long, default_value_t = 30)]
    pub start_timeout: u64,
    /// Before starting the server, wait up to this many seconds for the
    /// machine to be quiet.
    #[arg(long, default_value_t = 0)]
    pub wait_quiet: u64,
}

impl EchoOptions {
    /// The options given as command-line arguments (`["--conns", "10"]`),
    /// the others at their defaults.
    pub fn from_args(args: &[String]) -> Result<EchoOptions, clap::Error> {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            options: EchoOptions,
        }
        let argv = std::iter::once("echo".to_string()).chain(args.iter().cloned());
        Ok(<Wrapper as clap::Parser>::try_parse_from(argv)?.options)
    }

    /// Checks the options that do not depend on the machine.
    pub fn check(&self) -> Result<(), Error> {
        if self.conns == 0
            || self.rate <= 0.0
            || self.secs == 0
            || self.connect_rate == 0
            || self.max_in_flight == 0
        {
            return Err(
                "--conns, --rate, --secs, --connect-rate and --max-in-flight must be positive"
                    .into(),
            );
        }
        let widest = EchoStamp {
            conn: self.conns as u64,
            seq: u64::MAX,
            sent_ns: u64::MAX,
        };
        if !message::encode_echo(widest, self.payload_bytes, false, &mut Vec::new()) {
            return Err(format!(
                "--payload-bytes {} is too small for a connection id, a sequence number and a timestamp",
                self.payload_bytes
            )
            .into());
        }
        Ok(())
    }
}

/// Everything measured in one echo run at one rate.
#[derive(Debug, Clone, Serialize)]
pub struct EchoReport {
    /// Label of the server.
    pub server: String,
    /// Round of a comparison (from 1).
    pub round: u32,
    /// The command that started it.
    pub command: String,
    /// Connections asked for.
    pub conns: usize,
    /// Connections open when the sending began.
    pub open: usize,
    /// Messages per second per connection asked for.
    pub rate: f64,
    /// Messages per second per connection actually sent.
    pub achieved_rate: f64,
    /// Payload bytes per message.
    pub payload_bytes: usize,
    /// Seconds of sending.
    pub send_secs: f64,
    /// Seconds from the first request to the last echo (or the drain timeout).
    pub wall_secs: f64,
    /// Requests sent.
    pub sent: u64,
    /// Echoes received, each checked byte for byte.
    pub echoed: u64,
    /// Requests never echoed.
    pub lost: u64,
    /// Connection failures by kind (an echo that differs is `echo mismatch`).
    pub failures: BTreeMap<String, u64>,
    /// Echoes per second of sending.
    pub echoed_per_sec: f64,
    /// Client → server, frame bytes, in Mbit/s over the sending time.
    pub mbps_up: f64,
    /// Server → client, in Mbit/s over the sending time.
    pub mbps_down: f64,
    /// Requests sent compressed (all of them with `--deflate`), and echoes
    /// that came back compressed.
    pub compressed: Option<(u64, u64)>,
    /// Round-trip time of every echo.
    pub rtt: LatencyReport,
    /// Server CPU time from the first request to the end.
    pub server_cpu_secs: f64,
    /// `server_cpu_secs` over the wall time, in % of one CPU.
    pub server_cpu_percent: f64,
    /// `server_cpu_secs` per echoed message, in µs.
    pub server_us_per_echo: f64,
    /// This client's CPU time over the same span.
    pub client_cpu_secs: f64,
}

impl EchoReport {
    /// Whether the server kept the p99 round trip under `limit_ms` without
    /// losing anything, at (nearly) the requested rate.
    pub fn passes(&self, limit_ms: f64) -> bool {
        self.rtt.p99_us < limit_ms * 1e3
            && self.lost == 0
            && self.failures.is_empty()
            && self.achieved_rate >= ACHIEVED_SHARE * self.rate
    }

    /// Whether this client could not send at the requested rate.
    pub fn client_limited(&self) -> bool {
        self.achieved_rate < ACHIEVED_SHARE * self.rate
    }

    /// Multi-line human-readable report.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} (round {}): {}",
            self.server, self.round, self.command
        );
        let _ = writeln!(
            out,
            "  load         {} connections × {} msg/s × {} B for {:.1} s (achieved {:.1} msg/s per connection{})",
            self.open,
            self.rate,
            self.payload_bytes,
            self.send_secs,
            self.achieved_rate,
            if self.client_limited() { ": CLIENT-LIMITED" } else { "" }
        );
        let _ = writeln!(
            out,
            "  echoed       {} of {} ({:.0}/s), lost {}; failures: {}",
            format::grouped(self.echoed),
            format::grouped(self.sent),
            self.echoed_per_sec,
            self.lost,
            format::failures(&self.failures)
        );
        let _ = writeln!(
            out,
            "  bandwidth    {:.1} Mbps up, {:.1} Mbps down",
            self.mbps_up, self.mbps_down
        );
        if let Some((requests, echoes)) = self.compressed {
            let _ = writeln!(
                out,
                "  deflate      {} requests sent compressed, {} echoes came back compressed",
                format::grouped(requests),
                format::grouped(echoes)
            );
        }
        let _ = writeln!(out, "  round trip   {}", self.rtt.render());
        let _ = writeln!(
            out,
            "  server CPU   {:.2} s in {:.1} s = {:.1}% of one CPU, {:.2} µs per echoed message (client {:.2} s)",
            self.server_cpu_secs,
            self.wall_secs,
            self.server_cpu_percent,
            self.server_us_per_echo,
            self.client_cpu_secs
        );
        out
    }
}

/// The outcome of `--find-max-rate`.
#[derive(Debug, Clone, Serialize)]
pub struct MaxRateReport {
    /// Label of the server.
    pub server: String,
    /// The p99 limit, in ms.
    pub limit_ms: f64,
    /// The highest per-connection rate that passed, if any did.
    pub best_rate: Option<f64>,
    /// The lowest rate that failed, if any did.
    pub failed_rate: Option<f64>,
    /// Whether the failing step was limited by this client rather than the server.
    pub client_limited: bool,
    /// Every step, in the order run.
    pub steps: Vec<EchoReport>,
}

impl MaxRateReport {
    /// One line per step, then the verdict.
    pub fn render_text(&self) -> String {
        let rows: Vec<Vec<(&str, String)>> = self
            .steps
            .iter()
            .map(|s| {
                vec![
                    ("  msg/s per conn", format!("  {}", s.rate)),
                    ("achieved", format!("{:.1}", s.achieved_rate)),
                    ("echoed/s", format!("{:.0}", s.echoed_per_sec)),
                    ("p50 ms", format!("{:.2}", s.rtt.p50_us / 1e3)),
                    ("p99 ms", format!("{:.2}", s.rtt.p99_us / 1e3)),
                    ("lost", s.lost.to_string()),
                    ("server CPU %", format!("{:.1}", s.server_cpu_percent)),
                    ("µs/echo", format!("{:.2}", s.server_us_per_echo)),
                    (
                        "verdict",
                        match (s.passes(self.limit_ms), s.client_limited()) {
                            (true, _) => "pass".into(),
                            (false, true) => "client-limited".into(),
                            (false, false) => "fail".into(),
                        },
                    ),
                ]
            })
            .collect();
        let mut out = format!(
            "{}: highest rate with p99 < {} ms and nothing lost\n",
            self.server, self.limit_ms
        );
        out.push_str(&format::render_columns(&rows));
        let _ = writeln!(
            out,
            "  => {} msg/s per connection{}",
            self.best_rate.map_or("none".into(), |r| format!("{r:.0}")),
            match (self.failed_rate, self.client_limited) {
                (Some(f), true) => format!(" (at {f:.0} this client could not keep up)"),
                (Some(f), false) => format!(" ({f:.0} failed)"),
                (None, _) => " (the rate limit was reached)".into(),
            }
        );
        out
    }
}

/// The next rate `--find-max-rate` tries after the steps so far (`best`
/// is the highest that passed, `failed` the lowest that did not), or
/// `None` when the search is over: doubling until a failure (halving
/// until a pass if the first step failed, down to 1 msg/s), then `refine`
/// bisections (geometric means), stopping early once the two are within 10%.
pub fn next_rate(
    best: Option<f64>,
    failed: Option<f64>,
    refinements_done: u32,
    refine: u32,
    limit: f64,
) -> Option<f64> {
    match (best, failed) {
        (Some(b), None) if b < limit => Some((b * 2.0).min(limit)),
        (None, Some(f)) if f > 1.0 => Some((f / 2.0).floor().max(1.0)),
        (Some(b), Some(f)) if refinements_done < refine && f > b * 1.1 => {
            Some((b * f).sqrt().round().max(b + 1.0))
        }
        _ => None,
    }
}

/// Spawns `spec`, runs the echo measurement (or the max-rate search), and
/// stops the server.
pub fn run(spec: &ServerSpec, options: &EchoOptions, round: u32) -> Result<EchoOutcome, Error> {
    options.check()?;
    let (mut server, command, port) = crate::target::server::start_server(
        spec,
        options.port,
        options.wait_quiet,
        options.start_timeout,
    )?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let info = RunInfo {
        server: spec.label.clone(),
        command,
        round,
    };
    if options.warmup_secs > 0 {
        let warmup = EchoOptions {
            secs: options.warmup_secs,
            ..options.clone()
        };
        measure(&mut server, addr, &warmup, options.rate, &info)?;
    }
    if !options.find_max_rate {
        return Ok(EchoOutcome::One(Box::new(measure(
            &mut server,
            addr,
            options,
            options.rate,
            &info,
        )?)));
    }
    let mut steps: Vec<EchoReport> = Vec::new();
    let (mut best, mut failed, mut refinements) = (None, None, 0);
    let mut rate = Some(options.rate);
    while let Some(r) = rate {
        let refining = failed.is_some() && best.is_some();
        let step = measure(&mut server, addr, options, r, &info)?;
        eprint!("{}", step.render_text());
        if step.passes(options.max_p99_ms) {
            best = Some(best.map_or(r, |b: f64| b.max(r)));
        } else {
            failed = Some(failed.map_or(r, |f: f64| f.min(r)));
        }
        refinements += u32::from(refining);
        steps.push(step);
        rate = next_rate(
            best,
            failed,
            refinements,
            options.refine,
            options.rate_limit,
        );
    }
    let client_limited = steps
        .iter()
        .find(|s| Some(s.rate) == failed)
        .is_some_and(EchoReport::client_limited);
    Ok(EchoOutcome::MaxRate(MaxRateReport {
        server: spec.label.clone(),
        limit_ms: options.max_p99_ms,
        best_rate: best,
        failed_rate: failed,
        client_limited,
        steps,
    }))
}

/// What `echo` produced.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum EchoOutcome {
    /// One run at the given rate.
    One(Box<EchoReport>),
    /// A max-rate search.
    MaxRate(MaxRateReport),
}

impl EchoOutcome {
    /// Multi-line human-readable report.
    pub fn render_text(&self) -> String {
        match self {
            EchoOutcome::One(r) => r.render_text(),
            EchoOutcome::MaxRate(m) => m.render_text(),
        }
    }
}

/// Runs `options.conns` connections at `rate` messages per second each
/// against the echoing server `target` at `addr`; the connections are
/// closed at the end.
pub fn measure(
    target: &mut dyn Target,
    addr: SocketAddr,
    options: &EchoOptions,
    rate: f64,
    info: &RunInfo,
) -> Result<EchoReport, Error> {
    options.check()?;
    let nofile = wspush::sys::raise_open_file_limit()? as usize;
    if options.conns + SPARE_FDS > nofile {
        return Err(format!(
            "{} echo connections need more than the {nofile} open files one process may have",
            options.conns
        )
        .into());
    }
    let sources = (0..options.sources)
        .map(|i| Ipv4Addr::new(127, 0, 0, 2 + i))
        .collect();
    let mut echoers = echoer::clients(addr, sources, options.payload_bytes, options.deflate)?;
    connect_all(target, &mut echoers, options)?;
    let open = echoers.open();
    if open == 0 {
        return Err(format!(
            "no echo connection opened: {}",
            format::failures(&echoers.echo_counts().failures)
        )
        .into());
    }

    let before = target.usage()?;
    let client_before = procfs::own_cpu_ns()?;
    let total = (open as f64 * rate * options.secs as f64).round().max(1.0) as u64;
    let schedule = Schedule::new(open as f64 * rate, total);
    let start = Instant::now();
    let send_deadline = start + Duration::from_secs(options.secs);
    let mut checked = start;
    loop {
        let now = Instant::now();
        let sent = echoers.echo_counts().sent;
        if sent >= total || now >= send_deadline + MAX_WAIT {
            break;
        }
        if now >= checked + Duration::from_millis(100) {
            target::check(target)?;
            checked = now;
        }
        let due = schedule.due(now - start).saturating_sub(sent);
        if due > 0 && echoers.send(due) == 0 {
            break; // every connection has failed
        }
        let next = schedule.due_at(echoers.echo_counts().sent);
        let wait = (start + next).saturating_duration_since(Instant::now());
        echoers.step(wait.min(MAX_WAIT))?;
    }
    let send_secs = start.elapsed().as_secs_f64();
    let drain_deadline = Instant::now() + Duration::from_secs(options.drain_secs);
    while echoers.outstanding() > 0 && Instant::now() < drain_deadline {
        target::check(target)?;
        echoers.step(MAX_WAIT)?;
    }
    let wall = start.elapsed().as_secs_f64();
    let after = target.usage()?;
    let client_cpu = procfs::own_cpu_ns()?.saturating_sub(client_before);

    let counts = echoers.echo_counts();
    let server_ns = after.cpu_ns.saturating_sub(before.cpu_ns);
    let mbps = |bytes: u64| bytes as f64 * 8.0 / send_secs / 1e6;
    Ok(EchoReport {
        server: info.server.clone(),
        round: info.round,
        command: info.command.clone(),
        conns: options.conns,
        open,
        rate,
        achieved_rate: counts.sent as f64 / open as f64 / (options.secs as f64),
        payload_bytes: options.payload_bytes,
        send_secs,
        wall_secs: wall,
        sent: counts.sent,
        echoed: counts.echoed,
        lost: counts.sent - counts.echoed,
        failures: counts.failures.clone(),
        echoed_per_sec: counts.echoed as f64 / send_secs,
        mbps_up: mbps(counts.bytes_up),
        mbps_down: mbps(counts.bytes_down),
        compressed: options
            .deflate
            .then_some((counts.sent, counts.compressed_echoes)),
        rtt: LatencyReport::from_histogram(echoers.rtt()),
        server_cpu_secs: server_ns as f64 / 1e9,
        server_cpu_percent: 100.0 * server_ns as f64 / 1e9 / wall,
        server_us_per_echo: server_ns as f64 / 1e3 / counts.echoed.max(1) as f64,
        client_cpu_secs: client_cpu as f64 / 1e9,
    })
}

/// Opens every connection at the connect rate, or gives up at the timeout.
fn connect_all(
    target: &mut dyn Target,
    echoers: &mut Clients<Echo>,
    options: &EchoOptions,
) -> Result<(), Error> {
    let schedule = Schedule::new(f64::from(options.connect_rate), options.conns as u64);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(options.setup_timeout);
    while echoers.started() < options.conns || echoers.pending() > 0 {
        if Instant::now() >= deadline {
            echoers.abandon_pending();
            break;
        }
        target::check(target)?;
        let due = schedule.due(start.elapsed()) as usize;
        let room = options.max_in_flight.saturating_sub(echoers.pending());
        echoers.start(due.saturating_sub(echoers.started()).min(room));
        echoers.step(Duration::from_millis(1))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_doubles_until_a_failure_then_bisects() {
        assert_eq!(next_rate(Some(20.0), None, 0, 3, 1e5), Some(40.0));
        assert_eq!(next_rate(Some(80_000.0), None, 0, 3, 1e5), Some(1e5));
        assert_eq!(next_rate(Some(1e5), None, 0, 3, 1e5), None);
        assert_eq!(next_rate(Some(160.0), Some(320.0), 0, 3, 1e5), Some(226.0));
        assert_eq!(next_rate(Some(226.0), Some(320.0), 3, 3, 1e5), None);
        assert_eq!(
            next_rate(Some(300.0), Some(320.0), 1, 3, 1e5),
            None,
            "within 10%"
        );
        assert_eq!(next_rate(None, Some(20.0), 0, 3, 1e5), Some(10.0));
        assert_eq!(next_rate(None, Some(5.0), 0, 3, 1e5), Some(2.0));
        assert_eq!(next_rate(None, Some(1.0), 0, 3, 1e5), None);
        assert_eq!(next_rate(Some(10.0), Some(20.0), 0, 3, 1e5), Some(14.0));
    }

    #[test]
    fn passing_needs_the_latency_nothing_lost_and_the_rate() {
        let mut h = crate::observe::stats::new_histogram();
        h.record(10_000_000).unwrap();
        let good = EchoReport {
            server: "s".into(),
            round: 1,
            command: "c".into(),
            conns: 10,
            open: 10,
            rate: 100.0,
            achieved_rate: 99.0,
            payload_bytes: 1024,
            send_secs: 10.0,
            wall_secs: 10.1,
            sent: 9900,
            echoed: 9900,
            lost: 0,
            failures: BTreeMap::new(),
            echoed_per_sec: 990.0,
            mbps_up: 8.2,
            mbps_down: 8.1,
            compressed: None,
            rtt: LatencyReport::from_histogram(&h),
            server_cpu_secs: 0.5,
            server_cpu_percent: 5.0,
            server_us_per_echo: 50.5,
            client_cpu_secs: 0.6,
        };
        assert!(good.passes(50.0));
        assert!(!good.passes(10.0), "p99 of 10 ms is not under 10 ms");
        let lossy = EchoReport {
            lost: 1,
            ..good.clone()
        };
        assert!(!lossy.passes(50.0));
        let slow_client = EchoReport {
            achieved_rate: 90.0,
            ..good.clone()
        };
        assert!(!slow_client.passes(50.0) && slow_client.client_limited());
        let text = good.render_text();
        assert!(
            text.contains("10 connections × 100 msg/s × 1024 B"),
            "{text}"
        );
        assert!(text.contains("50.50 µs per echoed message"), "{text}");
        let search = MaxRateReport {
            server: "s".into(),
            limit_ms: 50.0,
            best_rate: Some(100.0),
            failed_rate: Some(200.0),
            client_limited: false,
            steps: vec![good],
        };
        let text = search.render_text();
        assert!(
            text.contains("=> 100 msg/s per connection (200 failed)"),
            "{text}"
        );
        assert!(
            text.lines().nth(2).unwrap().trim_end().ends_with("pass"),
            "{text}"
        );
    }
}

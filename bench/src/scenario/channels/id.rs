//! `id`: `id u{random}` messages one at a time or in bursts, the server's
//! CPU per message, next to a wspush sending the same messages with `all`
//! to its one connection.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::ledger::Checks;
use super::lines::{line, open_mask, target};
use super::options::ChannelsOptions;
use super::stage::{render_warnings, SetupReport, Stage};
use crate::client::receipts::Paths;
use crate::observe::format::grouped;
use crate::observe::latency::LatencyReport;
use crate::observe::sys;
use crate::target::Target;
use crate::wire::message::Stamp;
use crate::Error;

/// One server's side of an `id` run.
#[derive(Debug, Clone, Serialize)]
pub struct IdSide {
    /// The setup.
    pub setup: SetupReport,
    /// What each message line was.
    pub command: String,
    /// Messages in the complete bursts.
    pub messages: u32,
    /// Bursts all of whose messages arrived (the run stops at the first that did not).
    pub bursts_complete: u32,
    /// Bursts sent.
    pub bursts: u32,
    /// Wall time of the bursts.
    pub wall_secs: f64,
    /// The server's CPU over the bursts (user + system, 10-ms ticks).
    pub server_cpu_secs: f64,
    /// That per message, in µs.
    pub server_us_per_message: f64,
    /// The server's CPU while idle with the connections open just before,
    /// in % of one CPU.
    pub idle_percent: f64,
    /// Send-to-receipt time.
    pub latency: LatencyReport,
    /// Deliveries against what each connection should have got.
    pub checks: Checks,
}

/// An `id` run.
#[derive(Debug, Clone, Serialize)]
pub struct IdRun {
    /// Connections, each with its own id.
    pub conns: u64,
    /// Messages per burst.
    pub burst: u32,
    /// Payload size.
    pub payload_bytes: usize,
    /// `id u{random} PAYLOAD` among the connections.
    pub targeted: IdSide,
    /// `all PAYLOAD` to a wspush with one connection.
    pub baseline: IdSide,
    /// `targeted - baseline` per message, in µs: what finding the
    /// connection costs the loop beyond the write (with `--burst 1`).
    pub added_us_per_message: f64,
    /// One CPU tick over the messages of a side, per message, in µs.
    pub resolution_us: f64,
    /// Conditions that make the numbers less trustworthy.
    pub warnings: Vec<String>,
}

/// What [`bursts`] measured.
struct Bursts {
    /// Messages in the complete bursts.
    messages: u32,
    complete: u32,
    sent: u32,
    wall_secs: f64,
    cpu_secs: f64,
}

impl Bursts {
    /// The report of a side.
    fn side(
        self,
        stage: &Stage,
        command: &str,
        idle_percent: f64,
        checks: Checks,
    ) -> Result<IdSide, Error> {
        let per = |n: f64| n / f64::from(self.messages.max(1));
        Ok(IdSide {
            setup: stage.setup_report()?,
            command: command.into(),
            messages: self.messages,
            bursts_complete: self.complete,
            bursts: self.sent,
            wall_secs: self.wall_secs,
            server_cpu_secs: self.cpu_secs,
            server_us_per_message: per(self.cpu_secs * 1e6),
            idle_percent,
            latency: LatencyReport::from_histogram(&stage.ledger.histogram),
            checks,
        })
    }
}

/// Sends `messages` lines, `prefix(seq) PAYLOAD`, in bursts, each awaited
/// at `expected(seq)`; stops at the first burst not delivered in time.
fn bursts(
    stage: &mut Stage,
    o: &ChannelsOptions,
    messages: u32,
    prefix: impl Fn(u32) -> String,
    expected: impl Fn(u32) -> Vec<u64>,
) -> Result<Bursts, Error> {
    let count = messages.div_ceil(o.burst);
    let before = stage.mark()?;
    let start_cpu = stage.server.usage()?.cpu_ns;
    let start = Instant::now();
    let mut complete = 0;
    let mut sent = 0;
    for b in 0..count {
        let seqs: Vec<u32> = (b * o.burst + 1..=((b + 1) * o.burst).min(messages)).collect();
        let mut lines = Vec::new();
        let sent_ns = sys::now_ns();
        for &seq in &seqs {
            lines.extend(line(&prefix(seq), Stamp { seq, sent_ns }, o.payload_bytes));
        }
        stage.server.send_lines(&lines)?;
        sent += 1;
        let wanted: Vec<(u32, Vec<u64>)> = seqs.iter().map(|&s| (s, expected(s))).collect();
        let done = stage.wait_for(o.message_timeout(), |l| {
            wanted.iter().all(|(s, to)| l.count(*s) >= l.alive(to))
        })?;
        if !done {
            eprintln!(
                "[{}] burst {} not delivered before the timeout: stopping",
                stage.label,
                b + 1
            );
            break;
        }
        complete += 1;
    }
    let wall_secs = start.elapsed().as_secs_f64();
    let cpu = stage.server.usage()?.cpu_ns.saturating_sub(start_cpu) as f64 / 1e9;
    stage.warn_if_busy(&before, "during the bursts")?;
    Ok(Bursts {
        messages: (complete * o.burst).min(messages),
        complete,
        sent,
        wall_secs,
        cpu_secs: cpu,
    })
}

/// Idle CPU of the stage's server over `duration`, in % of one CPU.
fn idle_percent(stage: &mut Stage, duration: Duration) -> Result<f64, Error> {
    let before = stage.server.usage()?.cpu_ns;
    let start = Instant::now();
    stage.pump(duration)?;
    let cpu = stage.server.usage()?.cpu_ns.saturating_sub(before) as f64;
    Ok(100.0 * cpu / (start.elapsed().as_nanos().max(1) as f64))
}

pub(super) fn id(o: &ChannelsOptions) -> Result<IdRun, Error> {
    let n = o.conns;
    let messages = o.messages.unwrap_or(10_000);
    let settle = Duration::from_millis(o.settle_ms);
    let mut warnings = Vec::new();

    let mut ws = Stage::start(o, "wspush id", &o.wspush_command(None)?)?;
    ws.connect(o, Paths::Id, n)?;
    let open = open_mask(n, &ws.setup.failed);
    let candidates: Vec<u64> = (0..n).filter(|&i| open[i as usize]).collect();
    let targets: Vec<u64> = (1..=messages)
        .map(|seq| if o.one_target { 1 } else { seq })
        .map(|seq| candidates[target(o.seed, seq, candidates.len())])
        .collect();
    let idle = idle_percent(&mut ws, settle)?;
    let measured = bursts(
        &mut ws,
        o,
        messages,
        |seq| format!("id u{} ", targets[seq as usize - 1]),
        |seq| vec![targets[seq as usize - 1]],
    )?;
    ws.pump(Duration::from_millis(200))?;
    let mut per_conn: HashMap<u64, Vec<u32>> = HashMap::new();
    for (seq, &t) in (1..=measured.messages).zip(&targets) {
        per_conn.entry(t).or_default().push(seq);
    }
    let mut checks = Checks {
        corrupt: ws.ledger.corrupt,
        lost: ws.ledger.lost.len() as u64,
        ..Checks::default()
    };
    for &i in candidates.iter().filter(|i| !ws.ledger.lost.contains(i)) {
        let expected = per_conn.get(&i).map_or(&[][..], Vec::as_slice);
        checks.add(&ws.ledger.per_conn[i as usize], expected);
    }
    let targeted = measured.side(&ws, "id u{random} PAYLOAD", idle, checks)?;
    warnings.extend(ws.finish());

    let mut base = Stage::start(o, "wspush all", &o.wspush_command(None)?)?;
    base.connect(o, Paths::Plain, 1)?;
    let idle = idle_percent(&mut base, settle)?;
    let measured = bursts(&mut base, o, messages, |_| "all ".into(), |_| vec![0])?;
    base.pump(Duration::from_millis(200))?;
    let mut checks = Checks {
        corrupt: base.ledger.corrupt,
        lost: base.ledger.lost.len() as u64,
        ..Checks::default()
    };
    if base.ledger.lost.is_empty() {
        let wanted: Vec<u32> = (1..=measured.messages).collect();
        checks.add(&base.ledger.per_conn[0], &wanted);
    }
    let baseline = measured.side(&base, "all PAYLOAD", idle, checks)?;
    warnings.extend(base.finish());

    let tick_us = 1e6 / sys::clock_ticks_per_second() as f64;
    Ok(IdRun {
        conns: n,
        burst: o.burst,
        payload_bytes: o.payload_bytes,
        added_us_per_message: targeted.server_us_per_message - baseline.server_us_per_message,
        resolution_us: tick_us / f64::from(targeted.messages.max(1)),
        targeted,
        baseline,
        warnings,
    })
}

impl IdRun {
    /// The report as text.
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "channels id: messages of {} B in bursts of {}, each awaited: `id u{{random}}` among {} connections, and `all` to one\n",
            self.payload_bytes,
            self.burst,
            grouped(self.conns)
        );
        for s in [&self.targeted, &self.baseline] {
            let _ = writeln!(out, "  {}", s.setup.render());
            let _ = writeln!(
                out,
                "    {}: {} messages ({}/{} bursts complete) in {:.2} s; server CPU {:.3} s = {:.2} µs per message; idle before {:.2}% of a CPU",
                s.command,
                grouped(s.messages.into()),
                s.bursts_complete,
                s.bursts,
                s.wall_secs,
                s.server_cpu_secs,
                s.server_us_per_message,
                s.idle_percent
            );
            let _ = writeln!(out, "    latency  {}", s.latency.render());
            let _ = writeln!(out, "    delivery {}", s.checks.render());
        }
        let _ = writeln!(
            out,
            "  added CPU per targeted message: {:.2} µs (targeted {:.2} - all-to-one {:.2}; one CPU tick is {:.2} µs per message)",
            self.added_us_per_message,
            self.targeted.server_us_per_message,
            self.baseline.server_us_per_message,
            self.resolution_us
        );
        if self.burst > 1 {
            let _ = writeln!(
                out,
                "  NOTE  in bursts of {} wspush writes `all` to its one connection once per burst, each `id` message to its own: the difference includes the writes (--burst 1 compares write for write)",
                self.burst
            );
        }
        render_warnings(&mut out, &self.warnings);
        out
    }
}

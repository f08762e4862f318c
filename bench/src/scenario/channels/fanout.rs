//! `fanout`: `pub hot` to a share of the connections, one message at a
//! time, timed to the last subscriber's receipt, next to the floor writing
//! the same lines to the same share and to as many sockets alone.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::ledger::{Checks, SENTINEL};
use super::lines::{line, open_mask};
use super::options::ChannelsOptions;
use super::stage::{render_warnings, SetupReport, Stage};
use crate::client::receipts::{spread, Paths};
use crate::observe::format::{duration_us, grouped, render_columns};
use crate::observe::latency::LatencyReport;
use crate::observe::sys;
use crate::report::{BroadcastReport, Spread};
use crate::target::server;
use crate::target::Target;
use crate::wire::message::Stamp;
use crate::Error;

/// One server's side of a `fanout` run.
#[derive(Debug, Clone, Serialize)]
pub struct FanoutSide {
    /// The setup.
    pub setup: SetupReport,
    /// Connections each message was for (open at the start).
    pub receivers: u64,
    /// Fan-out per message: until the last receiver had it; per receiver.
    pub fanout: BroadcastReport,
    /// Send-to-receipt time over every receipt of the messages.
    pub latency: LatencyReport,
    /// Deliveries against what each connection should have got.
    pub checks: Checks,
}

/// A `fanout` run.
#[derive(Debug, Clone, Serialize)]
pub struct FanoutRun {
    /// Connections to wspush.
    pub conns: u64,
    /// Of those, on `hot`.
    pub subscribers: u64,
    /// Messages, one at a time.
    pub messages: u32,
    /// Payload size.
    pub payload_bytes: usize,
    /// wspush, `pub hot PAYLOAD`.
    pub wspush: FanoutSide,
    /// Connections not on `hot` that got a message besides the closing `all`.
    pub non_subscribers_leaked: u64,
    /// Connections (any) that did not get the closing `all`.
    pub sentinel_missing: u64,
    /// The floor holding as many connections, with the same requests,
    /// writing `PAYLOAD` to those that named `hot` (`floor --channel hot`).
    pub floor: FanoutSide,
    /// The floor holding only as many sockets as subscribers, writing to
    /// them all (measured while the first floor's connections stay open).
    pub floor_alone: FanoutSide,
    /// Median fan-out time of wspush over the floor's.
    pub ratio: Option<f64>,
    /// Median fan-out time of wspush over the lone floor's.
    pub ratio_alone: Option<f64>,
    /// Conditions that make the numbers less trustworthy.
    pub warnings: Vec<String>,
}

fn side(
    stage: &Stage,
    receivers: u64,
    fanout: BroadcastReport,
    checks: Checks,
) -> Result<FanoutSide, Error> {
    Ok(FanoutSide {
        setup: stage.setup_report()?,
        receivers,
        fanout,
        latency: LatencyReport::from_histogram(&stage.ledger.histogram),
        checks,
    })
}

pub(super) fn fanout(o: &ChannelsOptions) -> Result<FanoutRun, Error> {
    let n = o.conns;
    let subscribers = ((n as f64 * o.fraction).round() as u64).clamp(1, n);
    let messages = o.messages.unwrap_or(20);
    let settle = Duration::from_millis(o.settle_ms);
    let mut warnings = Vec::new();

    let mut ws = Stage::start(o, "wspush", &o.wspush_command(None)?)?;
    ws.connect(
        o,
        Paths::Hot {
            subscribers,
            total: n,
        },
        n,
    )?;
    let open = open_mask(n, &ws.setup.failed);
    let is_sub = |i: u64| spread(i, subscribers, n);
    let subs: Vec<u64> = (0..n).filter(|&i| open[i as usize] && is_sub(i)).collect();
    ws.pump(settle)?;
    let before = ws.mark()?;
    let (sent, receipts) = ws.one_at_a_time(o, "pub hot ", messages, &subs)?;
    ws.warn_if_busy(&before, "during the messages")?;
    // The closing `all`: the first and only thing the others get.
    let everyone: Vec<u64> = (0..n).filter(|&i| open[i as usize]).collect();
    let stamp = Stamp {
        seq: SENTINEL,
        sent_ns: sys::now_ns(),
    };
    ws.server
        .send_lines(&line("all ", stamp, o.payload_bytes))?;
    let timeout = o.message_timeout() + Duration::from_micros(50) * n as u32;
    ws.wait_for(timeout, |l| l.count(SENTINEL) >= l.alive(&everyone))?;
    ws.pump(Duration::from_millis(200))?;
    let mut checks = Checks {
        corrupt: ws.ledger.corrupt,
        lost: ws.ledger.lost.len() as u64,
        ..Checks::default()
    };
    let (mut leaked, mut sentinel_missing) = (0, 0);
    let wanted: Vec<u32> = (1..=messages).chain([SENTINEL]).collect();
    for &i in &everyone {
        if ws.ledger.lost.contains(&i) {
            continue;
        }
        let got = &ws.ledger.per_conn[i as usize];
        if is_sub(i) {
            checks.add(got, &wanted);
        } else {
            checks.add(got, &[SENTINEL]);
            leaked += u64::from(got.iter().any(|&s| s != SENTINEL));
        }
        sentinel_missing += u64::from(!got.contains(&SENTINEL));
    }
    let wspush = side(
        &ws,
        subs.len() as u64,
        BroadcastReport::new(&sent, &receipts, o.payload_bytes),
        checks,
    )?;

    warnings.extend(ws.finish());

    // The floor reaches the same subscribers among as many connections,
    // then (those staying open, so that the kernel holds as many
    // connections again) as many sockets alone.
    let command = format!("{} --channel hot", server::FLOOR);
    let mut among = Stage::start(o, "floor", &command)?;
    among.connect(
        o,
        Paths::Hot {
            subscribers,
            total: n,
        },
        n,
    )?;
    let floor = floor_side(o, &mut among, messages, is_sub)?;
    let mut alone = Stage::start(o, "floor alone", server::FLOOR)?;
    alone.connect(o, Paths::Plain, subscribers)?;
    let floor_alone = floor_side(o, &mut alone, messages, |_| true)?;
    warnings.extend(alone.finish());
    warnings.extend(among.finish());

    let median = |s: &FanoutSide| s.fanout.completion_us.map(|c| c.median);
    let over = |f: &FanoutSide| match (median(&wspush), median(f)) {
        (Some(w), Some(f)) if f > 0.0 => Some(w / f),
        _ => None,
    };
    let (ratio, ratio_alone) = (over(&floor), over(&floor_alone));
    Ok(FanoutRun {
        conns: n,
        subscribers,
        messages,
        payload_bytes: o.payload_bytes,
        wspush,
        non_subscribers_leaked: leaked,
        sentinel_missing,
        floor,
        floor_alone,
        ratio,
        ratio_alone,
        warnings,
    })
}

/// Sends `messages` one at a time through the floor of `stage`, each
/// awaited at the open connections `receives`; checks that each got each
/// once, in order, and the others nothing.
fn floor_side(
    o: &ChannelsOptions,
    stage: &mut Stage,
    messages: u32,
    receives: impl Fn(u64) -> bool,
) -> Result<FanoutSide, Error> {
    let count = stage.ledger.per_conn.len() as u64;
    let open = open_mask(count, &stage.setup.failed);
    let receivers: Vec<u64> = (0..count)
        .filter(|&i| open[i as usize] && receives(i))
        .collect();
    stage.pump(Duration::from_millis(o.settle_ms))?;
    let before = stage.mark()?;
    let (sent, receipts) = stage.one_at_a_time(o, "", messages, &receivers)?;
    stage.warn_if_busy(&before, "during the messages")?;
    stage.pump(Duration::from_millis(200))?;
    let mut checks = Checks {
        corrupt: stage.ledger.corrupt,
        lost: stage.ledger.lost.len() as u64,
        ..Checks::default()
    };
    let wanted: Vec<u32> = (1..=messages).collect();
    for i in (0..count).filter(|&i| open[i as usize] && !stage.ledger.lost.contains(&i)) {
        let expected: &[u32] = if receives(i) { &wanted } else { &[] };
        checks.add(&stage.ledger.per_conn[i as usize], expected);
    }
    side(
        stage,
        receivers.len() as u64,
        BroadcastReport::new(&sent, &receipts, o.payload_bytes),
        checks,
    )
}

fn spread_text(s: Option<Spread>, unit: fn(f64) -> String) -> String {
    s.map_or("-".into(), |s| {
        format!(
            "median {} (min {}, max {})",
            unit(s.median),
            unit(s.min),
            unit(s.max)
        )
    })
}

impl FanoutRun {
    /// The report as text.
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "channels fanout: {} messages of {} B, one at a time, to {} of {} connections (`pub hot`); the floor to as many among as many, and to {} sockets alone\n",
            self.messages,
            self.payload_bytes,
            grouped(self.subscribers),
            grouped(self.conns),
            grouped(self.floor_alone.receivers)
        );
        let per = |v: f64| format!("{v:.2} µs");
        for s in [&self.wspush, &self.floor, &self.floor_alone] {
            let _ = writeln!(out, "  {}", s.setup.render());
            let _ = writeln!(
                out,
                "    fan-out (write to last receipt): {}; per receiver {}; {}/{} complete",
                spread_text(s.fanout.completion_us, duration_us),
                spread_text(s.fanout.per_conn_us, per),
                s.fanout.complete,
                s.fanout.messages
            );
            let _ = writeln!(out, "    latency  {}", s.latency.render());
            let _ = writeln!(out, "    delivery {}", s.checks.render());
        }
        let _ = writeln!(
            out,
            "  non-subscribers: {} got a `pub hot` message; {} connections (of all) missed the closing `all`",
            self.non_subscribers_leaked, self.sentinel_missing
        );
        let time = |v: Option<f64>| v.map_or("-".into(), duration_us);
        let rows: Vec<Vec<(&str, String)>> = self
            .wspush
            .fanout
            .per_message
            .iter()
            .zip(&self.floor.fanout.per_message)
            .zip(&self.floor_alone.fanout.per_message)
            .map(|((w, f), a)| {
                vec![
                    ("  message", format!("  {}", w.seq)),
                    ("wspush got", format!("{}/{}", w.received, w.expected)),
                    ("wspush fan-out", time(w.last_us)),
                    ("floor got", format!("{}/{}", f.received, f.expected)),
                    ("floor fan-out", time(f.last_us)),
                    ("alone got", format!("{}/{}", a.received, a.expected)),
                    ("alone fan-out", time(a.last_us)),
                ]
            })
            .collect();
        out.push_str(&render_columns(&rows));
        let ratio = |r: Option<f64>| r.map_or("-".into(), |r| format!("{r:.2}"));
        let _ = writeln!(
            out,
            "  wspush / floor (median fan-out): {}; wspush / floor alone: {}",
            ratio(self.ratio),
            ratio(self.ratio_alone)
        );
        render_warnings(&mut out, &self.warnings);
        out
    }
}

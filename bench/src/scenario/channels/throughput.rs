//! `throughput`: one `pub ch{i}` per channel, each with one subscriber,
//! written as fast as the server takes them: messages a second until all
//! are delivered, each exactly to its subscriber.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::ledger::Checks;
use super::lines::{line, open_mask};
use super::options::ChannelsOptions;
use super::stage::{render_warnings, SetupReport, Stage};
use crate::client::receipts::Paths;
use crate::observe::format::grouped;
use crate::observe::latency::LatencyReport;
use crate::observe::sys;
use crate::target::Target;
use crate::wire::message::Stamp;
use crate::Error;

/// A `throughput` run.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputRun {
    /// The setup.
    pub setup: SetupReport,
    /// Channels, one subscriber each (and one message each).
    pub channels: u64,
    /// Payload size.
    pub payload_bytes: usize,
    /// Lines per write.
    pub feed_chunk: usize,
    /// Time to write the whole feed into the server's standard input.
    pub write_secs: f64,
    /// Whether every open connection got its message before the timeout.
    pub complete: bool,
    /// From the first write to the last receipt.
    pub completion_secs: f64,
    /// Messages received over that time.
    pub messages_per_sec: f64,
    /// The server's CPU from the first write to the end.
    pub server_cpu_secs: f64,
    /// That per message, in µs.
    pub server_us_per_message: f64,
    /// Send (of its chunk) to receipt.
    pub latency: LatencyReport,
    /// Each connection against its one message.
    pub checks: Checks,
    /// Conditions that make the numbers less trustworthy.
    pub warnings: Vec<String>,
}

pub(super) fn throughput(o: &ChannelsOptions) -> Result<ThroughputRun, Error> {
    let c = o.channels;
    let processes = (o.server_processes.as_str(), c);
    let mut st = Stage::start(o, "wspush", &o.wspush_command(Some(processes))?)?;
    st.connect(o, Paths::OwnChannel, c)?;
    let open = open_mask(c, &st.setup.failed);
    let everyone: Vec<u64> = (0..c).filter(|&i| open[i as usize]).collect();
    st.pump(Duration::from_millis(o.settle_ms))?;
    let before = st.mark()?;
    let start_cpu = st.server.usage()?.cpu_ns;
    let start_ns = sys::now_ns();
    let start = Instant::now();
    let mut lines = Vec::with_capacity(o.feed_chunk * (o.payload_bytes + 20));
    let ids: Vec<u64> = (0..c).collect();
    for chunk in ids.chunks(o.feed_chunk) {
        lines.clear();
        let sent_ns = sys::now_ns();
        for &i in chunk {
            let seq = u32::try_from(i + 1).map_err(|_| "too many channels")?;
            lines.extend(line(
                &format!("pub ch{i} "),
                Stamp { seq, sent_ns },
                o.payload_bytes,
            ));
        }
        st.server.send_lines(&lines)?;
    }
    let write_secs = start.elapsed().as_secs_f64();
    let timeout = o.message_timeout() + Duration::from_micros(50) * c as u32;
    let total = everyone.len() as u64;
    let complete = st.wait_for(timeout, |l| {
        l.received >= total.saturating_sub(l.lost.len() as u64)
    })?;
    let cpu = st.server.usage()?.cpu_ns.saturating_sub(start_cpu) as f64 / 1e9;
    st.warn_if_busy(&before, "during the feed")?;
    st.pump(Duration::from_millis(200))?;
    let completion = st.ledger.last_ns.saturating_sub(start_ns) as f64 / 1e9;
    let mut checks = Checks {
        corrupt: st.ledger.corrupt,
        lost: st.ledger.lost.len() as u64,
        ..Checks::default()
    };
    for &i in everyone.iter().filter(|i| !st.ledger.lost.contains(i)) {
        checks.add(&st.ledger.per_conn[i as usize], &[i as u32 + 1]);
    }
    let received = st.ledger.received;
    let report = ThroughputRun {
        setup: st.setup_report()?,
        channels: c,
        payload_bytes: o.payload_bytes,
        feed_chunk: o.feed_chunk,
        write_secs,
        complete,
        completion_secs: completion,
        messages_per_sec: received as f64 / completion.max(1e-9),
        server_cpu_secs: cpu,
        server_us_per_message: cpu * 1e6 / received.max(1) as f64,
        latency: LatencyReport::from_histogram(&st.ledger.histogram),
        checks,
        warnings: Vec::new(),
    };
    let warnings = st.finish();
    Ok(ThroughputRun { warnings, ..report })
}

impl ThroughputRun {
    /// The report as text.
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "channels throughput: one `pub ch{{i}}` of {} B to each of {} channels with one subscriber, {} lines per write\n",
            self.payload_bytes,
            grouped(self.channels),
            self.feed_chunk
        );
        let _ = writeln!(out, "  {}", self.setup.render());
        let _ = writeln!(
            out,
            "  feed written in {:.3} s; {} in {:.3} s = {} messages/s; server CPU {:.2} s = {:.2} µs per message",
            self.write_secs,
            if self.complete { "all delivered" } else { "NOT all delivered" },
            self.completion_secs,
            grouped(self.messages_per_sec as u64),
            self.server_cpu_secs,
            self.server_us_per_message
        );
        let _ = writeln!(out, "  latency  {}", self.latency.render());
        let _ = writeln!(out, "  delivery {}", self.checks.render());
        render_warnings(&mut out, &self.warnings);
        out
    }
}

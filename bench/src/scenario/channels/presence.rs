//! `presence`: how long `GET /presence?channel=c0` takes on the publish
//! listener of a wspush whose `--conns` connections (each with an id) are
//! all in `c0`, over `--server-processes` instances; `GET /clients` and
//! `GET /presence` (every channel) beside it. Meanwhile the probes time
//! the loop's answers to a new connection's upgrade and a connected one's
//! ping, so that a presence answer is seen to hold the loops up or not.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::lines::target;
use super::options::ChannelsOptions;
use super::stage::{render_warnings, SetupReport, Stage};
use crate::client::probe::Probes;
use crate::client::receipts::Paths;
use crate::observe::latency::{LatencyReport, ProbeReport};
use crate::observe::stats::{new_histogram, MAX_LATENCY_NS};
use crate::target::server::free_port;
use crate::Error;

/// The publishers' key the spawned wspush takes.
const KEY: &str = "bench-presence-key";
/// How often the probes sample.
const PROBE_EVERY: Duration = Duration::from_millis(10);

/// A `presence` run.
#[derive(Debug, Clone, Serialize)]
pub struct PresenceRun {
    /// The setup.
    pub setup: SetupReport,
    /// `/presence?channel=c0` (the first 100 ids and the count).
    pub channel: LatencyReport,
    /// `/clients?id=u{random}`.
    pub clients: LatencyReport,
    /// `/presence` (every channel and its count).
    pub channels: LatencyReport,
    /// The connection count the answers gave, last.
    pub counted: u64,
    /// Answers whose count or ids were not what the server holds.
    pub wrong: u64,
    /// The loop's upgrades and pongs meanwhile.
    pub probes: ProbeReport,
    /// Conditions that make the numbers less trustworthy.
    pub warnings: Vec<String>,
}

impl PresenceRun {
    /// The report as text.
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "channels presence: every connection in c0, asked on the publish listener\n  {}\n",
            self.setup.render()
        );
        let _ = writeln!(out, "  /presence?channel=c0  {}", self.channel.render());
        let _ = writeln!(out, "  /clients?id=ID        {}", self.clients.render());
        let _ = writeln!(out, "  /presence             {}", self.channels.render());
        let _ = writeln!(
            out,
            "  counted {} connections; {} answers wrong",
            self.counted, self.wrong
        );
        let _ = writeln!(out, "  probe upgrade {}", self.probes.upgrade.render());
        let _ = writeln!(out, "  probe ping    {}", self.probes.ping.render());
        render_warnings(&mut out, &self.warnings);
        out
    }
}

/// `GET target` on `addr` with the key: the answer's body, and how long
/// it took from the request's write.
fn get(addr: SocketAddr, target: &str) -> Result<(String, Duration), Error> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.set_nodelay(true)?;
    let request = format!(
        "GET {target} HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nConnection: close\r\n\r\n"
    );
    let start = Instant::now();
    stream.write_all(request.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let took = start.elapsed();
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or("an answer without a head")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{target}: {}", head.lines().next().unwrap_or("")).into());
    }
    Ok((body.to_string(), took))
}

/// The number after `"name":` in a JSON text.
fn number(json: &str, name: &str) -> Option<u64> {
    let at = json.find(&format!("\"{name}\":"))? + name.len() + 3;
    let digits: String = json[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

fn record(histogram: &mut Histogram<u64>, took: Duration) {
    let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
    histogram.saturating_record(ns.clamp(1, MAX_LATENCY_NS));
}

pub(super) fn presence(o: &ChannelsOptions) -> Result<PresenceRun, Error> {
    let n = o.conns;
    let asks = o.messages.unwrap_or(100);
    let key_file =
        std::env::temp_dir().join(format!("wspush-bench-presence-{}", std::process::id()));
    std::fs::write(&key_file, format!("{KEY}\n"))?;
    let publish = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
    let processes = match o.server_processes.as_str() {
        "auto" => "8",
        given => given,
    };
    let command = format!(
        "{} --publish-listen {publish} --publish-key-file {}",
        o.wspush_command(Some((processes, n)))?,
        key_file.display()
    );
    let mut stage = Stage::start(o, "wspush presence", &command)?;
    stage.connect(o, Paths::IdChannel { channels: 1 }, n)?;
    stage.pump(Duration::from_millis(o.settle_ms))?;
    let open = stage.setup.open;
    let before = stage.mark()?;
    let probes = Probes::start(stage.addr, PROBE_EVERY)?;
    let (mut channel, mut clients, mut channels) =
        (new_histogram(), new_histogram(), new_histogram());
    let (mut counted, mut wrong) = (0, 0);
    let mut first_wrong: Option<String> = None;
    let mut judge = |right: bool, body: &str| {
        if !right {
            wrong += 1;
            first_wrong.get_or_insert_with(|| body.chars().take(300).collect());
        }
    };
    for ask in 0..asks {
        let (body, took) = get(publish, "/presence?channel=c0")?;
        record(&mut channel, took);
        counted = number(&body, "connections").unwrap_or(0);
        let list = body
            .split("\"ids\":[")
            .nth(1)
            .and_then(|l| l.split(']').next());
        let ids = list.map_or(0, |l| l.matches("\"u").count() as u64);
        judge(counted == open && ids == 100.min(open), &body);
        let id = target(o.seed, ask, n as usize);
        let (body, took) = get(publish, &format!("/clients?id=u{id}"))?;
        record(&mut clients, took);
        let failed = stage.setup.failed.contains(&(id as u64));
        judge(failed || body.contains("\"channels\":[\"c0\"]"), &body);
        let (body, took) = get(publish, "/presence")?;
        record(&mut channels, took);
        judge(number(&body, "connections") == Some(open), &body);
        stage.pump(Duration::from_millis(o.gap_ms))?;
    }
    let probes = probes.finish()?;
    stage.warn_if_busy(&before, "during the questions")?;
    let mut warnings = std::mem::take(&mut stage.warnings);
    warnings.extend(first_wrong.map(|body| format!("the first wrong answer: {body}")));
    let _ = std::fs::remove_file(&key_file);
    Ok(PresenceRun {
        setup: stage.setup_report()?,
        channel: LatencyReport::from_histogram(&channel),
        clients: LatencyReport::from_histogram(&clients),
        channels: LatencyReport::from_histogram(&channels),
        counted,
        wrong,
        probes,
        warnings,
    })
}

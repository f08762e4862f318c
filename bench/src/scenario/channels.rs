//! `channels`: what targeted push costs in wspush (`--input commands`),
//! in four modes, each against servers it spawns:
//!
//! - `memory`: server memory per idle connection for several URL variants
//!   (`/`, an id and a channel, an id and ten channels), each in a server
//!   of its own; the subscriptions from `/metrics`; bytes per subscription;
//! - `fanout`: `pub hot` to the 1% of the connections on `hot`, one
//!   message at a time, timed to the last subscriber's receipt, next to
//!   the floor writing the same lines to the same share of as many
//!   connections (`floor --channel hot`), and to that many sockets alone;
//!   the others must get nothing but a closing `all`;
//! - `id`: `id u{random}` messages one at a time (or in bursts), the
//!   server's CPU per message, next to a wspush sending the same messages
//!   with `all` to its one connection;
//! - `throughput`: one `pub ch{i}` per channel of C, each with one
//!   subscriber, written as fast as the server takes them: messages a
//!   second until all are delivered, each exactly to its subscriber.
//!
//! The clients are [`Fleet`] workers; every receipt comes back to the
//! [`Ledger`] here, which judges it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::client::dial;
use crate::client::pacing;
use crate::client::receipts::{spread, Event, Paths};
use crate::fleet::coordinator::{Fleet, Launch, Setup};
use crate::fleet::protocol::{Plan, ReceiptsPlan};
use crate::observe::cpu::{CpuMark, QUIET_SHARE};
use crate::observe::format::{bytes, duration_us, failures, grouped, render_columns};
use crate::observe::latency::LatencyReport;
use crate::observe::procfs::{self, Usage};
use crate::observe::scrape::{fetch_metrics, metric};
use crate::observe::stats::{self, Receipts};
use crate::observe::sys;
use crate::report::{BroadcastReport, Spread};
use crate::target::server::{self, Server, ServerSpec};
use crate::target::{self, Target};
use crate::wire::feed::splitmix64;
use crate::wire::message::{self, Stamp};
use crate::Error;

/// Sequence number of the closing `all` of `fanout` (messages count from 1).
pub const SENTINEL: u32 = 0;

/// How often a wait checks the server.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// What `channels` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Memory per idle connection for each `--variants` URL, in separate servers.
    Memory,
    /// `pub hot` to `--fraction` of `--conns`, one at a time, against the floor.
    Fanout,
    /// `id u{random}` to one of `--conns`: CPU per message against `all` to one.
    Id,
    /// One `pub ch{i}` to each of `--channels` one-subscriber channels.
    Throughput,
}

/// The URL of each connection in a `memory` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum Variant {
    /// `/`.
    #[value(name = "plain")]
    #[serde(rename = "plain")]
    Plain,
    /// `/?id=u{i}`.
    #[value(name = "id")]
    #[serde(rename = "id")]
    Id,
    /// `/?id=u{i}&channel=c{i % 100}`.
    #[value(name = "id+channel")]
    #[serde(rename = "id+channel")]
    IdChannel,
    /// `/?id=u{i}` and ten `channel=c{(i + k * 7919) % 1000}`, k = 0..10.
    #[value(name = "id+10ch")]
    #[serde(rename = "id+10ch")]
    IdTenChannels,
}

impl Variant {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Id => "id",
            Variant::IdChannel => "id+channel",
            Variant::IdTenChannels => "id+10ch",
        }
    }

    /// The paths of its connections.
    pub fn paths(self) -> Paths {
        match self {
            Variant::Plain => Paths::Plain,
            Variant::Id => Paths::Id,
            Variant::IdChannel => Paths::IdChannel { channels: 100 },
            Variant::IdTenChannels => Paths::IdChannels {
                per: 10,
                channels: 1000,
                step: 7919,
            },
        }
    }

    /// Channels each connection subscribes to.
    pub fn channels_per_conn(self) -> u64 {
        match self {
            Variant::Plain | Variant::Id => 0,
            Variant::IdChannel => 1,
            Variant::IdTenChannels => 10,
        }
    }
}

/// Parameters of a `channels` run.
#[derive(Debug, Clone, clap::Args)]
pub struct ChannelsOptions {
    /// What to measure.
    #[arg(value_enum)]
    pub mode: Mode,
    /// Connections (memory, fanout, id).
    #[arg(long, default_value_t = 19_000)]
    pub conns: u64,
    /// Channels, one subscriber each (throughput).
    #[arg(long, default_value_t = 100_000)]
    pub channels: u64,
    /// Messages [default: 20 for fanout, 10,000 for id].
    #[arg(long)]
    pub messages: Option<u32>,
    /// Share of the connections on `hot` (fanout).
    #[arg(long, default_value_t = 0.01)]
    pub fraction: f64,
    /// Messages written at once before waiting for their receipts (id).
    /// With 1 both servers make one socket write per message; in larger
    /// bursts `all` to one connection shares one write per burst, so the
    /// difference includes the writes.
    #[arg(long, default_value_t = 1)]
    pub burst: u32,
    /// Lines written at once, each stamped just before (throughput).
    #[arg(long, default_value_t = 1000)]
    pub feed_chunk: usize,
    /// URL variants, each in a server of its own (memory).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "plain,id+channel,id+10ch"
    )]
    pub variants: Vec<Variant>,
    /// Size of each message payload (a sequence number and a send time, padded).
    #[arg(long, default_value_t = 32)]
    pub payload_bytes: usize,
    /// Connections started per second.
    #[arg(long, default_value_t = 10_000.0)]
    pub rate: f64,
    /// Most connections connecting or upgrading at once (over all workers).
    #[arg(long, default_value_t = 512)]
    pub max_in_flight: usize,
    /// Most connections one client process holds.
    #[arg(long, default_value_t = 19_000)]
    pub per_worker: usize,
    /// Source addresses 127.0.0.2, 127.0.0.3, ... [default: 45% of the
    /// local port range each at most].
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=250))]
    pub sources: Option<u8>,
    /// Idle time before each memory sample and before the messages, in ms.
    #[arg(long, default_value_t = 2000)]
    pub settle_ms: u64,
    /// Pause between two messages sent one at a time, in ms (fanout).
    #[arg(long, default_value_t = 50)]
    pub gap_ms: u64,
    /// Seconds a message (fanout), a burst (id) or the whole feed beyond
    /// 50 µs per line (throughput) may take to be delivered.
    #[arg(long, default_value_t = 10)]
    pub message_timeout: u64,
    /// Seconds the connection setup may take [default: 60 s plus one
    /// second per 1,000 connections].
    #[arg(long)]
    pub setup_timeout: Option<u64>,
    /// Seconds one connection may stay connecting or upgrading.
    #[arg(long, default_value_t = 10)]
    pub connect_timeout: u64,
    /// Seconds a server gets to start listening.
    #[arg(long, default_value_t = 30)]
    pub start_timeout: u64,
    /// The wspush to measure: `sh -c "exec COMMAND"`, `{port}` replaced by
    /// the port; it must read commands on stdin [default: the wspush next
    /// to this program with `--input commands --quiet --ping-interval 1h`].
    #[arg(long, value_name = "COMMAND")]
    pub server: Option<String>,
    /// Instances of the default wspush in `throughput` (`--processes`;
    /// `auto`: as many as the channels need).
    #[arg(long, value_name = "N|auto", default_value = "auto")]
    pub server_processes: String,
    /// Seed of the `id` mode's choice of targets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// `id` mode: every message to the same connection, whose socket stays
    /// warm, to tell the lookup's cost from a cold socket's.
    #[arg(long)]
    pub one_target: bool,
    /// Before each server starts, wait up to this many seconds for the
    /// machine to be quiet.
    #[arg(long, default_value_t = 0)]
    pub wait_quiet: u64,
    /// Stop the whole run after this many seconds, wherever it is (its
    /// servers and client workers die with it).
    #[arg(long, default_value_t = 900)]
    pub time_limit: u64,
}

impl ChannelsOptions {
    /// Checks the options that do not depend on the machine.
    pub fn check(&self) -> Result<(), Error> {
        if self.conns == 0
            || self.channels == 0
            || self.messages == Some(0)
            || self.burst == 0
            || self.feed_chunk == 0
            || self.per_worker == 0
            || self.max_in_flight == 0
            || !(self.rate > 0.0 && self.rate.is_finite())
        {
            return Err("counts, sizes and rates must be positive".into());
        }
        if !(self.fraction > 0.0 && self.fraction <= 1.0) {
            return Err("--fraction must be in (0, 1]".into());
        }
        if self.variants.is_empty() {
            return Err("--variants needs at least one".into());
        }
        Ok(message::check_room(self.payload_bytes, u32::MAX)?)
    }

    fn setup_timeout(&self, conns: u64) -> Duration {
        Duration::from_secs(self.setup_timeout.unwrap_or(60 + conns / 1000))
    }

    fn message_timeout(&self) -> Duration {
        Duration::from_secs(self.message_timeout)
    }

    /// The command of the wspush to measure (`processes`: the default's
    /// `--processes`, for `conns` connections in all).
    fn wspush_command(&self, processes: Option<(&str, u64)>) -> Result<String, Error> {
        if let Some(command) = &self.server {
            return Ok(command.clone());
        }
        let exe = server::wspush_exe(&std::env::current_exe()?);
        let base = format!("{exe} --input commands --quiet --ping-interval 1h");
        Ok(match processes {
            None => format!("{base} --listen 127.0.0.1:{{port}}"),
            Some(("auto", conns)) => {
                format!("{base} --processes auto --total-connections {conns} --listen 127.0.0.1:{{port}}")
            }
            Some((n, _)) => format!("{base} --processes {n} --listen 127.0.0.1:{{port}}"),
        })
    }
}

/// A report of any mode.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelsReport {
    /// `memory`.
    Memory(MemoryRun),
    /// `fanout`.
    Fanout(Box<FanoutRun>),
    /// `id`.
    Id(Box<IdRun>),
    /// `throughput`.
    Throughput(Box<ThroughputRun>),
}

impl ChannelsReport {
    /// The report as text.
    pub fn render_text(&self) -> String {
        match self {
            ChannelsReport::Memory(r) => r.render_text(),
            ChannelsReport::Fanout(r) => r.render_text(),
            ChannelsReport::Id(r) => r.render_text(),
            ChannelsReport::Throughput(r) => r.render_text(),
        }
    }
}

/// Runs the mode `options` names.
pub fn run(options: &ChannelsOptions) -> Result<ChannelsReport, Error> {
    options.check()?;
    // A write to a server that stopped reading blocks (and is retried
    // after a signal): the limit ends even that.
    let limit = options.time_limit;
    thread::Builder::new()
        .name("time-limit".into())
        .spawn(move || {
            thread::sleep(Duration::from_secs(limit));
            eprintln!("wspush-bench channels: --time-limit {limit} s reached: stopping");
            std::process::exit(1);
        })?;
    Ok(match options.mode {
        Mode::Memory => ChannelsReport::Memory(memory(options)?),
        Mode::Fanout => ChannelsReport::Fanout(Box::new(fanout(options)?)),
        Mode::Id => ChannelsReport::Id(Box::new(id(options)?)),
        Mode::Throughput => ChannelsReport::Throughput(Box::new(throughput(options)?)),
    })
}

// ---------------------------------------------------------------------
// What the connections received

/// Where the receipts of one message stand.
#[derive(Debug, Clone, Copy, Default)]
struct Arrival {
    count: u32,
    first_ns: u64,
    last_ns: u64,
}

/// Every receipt of a run's connections, by connection and by message.
#[derive(Debug)]
pub struct Ledger {
    /// Sequence numbers each connection received, in order.
    per_conn: Vec<Vec<u32>>,
    per_seq: HashMap<u32, Arrival>,
    /// Connections that failed after the setup.
    lost: BTreeSet<u64>,
    lost_kinds: BTreeMap<String, u64>,
    corrupt: u64,
    received: u64,
    last_ns: u64,
    /// Send-to-receipt times of the messages (not the sentinel).
    histogram: Histogram<u64>,
}

impl Ledger {
    /// An empty ledger for `conns` connections.
    pub fn new(conns: u64) -> Ledger {
        Ledger {
            per_conn: vec![Vec::new(); conns as usize],
            per_seq: HashMap::new(),
            lost: BTreeSet::new(),
            lost_kinds: BTreeMap::new(),
            corrupt: 0,
            received: 0,
            last_ns: 0,
            histogram: stats::new_histogram(),
        }
    }

    /// Records what a worker reported.
    pub fn absorb(&mut self, event: Event) {
        match event {
            Event::Got(receipts) => {
                for (conn, seq, sent_ns, recv_ns) in receipts {
                    if let Some(seqs) = self.per_conn.get_mut(conn as usize) {
                        seqs.push(seq);
                    }
                    let a = self.per_seq.entry(seq).or_default();
                    a.count += 1;
                    if a.first_ns == 0 {
                        a.first_ns = recv_ns;
                    }
                    a.last_ns = a.last_ns.max(recv_ns);
                    self.received += 1;
                    self.last_ns = self.last_ns.max(recv_ns);
                    if seq != SENTINEL {
                        let ns = recv_ns
                            .saturating_sub(sent_ns)
                            .clamp(1, stats::MAX_LATENCY_NS);
                        self.histogram.record(ns).expect("clamped into range");
                    }
                }
            }
            Event::Lost { conn, why } => {
                self.lost.insert(conn);
                *self.lost_kinds.entry(why).or_default() += 1;
            }
            Event::Corrupt { .. } => self.corrupt += 1,
        }
    }

    fn count(&self, seq: u32) -> u32 {
        self.per_seq.get(&seq).map_or(0, |a| a.count)
    }

    /// Of `conns`, those still open.
    fn alive(&self, conns: &[u64]) -> u32 {
        conns.iter().filter(|c| !self.lost.contains(c)).count() as u32
    }
}

/// Delivery checks over the connections of a run: each had a list of
/// messages to get, in order.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Checks {
    /// Deliveries expected.
    pub expected: u64,
    /// Messages received (all of them).
    pub received: u64,
    /// Expected deliveries that did not happen.
    pub missing: u64,
    /// Messages a connection got that were not for it.
    pub unexpected: u64,
    /// Messages a connection got more than once.
    pub duplicates: u64,
    /// Connections whose messages came in another order.
    pub out_of_order: u64,
    /// Payloads that were not a message.
    pub corrupt: u64,
    /// Connections that failed after the setup (not checked).
    pub lost: u64,
}

impl Checks {
    /// Whether every delivery was right.
    pub fn clean(&self) -> bool {
        self.missing == 0
            && self.unexpected == 0
            && self.duplicates == 0
            && self.out_of_order == 0
            && self.corrupt == 0
    }

    /// Adds what one connection got against what it should have, in order.
    pub fn add(&mut self, got: &[u32], expected: &[u32]) {
        self.expected += expected.len() as u64;
        self.received += got.len() as u64;
        let wanted: BTreeSet<u32> = expected.iter().copied().collect();
        let mut seen: BTreeMap<u32, u64> = BTreeMap::new();
        for &g in got {
            *seen.entry(g).or_default() += 1;
        }
        for (g, &n) in &seen {
            if !wanted.contains(g) {
                self.unexpected += n;
            } else if n > 1 {
                self.duplicates += n - 1;
            }
        }
        self.missing += wanted.iter().filter(|e| !seen.contains_key(e)).count() as u64;
        // Order: the first receipt of each expected message, against the
        // expected ones that came.
        let mut firsts = Vec::with_capacity(expected.len());
        let mut placed = BTreeSet::new();
        for &g in got {
            if wanted.contains(&g) && placed.insert(g) {
                firsts.push(g);
            }
        }
        let came: Vec<u32> = expected
            .iter()
            .copied()
            .filter(|e| seen.contains_key(e))
            .collect();
        if firsts != came {
            self.out_of_order += 1;
        }
    }

    /// One line.
    fn render(&self) -> String {
        format!(
            "{} of {} expected; missing {}, not theirs {}, duplicates {}, out of order {}, corrupt {}, connections lost {}{}",
            grouped(self.received),
            grouped(self.expected),
            self.missing,
            self.unexpected,
            self.duplicates,
            self.out_of_order,
            self.corrupt,
            self.lost,
            if self.clean() { " (clean)" } else { " (NOT CLEAN)" }
        )
    }
}

// ---------------------------------------------------------------------
// Pure helpers

/// `prefix` followed by the payload of `stamp` (`size` bytes) and `\n`.
pub fn line(prefix: &str, stamp: Stamp, size: usize) -> Vec<u8> {
    let payload = message::encode(stamp, size).expect("payload size checked up front");
    let mut out = Vec::with_capacity(prefix.len() + size + 1);
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(&payload);
    out.push(b'\n');
    out
}

/// The target of message `seq` among `count` candidates, for `seed`.
pub fn target(seed: u64, seq: u32, count: usize) -> usize {
    (splitmix64(seed.wrapping_mul(0x1_0000_0001) ^ u64::from(seq)) % count.max(1) as u64) as usize
}

/// Whether each of `conns` connections opened, given those that failed.
fn open_mask(conns: u64, failed: &[u64]) -> Vec<bool> {
    let mut open = vec![true; conns as usize];
    for &f in failed {
        if let Some(o) = open.get_mut(f as usize) {
            *o = false;
        }
    }
    open
}

// ---------------------------------------------------------------------
// Servers and clients

/// A server under test with its clients.
struct Stage {
    label: String,
    command: String,
    server: Server,
    addr: SocketAddr,
    fleet: Option<Fleet>,
    setup: Setup,
    ledger: Ledger,
    warnings: Vec<String>,
}

/// The setup as reported.
#[derive(Debug, Clone, Serialize)]
pub struct SetupReport {
    /// Label of the server.
    pub server: String,
    /// Its command line.
    pub command: String,
    /// Connections asked for.
    pub requested: u64,
    /// Connections open.
    pub open: u64,
    /// Failures by kind.
    pub failures: BTreeMap<String, u64>,
    /// Seconds until every connection was open or failed.
    pub setup_secs: f64,
    /// Client worker processes.
    pub client_processes: usize,
    /// Processes of the server's tree.
    pub server_processes: u32,
}

impl SetupReport {
    fn render(&self) -> String {
        format!(
            "{}: {} of {} connections open in {:.1} s over {} client process(es), server {} process(es); failures: {}\n  command: {}",
            self.server,
            grouped(self.open),
            grouped(self.requested),
            self.setup_secs,
            self.client_processes,
            self.server_processes,
            failures(&self.failures),
            self.command
        )
    }
}

impl Stage {
    /// Starts `command` (a template: `{port}`, or `floor`) as `label`.
    fn start(o: &ChannelsOptions, label: &str, command: &str) -> Result<Stage, Error> {
        let spec = ServerSpec {
            label: label.into(),
            command: command.into(),
        };
        let (server, command, port) =
            server::start_server(&spec, None, o.wait_quiet, o.start_timeout)?;
        Ok(Stage {
            label: label.into(),
            command,
            server,
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            fleet: None,
            setup: Setup::default(),
            ledger: Ledger::new(0),
            warnings: Vec::new(),
        })
    }

    /// Opens `count` connections with `paths`.
    fn connect(&mut self, o: &ChannelsOptions, paths: Paths, count: u64) -> Result<(), Error> {
        let sources = match o.sources {
            Some(n) => n,
            None => dial::sources_for(count as usize, procfs::local_port_range()?)
                .ok_or("too many connections for 250 source addresses")?,
        };
        let plan = Plan {
            servers: vec![self.addr],
            sources: (0..sources)
                .map(|i| Ipv4Addr::new(127, 0, 0, 2 + i))
                .collect(),
            first_id: 0,
            payload_bytes: o.payload_bytes,
            padding: Default::default(),
            deflate: false,
            transports: Default::default(),
            channel: None,
            positions: false,
            token: None,
            connect_timeout_ms: o.connect_timeout * 1000,
            receipts: Some(ReceiptsPlan {
                paths,
                count,
                rate: o.rate,
                max_in_flight: o.max_in_flight,
            }),
        };
        let launch = Launch::Processes {
            exe: std::env::current_exe()?,
        };
        let parts = (count as usize).div_ceil(o.per_worker.max(1)).max(1);
        let shares = pacing::split_evenly(count as usize, parts);
        let mut fleet = Fleet::launch(&launch, &plan, &shares)?;
        let server = &mut self.server;
        let timeout = o.setup_timeout(count);
        self.setup = fleet.wait_ready(timeout, || target::check(server), &self.label)?;
        eprintln!(
            "[{}] {} of {} connections open in {:.2} s ({} failed)",
            self.label,
            self.setup.open,
            count,
            self.setup.secs,
            self.setup.failed.len()
        );
        self.fleet = Some(fleet);
        self.ledger = Ledger::new(count);
        if self.setup.open == 0 {
            return Err(format!("[{}] no connection opened", self.label).into());
        }
        Ok(())
    }

    fn setup_report(&self) -> Result<SetupReport, Error> {
        Ok(SetupReport {
            server: self.label.clone(),
            command: self.command.clone(),
            requested: self.ledger.per_conn.len() as u64,
            open: self.setup.open,
            failures: self.setup.failures.clone(),
            setup_secs: self.setup.secs,
            client_processes: self.fleet.as_ref().map_or(0, Fleet::len),
            server_processes: self.server.usage()?.processes,
        })
    }

    /// Absorbs events until `done` holds (true) or `timeout` passes (false).
    fn wait_for(
        &mut self,
        timeout: Duration,
        done: impl Fn(&Ledger) -> bool,
    ) -> Result<bool, Error> {
        let deadline = Instant::now() + timeout;
        let mut checked = Instant::now();
        loop {
            if done(&self.ledger) {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            if now >= checked + CHECK_EVERY {
                target::check(&mut self.server)?;
                checked = now;
            }
            let left = deadline.saturating_duration_since(now).min(CHECK_EVERY);
            let fleet = self.fleet.as_mut().expect("connected");
            if let Some(event) = fleet.next_event(left)? {
                self.ledger.absorb(event);
            }
        }
    }

    /// Absorbs events for `duration`.
    fn pump(&mut self, duration: Duration) -> Result<(), Error> {
        self.wait_for(duration, |_| false).map(|_| ())
    }

    /// Waits `duration` without clients (checking the server).
    fn idle(&mut self, duration: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + duration;
        while Instant::now() < deadline {
            target::check(&mut self.server)?;
            thread::sleep(
                deadline
                    .saturating_duration_since(Instant::now())
                    .min(CHECK_EVERY),
            );
        }
        Ok(())
    }

    /// CPU counters now, to tell whether others were busy.
    fn mark(&self) -> Result<CpuMark, Error> {
        let workers = match &self.fleet {
            Some(s) => procfs::processes_usage(&s.pids())?.cpu_ns,
            None => 0,
        };
        Ok(CpuMark::take(
            self.server.usage()?.cpu_ns,
            procfs::own_cpu_ns()? + workers,
        )?)
    }

    /// Warns if others used more than [`QUIET_SHARE`] of a CPU since `before`.
    fn warn_if_busy(&mut self, before: &CpuMark, phase: &str) -> Result<(), Error> {
        let share = self.mark()?.others_since(before);
        if share > QUIET_SHARE {
            self.warnings.push(format!(
                "[{}] other processes used {:.0}% of a CPU {phase}: numbers may be disturbed",
                self.label,
                share * 100.0
            ));
        }
        Ok(())
    }

    /// Closes the connections, then stops the server.
    fn finish(mut self) -> Vec<String> {
        self.fleet = None;
        self.server.stop();
        self.warnings
    }

    /// Sends `prefix PAYLOAD` for each of `messages`, one at a time, each
    /// awaited at the open ones of `receivers` (or the timeout), `gap`
    /// apart; returns the send times and receipts.
    fn one_at_a_time(
        &mut self,
        o: &ChannelsOptions,
        prefix: &str,
        messages: u32,
        receivers: &[u64],
    ) -> Result<(Vec<u64>, Vec<Receipts>), Error> {
        let mut sent = Vec::with_capacity(messages as usize);
        let mut receipts = Vec::with_capacity(messages as usize);
        for seq in 1..=messages {
            let expected = self.ledger.alive(receivers);
            let sent_ns = sys::now_ns();
            self.server
                .send_lines(&line(prefix, Stamp { seq, sent_ns }, o.payload_bytes))?;
            let complete =
                self.wait_for(o.message_timeout(), |l| l.count(seq) >= l.alive(receivers))?;
            if !complete {
                eprintln!(
                    "[{}] message {seq}: {} of {expected} receipts before the timeout",
                    self.label,
                    self.ledger.count(seq)
                );
            }
            let a = self.ledger.per_seq.get(&seq).copied().unwrap_or_default();
            sent.push(sent_ns);
            receipts.push(Receipts {
                expected,
                received: a.count,
                first_ns: a.first_ns,
                last_ns: a.last_ns,
            });
            if seq < messages {
                self.pump(Duration::from_millis(o.gap_ms))?;
            }
        }
        Ok((sent, receipts))
    }
}

// ---------------------------------------------------------------------
// memory

/// One variant of a `memory` run.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    /// The variant.
    pub variant: Variant,
    /// An example of its paths (connection 0's).
    pub example_path: String,
    /// The setup.
    pub setup: SetupReport,
    /// Server memory before the connections.
    pub baseline: crate::report::Memory,
    /// Server memory with them open and idle.
    pub open: crate::report::Memory,
    /// RSS growth per open connection, in bytes.
    pub rss_per_conn: f64,
    /// PSS growth per open connection, in bytes.
    pub pss_per_conn: f64,
    /// `wspush_subscriptions` from `/metrics`.
    pub subscriptions: Option<f64>,
    /// `wspush_channels`.
    pub channels: Option<f64>,
    /// `wspush_connections_with_id`.
    pub connections_with_id: Option<f64>,
    /// Subscriptions the connections asked for.
    pub subscriptions_expected: u64,
}

/// A `memory` run.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRun {
    /// Connections per variant.
    pub conns: u64,
    /// Each variant, in order.
    pub rows: Vec<MemoryRow>,
    /// (RSS per connection with 10 channels − with 1) / 9, in bytes.
    pub rss_per_subscription: Option<f64>,
    /// The same from PSS.
    pub pss_per_subscription: Option<f64>,
    /// Conditions that make the numbers less trustworthy.
    pub warnings: Vec<String>,
}

fn memory(o: &ChannelsOptions) -> Result<MemoryRun, Error> {
    let settle = Duration::from_millis(o.settle_ms);
    let mut rows = Vec::new();
    let mut warnings = Vec::new();
    for &variant in &o.variants {
        let label = format!("wspush {}", variant.name());
        let mut stage = Stage::start(o, &label, &o.wspush_command(None)?)?;
        stage.idle(settle)?;
        let baseline = stage.server.usage()?;
        stage.connect(o, variant.paths(), o.conns)?;
        let before = stage.mark()?;
        stage.pump(settle)?;
        stage.warn_if_busy(&before, "while the connections settled")?;
        let open = stage.server.usage()?;
        let page = match fetch_metrics(stage.addr) {
            Ok(page) => Some(page),
            Err(e) => {
                stage.warnings.push(format!("[{label}] /metrics: {e}"));
                None
            }
        };
        let get = |name| page.as_deref().and_then(|p| metric(p, name));
        let n = stage.setup.open.max(1) as f64;
        let growth = |f: fn(&Usage) -> u64| (f(&open) as f64 - f(&baseline) as f64) / n;
        rows.push(MemoryRow {
            variant,
            example_path: variant.paths().path(0),
            setup: stage.setup_report()?,
            baseline: baseline.into(),
            open: open.into(),
            rss_per_conn: growth(|u| u.rss_bytes),
            pss_per_conn: growth(|u| u.pss_bytes),
            subscriptions: get("wspush_subscriptions"),
            channels: get("wspush_channels"),
            connections_with_id: get("wspush_connections_with_id"),
            subscriptions_expected: stage.setup.open * variant.channels_per_conn(),
        });
        warnings.extend(stage.finish());
    }
    let per_sub = |f: fn(&MemoryRow) -> f64| {
        let find = |v| rows.iter().find(|r| r.variant == v).map(f);
        Some((find(Variant::IdTenChannels)? - find(Variant::IdChannel)?) / 9.0)
    };
    Ok(MemoryRun {
        conns: o.conns,
        rss_per_subscription: per_sub(|r| r.rss_per_conn),
        pss_per_subscription: per_sub(|r| r.pss_per_conn),
        rows,
        warnings,
    })
}

impl MemoryRun {
    /// The report as text.
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "channels memory: {} idle connections per variant, each in a server of its own\n",
            grouped(self.conns)
        );
        let metric = |v: Option<f64>| v.map_or("-".into(), |v| grouped(v as u64));
        let rows: Vec<Vec<(&str, String)>> = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    ("  variant", format!("  {}", r.variant.name())),
                    ("open", grouped(r.setup.open)),
                    ("RSS/conn", bytes(r.rss_per_conn as i64)),
                    ("PSS/conn", bytes(r.pss_per_conn as i64)),
                    ("RSS open", bytes(r.open.rss_bytes as i64)),
                    ("subscriptions", metric(r.subscriptions)),
                    ("(asked)", grouped(r.subscriptions_expected)),
                    ("channels", metric(r.channels)),
                    ("with id", metric(r.connections_with_id)),
                    ("setup", format!("{:.1} s", r.setup.setup_secs)),
                ]
            })
            .collect();
        out.push_str(&render_columns(&rows));
        for r in &self.rows {
            let _ = writeln!(out, "  {}: e.g. {}", r.variant.name(), r.example_path);
            if !r.setup.failures.is_empty() {
                let _ = writeln!(out, "    failures: {}", failures(&r.setup.failures));
            }
        }
        if let (Some(rss), Some(pss)) = (self.rss_per_subscription, self.pss_per_subscription) {
            let _ = writeln!(
                out,
                "  per subscription: {rss:.0} B RSS, {pss:.0} B PSS  [(per conn with 10 channels - with 1) / 9]"
            );
        }
        if let Some(r) = self.rows.first() {
            let _ = writeln!(out, "  command: {}", r.setup.command);
        }
        render_warnings(&mut out, &self.warnings);
        out
    }
}

fn render_warnings(out: &mut String, warnings: &[String]) {
    for w in warnings {
        let _ = writeln!(out, "  WARNING  {w}");
    }
}

// ---------------------------------------------------------------------
// fanout

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

fn fanout(o: &ChannelsOptions) -> Result<FanoutRun, Error> {
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

// ---------------------------------------------------------------------
// id

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

fn id(o: &ChannelsOptions) -> Result<IdRun, Error> {
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

// ---------------------------------------------------------------------
// throughput

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

fn throughput(o: &ChannelsOptions) -> Result<ThroughputRun, Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_their_stamp_after_the_command() {
        let stamp = Stamp {
            seq: 17,
            sent_ns: 123_456_789,
        };
        let l = line("pub hot ", stamp, 32);
        assert_eq!(l.len(), "pub hot ".len() + 32 + 1);
        let text = std::str::from_utf8(&l).unwrap();
        assert!(text.starts_with("pub hot 17 123456789 ."), "{text}");
        assert!(text.ends_with(".\n"));
        let payload = &l["pub hot ".len()..l.len() - 1];
        assert_eq!(message::decode(payload, 32), Some(stamp));
        assert_eq!(line("", stamp, 32).len(), 33);
    }

    #[test]
    fn targets_are_spread_and_repeatable() {
        let n = 19_000;
        let picks: Vec<usize> = (1..=10_000).map(|s| target(1, s, n)).collect();
        assert!(picks.iter().all(|&p| p < n));
        assert_eq!(
            picks,
            (1..=10_000).map(|s| target(1, s, n)).collect::<Vec<_>>()
        );
        let distinct: BTreeSet<usize> = picks.iter().copied().collect();
        // 10,000 draws among 19,000: about 7,700 distinct.
        assert!(distinct.len() > 7_000, "{}", distinct.len());
        assert_ne!(
            picks[..10],
            (1..=10).map(|s| target(2, s, n)).collect::<Vec<_>>()[..]
        );
        assert_eq!(target(1, 5, 1), 0);
    }

    #[test]
    fn checks_count_what_went_wrong() {
        let mut c = Checks::default();
        c.add(&[1, 2, 3, 0], &[1, 2, 3, 0]);
        assert!(c.clean());
        assert_eq!((c.expected, c.received), (4, 4));
        c.add(&[0], &[0]);
        c.add(&[], &[]);
        assert!(c.clean());

        let mut c = Checks::default();
        c.add(&[5, 0], &[0]);
        assert_eq!(c.unexpected, 1);
        assert!(!c.clean());

        let mut c = Checks::default();
        c.add(&[1, 1, 3], &[1, 2, 3]);
        assert_eq!((c.missing, c.duplicates, c.out_of_order), (1, 1, 0));

        let mut c = Checks::default();
        c.add(&[2, 1], &[1, 2]);
        assert_eq!((c.missing, c.out_of_order), (0, 1));
        c.add(&[], &[7]);
        assert_eq!(c.missing, 1);
    }

    #[test]
    fn open_masks_leave_out_the_failed() {
        assert_eq!(open_mask(4, &[1, 3, 9]), vec![true, false, true, false]);
    }

    #[test]
    fn the_options_parse_with_their_defaults() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            o: ChannelsOptions,
        }
        let o = Cli::try_parse_from(["x", "memory"]).unwrap().o;
        assert_eq!(
            o.variants,
            [Variant::Plain, Variant::IdChannel, Variant::IdTenChannels]
        );
        assert_eq!(o.conns, 19_000);
        o.check().unwrap();
        let o = Cli::try_parse_from(["x", "memory", "--variants", "id,id+10ch"])
            .unwrap()
            .o;
        assert_eq!(o.variants, [Variant::Id, Variant::IdTenChannels]);
        let o = Cli::try_parse_from(["x", "fanout", "--fraction", "0"])
            .unwrap()
            .o;
        assert!(o.check().is_err());
        assert!(Cli::try_parse_from(["x", "sideways"]).is_err());
    }
}

//! The `push` measurement: open N idle connections through worker
//! processes, sample the server's memory and CPU, watch it idle, then
//! broadcast K messages one at a time and check and time every delivery;
//! optionally then streams: a burst of lines written back to back, a feed
//! at a steady rate, or a search for the highest rate a feed can have
//! with its p99 latency under a limit.

use std::io::{self, IsTerminal, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use crate::client::dial::{auto_sources, Transports};
use crate::client::pacing::{self, Schedule};
use crate::client::probe::Probes;
use crate::fleet::coordinator::{Fleet, Launch};
use crate::fleet::protocol::{Plan, Report};
use crate::observe::cpu::{CpuMark, QUIET_SHARE};
use crate::observe::format;
use crate::observe::latency::LatencyReport;
use crate::observe::procfs::{self, Usage};
use crate::observe::ramp::Ramp;
use crate::observe::scrape;
use crate::observe::sys;
use crate::report::RunInfo;
use crate::report::{
    BroadcastReport, ConnectionReport, CpuReport, DeliveryReport, Memory, MemoryReport, RunReport,
    StreamReport,
};
use crate::target::publish::ThroughPublish;
use crate::target::server::start_server;
use crate::target::server::ServerSpec;
use crate::target::Target;
use crate::wire::message::{self, Padding, Stamp};
use crate::Error;

/// Descriptors a worker needs besides one per connection.
const SPARE_FDS: usize = 64;

/// How often the coordinator grants connection attempts during the setup.
const TICK: Duration = Duration::from_millis(2);

/// How often the server's liveness is checked while waiting.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// How often the live progress line is redrawn on a terminal (on other
/// standard errors, a line is written every [`PROGRESS_LOG_EVERY`]).
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
const PROGRESS_LOG_EVERY: Duration = Duration::from_secs(5);

/// Steps of the feed rate search at most.
const MAX_SEARCH_STEPS: u32 = 12;

/// Feeds of `--feed-secs` tried at most to hold the rate the search found
/// (each 10% below the one before).
const HOLD_TRIES: u32 = 3;

/// The search stops once the lowest failing rate is within this factor of
/// the highest passing one.
const SEARCH_PRECISION: f64 = 1.1;

/// Parameters of a `push` run.
#[derive(Debug, Clone, clap::Args)]
pub struct PushOptions {
    /// Connections to open.
    #[arg(long, default_value_t = 1000)]
    pub conns: usize,
    /// Broadcast messages to send, one at a time.
    #[arg(long, default_value_t = 10)]
    pub messages: u32,
    /// Size of each message payload (it carries a sequence number and a timestamp).
    #[arg(long, default_value_t = 32)]
    pub payload_bytes: usize,
    /// What fills each payload after its sequence number and timestamp:
    /// `dots`, or `json` (an order book, which compresses as a JSON feed
    /// does).
    #[arg(long, value_enum, default_value_t = Padding::Dots)]
    pub padding: Padding,
    /// The connections offer permessage-deflate, without context takeover
    /// either way, and fail if the server does not agree; they inflate
    /// what arrives compressed. The report adds the compressed share and
    /// the payload bytes on the wire over their plain size.
    #[arg(long)]
    pub deflate: bool,
    /// What the connections speak: `ws`, `sse` (event streams, as
    /// `EventSource` opens them: a `GET` with `Accept:
    /// text/event-stream`), or `mixed` (connections of odd ids are event
    /// streams). The messages are checked the same way for both.
    #[arg(long, value_enum, default_value_t = Transports::WebSocket)]
    pub transport: Transports,
    /// Every connection subscribes to this channel (`&channel=NAME` in its
    /// URL) and every line is sent as `pub NAME PAYLOAD`: for wspush with
    /// `--input commands`, a channel's messages instead of broadcasts.
    #[arg(long, value_name = "NAME")]
    pub channel: Option<String>,
    /// Every connection presents this token (`&token=TOKEN` in its URL):
    /// one of a token file's, or a signed one, for what checking tokens
    /// costs the setup.
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Send the broadcasts as `POST /publish` requests to this address (the
    /// server's `--publish-listen`), on one keep-alive connection, instead
    /// of on its standard input.
    #[arg(long, value_name = "ADDR", requires = "publish_key")]
    pub publish: Option<SocketAddr>,
    /// The key the requests present (`Authorization: Bearer KEY`).
    #[arg(long, value_name = "KEY", requires = "publish")]
    pub publish_key: Option<String>,
    /// Read the server's counts of what it encoded and delivered (its
    /// `/metrics` at this address) at the end of the run, for the report:
    /// a batch framed, made into events, or compressed once for every
    /// connection that gets it shows as one count per batch or message.
    #[arg(long, value_name = "ADDR")]
    pub metrics_from: Option<SocketAddr>,
    /// Connection attempts started per second.
    #[arg(long, default_value_t = 10_000)]
    pub rate: u32,
    /// Most connections connecting or upgrading at once (over all workers).
    #[arg(long, default_value_t = 512)]
    pub max_in_flight: usize,
    /// Source addresses used in turn: 127.0.0.2, 127.0.0.3, ... [default:
    /// enough for the connections to use at most 45% of the local port
    /// range per address: beyond half of it, connect() slows down 20×].
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=250))]
    pub sources: Option<u8>,
    /// The first source address (the others follow it).
    #[arg(long, value_name = "IP", default_value = "127.0.0.2")]
    pub first_source: Ipv4Addr,
    /// Most connections one worker process holds (each process may have at
    /// most RLIMIT_NOFILE descriptors).
    #[arg(long, default_value_t = 19_500)]
    pub per_worker: usize,
    /// Workers that open connections at the same time (they are filled in
    /// order). With 2, a fifth to a tenth of this 2-CPU machine stayed idle
    /// during the setup; 4 to 8 keep both CPUs busy.
    #[arg(long, default_value_t = 6)]
    pub active_workers: usize,
    /// Server port (default: a free one).
    #[arg(long)]
    pub port: Option<u16>,
    /// Idle time before each memory sample, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub settle_ms: u64,
    /// Seconds over which the server's idle CPU is measured after the setup.
    #[arg(long, default_value_t = 10)]
    pub idle_secs: u64,
    /// Pause between the end of one broadcast and the next, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub gap_ms: u64,
    /// Seconds the server gets to start listening.
    #[arg(long, default_value_t = 30)]
    pub start_timeout: u64,
    /// Seconds the whole connection setup may take [default: 60 s plus one
    /// second per 1,000 connections].
    #[arg(long)]
    pub setup_timeout: Option<u64>,
    /// Give up the setup when no connection opened or failed for this many
    /// seconds.
    #[arg(long, default_value_t = 30)]
    pub stall_timeout: u64,
    /// Seconds one connection may stay connecting or upgrading.
    #[arg(long, default_value_t = 10)]
    pub connect_timeout: u64,
    /// Seconds one broadcast may take to reach every connection [default:
    /// 10 s plus 50 µs per connection].
    #[arg(long)]
    pub message_timeout: Option<u64>,
    /// While a broadcast is arriving, a worker polls its sockets without
    /// blocking and naps this many microseconds, times the number of
    /// workers, whenever a poll found less than a full batch of events. A
    /// client blocked in `epoll_wait` is woken up by nearly every server
    /// `write()`, which charges the server for a cross-CPU wake-up per
    /// socket (costly in a VM); a napping client is not waiting on the
    /// sockets, so writes to it wake nobody. Receipt times are late by up
    /// to the nap. 0 blocks in `epoll_wait` instead.
    #[arg(long, default_value_t = 200)]
    pub nap_us: u64,
    /// Before starting the server, wait up to this many seconds for the
    /// machine to be quiet (other processes below 10% of a CPU for 5 s in
    /// a row).
    #[arg(long, default_value_t = 0)]
    pub wait_quiet: u64,
    /// After the broadcasts one at a time: a burst of this many lines
    /// written back to back (one write), timed until every connection has
    /// every one of them.
    #[arg(long, value_name = "LINES")]
    pub burst: Option<u32>,
    /// Then a feed of this many lines a second for `--feed-secs`.
    #[arg(long, value_name = "LINES_PER_SEC")]
    pub feed_rate: Option<f64>,
    /// Seconds of the feed.
    #[arg(long, default_value_t = 30)]
    pub feed_secs: u64,
    /// Instead of one feed: search the highest feed rate with p99 latency
    /// under `--feed-max-p99-ms` and every line delivered (steps of
    /// `--feed-search-secs` from `--feed-rate` or 100/s, doubling, then
    /// halving the interval), then hold the rate found for `--feed-secs`.
    #[arg(long)]
    pub find_max_feed_rate: bool,
    /// The p99 latency limit of the feed rate search, in ms.
    #[arg(long, default_value_t = 100.0)]
    pub feed_max_p99_ms: f64,
    /// Seconds of each step of the feed rate search.
    #[arg(long, default_value_t = 5)]
    pub feed_search_secs: u64,
    /// During each stream, probe the server's responsiveness every this
    /// many milliseconds: a new connection's upgrade time, and the ping
    /// round trip of a connected client (one more connection, besides
    /// `--conns`, that gets the stream too).
    #[arg(long, value_name = "MS")]
    pub probe_ms: Option<u64>,
    /// The connections ask for positions (`&positions=1`): each message
    /// comes as its position, a space and the payload, checked as before;
    /// a connection dialed again resumes with `&since=` its last position.
    #[arg(long)]
    pub positions: bool,
    /// This many seconds into the feed, every connection is dropped by
    /// its client at once and dialed again (a reconnect storm), spread
    /// over `--storm-within-ms`, to the next server (host) of the run; the
    /// feed's report counts what each connection received, which must
    /// still be every line once, in order. Repeatable.
    #[arg(long, value_name = "SECS", requires = "feed_rate")]
    pub storm_at_secs: Vec<f64>,
    /// The reconnects of a storm are spread over this long.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub storm_within_ms: u64,
    /// This many seconds into the feed, one instance of the server (run
    /// with `--processes`) is killed with SIGKILL; its clients, dropped,
    /// dial again after 0 to 2 s (resuming, with `--positions`).
    #[arg(long, value_name = "SECS", requires = "feed_rate")]
    pub kill_instance_at_secs: Option<f64>,
    /// This many seconds into the feed, the server (a supervisor, run with
    /// `--processes`) is sent SIGHUP: a rolling restart. Its clients,
    /// closed as each instance drains, dial again after the delay the
    /// server's hint gives (resuming, with `--positions`); the feed's
    /// report gives the peak rate of those redials.
    #[arg(long, value_name = "SECS", requires = "feed_rate")]
    pub roll_at_secs: Option<f64>,
    /// This many seconds into the feed, the broker the servers read (the
    /// `hosts` measurement's redis-server) is stopped, and started again
    /// `--broker-outage-secs` later; the lines of the feed meanwhile
    /// wait in the publisher, which sends them once it is back.
    #[arg(long, value_name = "SECS", requires = "feed_rate")]
    pub broker_outage_at_secs: Option<f64>,
    /// How long the broker stays stopped.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub broker_outage_secs: f64,
}

impl PushOptions {
    /// What goes before each line's payload: `pub NAME ` with `--channel`.
    fn line_prefix(&self) -> Vec<u8> {
        self.channel
            .as_ref()
            .map_or_else(Vec::new, |name| format!("pub {name} ").into_bytes())
    }

    fn setup_timeout(&self) -> Duration {
        Duration::from_secs(self.setup_timeout.unwrap_or(60 + self.conns as u64 / 1000))
    }

    fn message_timeout(&self) -> Duration {
        match self.message_timeout {
            Some(secs) => Duration::from_secs(secs),
            None => Duration::from_secs(10) + Duration::from_micros(50) * self.conns as u32,
        }
    }

    /// Checks the options that do not depend on the machine.
    pub fn check(&self) -> Result<(), Error> {
        if self.conns == 0
            || self.messages == 0
            || self.rate == 0
            || self.max_in_flight == 0
            || self.per_worker == 0
            || self.active_workers == 0
        {
            return Err(
                "--conns, --messages, --rate, --max-in-flight, --per-worker and \
                        --active-workers must be positive"
                    .into(),
            );
        }
        if self.burst == Some(0)
            || self.feed_rate.is_some_and(|r| !(r > 0.0 && r.is_finite()))
            || self.feed_secs == 0
            || self.feed_search_secs == 0
        {
            return Err(
                "--burst, --feed-rate, --feed-secs and --feed-search-secs must be positive".into(),
            );
        }
        // The widest stamp: the last sequence number with a 20-digit time.
        let streams = self.burst.is_some() || self.feed_rate.is_some() || self.find_max_feed_rate;
        let max_seq = if streams { u32::MAX } else { self.messages };
        Ok(message::check_room(self.payload_bytes, max_seq)?)
    }
}

/// Spawns `spec` on a free port, measures it with worker processes of
/// this program, and stops it (also on error).
pub fn run(spec: &ServerSpec, options: &PushOptions, round: u32) -> Result<RunReport, Error> {
    options.check()?;
    let (mut server, command, port) = start_server(
        spec,
        options.port,
        options.wait_quiet,
        options.start_timeout,
    )?;
    let info = RunInfo {
        server: spec.label.clone(),
        command,
        round,
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let launch = Launch::Processes {
        exe: std::env::current_exe()?,
    };
    match (options.publish, &options.publish_key) {
        (Some(publish), Some(key)) => {
            let commands = options.channel.is_some();
            let mut via = ThroughPublish::new(&mut server, publish, key, commands)?;
            measure(&mut via, addr, options, &launch, info)
        }
        _ => measure(&mut server, addr, options, &launch, info),
    }
}

/// Measures the listening server `target` at `addr`, phase by phase, with
/// workers launched as `launch` says.
pub fn measure(
    target: &mut dyn Target,
    addr: SocketAddr,
    options: &PushOptions,
    launch: &Launch,
    info: RunInfo,
) -> Result<RunReport, Error> {
    measure_hosts(target, &[addr], options, launch, info)
}

/// [`measure`] for a server on several hosts, `servers`: connection `i`
/// dials `servers[i % len]`; the probes go to the first.
pub fn measure_hosts(
    target: &mut dyn Target,
    servers: &[SocketAddr],
    options: &PushOptions,
    launch: &Launch,
    info: RunInfo,
) -> Result<RunReport, Error> {
    let addr = *servers.first().ok_or("no server address")?;
    options.check()?;
    let nofile = wspush::sys::raise_open_file_limit()? as usize;
    let workers = options.conns.div_ceil(options.per_worker);
    let per_process = match launch {
        Launch::Processes { .. } => options.per_worker.min(options.conns),
        Launch::Threads => options.conns,
    };
    if per_process + SPARE_FDS > nofile {
        return Err(format!(
            "{per_process} connections in one process need more than the {nofile} open files \
             a process may have: lower --per-worker"
        )
        .into());
    }
    let sources = match options.sources {
        Some(n) => n,
        None => auto_sources(options.conns)?,
    };
    let first = u32::from(options.first_source);
    let plan = Plan {
        servers: servers.to_vec(),
        sources: (0..u32::from(sources))
            .map(|i| Ipv4Addr::from(first + i))
            .collect(),
        first_id: 0,
        payload_bytes: options.payload_bytes,
        padding: options.padding,
        deflate: options.deflate,
        transports: options.transport,
        channel: options.channel.clone(),
        positions: options.positions,
        token: options.token.clone(),
        connect_timeout_ms: options.connect_timeout * 1000,
        receipts: None,
    };
    let shares = pacing::split_evenly(options.conns, workers);
    let fleet = Fleet::launch(launch, &plan, &shares)?;
    let label = info.server.clone();
    let mut run = Run {
        addr,
        target,
        fleet,
        options,
        label: &label,
        warnings: Vec::new(),
    };
    let observations = run.observe()?;
    let listeners = procfs::listeners(addr.port()).unwrap_or(0);
    Ok(summarise(
        info,
        options,
        run.fleet.len(),
        sources,
        listeners,
        observations,
        run.warnings,
    ))
}

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

/// Everything a run observed, before it is summarised.
pub struct Observations {
    /// Server usage before the connections.
    pub baseline: Usage,
    /// Server usage when the setup began.
    pub setup_start: Usage,
    /// Server usage at the end of the setup.
    pub setup_end: Usage,
    /// Server usage with the connections open, after settling.
    pub open: Usage,
    /// Server usage at the end of the idle period.
    pub idle_end: Usage,
    /// Server usage after the last broadcast.
    pub end: Usage,
    /// Length of the setup.
    pub setup: Duration,
    /// CPU time of the client (this process and its workers) during the setup.
    pub client_setup_ns: u64,
    /// Busy CPU time of the machine during the setup.
    pub machine_setup_ns: u64,
    /// Of that, interrupt time (softirq: loopback TCP work).
    pub interrupts_setup_ns: u64,
    /// Length of the idle period.
    pub idle: Duration,
    /// Connections open after the setup.
    pub open_conns: usize,
    /// The setup over time.
    pub ramp: Ramp,
    /// Send time of each message ([`sys::now_ns`]).
    pub sent_ns: Vec<u64>,
    /// Wall time from the first broadcast to the end of the last.
    pub broadcast_wall: Duration,
    /// CPU time of the client (this process and its workers) during the broadcasts.
    pub client_broadcast_ns: u64,
    /// Busy CPU time of the machine during the broadcasts.
    pub machine_broadcast_ns: u64,
    /// Memory of the worker processes with the connections open (none for threads).
    pub client: Option<Usage>,
    /// The streams after the broadcasts one at a time, in order.
    pub streams: Vec<StreamReport>,
    /// The steps of the feed rate search, in order.
    pub feed_search: Vec<StreamReport>,
    /// The highest feed rate the search found, held for `--feed-secs`.
    pub max_feed_rate: Option<f64>,
    /// What the connections observed.
    pub observed: crate::observe::stats::Observed,
    /// The server's counts `--metrics-from` read, at the end.
    pub counted: Vec<(String, u64)>,
}

/// One measurement in progress.
struct Run<'a> {
    addr: SocketAddr,
    target: &'a mut dyn Target,
    fleet: Fleet,
    options: &'a PushOptions,
    label: &'a str,
    warnings: Vec<String>,
}

impl Run<'_> {
    /// The phases of the run, in order.
    fn observe(&mut self) -> Result<Observations, Error> {
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
        let counted = match o.metrics_from {
            Some(addr) => {
                let page = scrape::fetch_metrics(addr)
                    .map_err(|e| format!("/metrics from {addr}: {e}"))?;
                COUNTED
                    .iter()
                    .filter_map(|&name| {
                        Some((name.to_string(), scrape::metric(&page, name)? as u64))
                    })
                    .collect()
            }
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
        })
    }

    /// A feed of `rate` lines a second for `secs` seconds.
    fn feed(&mut self, first: &mut u32, rate: f64, secs: u64) -> Result<StreamReport, Error> {
        self.pump(Duration::from_millis(self.options.gap_ms))?;
        let lines = (rate * secs as f64).round().max(1.0) as u32;
        self.stream("feed", first, lines, Some(rate))
    }

    /// Feeds at rising rates (doubling from `--feed-rate`, then halving
    /// the gap between the highest that held and the lowest that did not)
    /// until the two are within [`SEARCH_PRECISION`]; returns the highest
    /// rate that held and every step.
    fn find_max_feed_rate(
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
    fn stream(
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
        let expected = self.fleet.arm_stream(start_seq, count, nap_us)?;
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
                let pid = self.target.roll()?;
                eprintln!(
                    "[{}] rolling restart asked of process {pid} (SIGHUP)",
                    self.label
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
            server_cpu_secs: after.server_ns.saturating_sub(before.server_ns) as f64 / 1e9,
            client_cpu_secs: after.client_ns.saturating_sub(before.client_ns) as f64 / 1e9,
            machine_cpu_secs: after.machine_ns.saturating_sub(before.machine_ns) as f64 / 1e9,
            probes,
            redials: receipts.redial_peak().1,
            redials_peak_per_sec: receipts.redial_peak().0,
        })
    }

    /// Memory and CPU of the worker processes (none when they are threads).
    fn client_usage(&self) -> io::Result<Option<Usage>> {
        let pids = self.fleet.pids();
        if pids.is_empty() {
            return Ok(None);
        }
        procfs::processes_usage(&pids).map(Some)
    }

    /// CPU time of the client: this process and its worker processes.
    fn client_cpu_ns(&self) -> io::Result<u64> {
        let workers = self.client_usage()?.map_or(0, |u| u.cpu_ns);
        Ok(procfs::own_cpu_ns()? + workers)
    }

    /// Waits `duration` (handling reports), then samples the server; warns
    /// if other processes were busy meanwhile (`phase` names the moment).
    fn settle(&mut self, duration: Duration, phase: &str) -> Result<Usage, Error> {
        let before = CpuMark::take(self.target.usage()?.cpu_ns, self.client_cpu_ns()?)?;
        self.pump(duration)?;
        let usage = self.target.usage()?;
        let others = CpuMark::take(usage.cpu_ns, self.client_cpu_ns()?)?.others_since(&before);
        self.warn_if_busy(others, phase);
        Ok(usage)
    }

    /// Records a warning if others used more than [`QUIET_SHARE`] of a CPU.
    fn warn_if_busy(&mut self, share: f64, phase: &str) {
        if share > QUIET_SHARE {
            self.warnings.push(format!(
                "other processes used {:.0}% of a CPU {phase}: numbers may be disturbed",
                share * 100.0
            ));
        }
    }

    /// Opens the connections at the configured rate, at most
    /// `max_in_flight` at a time, until all are open or failed (or the
    /// setup timeout); returns the setup time and its ramp.
    fn open_connections(&mut self) -> Result<(Duration, Ramp), Error> {
        let o = self.options;
        let schedule = Schedule::new(f64::from(o.rate), o.conns as u64);
        let mut ramp = Ramp::new();
        let mut progress = ProgressLine::new(self.label);
        let start = Instant::now();
        let deadline = start + o.setup_timeout();
        let stall = Duration::from_secs(o.stall_timeout);
        let (mut settled, mut last_change) = (0, start);
        let mut checked = start;
        loop {
            let now = Instant::now();
            if self.fleet.granted() >= o.conns && self.fleet.in_flight() == 0 {
                break;
            }
            let counts = self.fleet.counts();
            if counts.opened as u64 + counts.failed != settled {
                settled = counts.opened as u64 + counts.failed;
                last_change = now;
            }
            if now >= deadline || now >= last_change + stall {
                eprintln!(
                    "\n[{}] setup {}; {} still in flight",
                    self.label,
                    if now >= deadline {
                        "timed out"
                    } else {
                        "stalled"
                    },
                    self.fleet.in_flight()
                );
                self.fleet.abandon()?;
                self.pump(Duration::from_millis(500))?;
                break;
            }
            if now >= checked + CHECK_EVERY {
                self.check()?;
                checked = now;
            }
            let due = schedule.due(now - start) as usize;
            let room = o.max_in_flight.saturating_sub(self.fleet.in_flight());
            let want = due.saturating_sub(self.fleet.granted()).min(room);
            if want > 0 {
                self.fleet.open(want, o.active_workers)?;
            }
            let tick_end = now + TICK;
            loop {
                let left = tick_end.saturating_duration_since(Instant::now());
                if left.is_zero() || self.fleet.next_report(left)?.is_none() {
                    break;
                }
            }
            let counts = self.fleet.counts();
            ramp.record(start.elapsed(), counts.opened as u64);
            progress.update(|| {
                format!(
                    "{}/{} open, {} in flight, {} failed, {:.1} s",
                    counts.open,
                    o.conns,
                    self.fleet.in_flight(),
                    counts.failed,
                    start.elapsed().as_secs_f64()
                )
            });
        }
        let setup = start.elapsed();
        progress.finish();
        ramp.finish(setup, self.fleet.counts().opened as u64);
        Ok((setup, ramp))
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

    /// Handles reports for `duration`, checking the server now and then.
    fn pump(&mut self, duration: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + duration;
        loop {
            self.check()?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            self.fleet.next_report(left.min(CHECK_EVERY))?;
        }
    }

    /// Fails if the run was interrupted or the server died.
    fn check(&mut self) -> Result<(), Error> {
        crate::target::check(self.target)
    }
}

/// Whether a feed held: every line reached every connection, with p99
/// latency at most `max_p99_ms`.
fn is_held(feed: &StreamReport, max_p99_ms: f64) -> bool {
    feed.complete && feed.received >= feed.expected && feed.latency.p99_us <= max_p99_ms * 1e3
}

/// The live progress line on standard error: redrawn in place on a
/// terminal, written as a plain line every few seconds elsewhere.
struct ProgressLine<'a> {
    label: &'a str,
    terminal: bool,
    last: Option<Instant>,
    drawn: bool,
}

impl<'a> ProgressLine<'a> {
    fn new(label: &'a str) -> Self {
        ProgressLine {
            label,
            terminal: io::stderr().is_terminal(),
            last: None,
            drawn: false,
        }
    }

    /// Shows `text()` if it is time to.
    fn update(&mut self, text: impl FnOnce() -> String) {
        let every = if self.terminal {
            PROGRESS_EVERY
        } else {
            PROGRESS_LOG_EVERY
        };
        let now = Instant::now();
        if self.last.is_some_and(|t| now < t + every) {
            return;
        }
        self.last = Some(now);
        let mut err = io::stderr().lock();
        let _ = if self.terminal {
            self.drawn = true;
            write!(err, "\r[{}] {}\x1b[K", self.label, text())
        } else {
            writeln!(err, "[{}] {}", self.label, text())
        };
    }

    /// Ends the line on a terminal.
    fn finish(&mut self) {
        if self.drawn {
            eprintln!();
        }
    }
}

/// Summarises what a run observed.
fn summarise(
    info: RunInfo,
    options: &PushOptions,
    workers: usize,
    sources: u8,
    listeners: usize,
    o: Observations,
    warnings: Vec<String>,
) -> RunReport {
    let secs = |ns: u64| ns as f64 / 1e9;
    let percent = |ns: u64, wall: f64| 100.0 * secs(ns) / wall.max(1e-9);
    let open = o.open_conns as f64;
    let observed = &o.observed;
    let setup_ns = o.setup_end.cpu_ns.saturating_sub(o.setup_start.cpu_ns);
    let idle_ns = o.idle_end.cpu_ns.saturating_sub(o.open.cpu_ns);
    let broadcast_ns = o.end.cpu_ns.saturating_sub(o.idle_end.cpu_ns);
    // The messages sent one at a time (streams follow them).
    let expected: u64 = observed
        .messages
        .iter()
        .take(o.sent_ns.len())
        .map(|m| u64::from(m.expected))
        .sum();
    let rss_growth = o.open.rss_bytes as i64 - o.baseline.rss_bytes as i64;
    let pss_growth = o.open.pss_bytes as i64 - o.baseline.pss_bytes as i64;
    let broadcast_wall = o.broadcast_wall.as_secs_f64();
    let opened = o.ramp.points().last().map_or(0, |&(_, n)| n).max(1) as f64;
    let per_conn_us = |ns: u64| ns as f64 / 1e3 / opened;
    RunReport {
        server: info.server,
        round: info.round,
        command: info.command,
        connections: ConnectionReport {
            requested: options.conns as u64,
            open: o.open_conns as u64,
            failed: observed.failed(),
            failures: observed.failures.clone(),
            statuses: observed.statuses.clone(),
            setup_secs: o.setup.as_secs_f64(),
            rate: o.ramp.summary(o.setup),
            workers,
            sources,
            ramp: o.ramp.points().to_vec(),
        },
        memory: MemoryReport {
            processes: o.open.processes,
            listeners,
            baseline: o.baseline.into(),
            open: o.open.into(),
            end: o.end.into(),
            rss_growth_bytes: rss_growth,
            pss_growth_bytes: pss_growth,
            rss_per_conn: rss_growth as f64 / open,
            pss_per_conn: pss_growth as f64 / open,
            client: o.client.map(Memory::from),
        },
        cpu: CpuReport {
            server_setup_secs: secs(setup_ns),
            setup_percent: percent(setup_ns, o.setup.as_secs_f64()),
            server_setup_us_per_conn: per_conn_us(setup_ns),
            client_setup_us_per_conn: per_conn_us(o.client_setup_ns),
            interrupts_setup_us_per_conn: per_conn_us(o.interrupts_setup_ns),
            machine_setup_us_per_conn: per_conn_us(o.machine_setup_ns),
            server_idle_secs: secs(idle_ns),
            idle_wall_secs: o.idle.as_secs_f64(),
            idle_percent: percent(idle_ns, o.idle.as_secs_f64()),
            server_broadcast_secs: secs(broadcast_ns),
            broadcast_wall_secs: broadcast_wall,
            broadcast_percent: percent(broadcast_ns, broadcast_wall),
            server_us_per_delivery: broadcast_ns as f64 / 1e3 / expected.max(1) as f64,
            client_broadcast_secs: secs(o.client_broadcast_ns),
            machine_broadcast_secs: secs(o.machine_broadcast_ns),
        },
        broadcast: BroadcastReport::new(&o.sent_ns, &observed.messages, options.payload_bytes),
        latency: LatencyReport::from_histogram(&observed.histogram()),
        delivery: DeliveryReport {
            lost: observed.lost(),
            duplicates: observed.duplicates,
            out_of_order: observed.out_of_order,
            corrupt: observed.corrupt,
            payloads: observed.payloads,
        },
        streams: o.streams,
        feed_search: o.feed_search,
        max_feed_rate: o.max_feed_rate,
        counted: o.counted,
        warnings,
    }
}

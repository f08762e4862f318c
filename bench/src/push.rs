//! The `push` measurement: spawn a server, open N idle connections, measure
//! its memory, broadcast K messages one at a time and time their fan-out.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use crate::clients::Clients;
use crate::message::{self, Stamp};
use crate::procfs;
use crate::report::{
    BroadcastReport, ConnectionReport, CpuReport, DeliveryReport, LatencyReport, MemoryReport,
    RunReport,
};
use crate::server::{self, Server, ServerSpec};
use crate::sys;

/// Descriptors this process needs besides one per connection.
const SPARE_FDS: u64 = 64;

/// How often the server's liveness is checked while waiting on sockets.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// Parameters of a `push` run.
#[derive(Debug, Clone, clap::Args)]
pub struct PushOptions {
    /// Connections to open.
    #[arg(long, default_value_t = 1000)]
    pub conns: usize,
    /// Broadcast messages to send, one at a time.
    #[arg(long, default_value_t = 20)]
    pub messages: u32,
    /// Size of each message payload (it carries a sequence number and a timestamp).
    #[arg(long, default_value_t = 32)]
    pub payload_bytes: usize,
    /// Connection attempts started per second.
    #[arg(long, default_value_t = 10_000)]
    pub rate: u32,
    /// Most connections connecting or upgrading at once.
    #[arg(long, default_value_t = 512)]
    pub max_in_flight: usize,
    /// Source addresses used in turn: 127.0.0.2, 127.0.0.3, ...
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=250))]
    pub sources: u8,
    /// Server port (default: a free one).
    #[arg(long)]
    pub port: Option<u16>,
    /// Idle time before each memory sample, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub settle_ms: u64,
    /// Pause between the end of one broadcast and the next, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub gap_ms: u64,
    /// Seconds the server gets to start listening.
    #[arg(long, default_value_t = 30)]
    pub start_timeout: u64,
    /// Seconds the whole connection setup may take.
    #[arg(long, default_value_t = 120)]
    pub setup_timeout: u64,
    /// Seconds one broadcast may take to reach every connection.
    #[arg(long, default_value_t = 10)]
    pub message_timeout: u64,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Runs one measurement of `spec`; the server is stopped before returning,
/// also on error.
pub fn run(spec: &ServerSpec, options: &PushOptions, round: u32) -> Result<RunReport, Error> {
    check_options(options)?;
    let nofile = sys::raise_nofile_limit()?;
    if options.conns as u64 + SPARE_FDS > nofile {
        return Err(format!(
            "{} connections need more than the {nofile} open files one process may have",
            options.conns
        )
        .into());
    }
    let port = match options.port {
        Some(port) => port,
        None => server::free_port()?,
    };
    let command = server::command_line(&spec.command, port, &std::env::current_exe()?);
    eprintln!("[{}] starting: {command}", spec.label);
    let mut server = Server::spawn(&command)?;
    server.wait_listening(port, Duration::from_secs(options.start_timeout))?;
    let mut run = Run {
        server,
        options,
        label: &spec.label,
    };
    let mut report = run.measure(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))?;
    report.round = round;
    report.command = command;
    Ok(report)
}

fn check_options(options: &PushOptions) -> Result<(), Error> {
    if options.conns == 0
        || options.messages == 0
        || options.rate == 0
        || options.max_in_flight == 0
    {
        return Err("--conns, --messages, --rate and --max-in-flight must be positive".into());
    }
    // The largest stamp: the last sequence number with a 20-digit time.
    let widest = Stamp {
        seq: options.messages,
        sent_ns: u64::MAX,
    };
    if message::encode(widest, options.payload_bytes).is_none() {
        return Err(format!(
            "--payload-bytes {} is too small for a sequence number and a timestamp",
            options.payload_bytes
        )
        .into());
    }
    Ok(())
}

/// One measurement in progress.
struct Run<'a> {
    server: Server,
    options: &'a PushOptions,
    label: &'a str,
}

impl Run<'_> {
    /// Measures the listening server at `addr`; the caller fills in the
    /// report's `round` and `command`.
    fn measure(&mut self, addr: SocketAddr) -> Result<RunReport, Error> {
        let o = self.options;
        let sources = (0..o.sources)
            .map(|i| Ipv4Addr::new(127, 0, 0, 2 + i))
            .collect();
        let mut clients = Clients::new(addr, sources, o.payload_bytes)?;

        self.idle(&mut clients, Duration::from_millis(o.settle_ms))?;
        let baseline = self.server.usage()?;

        let setup_start = Instant::now();
        self.open_connections(&mut clients)?;
        let setup_secs = setup_start.elapsed().as_secs_f64();
        let after_setup = self.server.usage()?;
        let open = clients.open();
        eprintln!(
            "[{}] {open} of {} connections open in {setup_secs:.2} s",
            self.label, o.conns
        );
        if open == 0 {
            return Err(format!("no connection opened: {:?}", clients.tally().failures).into());
        }

        self.idle(&mut clients, Duration::from_millis(o.settle_ms))?;
        let idle = self.server.usage()?;

        let client_cpu_start = procfs::own_cpu_ns()?;
        let broadcast_start = Instant::now();
        for seq in 1..=o.messages {
            self.broadcast(&mut clients, seq)?;
            if seq < o.messages {
                self.idle(&mut clients, Duration::from_millis(o.gap_ms))?;
            }
        }
        let broadcast_wall = broadcast_start.elapsed().as_secs_f64();
        let client_cpu = procfs::own_cpu_ns()? - client_cpu_start;
        let end = self.server.usage()?;

        let tally = clients.tally();
        let secs = |ns: u64| ns as f64 / 1e9;
        Ok(RunReport {
            server: self.label.to_string(),
            round: 0,
            command: String::new(),
            connections: ConnectionReport {
                requested: o.conns as u64,
                open: open as u64,
                failures: tally.failures.clone(),
                setup_secs,
                setup_rate: open as f64 / setup_secs,
            },
            memory: MemoryReport {
                baseline_rss_bytes: baseline.rss_bytes,
                open_rss_bytes: idle.rss_bytes,
                end_rss_bytes: end.rss_bytes,
                bytes_per_conn: (idle.rss_bytes as f64 - baseline.rss_bytes as f64) / open as f64,
            },
            cpu: CpuReport {
                server_setup_secs: secs(after_setup.cpu_ns.saturating_sub(baseline.cpu_ns)),
                server_broadcast_secs: secs(end.cpu_ns.saturating_sub(idle.cpu_ns)),
                client_broadcast_secs: secs(client_cpu),
                broadcast_wall_secs: broadcast_wall,
            },
            broadcast: BroadcastReport::new(tally.messages(), o.payload_bytes),
            latency: LatencyReport::from_histogram(tally.latency()),
            delivery: DeliveryReport {
                lost: tally.lost(),
                duplicates: tally.duplicates,
                out_of_order: tally.out_of_order,
                corrupt: tally.corrupt,
            },
        })
    }

    /// Opens the connections at the configured rate, at most
    /// `max_in_flight` at a time, until all are open or failed.
    fn open_connections(&mut self, clients: &mut Clients) -> Result<(), Error> {
        let o = self.options;
        let start = Instant::now();
        let deadline = start + Duration::from_secs(o.setup_timeout);
        let mut checked = start;
        while clients.started() < o.conns || clients.pending() > 0 {
            let now = Instant::now();
            if now >= deadline {
                eprintln!(
                    "[{}] setup timed out; {} still pending",
                    self.label,
                    clients.pending()
                );
                clients.abandon_pending();
                break;
            }
            if now >= checked + CHECK_EVERY {
                self.check()?;
                checked = now;
            }
            let due = (now - start).as_secs_f64() * f64::from(o.rate);
            let due = (due as usize + 1).min(o.conns);
            let room = o.max_in_flight.saturating_sub(clients.pending());
            clients.start(due.saturating_sub(clients.started()).min(room));
            clients.step(Duration::from_millis(1))?;
        }
        Ok(())
    }

    /// Sends message `seq` and waits until every open connection has it,
    /// or the message timeout passes.
    fn broadcast(&mut self, clients: &mut Clients, seq: u32) -> Result<(), Error> {
        let o = self.options;
        let expected = clients.open() as u32;
        let sent_ns = sys::now_ns();
        let line = message::encode(Stamp { seq, sent_ns }, o.payload_bytes)
            .expect("payload size checked up front");
        clients.tally_mut().sent(seq, sent_ns, expected);
        self.server.send_line(&line)?;
        let start = Instant::now();
        let deadline = start + Duration::from_secs(o.message_timeout);
        let mut checked = start;
        loop {
            let progress = clients.tally().message(seq).expect("registered above");
            // Connections that failed meanwhile will not receive it.
            if progress.received as usize >= clients.open().min(expected as usize) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                eprintln!(
                    "[{}] message {seq}: {} of {expected} received before the timeout",
                    self.label, progress.received
                );
                return Ok(());
            }
            if now >= checked + CHECK_EVERY {
                self.check()?;
                checked = now;
            }
            clients.step(Duration::from_millis(10))?;
        }
    }

    /// Keeps serving the sockets (e.g. answering pings) for `duration`.
    fn idle(&mut self, clients: &mut Clients, duration: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + duration;
        loop {
            self.check()?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            clients.step(left.min(CHECK_EVERY))?;
        }
    }

    /// Fails if the run was interrupted or the server died.
    fn check(&mut self) -> Result<(), Error> {
        if sys::interrupted() {
            return Err(io::Error::from(io::ErrorKind::Interrupted).into());
        }
        Ok(self.server.check_alive()?)
    }
}

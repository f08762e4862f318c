//! The `push` measurement: spawn a server, open N idle connections, measure
//! its memory, broadcast K messages one at a time and time their fan-out.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use crate::clients::{Clients, EVENTS_PER_POLL};
use crate::message::{self, Stamp};
use crate::procfs::{self, Usage};
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

/// CPU share (of one CPU) that other processes may use during a phase
/// before the report warns that the machine was not quiet.
const QUIET_SHARE: f64 = 0.1;

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
    /// While a broadcast is in flight, poll the sockets without blocking and
    /// nap this many microseconds whenever a poll found less than a full
    /// batch of events. A client blocked in `epoll_wait` is woken up by
    /// nearly every server `write()`, which charges the server for a
    /// cross-CPU wake-up per socket (costly in a VM); a napping client
    /// is not waiting on the sockets, so writes to it wake nobody. Receipt
    /// times are late by up to this much. 0 blocks in `epoll_wait` instead.
    #[arg(long, default_value_t = 200)]
    pub nap_us: u64,
    /// Before starting the server, wait up to this many seconds for the
    /// machine to be quiet (other processes below 10% of a CPU for 1 s).
    #[arg(long, default_value_t = 0)]
    pub wait_quiet: u64,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Runs one measurement of `spec` (as round `round` of a comparison); the
/// server is stopped before returning, also on error.
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
    if options.wait_quiet > 0 {
        wait_quiet(Duration::from_secs(options.wait_quiet))?;
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
        warnings: Vec::new(),
    };
    let measured = run.measure(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))?;
    Ok(measured.into_report(spec.label.clone(), round, command, options, run.warnings))
}

fn check_options(options: &PushOptions) -> Result<(), Error> {
    if options.conns == 0
        || options.messages == 0
        || options.rate == 0
        || options.max_in_flight == 0
    {
        return Err("--conns, --messages, --rate and --max-in-flight must be positive".into());
    }
    // The widest stamp: the last sequence number with a 20-digit time.
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

/// Waits until the machine has been quiet for a second, for at most `limit`.
fn wait_quiet(limit: Duration) -> Result<(), Error> {
    let deadline = Instant::now() + limit;
    loop {
        let before = CpuMark::take(0)?;
        thread::sleep(Duration::from_secs(1));
        let share = CpuMark::take(0)?.others_since(&before);
        if share <= QUIET_SHARE {
            return Ok(());
        }
        if sys::interrupted() {
            return Err(io::Error::from(io::ErrorKind::Interrupted).into());
        }
        if Instant::now() >= deadline {
            eprintln!(
                "machine still busy ({:.0}% of a CPU) after {limit:?}; going ahead",
                share * 100.0
            );
            return Ok(());
        }
    }
}

/// CPU counters at one moment, to tell how much CPU time processes other
/// than the server and this client used in between two marks.
struct CpuMark {
    at: Instant,
    /// Busy time of all CPUs.
    machine_ns: u64,
    /// CPU time of this process (the client).
    own_ns: u64,
    /// CPU time of the server's process tree.
    server_ns: u64,
}

impl CpuMark {
    /// Marks now; `server_cpu_ns` is the server's CPU time so far (0 if none).
    fn take(server_cpu_ns: u64) -> io::Result<CpuMark> {
        Ok(CpuMark {
            at: Instant::now(),
            machine_ns: procfs::machine_busy_ns()?,
            own_ns: procfs::own_cpu_ns()?,
            server_ns: server_cpu_ns,
        })
    }

    /// Share of one CPU that others used since `earlier`.
    fn others_since(&self, earlier: &CpuMark) -> f64 {
        let machine = self.machine_ns.saturating_sub(earlier.machine_ns);
        let ours =
            (self.own_ns + self.server_ns).saturating_sub(earlier.own_ns + earlier.server_ns);
        let wall = self.at.duration_since(earlier.at).as_nanos().max(1);
        machine.saturating_sub(ours) as f64 / wall as f64
    }
}

/// The raw observations of one run, before they are summarised.
struct Measured {
    clients: Clients,
    setup: Duration,
    /// Server usage before the connections, after setup, with the
    /// connections idle, and after the last broadcast.
    baseline: Usage,
    after_setup: Usage,
    idle: Usage,
    end: Usage,
    /// Open connections after setup.
    open: usize,
    broadcast_wall: Duration,
    client_broadcast_ns: u64,
    machine_broadcast_ns: u64,
}

impl Measured {
    fn into_report(
        self,
        server: String,
        round: u32,
        command: String,
        options: &PushOptions,
        warnings: Vec<String>,
    ) -> RunReport {
        let tally = self.clients.tally();
        let secs = |ns: u64| ns as f64 / 1e9;
        let open = self.open as f64;
        let server_broadcast_ns = self.end.cpu_ns.saturating_sub(self.idle.cpu_ns);
        let expected: u64 = tally.messages().iter().map(|m| u64::from(m.expected)).sum();
        RunReport {
            server,
            round,
            command,
            connections: ConnectionReport {
                requested: options.conns as u64,
                open: self.open as u64,
                failures: tally.failures.clone(),
                setup_secs: self.setup.as_secs_f64(),
                setup_rate: open / self.setup.as_secs_f64(),
            },
            memory: MemoryReport {
                baseline_rss_bytes: self.baseline.rss_bytes,
                open_rss_bytes: self.idle.rss_bytes,
                end_rss_bytes: self.end.rss_bytes,
                bytes_per_conn: (self.idle.rss_bytes as f64 - self.baseline.rss_bytes as f64)
                    / open,
            },
            cpu: CpuReport {
                server_setup_secs: secs(
                    self.after_setup.cpu_ns.saturating_sub(self.baseline.cpu_ns),
                ),
                server_broadcast_secs: secs(server_broadcast_ns),
                server_us_per_delivery: server_broadcast_ns as f64 / 1e3 / expected.max(1) as f64,
                client_broadcast_secs: secs(self.client_broadcast_ns),
                machine_broadcast_secs: secs(self.machine_broadcast_ns),
                broadcast_wall_secs: self.broadcast_wall.as_secs_f64(),
            },
            broadcast: BroadcastReport::new(tally.messages(), options.payload_bytes),
            latency: LatencyReport::from_histogram(tally.latency()),
            delivery: DeliveryReport {
                lost: tally.lost(),
                duplicates: tally.duplicates,
                out_of_order: tally.out_of_order,
                corrupt: tally.corrupt,
            },
            warnings,
        }
    }
}

/// One measurement in progress.
struct Run<'a> {
    server: Server,
    options: &'a PushOptions,
    label: &'a str,
    warnings: Vec<String>,
}

impl Run<'_> {
    /// Measures the listening server at `addr`, phase by phase.
    fn measure(&mut self, addr: SocketAddr) -> Result<Measured, Error> {
        let o = self.options;
        let sources = (0..o.sources)
            .map(|i| Ipv4Addr::new(127, 0, 0, 2 + i))
            .collect();
        let mut clients = Clients::new(addr, sources, o.payload_bytes)?;
        let settle = Duration::from_millis(o.settle_ms);

        let baseline = self.settle(&mut clients, settle, "before the connections")?;

        let setup_start = Instant::now();
        self.open_connections(&mut clients)?;
        let setup = setup_start.elapsed();
        let after_setup = self.server.usage()?;
        let open = clients.open();
        eprintln!(
            "[{}] {open} of {} connections open in {:.2} s",
            self.label,
            o.conns,
            setup.as_secs_f64()
        );
        if open == 0 {
            return Err(format!("no connection opened: {:?}", clients.tally().failures).into());
        }

        let idle = self.settle(&mut clients, settle, "with the connections idle")?;

        let before = CpuMark::take(idle.cpu_ns)?;
        for seq in 1..=o.messages {
            self.broadcast(&mut clients, seq)?;
            if seq < o.messages {
                self.idle(&mut clients, Duration::from_millis(o.gap_ms))?;
            }
        }
        let end = self.server.usage()?;
        let after = CpuMark::take(end.cpu_ns)?;
        self.warn_if_busy(after.others_since(&before), "during the broadcasts");

        Ok(Measured {
            clients,
            setup,
            baseline,
            after_setup,
            idle,
            end,
            open,
            broadcast_wall: after.at - before.at,
            client_broadcast_ns: after.own_ns.saturating_sub(before.own_ns),
            machine_broadcast_ns: after.machine_ns.saturating_sub(before.machine_ns),
        })
    }

    /// Idles for `duration`, then samples the server; warns if other
    /// processes were busy meanwhile (`phase` names the moment).
    fn settle(
        &mut self,
        clients: &mut Clients,
        duration: Duration,
        phase: &str,
    ) -> Result<Usage, Error> {
        let before = CpuMark::take(self.server.usage()?.cpu_ns)?;
        self.idle(clients, duration)?;
        let usage = self.server.usage()?;
        let others = CpuMark::take(usage.cpu_ns)?.others_since(&before);
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
            if o.nap_us == 0 {
                clients.step(Duration::from_millis(10))?;
            } else if clients.step(Duration::ZERO)? < EVENTS_PER_POLL {
                thread::sleep(Duration::from_micros(o.nap_us));
            }
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

//! `hosts`: wspush on several hosts, measured as one server by the push
//! measurement ([`push::measure_hosts`]): connection `i` goes to host
//! `i % hosts` (and to the next host after each reconnect storm), and
//! every line goes to every host: published once on Redis (each host
//! subscribed with `--redis-channel`), added once to a Redis stream (each
//! host reading it with `--redis-stream`), or written to each host's
//! standard input (the baseline). With a stream, the broker may be stopped
//! for a while mid-feed (`--broker-outage-at-secs`): Redis then keeps its
//! stream in an append-only file, and the publisher holds the lines meanwhile
//! and adds them once Redis is back.
//!
//! A host is a network namespace (`NETNS=IP`, as `bench/multihost.sh`
//! makes them), so that the hosts, Redis and the clients talk across a
//! network boundary rather than over one loopback: each wspush, and
//! `redis-server`, runs in its namespace under `ip netns exec`; this
//! program and its client workers run in the clients' namespace.

use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::fleet::coordinator::Launch;
use crate::observe::procfs::Usage;
use crate::report::RunInfo;
use crate::report::RunReport;
use crate::scenario::push::{self, PushOptions};
use crate::target::server::{self, Server};
use crate::target::Target;
use crate::Error;

/// A host: its network namespace and its address there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostSpec {
    /// The namespace (`ip netns`).
    pub netns: String,
    /// Its address.
    pub ip: Ipv4Addr,
}

impl FromStr for HostSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (netns, ip) = s
            .split_once('=')
            .ok_or_else(|| format!("expected NETNS=IP, got `{s}`"))?;
        let ip = ip.parse().map_err(|e| format!("`{ip}`: {e}"))?;
        if netns.is_empty() {
            return Err(format!("no namespace in `{s}`"));
        }
        Ok(HostSpec {
            netns: netns.to_string(),
            ip,
        })
    }
}

/// How every line reaches the hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum Feed {
    /// Published once on Redis; each host subscribes (`--redis-channel`).
    Redis,
    /// Added once to a Redis stream (`XADD`); each host reads it
    /// (`--redis-stream`).
    Stream,
    /// Written to each host's standard input.
    Stdin,
}

/// Options of `hosts` (beside the push measurement's).
#[derive(Debug, Clone, clap::Args)]
pub struct HostsOptions {
    /// How the lines reach the hosts.
    #[arg(long, value_enum, default_value = "redis")]
    pub feed: Feed,
    /// A wspush host, as NETNS=IP (repeatable).
    #[arg(long = "host", value_name = "NETNS=IP", required = true)]
    pub hosts: Vec<HostSpec>,
    /// The Redis host, as NETNS=IP (for `--feed redis` and `stream`).
    #[arg(long, value_name = "NETNS=IP")]
    pub redis: Option<HostSpec>,
    /// With `--feed stream`, each `XADD` trims the stream to about this
    /// many entries (`MAXLEN ~ N`).
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub stream_maxlen: u64,
    /// The redis-server program.
    #[arg(long, default_value = "redis-server")]
    pub redis_server: String,
    /// Port of every wspush (and 6379 for Redis).
    #[arg(long = "host-port", default_value_t = 8080)]
    pub host_port: u16,
    /// The wspush program [default: the one next to this program].
    #[arg(long, value_name = "PATH")]
    pub wspush: Option<PathBuf>,
}

/// Redis's port.
const REDIS_PORT: u16 = 6379;
/// How long Redis's idle CPU is measured.
pub const IDLE_WINDOW: Duration = Duration::from_secs(2);
/// The channel the hosts subscribe to, or the stream they read.
const CHANNEL: &str = "feed";

/// A `hosts` run: the push report, and what Redis cost.
#[derive(Debug, Clone, Serialize)]
pub struct HostsReport {
    /// How the lines reached the hosts.
    pub feed: Feed,
    /// The hosts.
    pub hosts: Vec<HostSpec>,
    /// The push measurement over all hosts.
    pub push: RunReport,
    /// Lines published (or written to every host).
    pub lines: u64,
    /// Redis's CPU time over the measurement, in ms.
    pub redis_cpu_ms: Option<f64>,
    /// Redis's CPU while idle (its timers), in % of one CPU, measured over
    /// [`IDLE_WINDOW`] before the measurement.
    pub redis_idle_percent: Option<f64>,
    /// Redis's CPU per line published, in µs, its idle CPU over the
    /// measurement subtracted.
    pub redis_cpu_us_per_line: Option<f64>,
}

impl HostsReport {
    /// The report as text.
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "hosts: {} wspush hosts ({}), fed through {}\n",
            self.hosts.len(),
            self.hosts
                .iter()
                .map(|h| h.ip.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            match self.feed {
                Feed::Redis => "Redis (one PUBLISH per line)",
                Feed::Stream => "a Redis stream (one XADD per line)",
                Feed::Stdin => "each host's standard input",
            }
        );
        out.push_str(&self.push.render_text());
        let _ = write!(out, "lines sent: {}", self.lines);
        if let (Some(ms), Some(idle), Some(us)) = (
            self.redis_cpu_ms,
            self.redis_idle_percent,
            self.redis_cpu_us_per_line,
        ) {
            let _ = write!(
                out,
                "; Redis CPU {ms:.0} ms (idle {idle:.2}% of a CPU), {us:.1} µs per line beyond idle"
            );
        }
        out.push('\n');
        out
    }
}

/// Runs the push measurement over the hosts fed as `hosts.feed` says.
pub fn run(hosts: &HostsOptions, options: &PushOptions) -> Result<HostsReport, Error> {
    let broker = match (hosts.feed, &hosts.redis) {
        (Feed::Stdin, _) => None,
        (_, Some(spec)) => Some(spec),
        (_, None) => return Err("--feed redis and stream need --redis NETNS=IP".into()),
    };
    let outage = options.broker_outage_at_secs.is_some();
    if outage && hosts.feed != Feed::Stream {
        return Err("a broker outage is measured with --feed stream".into());
    }
    let exe = std::env::current_exe()?;
    let wspush = match &hosts.wspush {
        Some(path) => path.display().to_string(),
        None => server::wspush_exe(&exe),
    };
    let redis = match broker {
        Some(spec) => Some(Redis::start(spec, &hosts.redis_server, options, outage)?),
        None => None,
    };
    let mut servers = Vec::new();
    let mut commands = Vec::new();
    for host in &hosts.hosts {
        let mut command = format!(
            "ip netns exec {} {wspush} --listen {}:{} --quiet",
            host.netns, host.ip, hosts.host_port
        );
        if let Some(spec) = broker {
            let input = match hosts.feed {
                Feed::Stream => "--redis-stream",
                _ => "--redis-channel",
            };
            let _ = write!(
                command,
                " --redis redis://{}:{REDIS_PORT} {input} {CHANNEL}",
                spec.ip
            );
        }
        servers.push(Server::spawn(&command)?);
        commands.push(command);
    }
    let addrs: Vec<SocketAddr> = hosts
        .hosts
        .iter()
        .map(|h| SocketAddr::from((h.ip, hosts.host_port)))
        .collect();
    let timeout = Duration::from_secs(options.start_timeout);
    for (server, &addr) in servers.iter_mut().zip(&addrs) {
        wait_listening(addr, timeout, &mut || server.check_alive())?;
    }
    let publisher = match &redis {
        Some(redis) => Some(Publisher::connect(
            redis.addr,
            hosts.hosts.len(),
            hosts.feed,
            hosts.stream_maxlen,
        )?),
        None => None,
    };
    let mut target = Hosts {
        servers,
        redis,
        publisher,
        lines: 0,
    };
    if let Some(publisher) = &mut target.publisher {
        publisher.wait_ready(timeout)?;
    }
    // Redis's own timers, measured idle, are taken out of its cost per line.
    let idle_ns_per_s = match &target.redis {
        Some(r) => {
            let before = r.cpu_ns()?;
            std::thread::sleep(IDLE_WINDOW);
            Some(r.cpu_ns()?.saturating_sub(before) as f64 / IDLE_WINDOW.as_secs_f64())
        }
        None => None,
    };
    let redis_before = target.redis.as_ref().map(Redis::cpu_ns).transpose()?;
    let started = Instant::now();
    let info = RunInfo {
        server: format!("wspush × {}", hosts.hosts.len()),
        command: commands.join("; "),
        round: 1,
    };
    let launch = Launch::Processes { exe };
    let push = push::measure_hosts(&mut target, &addrs, options, &launch, info)?;
    let elapsed = started.elapsed().as_secs_f64();
    let redis_cpu_ms = match (&target.redis, redis_before) {
        (Some(r), Some(before)) => Some(r.cpu_ns()?.saturating_sub(before) as f64 / 1e6),
        _ => None,
    };
    let lines = target.lines;
    let beyond_idle = match (redis_cpu_ms, idle_ns_per_s) {
        (Some(ms), Some(idle)) if lines > 0 => {
            Some((ms * 1e6 - idle * elapsed).max(0.0) / 1e3 / lines as f64)
        }
        _ => None,
    };
    Ok(HostsReport {
        feed: hosts.feed,
        hosts: hosts.hosts.clone(),
        push,
        lines,
        redis_cpu_ms,
        redis_idle_percent: idle_ns_per_s.map(|ns| ns / 1e7),
        redis_cpu_us_per_line: beyond_idle,
    })
}

/// Waits until something accepts connections on `addr` (in another
/// namespace: `/proc/net/tcp` here does not list it).
fn wait_listening(
    addr: SocketAddr,
    timeout: Duration,
    alive: &mut dyn FnMut() -> io::Result<()>,
) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        alive()?;
        if Instant::now() >= deadline {
            return Err(format!("nothing listens on {addr} after {timeout:?}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// redis-server, running in its namespace.
struct Redis {
    /// `None` while stopped (a broker outage).
    server: Option<Server>,
    addr: SocketAddr,
    command: String,
    /// Where it keeps its append-only file, when it must keep the stream
    /// through a restart (removed at the end).
    dir: Option<PathBuf>,
    /// CPU time of its earlier processes, in ns.
    spent_ns: u64,
    start_timeout: Duration,
}

impl Redis {
    /// Starts redis-server (`program`) in `spec`'s namespace; with
    /// `persist`, keeping its data in an append-only file written through
    /// on every command, so that a restart loses nothing.
    fn start(
        spec: &HostSpec,
        program: &str,
        options: &PushOptions,
        persist: bool,
    ) -> Result<Redis, Error> {
        let dir = match persist {
            true => {
                let dir =
                    std::env::temp_dir().join(format!("wspush-bench-redis-{}", std::process::id()));
                std::fs::create_dir_all(&dir)?;
                Some(dir)
            }
            false => None,
        };
        let persistence = match &dir {
            Some(dir) => format!(
                "--appendonly yes --appendfsync always --dir {}",
                dir.display()
            ),
            None => "--appendonly no".to_string(),
        };
        let command = format!(
            "ip netns exec {} {program} --bind {} --port {REDIS_PORT} --save '' {persistence} \
             --protected-mode no --logfile ''",
            spec.netns, spec.ip
        );
        let mut redis = Redis {
            server: None,
            addr: SocketAddr::from((spec.ip, REDIS_PORT)),
            command,
            dir,
            spent_ns: 0,
            start_timeout: Duration::from_secs(options.start_timeout),
        };
        redis.resume()?;
        Ok(redis)
    }

    /// Starts its process (again), and waits until it listens.
    fn resume(&mut self) -> io::Result<()> {
        let mut server = Server::spawn(&self.command)?;
        wait_listening(self.addr, self.start_timeout, &mut || server.check_alive())
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.server = Some(server);
        Ok(())
    }

    /// Stops its process (SIGINT: Redis shuts down, its file written).
    fn pause(&mut self) -> io::Result<()> {
        self.spent_ns = self.cpu_ns()?;
        if let Some(mut server) = self.server.take() {
            server.stop();
        }
        Ok(())
    }

    /// CPU time of all of Redis's threads, in ns, its earlier processes
    /// included (from `schedstat`, which counts nanoseconds, where `stat`
    /// counts 10 ms ticks: Redis idles at well under one tick a second).
    fn cpu_ns(&self) -> io::Result<u64> {
        let Some(server) = &self.server else {
            return Ok(self.spent_ns);
        };
        let mut sum = self.spent_ns;
        for task in std::fs::read_dir(format!("/proc/{}/task", server.pid()))? {
            let stat = std::fs::read_to_string(task?.path().join("schedstat"))?;
            let ran = stat
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok());
            sum += ran.ok_or_else(|| io::Error::other(format!("schedstat: {stat:?}")))?;
        }
        Ok(sum)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.server = None;
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// One connection to Redis that publishes, or adds to the stream. While
/// Redis cannot be reached, the lines wait here, and go, in order, once
/// it can: each leaves the queue when Redis has answered for it, so none
/// is sent twice.
struct Publisher {
    addr: SocketAddr,
    /// `None` while Redis cannot be reached.
    connection: Option<BufReader<TcpStream>>,
    /// Subscribers (or readers) every line must reach: one per host.
    hosts: u64,
    feed: Feed,
    /// `MAXLEN ~` of each `XADD`.
    maxlen: u64,
    /// Lines not yet answered for, oldest first.
    waiting: std::collections::VecDeque<Vec<u8>>,
    out: Vec<u8>,
}

impl Publisher {
    fn connect(addr: SocketAddr, hosts: usize, feed: Feed, maxlen: u64) -> io::Result<Publisher> {
        let mut publisher = Publisher {
            addr,
            connection: None,
            hosts: hosts as u64,
            feed,
            maxlen,
            waiting: Default::default(),
            out: Vec::new(),
        };
        publisher.connection = Some(publisher.dial()?);
        Ok(publisher)
    }

    fn dial(&self) -> io::Result<BufReader<TcpStream>> {
        let stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(BufReader::new(stream))
    }

    /// Drops the connection (Redis is being stopped).
    fn disconnect(&mut self) {
        self.connection = None;
    }

    /// Publishes (or adds) each of `lines`, after those still waiting,
    /// pipelined, and reads Redis's answers. Lines wait while Redis cannot
    /// be reached; an error if Redis refused one, or a `PUBLISH` reached
    /// fewer subscribers than there are hosts.
    fn publish(&mut self, lines: &[&[u8]]) -> io::Result<()> {
        self.waiting.extend(lines.iter().map(|l| l.to_vec()));
        if self.connection.is_none() {
            match self.dial() {
                Ok(connection) => {
                    eprintln!("[publisher] Redis is back: {} lines go", self.waiting.len());
                    self.connection = Some(connection);
                }
                Err(_) => return Ok(()),
            }
        }
        match self.send_waiting() {
            Err(e) if is_lost(&e) => {
                eprintln!(
                    "[publisher] Redis went away ({e}); {} lines wait",
                    self.waiting.len()
                );
                self.connection = None;
                Ok(())
            }
            other => other,
        }
    }

    fn send_waiting(&mut self) -> io::Result<()> {
        self.out.clear();
        for line in &self.waiting {
            match self.feed {
                Feed::Stream => self.out.extend_from_slice(
                    format!(
                        "*8\r\n$4\r\nXADD\r\n${}\r\n{CHANNEL}\r\n$6\r\nMAXLEN\r\n$1\r\n~\r\n${}\r\n{}\r\n$1\r\n*\r\n$4\r\nline\r\n",
                        CHANNEL.len(),
                        self.maxlen.to_string().len(),
                        self.maxlen
                    )
                    .as_bytes(),
                ),
                _ => self.out.extend_from_slice(
                    format!("*3\r\n$7\r\nPUBLISH\r\n${}\r\n{CHANNEL}\r\n", CHANNEL.len())
                        .as_bytes(),
                ),
            }
            self.out
                .extend_from_slice(format!("${}\r\n", line.len()).as_bytes());
            self.out.extend_from_slice(line);
            self.out.extend_from_slice(b"\r\n");
        }
        let connection = self.connection.as_mut().expect("connected");
        connection.get_mut().write_all(&self.out)?;
        while !self.waiting.is_empty() {
            let connection = self.connection.as_mut().expect("connected");
            match self.feed {
                Feed::Stream => {
                    bulk(connection)?;
                }
                _ => {
                    let reached = number(connection)?;
                    if reached < self.hosts {
                        return Err(io::Error::other(format!(
                            "a PUBLISH reached {reached} of {} hosts",
                            self.hosts
                        )));
                    }
                }
            }
            self.waiting.pop_front();
        }
        Ok(())
    }

    /// Waits until every host has subscribed (`PUBSUB NUMSUB`), or reads
    /// the stream (a client blocked in `XREAD`, in `CLIENT LIST`).
    fn wait_ready(&mut self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        let connection = self.connection.as_mut().expect("connected");
        loop {
            let ready = match self.feed {
                Feed::Stream => {
                    connection
                        .get_mut()
                        .write_all(b"*2\r\n$6\r\nCLIENT\r\n$4\r\nLIST\r\n")?;
                    let list = bulk(connection)?;
                    list.matches("cmd=xread").count() as u64
                }
                _ => {
                    let request = format!(
                        "*3\r\n$6\r\nPUBSUB\r\n$6\r\nNUMSUB\r\n${}\r\n{CHANNEL}\r\n",
                        CHANNEL.len()
                    );
                    connection.get_mut().write_all(request.as_bytes())?;
                    // *2, $len, channel, :count
                    let mut lines = [String::new(), String::new(), String::new()];
                    for line in &mut lines {
                        connection.read_line(line)?;
                    }
                    number(connection)?
                }
            };
            if ready >= self.hosts {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err("the hosts did not all subscribe in time".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether `error` means the connection to Redis is gone.
fn is_lost(error: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        error.kind(),
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | ConnectionRefused
    )
}

/// Reads one answer line of Redis (an error answer is an error).
fn answer_line(connection: &mut BufReader<TcpStream>) -> io::Result<String> {
    let mut line = String::new();
    if connection.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    if line.starts_with('-') {
        return Err(io::Error::other(format!(
            "Redis answered {}",
            line.trim_end()
        )));
    }
    Ok(line)
}

/// Reads a number answer (`:N`).
fn number(connection: &mut BufReader<TcpStream>) -> io::Result<u64> {
    let line = answer_line(connection)?;
    line.trim_end()
        .strip_prefix(':')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| io::Error::other(format!("Redis answered {line:?}")))
}

/// Reads a bulk string answer (`$N`, then N bytes).
fn bulk(connection: &mut BufReader<TcpStream>) -> io::Result<String> {
    let line = answer_line(connection)?;
    let len: usize = line
        .trim_end()
        .strip_prefix('$')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| io::Error::other(format!("Redis answered {line:?}")))?;
    let mut body = vec![0; len + 2];
    connection.read_exact(&mut body)?;
    body.truncate(len);
    String::from_utf8(body).map_err(io::Error::other)
}

/// The hosts as one server under measurement.
struct Hosts {
    servers: Vec<Server>,
    redis: Option<Redis>,
    publisher: Option<Publisher>,
    lines: u64,
}

impl Target for Hosts {
    fn send_line(&mut self, line: &[u8]) -> io::Result<()> {
        self.lines += 1;
        match &mut self.publisher {
            Some(publisher) => publisher.publish(&[line]),
            None => self.servers.iter_mut().try_for_each(|s| s.send_line(line)),
        }
    }

    fn send_lines(&mut self, lines: &[u8]) -> io::Result<()> {
        let each: Vec<&[u8]> = lines
            .split_inclusive(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\n").unwrap_or(l))
            .collect();
        self.lines += each.len() as u64;
        match &mut self.publisher {
            Some(publisher) => publisher.publish(&each),
            None => self
                .servers
                .iter_mut()
                .try_for_each(|s| s.send_lines(lines)),
        }
    }

    fn usage(&self) -> io::Result<Usage> {
        let mut sum = Usage::default();
        for server in &self.servers {
            let u = server.usage()?;
            sum.rss_bytes += u.rss_bytes;
            sum.pss_bytes += u.pss_bytes;
            sum.cpu_ns += u.cpu_ns;
            sum.user_ns += u.user_ns;
            sum.processes += u.processes;
        }
        Ok(sum)
    }

    fn check_alive(&mut self) -> io::Result<()> {
        self.servers.iter_mut().try_for_each(|s| s.check_alive())
    }

    fn stop_broker(&mut self) -> io::Result<()> {
        let redis = self
            .redis
            .as_mut()
            .ok_or_else(|| io::Error::other("no broker"))?;
        if let Some(publisher) = &mut self.publisher {
            publisher.disconnect();
        }
        redis.pause()
    }

    fn start_broker(&mut self) -> io::Result<()> {
        let redis = self
            .redis
            .as_mut()
            .ok_or_else(|| io::Error::other("no broker"))?;
        redis.resume()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_named_by_namespace_and_address() {
        let h: HostSpec = "wsp-1-h1=10.77.0.11".parse().unwrap();
        assert_eq!(h.netns, "wsp-1-h1");
        assert_eq!(h.ip, Ipv4Addr::new(10, 77, 0, 11));
        assert!("10.77.0.11".parse::<HostSpec>().is_err());
        assert!("=10.77.0.11".parse::<HostSpec>().is_err());
        assert!("ns=10.77.0".parse::<HostSpec>().is_err());
    }
}

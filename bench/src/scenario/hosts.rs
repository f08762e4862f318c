//! `hosts`: wspush on several hosts, measured as one server by the push
//! measurement ([`push::measure_hosts`]): connection `i` goes to host
//! `i % hosts`, and every line goes to every host, either published once
//! on Redis (each host subscribed with `--redis`) or written to each
//! host's standard input (the baseline).
//!
//! A host is a network namespace (`NETNS=IP`, as `bench/multihost.sh`
//! makes them), so that the hosts, Redis and the clients talk across a
//! network boundary rather than over one loopback: each wspush, and
//! `redis-server`, runs in its namespace under `ip netns exec`; this
//! program and its client workers run in the clients' namespace.

use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Write};
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
    /// Published once on Redis; each host subscribes (`--redis`).
    Redis,
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
    /// The Redis host, as NETNS=IP (for `--feed redis`).
    #[arg(long, value_name = "NETNS=IP")]
    pub redis: Option<HostSpec>,
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
/// The channel the hosts subscribe to.
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
    if hosts.feed == Feed::Redis && hosts.redis.is_none() {
        return Err("--feed redis needs --redis NETNS=IP".into());
    }
    let exe = std::env::current_exe()?;
    let wspush = match &hosts.wspush {
        Some(path) => path.display().to_string(),
        None => server::wspush_exe(&exe),
    };
    let redis = match (&hosts.redis, hosts.feed) {
        (Some(spec), Feed::Redis) => Some(start_redis(spec, &hosts.redis_server, options)?),
        _ => None,
    };
    let mut servers = Vec::new();
    let mut commands = Vec::new();
    for host in &hosts.hosts {
        let mut command = format!(
            "ip netns exec {} {wspush} --listen {}:{} --quiet",
            host.netns, host.ip, hosts.host_port
        );
        if let (Some(spec), Feed::Redis) = (&hosts.redis, hosts.feed) {
            let _ = write!(
                command,
                " --redis redis://{}:{REDIS_PORT} --redis-channel {CHANNEL}",
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
        Some(redis) => Some(Publisher::connect(redis.addr, hosts.hosts.len())?),
        None => None,
    };
    let mut target = Hosts {
        servers,
        publisher,
        lines: 0,
    };
    if let Some(publisher) = &mut target.publisher {
        publisher.wait_subscribed(timeout)?;
    }
    // Redis's own timers, measured idle, are taken out of its cost per line.
    let idle_ns_per_s = match &redis {
        Some(r) => {
            let before = r.cpu_ns()?;
            std::thread::sleep(IDLE_WINDOW);
            Some(r.cpu_ns()?.saturating_sub(before) as f64 / IDLE_WINDOW.as_secs_f64())
        }
        None => None,
    };
    let redis_before = redis.as_ref().map(|r| r.cpu_ns()).transpose()?;
    let started = Instant::now();
    let info = RunInfo {
        server: format!("wspush × {}", hosts.hosts.len()),
        command: commands.join("; "),
        round: 1,
    };
    let launch = Launch::Processes { exe };
    let push = push::measure_hosts(&mut target, &addrs, options, &launch, info)?;
    let elapsed = started.elapsed().as_secs_f64();
    let redis_cpu_ms = match (&redis, redis_before) {
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
    server: Server,
    addr: SocketAddr,
}

impl Redis {
    /// CPU time of all of Redis's threads, in ns (from `schedstat`, which
    /// counts nanoseconds, where `stat` counts 10 ms ticks: Redis idles at
    /// well under one tick a second).
    fn cpu_ns(&self) -> io::Result<u64> {
        let mut sum = 0;
        for task in std::fs::read_dir(format!("/proc/{}/task", self.server.pid()))? {
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

fn start_redis(spec: &HostSpec, program: &str, options: &PushOptions) -> Result<Redis, Error> {
    let command = format!(
        "ip netns exec {} {program} --bind {} --port {REDIS_PORT} --save '' --appendonly no \
         --protected-mode no --logfile ''",
        spec.netns, spec.ip
    );
    let mut server = Server::spawn(&command)?;
    let addr = SocketAddr::from((spec.ip, REDIS_PORT));
    wait_listening(
        addr,
        Duration::from_secs(options.start_timeout),
        &mut || server.check_alive(),
    )?;
    Ok(Redis { server, addr })
}

/// One connection to Redis that publishes.
struct Publisher {
    reader: BufReader<TcpStream>,
    /// Subscribers every line must reach: one per host.
    hosts: u64,
    out: Vec<u8>,
}

impl Publisher {
    fn connect(addr: SocketAddr, hosts: usize) -> io::Result<Publisher> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Publisher {
            reader: BufReader::new(stream),
            hosts: hosts as u64,
            out: Vec::new(),
        })
    }

    /// Publishes each of `lines` (pipelined), then reads Redis's answers;
    /// an error if one reached fewer subscribers than there are hosts.
    fn publish(&mut self, lines: &[&[u8]]) -> io::Result<()> {
        self.out.clear();
        for line in lines {
            self.out.extend_from_slice(
                format!("*3\r\n$7\r\nPUBLISH\r\n${}\r\n{CHANNEL}\r\n", CHANNEL.len()).as_bytes(),
            );
            self.out
                .extend_from_slice(format!("${}\r\n", line.len()).as_bytes());
            self.out.extend_from_slice(line);
            self.out.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&self.out)?;
        for _ in lines {
            let reached = self.answer()?;
            if reached < self.hosts {
                return Err(io::Error::other(format!(
                    "a PUBLISH reached {reached} of {} hosts",
                    self.hosts
                )));
            }
        }
        Ok(())
    }

    /// The number Redis answered a command with.
    fn answer(&mut self) -> io::Result<u64> {
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        line.trim_end()
            .strip_prefix(':')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| io::Error::other(format!("Redis answered {line:?}")))
    }

    /// Waits until every host has subscribed (`PUBSUB NUMSUB`).
    fn wait_subscribed(&mut self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let request = format!(
                "*3\r\n$6\r\nPUBSUB\r\n$6\r\nNUMSUB\r\n${}\r\n{CHANNEL}\r\n",
                CHANNEL.len()
            );
            self.reader.get_mut().write_all(request.as_bytes())?;
            // *2, $len, channel, :count
            let mut lines = [String::new(), String::new(), String::new()];
            for line in &mut lines {
                self.reader.read_line(line)?;
            }
            if self.answer()? >= self.hosts {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err("the hosts did not all subscribe in time".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The hosts as one server under measurement.
struct Hosts {
    servers: Vec<Server>,
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

//! `upstream`: what clients send, into a Redis stream (`wspush --upstream
//! redis-stream`), checked whole, once and in each client's order.
//!
//! The run starts its own `redis-server` (append-only, every write synced,
//! so that a restart keeps what it took) and the server under test, opens
//! `--conns` clients (`/?id=c{i}`), and sends `--rate` messages a second
//! over them, round-robin, for `--secs` seconds: message `k` of client `i`
//! is the text `c{i}:{k}`. With `--outage-at-secs S`, Redis is killed S
//! seconds in and started again `--outage-secs` later. Once the stream
//! stops growing, it is read back (XRANGE) and every client's messages
//! are checked: each sent one there once, in order, whole.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::client::probe::upgrade;
use crate::observe::scrape;
use crate::target::server::{self, free_port, ServerSpec};
use crate::wire::frame::{self, opcode, MASK};
use crate::Error;

/// The stream the server writes to.
pub const KEY: &str = "wspush-bench-upstream";

/// Parameters of an `upstream` run.
#[derive(Debug, Clone, clap::Args)]
pub struct UpstreamOptions {
    /// Clients.
    #[arg(long, default_value_t = 19_000)]
    pub conns: u32,
    /// Messages a second over all clients.
    #[arg(long, default_value_t = 50_000)]
    pub rate: u32,
    /// Seconds of sending.
    #[arg(long, default_value_t = 20)]
    pub secs: u64,
    /// Kill Redis this many seconds into the sending...
    #[arg(long)]
    pub outage_at_secs: Option<u64>,
    /// ...and start it again this many seconds later.
    #[arg(long, default_value_t = 10)]
    pub outage_secs: u64,
    /// The server: `sh -c "exec COMMAND"`, `{port}` replaced by its port and
    /// `{redis}` by the Redis URL [default: the wspush next to this
    /// program, `--upstream redis-stream` into the stream
    /// `wspush-bench-upstream`].
    #[arg(long, value_name = "COMMAND")]
    pub server: Option<String>,
    /// The server's `/metrics` (its counters are reported).
    #[arg(long, value_name = "ADDR")]
    pub metrics_from: Option<SocketAddr>,
    /// The redis-server to run.
    #[arg(long, default_value = "redis-server")]
    pub redis_server: String,
    /// Seconds the stream may take to hold everything after the sending.
    #[arg(long, default_value_t = 60)]
    pub drain_timeout: u64,
}

/// What an `upstream` run found.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamRun {
    /// The server's command.
    pub command: String,
    /// Clients open.
    pub conns: u32,
    /// Messages sent.
    pub sent: u64,
    /// Seconds the sending took.
    pub send_secs: f64,
    /// Messages a second sent.
    pub sent_per_sec: f64,
    /// Seconds from the end of the sending until the stream held them.
    pub drain_secs: f64,
    /// Entries in the stream.
    pub entries: u64,
    /// Sent messages not in the stream.
    pub missing: u64,
    /// Messages in the stream more than once.
    pub duplicates: u64,
    /// Messages after a later one of the same client.
    pub out_of_order: u64,
    /// Entries that are not a sent message whole (or lack the host).
    pub corrupt: u64,
    /// The outage, if one was made: when and how long, in seconds.
    pub outage: Option<(u64, u64)>,
    /// The server's upstream counters at the end.
    pub counted: Vec<(String, f64)>,
}

impl UpstreamRun {
    /// The report as text.
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "upstream into a Redis stream\n  command: {}\n",
            self.command
        );
        let _ = writeln!(
            out,
            "  {} clients sent {} messages in {:.2} s = {:.0}/s; the stream held them {:.2} s after",
            self.conns, self.sent, self.send_secs, self.sent_per_sec, self.drain_secs
        );
        if let Some((at, secs)) = self.outage {
            let _ = writeln!(out, "  Redis killed {at} s in, back {secs} s later");
        }
        let _ = writeln!(
            out,
            "  stream: {} entries; missing {}, duplicated {}, out of order {}, corrupt {}",
            self.entries, self.missing, self.duplicates, self.out_of_order, self.corrupt
        );
        for (name, value) in &self.counted {
            let _ = writeln!(out, "  counted {name} {value}");
        }
        out
    }
}

/// A redis-server of the run's own.
struct Redis {
    program: String,
    port: u16,
    dir: std::path::PathBuf,
    child: Option<Child>,
}

impl Redis {
    fn start(program: &str) -> Result<Redis, Error> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("wspush-bench-redis-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut redis = Redis {
            program: program.into(),
            port,
            dir,
            child: None,
        };
        redis.up()?;
        Ok(redis)
    }

    /// Starts it (again), from what its files hold.
    fn up(&mut self) -> Result<(), Error> {
        let child = Command::new(&self.program)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--protected-mode", "no", "--logfile", ""])
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.program))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.connect().and_then(|mut c| c.call(&["PING"])).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not answer".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Kills it at once.
    fn down(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn connect(&self) -> io::Result<Resp> {
        let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Resp(BufReader::new(stream)))
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.down();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A reply.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Nil,
    Int(i64),
    Text(String),
    List(Vec<Value>),
}

/// One connection to Redis, speaking RESP.
struct Resp(BufReader<TcpStream>);

impl Resp {
    fn call(&mut self, args: &[&str]) -> io::Result<Value> {
        let mut out = format!("*{}\r\n", args.len());
        for arg in args {
            let _ = write!(out, "${}\r\n{arg}\r\n", arg.len());
        }
        self.0.get_mut().write_all(out.as_bytes())?;
        self.read()
    }

    fn read(&mut self) -> io::Result<Value> {
        let mut line = String::new();
        self.0.read_line(&mut line)?;
        let line = line.trim_end_matches("\r\n");
        let bad = || io::Error::other(format!("a reply that does not read: {line:?}"));
        let (kind, rest) = line.split_at_checked(1).ok_or_else(bad)?;
        let number = || rest.parse::<i64>().map_err(|_| bad());
        Ok(match kind {
            "+" => Value::Text(rest.into()),
            "-" => return Err(io::Error::other(format!("redis: {rest}"))),
            ":" => Value::Int(number()?),
            "$" if number()? < 0 => Value::Nil,
            "$" => {
                let mut bulk = vec![0u8; number()? as usize + 2];
                io::Read::read_exact(&mut self.0, &mut bulk)?;
                bulk.truncate(bulk.len() - 2);
                Value::Text(String::from_utf8_lossy(&bulk).into_owned())
            }
            "*" if number()? < 0 => Value::Nil,
            "*" => Value::List(
                (0..number()?)
                    .map(|_| self.read())
                    .collect::<io::Result<_>>()?,
            ),
            _ => return Err(bad()),
        })
    }
}

/// The entries of the stream, each its fields, in order.
fn read_stream(redis: &mut Resp) -> io::Result<Vec<HashMap<String, String>>> {
    let mut entries = Vec::new();
    let mut from = "-".to_string();
    loop {
        let Value::List(page) = redis.call(&["XRANGE", KEY, &from, "+", "COUNT", "10000"])? else {
            return Err(io::Error::other("XRANGE gave no list"));
        };
        let mut last = None;
        for entry in &page {
            let Value::List(parts) = entry else { continue };
            let (Some(Value::Text(id)), Some(Value::List(fields))) = (parts.first(), parts.get(1))
            else {
                continue;
            };
            let text = |v: &Value| match v {
                Value::Text(t) => t.clone(),
                _ => String::new(),
            };
            entries.push(
                fields
                    .chunks(2)
                    .map(|pair| (text(&pair[0]), pair.get(1).map(text).unwrap_or_default()))
                    .collect(),
            );
            last = Some(id.clone());
        }
        match last {
            Some(id) if page.len() == 10000 => from = format!("({id}"),
            _ => return Ok(entries),
        }
    }
}

/// The stream's length.
fn length(redis: &mut Resp) -> io::Result<u64> {
    match redis.call(&["XLEN", KEY])? {
        Value::Int(n) => Ok(n as u64),
        other => Err(io::Error::other(format!("XLEN gave {other:?}"))),
    }
}

/// Client and number of a message line's payload (`msg KEY c{i} text c{i}:{k}`).
fn message(line: &str) -> Option<(u32, u64)> {
    let mut words = line.splitn(5, ' ');
    let (verb, _key, id, kind, payload) = (
        words.next()?,
        words.next()?,
        words.next()?,
        words.next()?,
        words.next()?,
    );
    let (client, k) = payload.split_once(':')?;
    let ok = verb == "msg" && kind == "text" && id == client;
    ok.then_some(())?;
    Some((client.strip_prefix('c')?.parse().ok()?, k.parse().ok()?))
}

/// Runs it.
pub fn run(o: &UpstreamOptions) -> Result<UpstreamRun, Error> {
    let mut redis = Redis::start(&o.redis_server)?;
    let template = match &o.server {
        Some(command) => command.clone(),
        None => format!(
            "{} --listen 127.0.0.1:{{port}} --quiet --ping-interval 1h --upstream redis-stream --upstream-stream {KEY} --redis {{redis}}",
            server::wspush_exe(&std::env::current_exe()?)
        ),
    };
    let spec = ServerSpec {
        label: "wspush upstream".into(),
        command: template.replace("{redis}", &redis.url()),
    };
    let (mut target, command, port) = server::start_server(&spec, None, 0, 30)?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut clients = Vec::with_capacity(o.conns as usize);
    for i in 0..o.conns {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        upgrade(&mut stream, &format!("/?id=c{i}"), u64::from(i))?;
        clients.push(stream);
    }
    eprintln!("[upstream] {} clients open", clients.len());
    let mut sent = vec![0u64; clients.len()];
    let mut frame_bytes = Vec::with_capacity(64);
    let start = Instant::now();
    let end = start + Duration::from_secs(o.secs);
    let outage = o.outage_at_secs.map(|at| (at, o.outage_secs));
    let (mut down_at, mut up_at) = (outage.map(|(at, _)| start + Duration::from_secs(at)), None);
    let mut total = 0u64;
    let mut next = 0usize;
    while Instant::now() < end {
        let due = (start.elapsed().as_secs_f64() * f64::from(o.rate)) as u64;
        while total < due {
            let i = next % clients.len();
            next += 1;
            sent[i] += 1;
            let text = format!("c{i}:{}", sent[i]);
            frame_bytes.clear();
            frame::encode(&mut frame_bytes, opcode::TEXT, text.as_bytes(), Some(MASK));
            clients[i].write_all(&frame_bytes)?;
            total += 1;
        }
        let now = Instant::now();
        if down_at.is_some_and(|at| now >= at) {
            redis.down();
            eprintln!(
                "[upstream] redis killed after {:.1} s",
                start.elapsed().as_secs_f64()
            );
            down_at = None;
            up_at = Some(now + Duration::from_secs(o.outage_secs));
        }
        if up_at.is_some_and(|at| now >= at) {
            redis.up()?;
            eprintln!(
                "[upstream] redis back after {:.1} s",
                start.elapsed().as_secs_f64()
            );
            up_at = None;
        }
        std::thread::sleep(Duration::from_millis(1));
        crate::target::check(&mut target)?;
    }
    let send_secs = start.elapsed().as_secs_f64();
    if up_at.is_some() {
        redis.up()?;
    }
    // The stream holds everything, or stops growing.
    let drained = Instant::now();
    let mut reader = redis.connect()?;
    let (mut last, mut still_since) = (0, Instant::now());
    loop {
        let len = length(&mut reader)?;
        if len >= total {
            break;
        }
        if len != last {
            (last, still_since) = (len, Instant::now());
        }
        if still_since.elapsed() > Duration::from_secs(5)
            || drained.elapsed() > Duration::from_secs(o.drain_timeout)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let drain_secs = drained.elapsed().as_secs_f64();
    let entries = read_stream(&mut reader)?;
    let mut seen = vec![0u64; clients.len()];
    let (mut duplicates, mut out_of_order, mut corrupt, mut found) = (0, 0, 0, 0u64);
    for entry in &entries {
        let parsed = entry
            .get("line")
            .filter(|_| entry.get("host").is_some_and(|h| !h.is_empty()))
            .and_then(|line| message(line))
            .filter(|&(c, k)| (c as usize) < sent.len() && k >= 1 && k <= sent[c as usize]);
        let Some((c, k)) = parsed else {
            corrupt += 1;
            continue;
        };
        let last = &mut seen[c as usize];
        match k.cmp(&(*last + 1)) {
            std::cmp::Ordering::Equal => {
                *last = k;
                found += 1;
            }
            std::cmp::Ordering::Less => duplicates += 1,
            std::cmp::Ordering::Greater => {
                out_of_order += 1;
                *last = k;
                found += 1;
            }
        }
    }
    let counted = o
        .metrics_from
        .and_then(|addr| scrape::fetch_metrics(addr).ok())
        .map(|page| {
            page.lines()
                .filter(|l| l.starts_with("wspush_upstream") && !l.contains('{'))
                .filter_map(|l| {
                    let (name, value) = l.split_once(' ')?;
                    Some((name.to_string(), value.trim().parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    drop(clients);
    target.stop();
    Ok(UpstreamRun {
        command,
        conns: o.conns,
        sent: total,
        send_secs,
        sent_per_sec: total as f64 / send_secs,
        drain_secs,
        entries: entries.len() as u64,
        missing: total.saturating_sub(found),
        duplicates,
        out_of_order,
        corrupt,
        outage,
        counted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_line_gives_its_client_and_number_and_nothing_else_does() {
        assert_eq!(message("msg 0.1.2 c7 text c7:42"), Some((7, 42)));
        assert_eq!(message("msg 0.1.2 c7 text c8:42"), None);
        assert_eq!(message("open 0.1.2 c7 -"), None);
        assert_eq!(message("msg 0.1.2 c7 binary YzE6MQ=="), None);
    }
}

//! A server fed through its HTTP publish listener (`wspush
//! --publish-listen`) instead of its standard input: each broadcast line
//! (or burst of them) is one `POST /publish` on one keep-alive
//! connection, answered before the next; the server's processes are
//! watched through the target it wraps. Also the request loop of
//! `publish-load`: how many single-message requests one connection gets
//! taken a second.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::observe::procfs::Usage;
use crate::target::Target;

/// How long a publisher answered 503 waits before it sends again.
const BUSY_WAIT: Duration = Duration::from_millis(5);

/// One keep-alive connection to a publish listener.
#[derive(Debug)]
pub struct PublishConn {
    stream: TcpStream,
    key: String,
    /// Bytes of answers read and not yet taken.
    answers: Vec<u8>,
    /// Requests answered 503 and sent again.
    pub busy: u64,
}

impl PublishConn {
    /// Connects to the listener at `addr`, presenting `key`.
    pub fn connect(addr: SocketAddr, key: &str) -> io::Result<PublishConn> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(PublishConn {
            stream,
            key: key.to_string(),
            answers: Vec::new(),
            busy: 0,
        })
    }

    /// Posts `body` to `target` (`/publish`, or `/publish?all` for one
    /// message) until it is taken (a 503 is sent again after a short
    /// wait); an error for any other refusal.
    pub fn post(&mut self, target: &str, body: &[u8]) -> io::Result<()> {
        loop {
            self.send(target, body)?;
            match self.status()? {
                200 => return Ok(()),
                503 => {
                    self.busy += 1;
                    std::thread::sleep(BUSY_WAIT);
                }
                other => return Err(io::Error::other(format!("POST {target} answered {other}"))),
            }
        }
    }

    /// Writes a `POST target` request with `body`, answered later.
    pub fn send(&mut self, target: &str, body: &[u8]) -> io::Result<()> {
        let mut request = format!(
            "POST {target} HTTP/1.1\r\nHost: wspush\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n",
            self.key,
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        self.stream.write_all(&request)
    }

    /// Reads the next answer whole; its status.
    pub fn status(&mut self) -> io::Result<u16> {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(end) = self.answers.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.answers[..end]).into_owned();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                if self.answers.len() >= end + 4 + length {
                    self.answers.drain(..end + 4 + length);
                    return head
                        .get(9..12)
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| io::Error::other(format!("not an answer: {head}")));
                }
            }
            let n = self.stream.read(&mut buf)?;
            if n == 0 {
                return Err(io::Error::other(
                    "the publish listener closed the connection",
                ));
            }
            self.answers.extend_from_slice(&buf[..n]);
        }
    }
}

/// A server whose broadcasts go through its publish listener.
pub struct ThroughPublish<'a> {
    inner: &'a mut dyn Target,
    conn: PublishConn,
    /// The lines are commands already (`pub NAME PAYLOAD`), not messages.
    commands: bool,
}

impl<'a> ThroughPublish<'a> {
    /// Feeds `inner` through the listener at `addr` with `key`; `commands`:
    /// the lines sent are command lines, else each is a message to all.
    pub fn new(
        inner: &'a mut dyn Target,
        addr: SocketAddr,
        key: &str,
        commands: bool,
    ) -> io::Result<ThroughPublish<'a>> {
        Ok(ThroughPublish {
            inner,
            conn: PublishConn::connect(addr, key)?,
            commands,
        })
    }
}

impl Target for ThroughPublish<'_> {
    fn send_line(&mut self, line: &[u8]) -> io::Result<()> {
        match self.commands {
            true => self.conn.post("/publish", line),
            false => self.conn.post("/publish?all", line),
        }
    }

    /// The lines in one request, as command lines.
    fn send_lines(&mut self, lines: &[u8]) -> io::Result<()> {
        if self.commands {
            return self.conn.post("/publish", lines);
        }
        let mut body = Vec::with_capacity(lines.len() + lines.len() / 8);
        for line in lines.split_inclusive(|&b| b == b'\n') {
            body.extend_from_slice(b"all ");
            body.extend_from_slice(line);
        }
        self.conn.post("/publish", &body)
    }

    fn usage(&self) -> io::Result<Usage> {
        self.inner.usage()
    }

    fn check_alive(&mut self) -> io::Result<()> {
        self.inner.check_alive()
    }
}

/// What `publish-load` measured.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Requests taken.
    pub requests: u64,
    /// Over this long.
    pub secs: f64,
    /// Answered 503.
    pub busy: u64,
    /// Round trips of a request, median and 99th percentile, in µs.
    pub p50_us: f64,
    /// See `p50_us`.
    pub p99_us: f64,
}

/// Sends single-message requests (`POST /publish?all` with a `payload`
/// body) on one connection for `secs`, `in_flight` of them at a time (1:
/// each after the last was answered; more: written back to back, a new
/// one for each answer). A 503 is counted, not sent again.
pub fn load(
    addr: SocketAddr,
    key: &str,
    payload: &[u8],
    secs: f64,
    in_flight: usize,
) -> io::Result<Load> {
    let mut conn = PublishConn::connect(addr, key)?;
    let mut round_trips = Vec::new();
    let mut sent = std::collections::VecDeque::new();
    let start = Instant::now();
    loop {
        let sending = start.elapsed().as_secs_f64() < secs;
        while sending && sent.len() < in_flight.max(1) {
            conn.send("/publish?all", payload)?;
            sent.push_back(Instant::now());
        }
        let Some(at) = sent.pop_front() else {
            break;
        };
        match conn.status()? {
            200 => round_trips.push(at.elapsed().as_secs_f64() * 1e6),
            503 => conn.busy += 1,
            other => return Err(io::Error::other(format!("answered {other}"))),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    round_trips.sort_by(f64::total_cmp);
    let at = |q: f64| round_trips[((round_trips.len() - 1) as f64 * q) as usize];
    Ok(Load {
        requests: round_trips.len() as u64,
        secs,
        busy: conn.busy,
        p50_us: at(0.5),
        p99_us: at(0.99),
    })
}

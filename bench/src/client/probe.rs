//! Responsiveness probes: while a stream goes out, how long a new client
//! waits for the answer to its upgrade, and a connected client for the
//! pong to its ping. Each probe is a thread with one blocking socket of
//! its own, next to the worker fleet. A probe rides through a deploy: an
//! upgrade refused with a status is counted and tried again at the next
//! sample, and a ping client the server closes dials again.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::observe::latency::{LatencyReport, ProbeReport};
use crate::observe::stats::{new_histogram, MAX_LATENCY_NS};
use crate::wire::frame::MASK;
use crate::wire::frame::{self, opcode, FrameError, FrameReader};
use crate::wire::handshake;
use crate::Error;

/// Longest a probe waits for an answer before it fails.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// What one probe thread measured: the samples, how many were
/// interrupted (see [`Sample::Interrupted`]), and why it stopped early, if
/// it did.
type Samples = (Histogram<u64>, u64, Option<String>);

/// One call of a probe.
enum Sample {
    /// The answer came after this long.
    Took(Duration),
    /// The server refused the upgrade with a status, or closed the ping
    /// client (which dialed again): not a sample.
    Interrupted,
}

/// The probes running against one server.
pub struct Probes {
    stop: Arc<AtomicBool>,
    upgrade: JoinHandle<Samples>,
    ping: JoinHandle<Samples>,
}

impl Probes {
    /// Connects the ping probe's client, then starts both probes, each
    /// taking a sample every `every`.
    pub fn start(server: SocketAddr, every: Duration) -> io::Result<Probes> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut pinger = upgraded(server, u64::MAX)?.0;
        let upgrade = {
            let stop = Arc::clone(&stop);
            thread::Builder::new()
                .name("probe-upgrade".into())
                .spawn(move || {
                    sample(&stop, every, |n| match upgraded(server, n) {
                        Ok((_, took)) => Ok(Sample::Took(took)),
                        Err(e) if refused(&e) => Ok(Sample::Interrupted),
                        Err(e) => Err(e),
                    })
                })?
        };
        let ping = {
            let stop = Arc::clone(&stop);
            let mut reader = FrameReader::new();
            thread::Builder::new()
                .name("probe-ping".into())
                .spawn(move || {
                    sample(&stop, every, |n| {
                        if let Some(took) = ping(&mut pinger, &mut reader, n)? {
                            return Ok(Sample::Took(took));
                        }
                        // Closed by the server: dial again (a refusal is
                        // tried again at the next sample).
                        match upgraded(server, n) {
                            Ok((stream, _)) => (pinger, reader) = (stream, FrameReader::new()),
                            Err(e) if refused(&e) => {}
                            Err(e) => return Err(e),
                        }
                        Ok(Sample::Interrupted)
                    })
                })?
        };
        Ok(Probes {
            stop,
            upgrade,
            ping,
        })
    }

    /// Stops the probes and summarises what they measured.
    pub fn finish(self) -> Result<ProbeReport, Error> {
        self.stop.store(true, Ordering::SeqCst);
        let mut stopped = Vec::new();
        let mut join = |h: JoinHandle<Samples>, what: &str| -> Result<_, Error> {
            let (histogram, interrupted, why) =
                h.join().map_err(|_| format!("the {what} probe panicked"))?;
            stopped.extend(why.map(|e| format!("{what}: {e}")));
            Ok((LatencyReport::from_histogram(&histogram), interrupted))
        };
        let (upgrade, upgrades_refused) = join(self.upgrade, "upgrade")?;
        let (ping, pings_redialed) = join(self.ping, "ping")?;
        Ok(ProbeReport {
            upgrade,
            ping,
            upgrades_refused,
            pings_redialed,
            stopped,
        })
    }
}

/// Calls `probe` (with a sample number) every `every` until `stop`, or
/// until a call fails; records what each call took.
fn sample(
    stop: &AtomicBool,
    every: Duration,
    mut probe: impl FnMut(u64) -> io::Result<Sample>,
) -> Samples {
    let mut histogram = new_histogram();
    let (mut n, mut interrupted) = (0, 0);
    while !stop.load(Ordering::SeqCst) {
        match probe(n) {
            Ok(Sample::Took(took)) => {
                let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
                histogram.saturating_record(ns.clamp(1, MAX_LATENCY_NS));
            }
            Ok(Sample::Interrupted) => interrupted += 1,
            Err(e) => return (histogram, interrupted, Some(e.to_string())),
        }
        n += 1;
        thread::sleep(every);
    }
    (histogram, interrupted, None)
}

/// Whether `error` is the server's refusal of an upgrade with a status.
fn refused(error: &io::Error) -> bool {
    error
        .get_ref()
        .and_then(|e| e.downcast_ref::<handshake::HandshakeError>())
        .is_some_and(|e| matches!(e, handshake::HandshakeError::Status(_)))
}

/// A new upgraded connection (as client `id`), and how long it took from
/// `connect()` to the whole 101 response.
fn upgraded(server: SocketAddr, id: u64) -> io::Result<(TcpStream, Duration)> {
    let start = Instant::now();
    let mut stream = TcpStream::connect(server)?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
    stream.set_nodelay(true)?;
    upgrade(&mut stream, "/ws?id=probe", id)?;
    Ok((stream, start.elapsed()))
}

/// Upgrades the blocking `stream` with a request for `path` (key of
/// client `id`), reading the response and nothing after it.
pub fn upgrade(stream: &mut TcpStream, path: &str, id: u64) -> io::Result<()> {
    let server = stream.peer_addr()?;
    let key = handshake::client_key(id);
    let request = handshake::client_request(&server.to_string(), path, &key, false);
    stream.write_all(&request)?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    // Byte by byte: nothing after the head may be consumed here.
    while handshake::head_len(&head).is_none() {
        if stream.read(&mut byte)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.push(byte[0]);
        if head.len() > handshake::MAX_HEAD {
            return Err(io::Error::other("response head too long"));
        }
    }
    handshake::check_response(&head, &key, false).map_err(io::Error::other)
}

/// Writes ping `n` and reads until its pong (through whatever broadcast
/// frames come first); returns the round trip, or `None` when the server
/// closed the connection instead (a close frame, or its end).
fn ping(stream: &mut TcpStream, reader: &mut FrameReader, n: u64) -> io::Result<Option<Duration>> {
    let payload = n.to_be_bytes();
    let mut wire = Vec::with_capacity(16);
    frame::encode(&mut wire, opcode::PING, &payload, Some(MASK));
    let start = Instant::now();
    if stream.write_all(&wire).is_err() {
        return Ok(None);
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let got = match stream.read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(None),
            Err(e) => return Err(e),
        };
        let (mut ponged, mut closed) = (false, false);
        let mut pong = Vec::new();
        reader
            .feed(&buf[..got], |f| {
                match f.opcode {
                    opcode::PONG if f.payload == payload => ponged = true,
                    opcode::PING => frame::encode(&mut pong, opcode::PONG, f.payload, Some(MASK)),
                    opcode::CLOSE => closed = true,
                    _ => {}
                }
                Ok::<(), FrameError>(())
            })
            .map_err(io::Error::other)?;
        if ponged {
            return Ok(Some(start.elapsed()));
        }
        if closed {
            return Ok(None);
        }
        if !pong.is_empty() {
            stream.write_all(&pong)?;
        }
    }
}

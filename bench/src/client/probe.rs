//! Responsiveness probes: while a stream goes out, how long a new client
//! waits for the answer to its upgrade, and a connected client for the
//! pong to its ping. Each probe is a thread with one blocking socket of
//! its own, next to the worker fleet.

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

/// What one probe thread measured, and why it stopped early, if it did.
type Samples = (Histogram<u64>, Option<String>);

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
                .spawn(move || sample(&stop, every, |n| upgraded(server, n).map(|(_, t)| t)))?
        };
        let ping = {
            let stop = Arc::clone(&stop);
            let mut reader = FrameReader::new();
            thread::Builder::new()
                .name("probe-ping".into())
                .spawn(move || sample(&stop, every, |n| ping(&mut pinger, &mut reader, n)))?
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
        let mut join = |h: JoinHandle<Samples>, what: &str| -> Result<Histogram<u64>, Error> {
            let (histogram, why) = h.join().map_err(|_| format!("the {what} probe panicked"))?;
            stopped.extend(why.map(|e| format!("{what}: {e}")));
            Ok(histogram)
        };
        let upgrade = join(self.upgrade, "upgrade")?;
        let ping = join(self.ping, "ping")?;
        Ok(ProbeReport {
            upgrade: LatencyReport::from_histogram(&upgrade),
            ping: LatencyReport::from_histogram(&ping),
            stopped,
        })
    }
}

/// Calls `probe` (with a sample number) every `every` until `stop`, or
/// until a call fails; records what each call took.
fn sample(
    stop: &AtomicBool,
    every: Duration,
    mut probe: impl FnMut(u64) -> io::Result<Duration>,
) -> Samples {
    let mut histogram = new_histogram();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let took = match probe(n) {
            Ok(took) => took,
            Err(e) => return (histogram, Some(e.to_string())),
        };
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        histogram.saturating_record(ns.clamp(1, MAX_LATENCY_NS));
        n += 1;
        thread::sleep(every);
    }
    (histogram, None)
}

/// A new upgraded connection (as client `id`), and how long it took from
/// `connect()` to the whole 101 response.
fn upgraded(server: SocketAddr, id: u64) -> io::Result<(TcpStream, Duration)> {
    let start = Instant::now();
    let mut stream = TcpStream::connect(server)?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
    stream.set_nodelay(true)?;
    let key = handshake::client_key(id);
    let request = handshake::client_request(&server.to_string(), "/ws?id=probe", &key, false);
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
    handshake::check_response(&head, &key, false).map_err(io::Error::other)?;
    Ok((stream, start.elapsed()))
}

/// Writes ping `n` and reads until its pong (through whatever broadcast
/// frames come first); returns the round trip.
fn ping(stream: &mut TcpStream, reader: &mut FrameReader, n: u64) -> io::Result<Duration> {
    let payload = n.to_be_bytes();
    let mut wire = Vec::with_capacity(16);
    frame::encode(&mut wire, opcode::PING, &payload, Some(MASK));
    let start = Instant::now();
    stream.write_all(&wire)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let got = stream.read(&mut buf)?;
        if got == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let mut ponged = false;
        let mut pong = Vec::new();
        reader
            .feed(&buf[..got], |f| {
                match f.opcode {
                    opcode::PONG if f.payload == payload => ponged = true,
                    opcode::PING => frame::encode(&mut pong, opcode::PONG, f.payload, Some(MASK)),
                    _ => {}
                }
                Ok::<(), FrameError>(())
            })
            .map_err(io::Error::other)?;
        if !pong.is_empty() {
            stream.write_all(&pong)?;
        }
        if ponged {
            return Ok(start.elapsed());
        }
    }
}

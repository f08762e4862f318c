//! The client side of an echo run: connections that send paced,
//! self-checking requests and verify every echo byte for byte, all in one
//! epoll loop. Unlike the push client these keep an output buffer each
//! (a request may not fit into a full socket), so they are for thousands
//! of connections, not a million. With permessage-deflate, every request
//! is compressed (its filler an order book in JSON) and echoes may come
//! back compressed or plain.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use hdrhistogram::Histogram;
use mio::event::Event;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::client::clients::EVENTS_PER_POLL;
use crate::client::dial::{self, Failure, Phase};
use crate::observe::stats::{self, MAX_LATENCY_NS};
use crate::observe::sys;
use crate::wire::compression::{Deflater, Inflater};
use crate::wire::frame::MASK;
use crate::wire::frame::{self, opcode, FrameError, FrameReader};
use crate::wire::message::{self, EchoStamp};

/// Size of the buffer every read goes through.
const SCRATCH_BYTES: usize = 256 * 1024;

/// One echo connection.
#[derive(Debug)]
struct EchoConn {
    stream: Option<TcpStream>,
    phase: Phase,
    reader: FrameReader,
    /// Bytes of requests the socket has not taken yet.
    outbox: Vec<u8>,
    /// Number of the next request to send.
    next_send: u64,
    /// Number of the next echo expected.
    next_echo: u64,
}

/// Counters of an echo run so far.
#[derive(Debug, Clone, Default)]
pub struct EchoCounts {
    /// Requests sent.
    pub sent: u64,
    /// Echoes received and verified.
    pub echoed: u64,
    /// Requests whose connection failed before the echo came.
    pub lost: u64,
    /// Frame bytes sent (headers, masks and payloads).
    pub bytes_up: u64,
    /// Bytes received after the upgrades.
    pub bytes_down: u64,
    /// Echoes that came back compressed.
    pub compressed_echoes: u64,
    /// Connection failures by kind.
    pub failures: BTreeMap<String, u64>,
}

/// The echo connections to one server.
pub struct Echoers {
    poll: Poll,
    events: Events,
    conns: Vec<EchoConn>,
    scratch: Box<[u8]>,
    /// Reused buffer for one request's payload.
    payload: Vec<u8>,
    /// With `deflate`: the connections offer permessage-deflate; requests
    /// are compressed, and compressed echoes inflated, through these.
    deflate: bool,
    deflater: Deflater,
    compressed: Vec<u8>,
    inflater: Inflater,
    inflated: Vec<u8>,
    /// Reused list of the last poll's readiness, by connection.
    ready: Vec<(usize, Readiness)>,
    server: SocketAddr,
    sources: Vec<Ipv4Addr>,
    payload_len: usize,
    counts: EchoCounts,
    rtt: Histogram<u64>,
    pending: usize,
    open: usize,
    /// Next connection in the round-robin of requests.
    cursor: usize,
}

impl Echoers {
    /// No connections yet; they will connect to `server` from `sources` in
    /// turn and send requests of `payload_len` bytes, compressed if
    /// `deflate` (offered, and required of the server).
    pub fn new(
        server: SocketAddr,
        sources: Vec<Ipv4Addr>,
        payload_len: usize,
        deflate: bool,
    ) -> io::Result<Self> {
        assert!(!sources.is_empty(), "at least one source address");
        Ok(Echoers {
            poll: Poll::new()?,
            events: Events::with_capacity(EVENTS_PER_POLL),
            conns: Vec::new(),
            scratch: vec![0; SCRATCH_BYTES].into_boxed_slice(),
            payload: Vec::new(),
            deflate,
            deflater: Deflater::default(),
            compressed: Vec::new(),
            inflater: Inflater::default(),
            inflated: Vec::new(),
            ready: Vec::with_capacity(EVENTS_PER_POLL),
            server,
            sources,
            payload_len,
            counts: EchoCounts::default(),
            rtt: stats::new_histogram(),
            pending: 0,
            open: 0,
            cursor: 0,
        })
    }

    /// Starts `count` more connections.
    pub fn start(&mut self, count: usize) {
        for _ in 0..count {
            let id = self.conns.len();
            let source = self.sources[id % self.sources.len()];
            let registry = self.poll.registry();
            // Writable interest stays: a request that did not fit waits for it.
            let interest = Interest::READABLE | Interest::WRITABLE;
            let (stream, phase) = match dial::dial(
                source,
                self.server,
                id as u64,
                self.deflate,
                "",
                registry,
                Token(id),
                interest,
            ) {
                Ok(dialed) => {
                    self.pending += 1;
                    (Some(dialed.stream), Phase::dialed(dialed.requested))
                }
                Err(failure) => {
                    count_failure(&mut self.counts, &failure);
                    (None, Phase::Dead)
                }
            };
            self.conns.push(EchoConn {
                stream,
                phase,
                reader: FrameReader::new(),
                outbox: Vec::new(),
                next_send: 0,
                next_echo: 0,
            });
        }
    }

    /// Connections started so far.
    pub fn started(&self) -> usize {
        self.conns.len()
    }

    /// Connections connecting or upgrading.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Upgraded connections that are alive.
    pub fn open(&self) -> usize {
        self.open
    }

    /// Counters so far.
    pub fn counts(&self) -> &EchoCounts {
        &self.counts
    }

    /// Round-trip times of the verified echoes, in ns.
    pub fn rtt(&self) -> &Histogram<u64> {
        &self.rtt
    }

    /// Requests sent whose echo has not come back (on live connections).
    pub fn outstanding(&self) -> u64 {
        self.counts.sent - self.counts.echoed - self.counts.lost
    }

    /// Gives up every connection still connecting or upgrading.
    pub fn abandon_pending(&mut self) {
        for id in 0..self.conns.len() {
            if self.conns[id].phase.is_pending() {
                self.fail(id, Failure::Timeout);
            }
        }
    }

    /// Sends up to `count` requests, one per open connection in turn;
    /// returns how many were sent (fewer only if no connection is open).
    pub fn send(&mut self, count: u64) -> u64 {
        let mut sent = 0;
        let mut skipped = 0;
        while sent < count && skipped < self.conns.len() {
            let id = self.cursor;
            self.cursor = (self.cursor + 1) % self.conns.len();
            if !matches!(self.conns[id].phase, Phase::Open) {
                skipped += 1;
                continue;
            }
            skipped = 0;
            if let Err(failure) = self.send_one(id) {
                self.fail(id, failure);
            }
            sent += 1;
        }
        sent
    }

    fn send_one(&mut self, id: usize) -> Result<(), Failure> {
        let conn = &mut self.conns[id];
        let stamp = EchoStamp {
            conn: id as u64,
            seq: conn.next_send,
            sent_ns: sys::now_ns(),
        };
        self.payload.clear();
        assert!(
            message::encode_echo(stamp, self.payload_len, self.deflate, &mut self.payload),
            "payload size checked up front"
        );
        let queued = conn.outbox.len();
        if self.deflate {
            self.compressed.clear();
            self.deflater.deflate(&self.payload, &mut self.compressed);
            frame::encode_compressed(&mut conn.outbox, opcode::TEXT, &self.compressed, Some(MASK));
        } else {
            frame::encode(&mut conn.outbox, opcode::TEXT, &self.payload, Some(MASK));
        }
        conn.next_send += 1;
        self.counts.sent += 1;
        self.counts.bytes_up += (conn.outbox.len() - queued) as u64;
        flush(conn)
    }

    /// Waits up to `timeout` for readiness and handles it; returns the
    /// number of events.
    pub fn step(&mut self, timeout: Duration) -> io::Result<usize> {
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(0),
            Err(e) => return Err(e),
        }
        let mut ready = std::mem::take(&mut self.ready);
        ready.extend(
            self.events
                .iter()
                .map(|e: &Event| (e.token().0, Readiness::of(e))),
        );
        for &(id, readiness) in &ready {
            if let Err(failure) = self.on_event(id, readiness) {
                self.fail(id, failure);
            }
        }
        let events = ready.len();
        ready.clear();
        self.ready = ready;
        Ok(events)
    }

    fn on_event(&mut self, id: usize, readiness: Readiness) -> Result<(), Failure> {
        let conn = &mut self.conns[id];
        match conn.phase {
            Phase::Dead => return Ok(()),
            Phase::Connecting => {
                let stream = conn.stream.as_mut().expect("live connection has a socket");
                if !dial::connected(stream)? {
                    return Ok(());
                }
                dial::send_request(stream, id as u64, self.deflate, "", self.server)?;
                conn.phase = Phase::Upgrading(Vec::new());
            }
            Phase::Upgrading(_) | Phase::Open => {}
        }
        if let Phase::Upgrading(head) = &mut conn.phase {
            let stream = conn.stream.as_mut().expect("live connection has a socket");
            let Some(upgraded) =
                dial::read_upgrade(stream, head, &mut self.scratch, id as u64, self.deflate)?
            else {
                return Ok(());
            };
            conn.phase = Phase::Open;
            self.pending -= 1;
            self.open += 1;
            if !upgraded.early.is_empty() {
                return Err(Failure::BadEcho);
            }
        }
        if readiness.writable {
            flush(conn)?;
        }
        if readiness.readable || readiness.hangup {
            self.read_echoes(id, readiness.hangup)?;
        }
        Ok(())
    }

    /// Reads and checks every echo that has arrived on connection `id`.
    /// Without a hang-up, a read that leaves room in the buffer drained
    /// the socket (edge-triggered: later data raises a new event), so the
    /// read that would only say `WouldBlock` is skipped; after a hang-up it
    /// reads to the end.
    fn read_echoes(&mut self, id: usize, hangup: bool) -> Result<(), Failure> {
        let conn = &mut self.conns[id];
        let Some(stream) = conn.stream.as_mut() else {
            return Ok(());
        };
        loop {
            let Some(n) = dial::read_some(stream, &mut self.scratch)? else {
                return Ok(());
            };
            if n == 0 {
                return Err(Failure::Closed { upgrading: false });
            }
            self.counts.bytes_down += n as u64;
            let now = sys::now_ns();
            let (counts, rtt, payload_len) = (&mut self.counts, &mut self.rtt, self.payload_len);
            let (deflate, inflater, inflated) =
                (self.deflate, &mut self.inflater, &mut self.inflated);
            let next_echo = &mut conn.next_echo;
            conn.reader.feed(&self.scratch[..n], |f| match f.opcode {
                opcode::TEXT | opcode::BINARY if f.fin => {
                    let plain = match (f.compressed, deflate) {
                        (false, _) => f.payload,
                        (true, false) => return Err(FrameError::ReservedBits.into()),
                        (true, true) if inflater.inflate(f.payload, payload_len, inflated) => {
                            counts.compressed_echoes += 1;
                            &inflated[..]
                        }
                        (true, true) => return Err(Failure::BadEcho),
                    };
                    match message::decode_echo(plain, payload_len, deflate) {
                        Some(s) if s.conn == id as u64 && s.seq == *next_echo => {
                            *next_echo += 1;
                            counts.echoed += 1;
                            let ns = now.saturating_sub(s.sent_ns).clamp(1, MAX_LATENCY_NS);
                            rtt.saturating_record(ns);
                            Ok(())
                        }
                        _ => Err(Failure::BadEcho),
                    }
                }
                opcode::TEXT | opcode::BINARY | opcode::CONTINUATION => Err(Failure::Fragmented),
                opcode::PING | opcode::PONG => Ok(()),
                opcode::CLOSE => Err(Failure::CloseFrame),
                other => Err(Failure::UnknownOpcode(other)),
            })?;
            if !hangup && n < self.scratch.len() {
                return Ok(());
            }
        }
    }

    /// Closes connection `id` after `failure`; its outstanding requests are lost.
    fn fail(&mut self, id: usize, failure: Failure) {
        let conn = &mut self.conns[id];
        match conn.phase {
            Phase::Dead => return,
            Phase::Open => self.open -= 1,
            Phase::Connecting | Phase::Upgrading(_) => self.pending -= 1,
        }
        self.counts.lost += conn.next_send - conn.next_echo;
        conn.stream = None;
        conn.phase = Phase::Dead;
        conn.outbox = Vec::new();
        count_failure(&mut self.counts, &failure);
    }
}

/// What one readiness event reported for a connection.
#[derive(Debug, Clone, Copy)]
struct Readiness {
    readable: bool,
    writable: bool,
    /// The peer closed or the socket failed: read to the end.
    hangup: bool,
}

impl Readiness {
    fn of(event: &Event) -> Readiness {
        Readiness {
            readable: event.is_readable(),
            writable: event.is_writable(),
            hangup: event.is_read_closed() || event.is_error(),
        }
    }
}

fn count_failure(counts: &mut EchoCounts, failure: &Failure) {
    *counts.failures.entry(failure.label()).or_insert(0) += 1;
}

/// Writes as much of the connection's outbox as the socket takes.
fn flush(conn: &mut EchoConn) -> Result<(), Failure> {
    let Some(stream) = conn.stream.as_mut() else {
        return Ok(());
    };
    while !conn.outbox.is_empty() {
        match stream.write(&conn.outbox) {
            Ok(0) => return Err(Failure::ShortWrite),
            Ok(n) => {
                conn.outbox.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Failure::Io(e.kind())),
        }
    }
    Ok(())
}

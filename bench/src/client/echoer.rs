//! The echo check: connections that send paced, self-checking requests
//! and verify every echo byte for byte, in order. Unlike push connections
//! these keep an output buffer each (a request may not fit into a full
//! socket), so they are for thousands of connections, not a million.
//! With permessage-deflate, every request is compressed (its filler an
//! order book in JSON) and echoes may come back compressed or plain.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use hdrhistogram::Histogram;
use mio::net::TcpStream;

use crate::client::clients::{ClientPlan, Clients};
use crate::client::conn::Check;
use crate::client::dial::{self, Failure, Transport};
use crate::observe::stats::{self, MAX_LATENCY_NS};
use crate::observe::sys;
use crate::wire::compression::{Deflater, Inflater};
use crate::wire::frame::{self, opcode, Frame, FrameError, MASK};
use crate::wire::message::{self, EchoStamp};

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

/// What an echo connection keeps.
#[derive(Debug, Default)]
pub struct EchoState {
    /// Bytes of requests the socket has not taken yet.
    outbox: Vec<u8>,
    /// Number of the next request to send.
    next_send: u64,
    /// Number of the next echo expected.
    next_echo: u64,
}

/// The echo check: every echo is the next request of its connection.
pub struct Echo {
    payload_len: usize,
    /// The connections offer permessage-deflate; requests are compressed,
    /// and compressed echoes inflated, through these.
    deflate: bool,
    deflater: Deflater,
    inflater: Inflater,
    /// Reused buffers for one request's payload, compressed, and one
    /// echo's inflated.
    payload: Vec<u8>,
    compressed: Vec<u8>,
    inflated: Vec<u8>,
    counts: EchoCounts,
    rtt: Histogram<u64>,
    /// Next connection in the round-robin of requests.
    cursor: usize,
}

/// No connections yet; they will connect to `server` from `sources` in
/// turn and send requests of `payload_len` bytes, compressed if `deflate`
/// (offered, and required of the server). They wait for the upgrade until
/// [`Clients::abandon_pending`].
pub fn clients(
    server: SocketAddr,
    sources: Vec<Ipv4Addr>,
    payload_len: usize,
    deflate: bool,
) -> io::Result<Clients<Echo>> {
    let plan = ClientPlan {
        servers: vec![server],
        sources,
        first_id: 0,
        connect_timeout: Duration::MAX,
    };
    let echo = Echo {
        payload_len,
        deflate,
        deflater: Deflater::default(),
        inflater: Inflater::default(),
        payload: Vec::new(),
        compressed: Vec::new(),
        inflated: Vec::new(),
        counts: EchoCounts::default(),
        rtt: stats::new_histogram(),
        cursor: 0,
    };
    Clients::new(plan, echo)
}

impl Clients<Echo> {
    /// Counters so far.
    pub fn echo_counts(&self) -> &EchoCounts {
        &self.check().counts
    }

    /// Round-trip times of the verified echoes, in ns.
    pub fn rtt(&self) -> &Histogram<u64> {
        &self.check().rtt
    }

    /// Requests sent whose echo has not come back (on live connections).
    pub fn outstanding(&self) -> u64 {
        let counts = self.echo_counts();
        counts.sent - counts.echoed - counts.lost
    }

    /// Sends up to `count` requests, one per open connection in turn;
    /// returns how many were sent (fewer only if no connection is open).
    pub fn send(&mut self, count: u64) -> u64 {
        let conns = self.started();
        let mut sent = 0;
        let mut skipped = 0;
        while sent < count && skipped < conns {
            let index = self.check().cursor;
            self.check_mut().cursor = (index + 1) % conns;
            let Some((id, stream, state, echo)) = self.open_conn(index) else {
                skipped += 1;
                continue;
            };
            skipped = 0;
            if let Err(failure) = echo.send(id, stream, state) {
                self.fail_open(index, failure);
            }
            sent += 1;
        }
        sent
    }
}

impl Echo {
    /// Queues connection `id`'s next request and writes what the socket takes.
    fn send(
        &mut self,
        id: u64,
        stream: &mut TcpStream,
        state: &mut EchoState,
    ) -> Result<(), Failure> {
        let stamp = EchoStamp {
            conn: id,
            seq: state.next_send,
            sent_ns: sys::now_ns(),
        };
        self.payload.clear();
        assert!(
            message::encode_echo(stamp, self.payload_len, self.deflate, &mut self.payload),
            "payload size checked up front"
        );
        let queued = state.outbox.len();
        if self.deflate {
            self.compressed.clear();
            self.deflater.deflate(&self.payload, &mut self.compressed);
            frame::encode_compressed(
                &mut state.outbox,
                opcode::TEXT,
                &self.compressed,
                Some(MASK),
            );
        } else {
            frame::encode(&mut state.outbox, opcode::TEXT, &self.payload, Some(MASK));
        }
        state.next_send += 1;
        self.counts.sent += 1;
        self.counts.bytes_up += (state.outbox.len() - queued) as u64;
        self.flush(stream, state)
    }
}

impl Check for Echo {
    type State = EchoState;

    const SCRATCH_BYTES: usize = 256 * 1024;

    const WRITES: bool = true;

    fn transport(&self, _id: u64) -> Transport {
        Transport::WebSocket {
            deflate: self.deflate,
        }
    }

    fn path(&self, id: u64, _state: &EchoState) -> String {
        dial::default_path(id, "")
    }

    /// Inflates the echo if compressed and checks that it is the next
    /// request of its connection.
    fn message(
        &mut self,
        id: u64,
        f: &Frame<'_>,
        state: &mut EchoState,
        now: u64,
    ) -> Result<(), Failure> {
        let plain = match (f.compressed, self.deflate) {
            (false, _) => f.payload,
            (true, false) => return Err(FrameError::ReservedBits.into()),
            (true, true)
                if self
                    .inflater
                    .inflate(f.payload, self.payload_len, &mut self.inflated) =>
            {
                self.counts.compressed_echoes += 1;
                &self.inflated[..]
            }
            (true, true) => return Err(Failure::BadEcho),
        };
        match message::decode_echo(plain, self.payload_len, self.deflate) {
            Some(s) if s.conn == id && s.seq == state.next_echo => {
                state.next_echo += 1;
                self.counts.echoed += 1;
                let ns = now.saturating_sub(s.sent_ns).clamp(1, MAX_LATENCY_NS);
                self.rtt.saturating_record(ns);
                Ok(())
            }
            _ => Err(Failure::BadEcho),
        }
    }

    fn received(&mut self, bytes: usize) {
        self.counts.bytes_down += bytes as u64;
    }

    /// Writes as much of the connection's outbox as the socket takes.
    fn flush(&mut self, stream: &mut TcpStream, state: &mut EchoState) -> Result<(), Failure> {
        while !state.outbox.is_empty() {
            match stream.write(&state.outbox) {
                Ok(0) => return Err(Failure::ShortWrite),
                Ok(n) => {
                    state.outbox.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Failure::Io(e.kind())),
            }
        }
        Ok(())
    }

    /// Counts the failure; the connection's outstanding requests are lost.
    fn failed(&mut self, _id: u64, state: &mut EchoState, failure: Failure, _: bool) -> bool {
        self.counts.lost += state.next_send - state.next_echo;
        state.outbox = Vec::new();
        *self.counts.failures.entry(failure.label()).or_insert(0) += 1;
        false
    }
}

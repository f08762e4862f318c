//! The floor: the least a push server can do, as a reference measured in
//! the same run as the server under test.
//!
//! One thread, one epoll loop (mio). It accepts connections, answers the
//! upgrade (read the request head, hash the key, write the 101), then keeps
//! nothing per connection but the socket itself in a slab (16 bytes).
//! Its listener defers accepting until the request arrived
//! (`TCP_DEFER_ACCEPT`, as wspush's does), and it answers right after
//! `accept()`, registering the socket with epoll only afterwards: the
//! least work a connection can take (accept, read, write, one
//! `epoll_ctl`).
//! Each line read from standard input is encoded once as an unmasked text
//! frame and `write()`n to every socket in a tight loop: no per-connection
//! WebSocket state, no queues. Lines that are waiting together when the
//! loop gets to them are sent as one batch, their frames back to back (up
//! to [`MAX_BATCH_BYTES`]): one `write()` per socket per batch, the least
//! a stream of messages can cost. A socket that cannot take a whole batch
//! at once (its peer stopped reading, or is gone) is closed.
//!
//! It also echoes, so that the echo measurement has the same reference:
//! each complete client data frame is unmasked in the read buffer and
//! written straight back with the same opcode (a ping gets its pong; a
//! close, or an echo the socket cannot take whole, closes the connection).
//! A frame split across reads is the only thing ever buffered per
//! connection.
//!
//! With a channel name (`--channel hot`) it writes the lines only to the
//! connections whose request named that channel (`?channel=hot`), and
//! holds the others without writing to them: the bare cost of reaching a
//! channel's subscribers among idle connections, every socket in the
//! same process as for the server measured beside it.
//!
//! With a ping interval it also writes a pre-encoded ping frame to every
//! socket once per interval, all at once (pongs are read and dropped): the
//! physical cost of heartbeats, to compare a server's heartbeat CPU with.
//!
//! Standard input is read by a helper thread that hands finished frames to
//! the loop through a channel and a `Waker`; EOF stops the reading, not the
//! server. The server runs until it is killed. [`crate::target::supervisor`] runs
//! several of them behind one port.

use std::collections::HashMap;
use std::io::{self, BufRead, Read, Write};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;
use socket2::{Domain, Socket, Type};

use crate::wire::frame::{self, opcode};
use crate::wire::handshake;

/// Listen backlog; the kernel caps it at `net.core.somaxconn`.
const BACKLOG: i32 = 4096;

/// `TCP_DEFER_ACCEPT` of the listener, in seconds: the same as wspush's.
const DEFER_ACCEPT_SECS: u32 = 1;

const LISTENER: Token = Token(usize::MAX);
const STDIN: Token = Token(usize::MAX - 1);
/// Tokens at and above this name open connections (`OPEN_BASE + key`);
/// below it, connections still upgrading.
const OPEN_BASE: usize = 1 << 40;
/// Tokens at and above this name the connections held without writes
/// (`HELD_BASE + key`).
const HELD_BASE: usize = 1 << 41;

/// Size of the buffer every read goes through.
const READ_BUFFER: usize = 64 * 1024;

/// Frames sent together in one batch, at most (as wspush).
pub const MAX_BATCH_BYTES: usize = 64 * 1024;

/// An unmasked ping frame with no payload.
const PING_FRAME: [u8; 2] = [0x80 | opcode::PING, 0];

/// What the floor does besides writing every line to every socket.
#[derive(Debug, Clone, Default)]
pub struct FloorOptions {
    /// Write a ping to every socket this often.
    pub ping_interval: Option<Duration>,
    /// Write only to the connections whose request named this channel
    /// (`channel=NAME` in its query); hold the others.
    pub channel: Option<String>,
}

/// Runs the floor server on `listen` (sharing the port with other
/// processes if `reuse_port`), broadcasting standard input as `options`
/// say, until the process is killed.
pub fn run(listen: SocketAddr, reuse_port: bool, options: FloorOptions) -> io::Result<()> {
    let listener = bind(listen, reuse_port)?;
    eprintln!("floor listening on {}", listener.local_addr()?);
    serve_with(listener, io::stdin(), options)
}

/// A non-blocking listener on `addr` with `SO_REUSEADDR` (and
/// `SO_REUSEPORT` if asked), `TCP_DEFER_ACCEPT` and a large backlog.
pub fn bind(addr: SocketAddr, reuse_port: bool) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM.nonblocking(), None)?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    wspush::sys::set_tcp_defer_accept(&socket, DEFER_ACCEPT_SECS)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// A connection whose upgrade request is still arriving.
struct Upgrading {
    stream: TcpStream,
    head: Vec<u8>,
}

/// The floor's state.
struct Floor {
    poll: Poll,
    upgrading: Slab<Upgrading>,
    /// The connections every line is written to.
    open: Slab<TcpStream>,
    /// The connections that did not name [`Floor::channel`], never written to.
    held: Slab<TcpStream>,
    channel: Option<String>,
    /// Unfinished client frames of open connections, by slab key.
    partial: HashMap<usize, Vec<u8>>,
    buf: Box<[u8]>,
    /// Reused output buffer for echoes.
    out: Vec<u8>,
}

/// Serves `listener`, broadcasting each line of `input`; returns only on
/// an error of the poll itself.
pub fn serve(listener: TcpListener, input: impl Read + Send + 'static) -> io::Result<()> {
    serve_with(listener, input, FloorOptions::default())
}

/// [`serve`] as `options` say.
pub fn serve_with(
    mut listener: TcpListener,
    input: impl Read + Send + 'static,
    options: FloorOptions,
) -> io::Result<()> {
    let FloorOptions {
        ping_interval,
        channel,
    } = options;
    let poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let waker = Waker::new(poll.registry(), STDIN)?;
    let (frames_tx, frames) = mpsc::channel();
    thread::Builder::new()
        .name("input".into())
        .spawn(move || read_lines(input, frames_tx, waker))?;

    let mut floor = Floor {
        poll,
        upgrading: Slab::new(),
        open: Slab::new(),
        held: Slab::new(),
        channel,
        partial: HashMap::new(),
        buf: vec![0; READ_BUFFER].into_boxed_slice(),
        out: Vec::new(),
    };
    let mut events = Events::with_capacity(1024);
    let mut next_ping = ping_interval.map(|every| Instant::now() + every);
    loop {
        let timeout = next_ping.map(|at| at.saturating_duration_since(Instant::now()));
        match floor.poll.poll(&mut events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for event in &events {
            match event.token() {
                LISTENER => floor.accept(&listener)?,
                STDIN => {
                    let mut batch = Vec::new();
                    for frame in frames.try_iter() {
                        if !batch.is_empty() && batch.len() + frame.len() > MAX_BATCH_BYTES {
                            floor.broadcast(&batch);
                            batch.clear();
                        }
                        batch.extend_from_slice(&frame);
                    }
                    if !batch.is_empty() {
                        floor.broadcast(&batch);
                    }
                }
                Token(t) if t >= HELD_BASE => floor.drain_held(t - HELD_BASE),
                Token(t) if t >= OPEN_BASE => {
                    if floor.echo(t - OPEN_BASE).is_err() {
                        floor.close(t - OPEN_BASE);
                    }
                }
                Token(key) => floor.upgrade(key)?,
            }
        }
        if let (Some(at), Some(every)) = (next_ping, ping_interval) {
            if Instant::now() >= at {
                floor.broadcast(&PING_FRAME);
                next_ping = Some(at + every);
            }
        }
    }
}

impl Floor {
    /// Accepts every waiting connection and answers the requests that
    /// arrived with them; registers each socket afterwards (the
    /// registration reports whatever arrived in between).
    fn accept(&mut self, listener: &TcpListener) -> io::Result<()> {
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    let mut conn = Upgrading {
                        stream,
                        head: Vec::new(),
                    };
                    match read_upgrade(&mut conn, &mut self.buf) {
                        Ok(true) => self.add_open(conn, false)?,
                        Ok(false) => {
                            let entry = self.upgrading.vacant_entry();
                            self.poll.registry().register(
                                &mut conn.stream,
                                Token(entry.key()),
                                Interest::READABLE,
                            )?;
                            entry.insert(conn);
                        }
                        Err(_) => {} // dropped: closes it
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                // A connection that died in the backlog, or a descriptor
                // limit: keep serving the others (new connections raise a
                // new edge).
                Err(e) => {
                    eprintln!("floor: accept: {e}");
                    return Ok(());
                }
            }
        }
    }

    /// Reads what has arrived of an upgrade request; answers it once whole
    /// and moves the connection to the open ones.
    fn upgrade(&mut self, key: usize) -> io::Result<()> {
        let Some(conn) = self.upgrading.get_mut(key) else {
            return Ok(()); // spurious event
        };
        match read_upgrade(conn, &mut self.buf) {
            Ok(false) => Ok(()),
            Ok(true) => {
                let conn = self.upgrading.remove(key);
                self.add_open(conn, true)
            }
            Err(_) => {
                drop(self.upgrading.remove(key));
                Ok(())
            }
        }
    }

    /// Keeps an upgraded connection among the open ones, under its open
    /// token, or among the held ones if it did not name the channel
    /// (`registered`: it is registered already, as an upgrading one).
    fn add_open(&mut self, conn: Upgrading, registered: bool) -> io::Result<()> {
        let Upgrading { mut stream, head } = conn;
        let receives = self
            .channel
            .as_deref()
            .is_none_or(|channel| names_channel(&head, channel));
        let (slab, base) = match receives {
            true => (&mut self.open, OPEN_BASE),
            false => (&mut self.held, HELD_BASE),
        };
        let entry = slab.vacant_entry();
        let token = Token(base + entry.key());
        let registry = self.poll.registry();
        if registered {
            registry.reregister(&mut stream, token, Interest::READABLE)?;
        } else {
            registry.register(&mut stream, token, Interest::READABLE)?;
        }
        entry.insert(stream);
        Ok(())
    }

    /// Writes `frame` (or a batch of frames) to every open socket, closing
    /// those that can't take it whole.
    fn broadcast(&mut self, frame: &[u8]) {
        let before = self.open.len();
        self.open
            .retain(|_, stream| matches!(stream.write(frame), Ok(n) if n == frame.len()));
        let dropped = before - self.open.len();
        if dropped > 0 {
            self.partial.retain(|key, _| self.open.contains(*key));
            eprintln!("floor: closed {dropped} connections that could not take a frame");
        }
    }

    /// Reads and drops whatever a held connection sent; closes it at its
    /// end or on an error.
    fn drain_held(&mut self, key: usize) {
        let Some(stream) = self.held.get_mut(key) else {
            return; // spurious event
        };
        loop {
            match stream.read(&mut self.buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.held.remove(key);
    }

    fn close(&mut self, key: usize) {
        if self.open.contains(key) {
            self.open.remove(key);
        }
        self.partial.remove(&key);
    }

    /// Reads everything that arrived on open connection `key` and echoes
    /// every complete data frame; an error closes the connection.
    fn echo(&mut self, key: usize) -> io::Result<()> {
        let Some(stream) = self.open.get_mut(key) else {
            return Ok(()); // spurious event
        };
        loop {
            let n = match stream.read(&mut self.buf) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.out.clear();
            match self.partial.remove(&key) {
                None => {
                    let used = answer_frames(&mut self.buf[..n], &mut self.out)?;
                    if used < n {
                        self.partial.insert(key, self.buf[used..n].to_vec());
                    }
                }
                Some(mut pending) => {
                    pending.extend_from_slice(&self.buf[..n]);
                    let used = answer_frames(&mut pending, &mut self.out)?;
                    if used < pending.len() {
                        pending.drain(..used);
                        self.partial.insert(key, pending);
                    }
                }
            }
            if !self.out.is_empty() && stream.write(&self.out)? != self.out.len() {
                return Err(io::ErrorKind::WriteZero.into());
            }
        }
    }
}

/// Unmasks the complete client frames at the start of `input` in place and
/// appends their answers to `out`; returns how many bytes they took. A
/// close frame or a malformed one is an error (the connection closes).
fn answer_frames(input: &mut [u8], out: &mut Vec<u8>) -> io::Result<usize> {
    let invalid = |e: frame::FrameError| io::Error::new(io::ErrorKind::InvalidData, e);
    let mut used = 0;
    while let Some(h) = frame::parse_client_header(&input[used..]).map_err(invalid)? {
        let end = used + h.header_len + h.payload_len;
        if end > input.len() {
            break;
        }
        let payload = &mut input[used + h.header_len..end];
        frame::unmask(payload, h.mask);
        match h.opcode {
            opcode::PING => frame::encode(out, opcode::PONG, payload, None),
            opcode::PONG => {}
            opcode::CLOSE => return Err(io::ErrorKind::ConnectionAborted.into()),
            op => frame::encode_fragment(out, h.fin, op, payload),
        }
        used = end;
    }
    Ok(used)
}

/// Whether the request `head` names `channel` in its query
/// (`channel=NAME` among its `&`-separated parameters).
fn names_channel(head: &[u8], channel: &str) -> bool {
    let target = head.split(|&b| b == b' ').nth(1).unwrap_or_default();
    let query = match target.iter().position(|&b| b == b'?') {
        Some(at) => &target[at + 1..],
        None => return false,
    };
    query
        .split(|&b| b == b'&')
        .any(|param| param.strip_prefix(b"channel=") == Some(channel.as_bytes()))
}

/// Reads what has arrived of the upgrade request; once the head is complete,
/// writes the 101 answer and returns `Ok(true)`.
fn read_upgrade(conn: &mut Upgrading, buf: &mut [u8]) -> io::Result<bool> {
    loop {
        let n = match conn.stream.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        conn.head.extend_from_slice(&buf[..n]);
        if let Some(end) = handshake::head_len(&conn.head) {
            let response = handshake::server_response(&conn.head[..end])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            // The first write to a fresh socket always fits whole.
            return match conn.stream.write(&response)? {
                n if n == response.len() => Ok(true),
                _ => Err(io::ErrorKind::WriteZero.into()),
            };
        }
        if conn.head.len() > handshake::MAX_HEAD {
            return Err(io::ErrorKind::InvalidData.into());
        }
    }
}

/// Reads `input` line by line, encodes each line (without its `\n` or
/// `\r\n`) as one text frame, and hands it to the loop.
fn read_lines(input: impl Read, frames: mpsc::Sender<Vec<u8>>, waker: Waker) {
    let mut input = io::BufReader::new(input);
    let mut line = Vec::new();
    loop {
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.last() == Some(&b'\n') {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        }
        let mut encoded = Vec::with_capacity(line.len() + 10);
        frame::encode(&mut encoded, opcode::TEXT, &line, None);
        if frames.send(encoded).is_err() || waker.wake().is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::MASK;

    #[test]
    fn a_request_names_a_channel_only_as_a_whole_parameter() {
        let head = |target: &str| format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n");
        for (target, named) in [
            ("/?channel=hot", true),
            ("/ws?id=u1&channel=cold&channel=hot", true),
            ("/?channel=hotter", false),
            ("/?xchannel=hot", false),
            ("/", false),
            ("/channel=hot", false),
        ] {
            assert_eq!(
                names_channel(head(target).as_bytes(), "hot"),
                named,
                "{target}"
            );
        }
    }

    #[test]
    fn answers_whole_frames_and_keeps_the_rest() {
        let mut wire = Vec::new();
        frame::encode(&mut wire, opcode::TEXT, b"hello", Some(MASK));
        frame::encode(&mut wire, opcode::PING, b"p", Some(MASK));
        frame::encode(&mut wire, opcode::BINARY, &[7; 300], Some(MASK));
        let whole = wire.len();
        frame::encode(&mut wire, opcode::TEXT, b"split", Some(MASK));
        let cut = whole + 4;
        let mut out = Vec::new();
        let used = answer_frames(&mut wire[..cut], &mut out).unwrap();
        assert_eq!(used, whole);
        let mut expected = Vec::new();
        frame::encode(&mut expected, opcode::TEXT, b"hello", None);
        frame::encode(&mut expected, opcode::PONG, b"p", None);
        frame::encode(&mut expected, opcode::BINARY, &[7; 300], None);
        assert_eq!(out, expected);

        let mut close = Vec::new();
        frame::encode(&mut close, opcode::CLOSE, &[3, 232], Some(MASK));
        assert!(answer_frames(&mut close, &mut out).is_err());
        let mut unmasked = Vec::new();
        frame::encode(&mut unmasked, opcode::TEXT, b"x", None);
        assert!(answer_frames(&mut unmasked, &mut out).is_err());
    }
}

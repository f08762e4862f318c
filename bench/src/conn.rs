//! One client connection: a raw non-blocking socket that connects, upgrades,
//! then reads broadcast frames and checks they arrive exactly once, in order.
//!
//! The state is deliberately small (a socket, a phase, a [`FrameReader`] and
//! the next expected sequence number) so that tens of thousands fit in one
//! process without the client costing more than the server it measures.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsFd;

use mio::event::Event;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use socket2::{Domain, Protocol, Socket, Type};

use crate::frame::{self, opcode, FrameError, FrameReader};
use crate::handshake::{self, HandshakeError};
use crate::message;
use crate::stats::{Order, Tally};
use crate::sys;

/// Mask for the few frames a client sends (pongs): RFC 6455's example key.
/// Masking defends browsers against cache poisoning through proxies; there
/// is no proxy on loopback, so a fixed key is enough.
const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

/// Why a connection was given up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Creating, binding or connecting the socket failed.
    Connect(io::ErrorKind),
    /// The upgrade was refused or answered wrongly.
    Handshake(HandshakeError),
    /// The server closed the TCP connection (during the upgrade if `upgrading`).
    Closed {
        /// Whether the upgrade had not completed yet.
        upgrading: bool,
    },
    /// Reading or writing the socket failed.
    Io(io::ErrorKind),
    /// The server sent a frame the reader refuses.
    Protocol(FrameError),
    /// The server sent a frame with an opcode RFC 6455 does not define.
    UnknownOpcode(u8),
    /// The server sent a fragmented message (not expected for push messages).
    Fragmented,
    /// The server sent a close frame.
    CloseFrame,
    /// A pong did not fit into the socket in one write.
    ShortWrite,
    /// The connection was still connecting or upgrading at the deadline.
    Timeout,
}

impl Failure {
    /// Label under which failures of this kind are counted.
    pub fn label(&self) -> String {
        match self {
            Failure::Connect(kind) => format!("connect: {kind}"),
            Failure::Handshake(e) => format!("upgrade: {e}"),
            Failure::Closed { upgrading: true } => "closed during upgrade".into(),
            Failure::Closed { upgrading: false } => "closed by server".into(),
            Failure::Io(kind) => format!("io: {kind}"),
            Failure::Protocol(e) => format!("protocol: {e}"),
            Failure::UnknownOpcode(op) => format!("protocol: opcode {op:#x}"),
            Failure::Fragmented => "protocol: fragmented message".into(),
            Failure::CloseFrame => "close frame from server".into(),
            Failure::ShortWrite => "short write".into(),
            Failure::Timeout => "timeout".into(),
        }
    }
}

impl From<FrameError> for Failure {
    fn from(e: FrameError) -> Self {
        Failure::Protocol(e)
    }
}

impl From<HandshakeError> for Failure {
    fn from(e: HandshakeError) -> Self {
        Failure::Handshake(e)
    }
}

/// Where a connection is in its life.
#[derive(Debug)]
enum Phase {
    /// Non-blocking connect in progress.
    Connecting,
    /// Request sent; the response head gathered so far.
    Upgrading(Vec<u8>),
    /// Upgraded: reading frames.
    Open,
    /// Failed; the socket is closed.
    Dead,
}

/// What a readiness event did to a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// It stayed in its phase.
    Same,
    /// It completed the upgrade.
    Opened,
}

/// Shared, per-step context for handling a connection's events.
pub struct Context<'a> {
    /// The poll registry the sockets are registered with.
    pub registry: &'a Registry,
    /// The server's address, for the `Host` header.
    pub server: SocketAddr,
    /// Buffer every read goes through.
    pub scratch: &'a mut [u8],
    /// Expected size of each message payload.
    pub payload_len: usize,
    /// Where deliveries are recorded.
    pub tally: &'a mut Tally,
}

/// One client connection; see the module documentation.
#[derive(Debug)]
pub struct Conn {
    /// `None` once the connection failed.
    stream: Option<TcpStream>,
    phase: Phase,
    reader: FrameReader,
    /// Sequence number of the next message in order.
    next_seq: u32,
}

impl Conn {
    /// Starts a non-blocking connect from `source` (port chosen by the kernel)
    /// to `server`, and registers the socket under `token`.
    pub fn connect(
        source: Ipv4Addr,
        server: SocketAddr,
        registry: &Registry,
        token: Token,
    ) -> Result<Conn, Failure> {
        let socket = Socket::new(
            Domain::IPV4,
            Type::STREAM.nonblocking(),
            Some(Protocol::TCP),
        )
        .map_err(|e| Failure::Connect(e.kind()))?;
        sys::set_bind_address_no_port(socket.as_fd()).map_err(|e| Failure::Connect(e.kind()))?;
        socket
            .bind(&SocketAddrV4::new(source, 0).into())
            .map_err(|e| Failure::Connect(e.kind()))?;
        match socket.connect(&server.into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(Failure::Connect(e.kind())),
        }
        let mut stream = TcpStream::from_std(socket.into());
        registry
            .register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| Failure::Connect(e.kind()))?;
        Ok(Conn {
            stream: Some(stream),
            phase: Phase::Connecting,
            reader: FrameReader::new(),
            next_seq: 1,
        })
    }

    /// A connection that failed before it had a socket.
    pub fn dead() -> Conn {
        Conn {
            stream: None,
            phase: Phase::Dead,
            reader: FrameReader::new(),
            next_seq: 1,
        }
    }

    /// Whether it is still connecting or upgrading.
    pub fn is_pending(&self) -> bool {
        matches!(self.phase, Phase::Connecting | Phase::Upgrading(_))
    }

    /// Whether it is upgraded and alive.
    pub fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open)
    }

    /// Closes the socket after a failure; events for it are ignored from now on.
    pub fn kill(&mut self) {
        self.stream = None;
        self.phase = Phase::Dead;
    }

    /// Handles a readiness event for connection `id`.
    ///
    /// On `Err` the caller counts the failure and calls [`Conn::kill`].
    pub fn on_event(
        &mut self,
        id: usize,
        event: &Event,
        cx: &mut Context<'_>,
    ) -> Result<Transition, Failure> {
        // After a hang-up or error, read to the end: the short-read shortcut
        // below could otherwise leave the EOF unseen.
        let drain = event.is_read_closed() || event.is_error();
        match self.phase {
            Phase::Connecting => {
                if !self.finish_connect()? {
                    return Ok(Transition::Same);
                }
                self.send_request(id, cx.server)?;
                if event.is_readable() {
                    self.read_upgrade(id, cx, drain)
                } else {
                    Ok(Transition::Same)
                }
            }
            Phase::Upgrading(_) => self.read_upgrade(id, cx, drain),
            Phase::Open => self.read_frames(cx, drain).map(|()| Transition::Same),
            Phase::Dead => Ok(Transition::Same),
        }
    }

    fn stream(&mut self) -> &mut TcpStream {
        self.stream.as_mut().expect("live connection has a socket")
    }

    /// Whether the connect completed (`false`: still in progress).
    fn finish_connect(&mut self) -> Result<bool, Failure> {
        let stream = self.stream();
        match stream.take_error() {
            Ok(None) => {}
            Ok(Some(e)) | Err(e) => return Err(Failure::Connect(e.kind())),
        }
        match stream.peer_addr() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(Failure::Connect(e.kind())),
        }
    }

    fn send_request(&mut self, id: usize, server: SocketAddr) -> Result<(), Failure> {
        let key = handshake::client_key(id as u64);
        let request = handshake::client_request(&server.to_string(), &format!("/ws?id={id}"), &key);
        write_whole(self.stream(), &request)?;
        self.phase = Phase::Upgrading(Vec::new());
        Ok(())
    }

    fn read_upgrade(
        &mut self,
        id: usize,
        cx: &mut Context<'_>,
        drain: bool,
    ) -> Result<Transition, Failure> {
        let Conn { stream, phase, .. } = self;
        let (Some(stream), Phase::Upgrading(head)) = (stream, phase) else {
            unreachable!("read_upgrade outside the upgrading phase");
        };
        let head_end = loop {
            let Some(n) = read_some(stream, cx.scratch)? else {
                return Ok(Transition::Same);
            };
            if n == 0 {
                return Err(Failure::Closed { upgrading: true });
            }
            head.extend_from_slice(&cx.scratch[..n]);
            if let Some(end) = handshake::head_len(head) {
                break end;
            }
            if head.len() > handshake::MAX_HEAD {
                return Err(HandshakeError::TooLarge.into());
            }
        };
        handshake::check_response(&head[..head_end], &handshake::client_key(id as u64))?;
        let early = head.split_off(head_end);
        self.phase = Phase::Open;
        cx.registry
            .reregister(self.stream(), Token(id), Interest::READABLE)
            .map_err(|e| Failure::Io(e.kind()))?;
        if !early.is_empty() {
            self.on_bytes(&early, sys::now_ns(), cx.tally, cx.payload_len)?;
        }
        self.read_frames(cx, drain)?;
        Ok(Transition::Opened)
    }

    fn read_frames(&mut self, cx: &mut Context<'_>, drain: bool) -> Result<(), Failure> {
        loop {
            let Some(n) = read_some(self.stream(), cx.scratch)? else {
                return Ok(());
            };
            if n == 0 {
                return Err(Failure::Closed { upgrading: false });
            }
            let now = sys::now_ns();
            self.on_bytes(&cx.scratch[..n], now, cx.tally, cx.payload_len)?;
            // A read that did not fill the buffer emptied the socket, and new
            // data will raise a new edge (epoll(7)): skip the EAGAIN read.
            if n < cx.scratch.len() && !drain {
                return Ok(());
            }
        }
    }

    /// Feeds received bytes through the frame reader and checks each message.
    fn on_bytes(
        &mut self,
        bytes: &[u8],
        now: u64,
        tally: &mut Tally,
        payload_len: usize,
    ) -> Result<(), Failure> {
        let Conn {
            stream,
            reader,
            next_seq,
            ..
        } = self;
        let stream = stream.as_mut().expect("live connection has a socket");
        reader.feed(bytes, |f| match f.opcode {
            opcode::TEXT | opcode::BINARY if f.fin => {
                match message::decode(f.payload, payload_len) {
                    None => tally.corrupt += 1,
                    Some(stamp) => {
                        let order = match stamp.seq.cmp(next_seq) {
                            std::cmp::Ordering::Equal => Order::Next,
                            std::cmp::Ordering::Greater => Order::Skipped,
                            std::cmp::Ordering::Less => Order::Duplicate,
                        };
                        if tally.delivered(stamp, order, now) && order != Order::Duplicate {
                            *next_seq = stamp.seq + 1;
                        }
                    }
                }
                Ok(())
            }
            opcode::TEXT | opcode::BINARY | opcode::CONTINUATION => Err(Failure::Fragmented),
            opcode::PING => {
                let mut pong = Vec::with_capacity(f.payload.len() + 6);
                frame::encode(&mut pong, opcode::PONG, f.payload, Some(MASK));
                write_whole(stream, &pong)
            }
            opcode::PONG => Ok(()),
            opcode::CLOSE => Err(Failure::CloseFrame),
            other => Err(Failure::UnknownOpcode(other)),
        })
    }
}

/// One `read()`: `Some(n)` bytes (0 at EOF), `None` when the socket is empty.
fn read_some(stream: &mut TcpStream, buf: &mut [u8]) -> Result<Option<usize>, Failure> {
    loop {
        match stream.read(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Failure::Io(e.kind())),
        }
    }
}

/// Writes a small message in one `write()`; it always fits into the empty
/// send buffer of a healthy connection, so anything less is a failure.
fn write_whole(stream: &mut TcpStream, bytes: &[u8]) -> Result<(), Failure> {
    match stream.write(bytes) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(_) => Err(Failure::ShortWrite),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(Failure::ShortWrite),
        Err(e) => Err(Failure::Io(e.kind())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_state_stays_small() {
        // Tens of thousands live in one process next to the server under test.
        assert!(
            std::mem::size_of::<Conn>() <= 96,
            "{}",
            std::mem::size_of::<Conn>()
        );
    }

    #[test]
    fn failure_labels() {
        assert_eq!(
            Failure::Connect(io::ErrorKind::ConnectionRefused).label(),
            "connect: connection refused"
        );
        assert_eq!(
            Failure::Handshake(HandshakeError::Status(503)).label(),
            "upgrade: HTTP status 503"
        );
        assert_eq!(
            Failure::Closed { upgrading: false }.label(),
            "closed by server"
        );
    }
}

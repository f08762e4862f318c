//! The client side of opening a WebSocket, shared by the push and echo
//! connections: a non-blocking connect from a chosen source address, the
//! upgrade request, and the check of the server's answer; plus the two
//! socket helpers every client read and write goes through.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsFd;

use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use socket2::{Domain, Protocol, Socket, Type};

use crate::observe::{procfs, sys};
use crate::wire::events;
use crate::wire::frame::FrameError;
use crate::wire::handshake::{self, HandshakeError};

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
    /// The server sent a fragmented message (not expected here).
    Fragmented,
    /// The server sent a close frame.
    CloseFrame,
    /// A small write (request, pong) did not fit into the socket at once.
    ShortWrite,
    /// The connection was still connecting or upgrading at its deadline.
    Timeout,
    /// An echo did not match what was sent.
    BadEcho,
}

impl Failure {
    /// Label under which failures of this kind are counted. The four kinds
    /// a loaded server typically causes come first and bare: `refused`,
    /// `reset`, `timeout`, `bad handshake: …`.
    pub fn label(&self) -> String {
        use io::ErrorKind as K;
        match self {
            Failure::Connect(K::ConnectionRefused) | Failure::Io(K::ConnectionRefused) => {
                "refused".into()
            }
            Failure::Connect(K::ConnectionReset) | Failure::Io(K::ConnectionReset) => {
                "reset".into()
            }
            Failure::Timeout | Failure::Connect(K::TimedOut) | Failure::Io(K::TimedOut) => {
                "timeout".into()
            }
            Failure::Handshake(e) => format!("bad handshake: {e}"),
            Failure::Connect(kind) => format!("connect: {kind}"),
            Failure::Closed { upgrading: true } => "closed during upgrade".into(),
            Failure::Closed { upgrading: false } => "closed by server".into(),
            Failure::Io(kind) => format!("io: {kind}"),
            Failure::Protocol(e) => format!("protocol: {e}"),
            Failure::UnknownOpcode(op) => format!("protocol: opcode {op:#x}"),
            Failure::Fragmented => "protocol: fragmented message".into(),
            Failure::CloseFrame => "close frame from server".into(),
            Failure::ShortWrite => "short write".into(),
            Failure::BadEcho => "echo mismatch".into(),
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

/// Where a client connection is in its life.
#[derive(Debug)]
pub enum Phase {
    /// Non-blocking connect in progress.
    Connecting,
    /// Request sent; the response head gathered so far.
    Upgrading(Vec<u8>),
    /// Upgraded: reading frames.
    Open,
    /// Failed; the socket is closed.
    Dead,
}

impl Phase {
    /// The phase of a connection [`dial`] just started: upgrading if its
    /// request went out already (see [`Dialed::requested`]), else still
    /// connecting.
    pub fn dialed(requested: bool) -> Phase {
        if requested {
            Phase::Upgrading(Vec::new())
        } else {
            Phase::Connecting
        }
    }

    /// Still connecting or upgrading.
    pub fn is_pending(&self) -> bool {
        matches!(self, Phase::Connecting | Phase::Upgrading(_))
    }
}

/// A connection attempt that [`dial`] started.
#[derive(Debug)]
pub struct Dialed {
    /// The socket, registered with the poll.
    pub stream: TcpStream,
    /// Whether the upgrade request is already sent: the connect completed
    /// within `connect()` (on loopback it always does). Otherwise the
    /// connect is still in progress and the socket waits for writable
    /// readiness: see [`connected`], then [`send_request`].
    pub requested: bool,
}

/// What a connection speaks once open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A WebSocket, offering (and requiring) permessage-deflate if
    /// `deflate`.
    WebSocket {
        /// Offers and requires permessage-deflate.
        deflate: bool,
    },
    /// An event stream (SSE): a `GET` with `Accept: text/event-stream`,
    /// answered with `200` and the events.
    EventStream,
}

/// What the connections of a run speak.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
pub enum Transports {
    /// Every one a WebSocket.
    #[default]
    #[value(name = "ws")]
    WebSocket,
    /// Every one an event stream (SSE).
    #[value(name = "sse")]
    EventStream,
    /// Half and half: connections of odd ids are event streams.
    Mixed,
}

impl Transports {
    /// What connection `id` speaks; its WebSocket offers permessage-deflate
    /// if `deflate`.
    pub fn of(self, id: u64, deflate: bool) -> Transport {
        match self {
            Transports::EventStream => Transport::EventStream,
            Transports::Mixed if id % 2 == 1 => Transport::EventStream,
            _ => Transport::WebSocket { deflate },
        }
    }
}

/// What an opening request asks for.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The path (and query).
    pub path: &'a str,
    /// What the connection speaks once open.
    pub transport: Transport,
}

/// Starts connection `id`: a non-blocking connect from `source` (port
/// chosen by the kernel at connect time) to `server`, then its upgrade
/// request for `ask` at once (its key is connection `id`'s), and
/// registers the socket under `token`.
///
/// On loopback the whole TCP handshake happens inside `connect()` (the
/// SYN-ACK is processed before the call returns, although it says
/// `EINPROGRESS`), so the request can go out right away, carrying the ACK
/// of the handshake too; that saves the wake-up for writable readiness and
/// the `getsockopt(SO_ERROR)` and `getpeername` that would confirm the
/// connect. Then the socket is registered for `interest` only. If the
/// socket does not take the request yet, it is registered for reading and
/// writing, and the caller finishes the connect on the writable event.
pub fn dial(
    source: Ipv4Addr,
    server: SocketAddr,
    id: u64,
    ask: Ask<'_>,
    registry: &Registry,
    token: Token,
    interest: Interest,
) -> Result<Dialed, Failure> {
    let connect_err = |e: io::Error| Failure::Connect(e.kind());
    let socket = Socket::new(
        Domain::IPV4,
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )
    .map_err(connect_err)?;
    sys::set_bind_address_no_port(socket.as_fd()).map_err(connect_err)?;
    // On a connecting socket, TCP_DEFER_ACCEPT makes Linux hold back the
    // bare ACK that completes the handshake (a delayed ACK is armed
    // instead): the request written next carries it. One packet fewer
    // per connection, through both ends' TCP stacks.
    wspush::sys::set_tcp_defer_accept(&socket, 1).map_err(connect_err)?;
    socket
        .bind(&SocketAddrV4::new(source, 0).into())
        .map_err(connect_err)?;
    match socket.connect(&server.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(connect_err(e)),
    }
    let mut stream = TcpStream::from_std(socket.into());
    let request = request(id, ask, server);
    // A failed connect (refused, reset) shows here as the write's error.
    let requested = match stream.write(&request) {
        Ok(n) if n == request.len() => true,
        Ok(_) => return Err(Failure::ShortWrite),
        Err(e) if not_connected_yet(&e) => false,
        Err(e) => return Err(connect_err(e)),
    };
    let interest = if requested {
        interest
    } else {
        Interest::READABLE | Interest::WRITABLE
    };
    registry
        .register(&mut stream, token, interest)
        .map_err(connect_err)?;
    Ok(Dialed { stream, requested })
}

/// Whether a write failed only because the connect has not completed:
/// `EAGAIN` while the handshake is in flight, `ENOTCONN` on some stacks.
fn not_connected_yet(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::NotConnected | io::ErrorKind::Interrupted
    )
}

/// Whether the connect completed (`false`: still in progress).
pub fn connected(stream: &TcpStream) -> Result<bool, Failure> {
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

/// The path connection `id` asks for unless told otherwise: `/ws?id=ID`
/// and `query` (e.g. `&channel=NAME&positions=1`).
pub fn default_path(id: u64, query: &str) -> String {
    format!("/ws?id={id}{query}")
}

/// Connection `id`'s opening request for `ask`: an upgrade, or the
/// `GET` of an event stream.
fn request(id: u64, ask: Ask<'_>, server: SocketAddr) -> Vec<u8> {
    match ask.transport {
        Transport::WebSocket { deflate } => {
            let key = handshake::client_key(id);
            handshake::client_request(&server.to_string(), ask.path, &key, deflate)
        }
        Transport::EventStream => events::request(&server.to_string(), ask.path),
    }
}

/// Sends connection `id`'s upgrade request for `ask` once [`connected`]
/// says the connect completed.
pub fn send_request(
    stream: &mut TcpStream,
    id: u64,
    ask: Ask<'_>,
    server: SocketAddr,
) -> Result<(), Failure> {
    write_whole(stream, &request(id, ask, server))
}

/// A complete, valid upgrade answer.
#[derive(Debug)]
pub struct Upgraded {
    /// The bytes that followed the head (frames the server sent right
    /// after the 101).
    pub early: Vec<u8>,
    /// The last read did not fill the buffer, so the socket is empty now:
    /// under edge-triggered polling more data raises a new event, and
    /// reading again would only say `WouldBlock`.
    pub emptied: bool,
}

/// Reads what has arrived of the answer into `head`; returns the answer
/// once the head is complete and valid for connection `id` opening
/// `transport`.
pub fn read_upgrade(
    stream: &mut TcpStream,
    head: &mut Vec<u8>,
    scratch: &mut [u8],
    id: u64,
    transport: Transport,
) -> Result<Option<Upgraded>, Failure> {
    let (head_end, emptied) = loop {
        let Some(n) = read_some(stream, scratch)? else {
            return Ok(None);
        };
        if n == 0 {
            return Err(Failure::Closed { upgrading: true });
        }
        head.extend_from_slice(&scratch[..n]);
        if let Some(end) = handshake::head_len(head) {
            break (end, n < scratch.len());
        }
        if head.len() > handshake::MAX_HEAD {
            return Err(HandshakeError::TooLarge.into());
        }
    };
    let head_only = &head[..head_end];
    match transport {
        Transport::WebSocket { deflate } => {
            handshake::check_response(head_only, &handshake::client_key(id), deflate)?
        }
        Transport::EventStream => events::check_response(head_only)?,
    }
    Ok(Some(Upgraded {
        early: head.split_off(head_end),
        emptied,
    }))
}

/// One `read()`: `Some(n)` bytes (0 at EOF), `None` when the socket is empty.
pub fn read_some(stream: &mut TcpStream, buf: &mut [u8]) -> Result<Option<usize>, Failure> {
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
pub fn write_whole(stream: &mut TcpStream, bytes: &[u8]) -> Result<(), Failure> {
    match stream.write(bytes) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(_) => Err(Failure::ShortWrite),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(Failure::ShortWrite),
        Err(e) => Err(Failure::Io(e.kind())),
    }
}

/// Share of the local port range, in %, a source address is given at most
/// when `--sources` is chosen automatically (`tuning/check.sh` plans the
/// same). `connect()` tries even ports first (odd ones are left to
/// `bind(0)`); once the even half of the range is taken, every connect
/// scans all of it before finding an odd port, and the setup rate falls
/// from ~10,000/s to ~500/s (measured here: 14,000 connections from one
/// address in 1.4 s, 15,000 in 2.8 s).
pub const PORT_RANGE_PERCENT: u32 = 45;

/// Enough source addresses for `conns` connections to use at most
/// [`PORT_RANGE_PERCENT`] of the local port range of each.
pub fn auto_sources(conns: usize) -> Result<u8, crate::Error> {
    let ports = procfs::local_port_range()?;
    sources_for(conns, ports)
        .ok_or_else(|| format!("{conns} connections need more than 250 source addresses").into())
}

/// Source addresses for `conns` connections when each may use
/// `PORT_RANGE_PERCENT` of `ports` local ports (`None` beyond 250).
pub fn sources_for(conns: usize, ports: u32) -> Option<u8> {
    let per_source = (ports as usize * PORT_RANGE_PERCENT as usize / 100).max(1);
    u8::try_from(conns.div_ceil(per_source).max(1))
        .ok()
        .filter(|&n| n <= 250)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Duration;

    use mio::Poll;

    #[test]
    fn the_request_goes_out_with_the_connect_on_loopback() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let poll = Poll::new().unwrap();
        let dialed = dial(
            Ipv4Addr::LOCALHOST,
            server,
            7,
            Ask {
                path: "/ws?id=7",
                transport: Transport::WebSocket { deflate: false },
            },
            poll.registry(),
            Token(0),
            Interest::READABLE,
        )
        .unwrap();
        assert!(
            dialed.requested,
            "loopback completes the handshake in connect()"
        );
        let (mut accepted, _) = listener.accept().unwrap();
        accepted
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while handshake::head_len(&got).is_none() {
            let n = accepted.read(&mut buf).unwrap();
            assert!(n > 0, "the request ended early: {got:?}");
            got.extend_from_slice(&buf[..n]);
        }
        let ask = Ask {
            path: "/ws?id=7",
            transport: Transport::WebSocket { deflate: false },
        };
        assert_eq!(got, request(7, ask, server));
    }

    #[test]
    fn a_refused_connect_counts_as_refused() {
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = closed.local_addr().unwrap();
        drop(closed);
        let poll = Poll::new().unwrap();
        let failure = dial(
            Ipv4Addr::LOCALHOST,
            server,
            1,
            Ask {
                path: "/ws?id=1",
                transport: Transport::WebSocket { deflate: false },
            },
            poll.registry(),
            Token(0),
            Interest::READABLE,
        )
        .unwrap_err();
        assert_eq!(failure.label(), "refused");
    }

    #[test]
    fn failure_labels_name_the_usual_kinds_first() {
        use io::ErrorKind as K;
        assert_eq!(Failure::Connect(K::ConnectionRefused).label(), "refused");
        assert_eq!(Failure::Io(K::ConnectionReset).label(), "reset");
        assert_eq!(Failure::Timeout.label(), "timeout");
        assert_eq!(
            Failure::Handshake(HandshakeError::Status(503)).label(),
            "bad handshake: HTTP status 503"
        );
        assert_eq!(
            Failure::Connect(K::AddrNotAvailable).label(),
            "connect: address not available"
        );
        assert_eq!(
            Failure::Closed { upgrading: false }.label(),
            "closed by server"
        );
    }

    #[test]
    fn each_source_address_gets_at_most_45_percent_of_the_port_range() {
        // The default range 32768-60999 has 28,232 ports: 12,704 per address.
        assert_eq!(sources_for(1_000_000, 28_232), Some(79));
        assert_eq!(sources_for(100_000, 28_232), Some(8));
        assert_eq!(sources_for(12_704, 28_232), Some(1));
        assert_eq!(sources_for(12_705, 28_232), Some(2));
        assert_eq!(sources_for(1, 1), Some(1));
        assert_eq!(sources_for(1_000_000, 55_536), Some(41));
        assert_eq!(sources_for(10_000_000, 28_232), None);
    }
}

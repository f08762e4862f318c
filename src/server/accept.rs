//! Accepting connections: the listening sockets, admission (limits, the
//! slab, the poll registration) and refusals before a connection exists.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Token};
use socket2::{Domain, Socket, Type};

use crate::ops::metrics::Metrics;
use crate::ops::sys;
use crate::protocol::http::{Endpoints, Rejection, MAX_RESPONSE_LEN};
use crate::server::conn::Conn;
use crate::server::key::ConnKey;
use crate::server::nonblocking::attempt;
use crate::server::{Lifecycle, Server};

/// Accept queue length asked of the kernel (capped by net.core.somaxconn).
const LISTEN_BACKLOG: i32 = 65_535;
/// Connections accepted per wake-up before the loop serves the others.
const ACCEPTS_PER_WAKE: usize = 256;
/// How long accepting pauses when file descriptors run out.
pub(super) const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// The listener a connection came in through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Door {
    /// The main listener: WebSocket upgrades (and `/healthz`, the demo
    /// page if on, and `/metrics` unless it has a listener of its own).
    Main,
    /// `metrics_listen`: `/metrics` and `/healthz` only.
    Metrics,
}

/// A listening socket: `SO_REUSEADDR` (restarts while old connections sit
/// in TIME_WAIT), `SO_REUSEPORT` when asked, `TCP_NODELAY` (Linux copies it
/// to every accepted socket, saving a syscall per connection),
/// `TCP_DEFER_ACCEPT`, and a deep accept queue for connection bursts (the
/// kernel caps it at somaxconn).
///
/// `TCP_DEFER_ACCEPT`: the kernel hands a connection to `accept()` only
/// once its first data (the upgrade or HTTP request) arrived, so one
/// wake-up accepts, reads and answers it, and the handshake's bare ACK
/// wakes nobody. A client that connects and sends nothing stays half-open
/// in the kernel (no descriptor, no slab slot) for about
/// `DEFER_ACCEPT_SECS`; then the kernel resends its SYN-ACK, the client's
/// answer completes the connection, and it is accepted and given
/// `handshake_timeout` like any other.
pub(super) fn listen(addr: SocketAddr, reuse_port: bool) -> io::Result<TcpListener> {
    const DEFER_ACCEPT_SECS: u32 = 1;
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM.nonblocking(), None)?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_tcp_nodelay(true)?;
    sys::set_tcp_defer_accept(&socket, DEFER_ACCEPT_SECS)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// Out of file descriptors or kernel memory: retrying at once would spin.
fn is_resource_exhaustion(e: &io::Error) -> bool {
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    const ENOBUFS: i32 = 105;
    const ENOMEM: i32 = 12;
    matches!(e.raw_os_error(), Some(ENFILE | EMFILE | ENOBUFS | ENOMEM))
}

/// Best effort 503 or 429 for a connection over a limit, without taking a
/// slot: read what the client sent (so closing does not reset the
/// response away), answer, close.
fn refuse(mut stream: TcpStream, rejection: Rejection, scratch: &mut [u8]) {
    let _ = stream.read(scratch);
    let mut response = [0u8; MAX_RESPONSE_LEN];
    let len = rejection.write_response(&mut response);
    let _ = stream.write(&response[..len]);
    let _ = stream.shutdown(Shutdown::Write);
}

impl Server {
    /// Accepts until the backlog is empty, the per-wake cap is reached, or
    /// file descriptors run out (then pauses instead of spinning).
    pub(super) fn accept(&mut self, door: Door, now: Instant) {
        self.accept_again[door as usize] = false;
        if self.accept_paused_until.is_some() || self.lifecycle != Lifecycle::Running {
            return;
        }
        for _ in 0..ACCEPTS_PER_WAKE {
            let listener = match (door, &self.metrics_listener) {
                (Door::Main, _) => &self.listener,
                (Door::Metrics, Some(listener)) => listener,
                (Door::Metrics, None) => return,
            };
            match attempt(|| listener.accept()) {
                Ok(Some((stream, peer))) => self.admit(stream, peer, door, now),
                Ok(None) => return,
                Err(e) if is_resource_exhaustion(&e) => return self.pause_accepting(&e, now),
                Err(e) => {
                    Metrics::incr(&self.shared.metrics.accept_errors);
                    log::debug!("accept failed: {e}");
                }
            }
        }
        self.accept_again[door as usize] = true;
    }

    fn pause_accepting(&mut self, error: &io::Error, now: Instant) {
        Metrics::incr(&self.shared.metrics.accept_pauses);
        self.accept_paused_until = Some(now + ACCEPT_PAUSE);
        if self
            .last_accept_warning
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1))
        {
            self.last_accept_warning = Some(now);
            log::warn!(
                "accept paused for {ACCEPT_PAUSE:?}: {error} ({} connections open; raise the open-file limit or --max-connections)",
                self.conns.len()
            );
        }
    }

    pub(super) fn resume_accepting(&mut self, now: Instant) {
        if self.accept_paused_until.is_some_and(|until| now >= until) {
            self.accept_paused_until = None;
            self.accept_again = [true; 2];
        }
        if self.accept_paused_until.is_none() {
            for door in [Door::Main, Door::Metrics] {
                if self.accept_again[door as usize] {
                    self.accept(door, now);
                }
            }
        }
    }

    /// Takes a new TCP connection into the slab, or refuses it with 503
    /// when the server is full or 429 when its address is.
    fn admit(&mut self, mut stream: TcpStream, peer: SocketAddr, door: Door, now: Instant) {
        let metrics = &self.shared.metrics;
        Metrics::incr(&metrics.connections_accepted);
        if self.conns.len() >= self.config.max_connections {
            Metrics::incr(&metrics.rejected_503);
            refuse(stream, Rejection::ServiceUnavailable, &mut self.scratch);
            return;
        }
        let key = self.conns.vacant_key();
        if let (Door::Main, Some(per_ip)) = (door, &mut self.per_ip) {
            if per_ip.admit(ConnKey(key), peer.ip()).is_err() {
                Metrics::incr(&metrics.rejected_429);
                log::debug!("{} holds its maximum of connections: 429", peer.ip());
                refuse(stream, Rejection::TooManyRequests, &mut self.scratch);
                return;
            }
        }
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, Token(key), Interest::READABLE)
        {
            Metrics::incr(&metrics.accept_errors);
            log::warn!("register failed: {e}");
            if let Some(per_ip) = &mut self.per_ip {
                per_ip.release(ConnKey(key));
            }
            return;
        }
        Metrics::incr(&metrics.connections_http);
        let endpoints = match door {
            Door::Main => Endpoints {
                websocket: true,
                metrics: self.metrics_listener.is_none(),
                demo: self.config.demo,
            },
            Door::Metrics => Endpoints {
                websocket: false,
                metrics: true,
                demo: false,
            },
        };
        let serial = self.serials.assign();
        self.conns.insert(Conn::accepted(stream, endpoints, serial));
        self.key_bound = self.key_bound.max(key + 1);
        // The request arrived with the connection (the listener defers
        // accepting until it has): reading now saves a trip through the poll.
        let parts = self.parts(now);
        let mut ctx = parts.ctx;
        let verdict = parts.conns[key].on_accepted(ConnKey(key), parts.scratch, &mut ctx);
        self.settle(ConnKey(key), verdict);
    }
}

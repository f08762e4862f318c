//! The loop's sockets: the poll, its events, the listening sockets and the
//! tokens reserved for what is not a connection.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use socket2::{Domain, Socket, Type};

use crate::config::Config;
use crate::ops::sys;
use crate::server::net::nonblocking::attempt;

/// What to do for a connection on one turn of the loop, after its event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ready {
    /// Read it.
    pub(crate) read: bool,
    /// Write what it has queued.
    pub(crate) write: bool,
    /// Answering an epoll edge without hang-up (see
    /// [`Conn::on_readable`](crate::server::conn::Conn::on_readable)).
    pub(crate) edge: bool,
}

impl From<&Event> for Ready {
    fn from(event: &Event) -> Ready {
        let hangup = event.is_read_closed() || event.is_error();
        Ready {
            read: event.is_readable() || hangup,
            write: event.is_writable() || event.is_write_closed(),
            edge: !hangup,
        }
    }
}

impl Ready {
    /// Read without an event to go by: until WouldBlock.
    pub(crate) const RETRY_READ: Ready = Ready {
        read: true,
        write: false,
        edge: false,
    };
}

/// The main listener's token.
pub(crate) const LISTENER: Token = Token(usize::MAX);
/// The token of the waker a handle rings when it queued something.
pub(crate) const WAKER: Token = Token(usize::MAX - 1);
/// The metrics listener's token.
pub(crate) const METRICS_LISTENER: Token = Token(usize::MAX - 2);
/// The alarm's token (see `time::alarm`).
pub(crate) const ALARM: Token = Token(usize::MAX - 3);
/// The token of the control socket successors' sockets arrive on.
pub(crate) const SUCCESSOR: Token = Token(usize::MAX - 4);
/// The token of a successor's socket, until its ask is read.
pub(crate) const ASKING: Token = Token(usize::MAX - 5);

/// Readiness events taken per poll.
const EVENTS_CAPACITY: usize = 1024;
/// Accept queue length asked of the kernel (capped by net.core.somaxconn).
const LISTEN_BACKLOG: i32 = 65_535;

/// The listener a connection came in through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Door {
    /// The main listener: WebSocket upgrades (and `/healthz`, the demo
    /// page if on, and `/metrics` unless it has a listener of its own).
    Main,
    /// `metrics_listen`: `/metrics` and `/healthz` only.
    Metrics,
}

/// The poll and what is registered in it besides the connections: the
/// listener, the optional metrics listener (the waker and the alarm
/// register through [`Sockets::registry`]).
#[derive(Debug)]
pub(crate) struct Sockets {
    poll: Poll,
    events: Events,
    /// `None` once closed (see [`Sockets::close`]).
    listener: Option<TcpListener>,
    /// The listener was bound here (not handed in): it may be bound again.
    own_listener: bool,
    local_addr: SocketAddr,
    metrics_listener: Option<TcpListener>,
}

impl Sockets {
    /// A new poll with `listener` (or else `config`'s listen address
    /// bound) and the metrics address, if any, registered.
    pub(crate) fn open(
        config: &Config,
        listener: Option<std::net::TcpListener>,
    ) -> io::Result<Sockets> {
        let poll = Poll::new()?;
        let own_listener = listener.is_none();
        let mut listener = match listener {
            Some(listener) => {
                listener.set_nonblocking(true)?;
                TcpListener::from_std(listener)
            }
            None => {
                TcpListener::from_std(listen(config.listen, config.reuse_port).map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot listen on {}: {e}", config.listen))
                })?)
            }
        };
        let local_addr = listener.local_addr()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let metrics_listener = match config.metrics_listen {
            Some(addr) => {
                // In an SO_REUSEPORT group, a replacement shares the port
                // with the process it replaces while that one drains.
                let metrics_listener = listen(addr, config.reuse_port).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("cannot listen on {addr} for metrics: {e}"),
                    )
                })?;
                let mut metrics_listener = TcpListener::from_std(metrics_listener);
                poll.registry().register(
                    &mut metrics_listener,
                    METRICS_LISTENER,
                    Interest::READABLE,
                )?;
                Some(metrics_listener)
            }
            None => None,
        };
        Ok(Sockets {
            poll,
            events: Events::with_capacity(EVENTS_CAPACITY),
            listener: Some(listener),
            own_listener,
            local_addr,
            metrics_listener,
        })
    }

    /// Where sockets are registered.
    pub(crate) fn registry(&self) -> &Registry {
        self.poll.registry()
    }

    /// The waker handles ring (see [`WAKER`]).
    /// Watches `socket` for reading under `token` ([`SUCCESSOR`] or
    /// [`ASKING`]; see `server::handover`).
    pub(crate) fn watch_handover(
        &self,
        socket: &std::os::fd::OwnedFd,
        token: Token,
    ) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let fd = socket.as_raw_fd();
        self.registry().register(
            &mut mio::unix::SourceFd(&fd),
            token,
            mio::Interest::READABLE,
        )
    }

    /// Stops watching `socket` (see [`Sockets::watch_handover`]).
    pub(crate) fn unwatch_handover(&self, socket: &std::os::fd::OwnedFd) {
        use std::os::fd::AsRawFd;
        let fd = socket.as_raw_fd();
        let _ = self.registry().deregister(&mut mio::unix::SourceFd(&fd));
    }

    /// A waker for the loop's poll.
    pub(crate) fn waker(&self) -> io::Result<Waker> {
        Waker::new(self.registry(), WAKER)
    }

    /// The address the listener is bound to.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The metrics listener's address, if there is one.
    pub(crate) fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// Whether `/metrics` has a listener of its own.
    pub(crate) fn has_metrics_listener(&self) -> bool {
        self.metrics_listener.is_some()
    }

    /// Waits for readiness, at most `timeout`, and hands the events out
    /// (give them back with [`Sockets::put_back`]); `None` if the wait was
    /// interrupted.
    pub(crate) fn wait(&mut self, timeout: Option<Duration>) -> io::Result<Option<Events>> {
        if let Err(e) = self.poll.poll(&mut self.events, timeout) {
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(None)
            } else {
                Err(e)
            };
        }
        Ok(Some(std::mem::replace(
            &mut self.events,
            Events::with_capacity(0),
        )))
    }

    /// Takes back the events [`Sockets::wait`] handed out, for the next poll.
    pub(crate) fn put_back(&mut self, events: Events) {
        self.events = events;
    }

    /// The next connection waiting at `door`'s listener, if any.
    pub(crate) fn accept(&self, door: Door) -> io::Result<Option<(TcpStream, SocketAddr)>> {
        let listener = match door {
            Door::Main => &self.listener,
            Door::Metrics => &self.metrics_listener,
        };
        match listener {
            Some(listener) => attempt(|| listener.accept()),
            None => Ok(None),
        }
    }

    /// Whether the main listener was bound here, in an `SO_REUSEPORT`
    /// group (`reuse_port`): it may leave the group and join it again.
    pub(crate) fn may_leave_group(&self, reuse_port: bool) -> bool {
        self.own_listener && reuse_port
    }

    /// Whether the main listener is closed.
    pub(crate) fn main_closed(&self) -> bool {
        self.listener.is_none()
    }

    /// Binds the main listener again, on the address it had, and registers
    /// it (after [`Sockets::close`], back in its `SO_REUSEPORT` group).
    pub(crate) fn reopen_main(&mut self, reuse_port: bool) -> io::Result<()> {
        let mut listener = TcpListener::from_std(listen(self.local_addr, reuse_port)?);
        self.poll
            .registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        self.listener = Some(listener);
        Ok(())
    }

    /// Closes `door`'s listener: nothing is accepted there any more, and
    /// in an `SO_REUSEPORT` group the kernel sends new connections to the
    /// other members (a listener merely taken out of the poll would go on
    /// taking its share, and leave it waiting). Connections still in its
    /// accept queue are reset.
    pub(crate) fn close(&mut self, door: Door) {
        drop(self.take(door));
    }

    /// Takes the listener of `door` out of the poll, open (for this
    /// process's next image to listen on), if it was not closed.
    pub(crate) fn take(&mut self, door: Door) -> Option<TcpListener> {
        let listener = match door {
            Door::Main => self.listener.take(),
            Door::Metrics => self.metrics_listener.take(),
        };
        let mut listener = listener?;
        if let Err(e) = self.poll.registry().deregister(&mut listener) {
            log::warn!("deregistering a listener failed: {e}");
        }
        Some(listener)
    }
}

/// A listening socket as a server makes it (for [`Server::from_listener`](crate::server::Server::from_listener):
/// a supervisor that holds the listeners its instances share): `SO_REUSEADDR` (restarts while old connections sit
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
pub fn listen(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::TcpListener> {
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
    Ok(socket.into())
}

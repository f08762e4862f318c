//! The loop as a value: one `mio::Poll`, the listener, a `Slab` of
//! connections, the buffer pool, the timer wheel and the command channel.
//! [`Server::poll_once`] is one non-blocking step; [`Server::run`] loops
//! until shutdown. A [`Handle`] broadcasts and shuts down from any thread.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use slab::Slab;
use socket2::{Domain, Socket, Type};

use crate::broadcast::SharedFrame;
use crate::config::Config;
use crate::conn::{CloseReason, Conn, Ctx, Delivery, Verdict};
use crate::http::{Rejection, MAX_RESPONSE_LEN};
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::pool::BufferPool;
use crate::timer::{Tick, TimerWheel};
use crate::ws::{CloseCode, MessageKind};

const LISTENER: Token = Token(usize::MAX);
const WAKER: Token = Token(usize::MAX - 1);

/// Accept queue length asked of the kernel (capped by net.core.somaxconn).
const LISTEN_BACKLOG: i32 = 65_535;
/// Readiness events taken per poll.
const EVENTS_CAPACITY: usize = 1024;
/// Size of the loop's one read buffer; every connection reads into it.
const SCRATCH_BYTES: usize = 64 * 1024;
/// Connections accepted per wake-up before the loop serves the others.
const ACCEPTS_PER_WAKE: usize = 256;
/// Commands (broadcasts) handled per loop iteration.
const COMMANDS_PER_ITERATION: usize = 64;
/// Commands a [`Handle`] can queue before `broadcast` blocks.
const COMMAND_QUEUE: usize = 4096;
/// How long accepting pauses when file descriptors run out.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Timer wheel resolution and size (100 ms × 1024 = 102 s per rotation).
const TIMER_RESOLUTION: Duration = Duration::from_millis(100);
const TIMER_SLOTS: usize = 1024;
/// Slab slots reserved up front (address space only: untouched pages cost
/// no memory), so growing to many connections never copies the slab.
const SLAB_RESERVE: usize = 1 << 20;
/// Input buffers allocated at start, and kept idle at most.
const POOL_PREALLOCATED: usize = 64;
const POOL_MAX_IDLE: usize = 1024;

/// State shared between the loop and its handles.
#[derive(Debug)]
struct Shared {
    waker: Waker,
    /// A wake-up is on its way; further senders need not wake again.
    wake_pending: AtomicBool,
    metrics: Metrics,
}

/// What a [`Handle`] asks the loop to do.
#[derive(Debug)]
enum Command {
    Broadcast(MessageKind, Vec<u8>),
    Shutdown,
}

/// The server's loop has ended; nothing can be sent to it any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerGone;

impl std::fmt::Display for ServerGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the wspush server loop has stopped")
    }
}

impl std::error::Error for ServerGone {}

/// A broadcast larger than `max_message_bytes`; it was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageTooBig;

/// Talks to a running server from any thread: broadcast, shut down, read
/// metrics. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Handle {
    commands: SyncSender<Command>,
    shared: Arc<Shared>,
}

impl Handle {
    /// Queues a text message for every open connection. Blocks while the
    /// loop is thousands of messages behind (backpressure), so do not call
    /// it from the loop's own thread; use [`Server::broadcast`] there.
    pub fn broadcast_text(&self, text: impl Into<String>) -> Result<(), ServerGone> {
        self.send(Command::Broadcast(
            MessageKind::Text,
            text.into().into_bytes(),
        ))
    }

    /// Queues a binary message for every open connection (see [`Handle::broadcast_text`]).
    pub fn broadcast_binary(&self, bytes: impl Into<Vec<u8>>) -> Result<(), ServerGone> {
        self.send(Command::Broadcast(MessageKind::Binary, bytes.into()))
    }

    /// Asks the loop to shut down: stop accepting, close every connection
    /// with 1001 after what is already queued for it, and let
    /// [`Server::run`] return once they are closed or the close timeout passed.
    pub fn shutdown(&self) -> Result<(), ServerGone> {
        self.send(Command::Shutdown)
    }

    /// The server's counters now.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// The live counters, for code in this crate that counts on the loop's behalf.
    pub(crate) fn metrics_ref(&self) -> &Metrics {
        &self.shared.metrics
    }

    fn send(&self, command: Command) -> Result<(), ServerGone> {
        self.commands.send(command).map_err(|_| ServerGone)?;
        if !self.shared.wake_pending.swap(true, Ordering::AcqRel) {
            self.shared.waker.wake().map_err(|_| ServerGone)?;
        }
        Ok(())
    }
}

/// An open WebSocket connection, as seen from the embedding program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionInfo<'a> {
    /// The connection's id (its slot; reused after it closes).
    pub id: usize,
    /// The request target of its upgrade request, e.g. `/ws?id=01`.
    pub target: &'a str,
}

impl ConnectionInfo<'_> {
    /// The path part of the target.
    pub fn path(&self) -> &str {
        self.target
            .split_once('?')
            .map_or(self.target, |(path, _)| path)
    }

    /// The query part of the target, without the `?`.
    pub fn query(&self) -> Option<&str> {
        self.target.split_once('?').map(|(_, query)| query)
    }
}

/// What to do for a connection on one turn of the loop.
#[derive(Debug, Clone, Copy)]
struct Ready {
    read: bool,
    write: bool,
    /// Answering an epoll edge without hang-up (see [`Conn::on_readable`]).
    edge: bool,
}

impl Ready {
    /// Read without an event to go by: until WouldBlock.
    const RETRY_READ: Ready = Ready {
        read: true,
        write: false,
        edge: false,
    };
    /// The first read of a connection just registered (edge-triggered):
    /// whatever arrives after the read raises an event, so a short read
    /// may end it as after an edge (no read that would only say WouldBlock).
    const REGISTERED: Ready = Ready {
        read: true,
        write: false,
        edge: true,
    };
}

/// Shutdown progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lifecycle {
    Running,
    /// Closing connections; give up on the rest at the deadline.
    Draining {
        deadline: Instant,
    },
}

/// A WebSocket push server: one thread, one poll loop.
///
/// ```no_run
/// use wspush::{Config, Server};
///
/// let mut server = Server::bind(Config::default())?;
/// println!("listening on {}", server.local_addr());
/// let handle = server.handle();
/// std::thread::spawn(move || {
///     handle.broadcast_text("hello, everyone").unwrap();
///     handle.shutdown().unwrap();
/// });
/// server.run()?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct Server {
    poll: Poll,
    events: Events,
    listener: TcpListener,
    local_addr: SocketAddr,
    conns: Slab<Conn>,
    pool: BufferPool,
    scratch: Box<[u8]>,
    timers: TimerWheel,
    config: Config,
    shared: Arc<Shared>,
    commands: Receiver<Command>,
    command_sender: SyncSender<Command>,
    /// Commands may be waiting (the waker fired, or the last drain stopped at its cap).
    commands_pending: bool,
    /// Connections that used their read budget with input left.
    read_again: Vec<usize>,
    /// Accepting stopped at its cap with connections left in the backlog.
    accept_again: bool,
    /// Accepting is paused (file descriptors ran out) until then.
    accept_paused_until: Option<Instant>,
    last_accept_warning: Option<Instant>,
    /// Reused buffers for deadlines due and closes found during a broadcast.
    expired: Vec<(usize, Tick)>,
    failed: Vec<(usize, CloseReason)>,
    lifecycle: Lifecycle,
}

/// The parts of a server a connection handler works with, borrowed apart.
struct Parts<'a> {
    conns: &'a mut Slab<Conn>,
    registry: &'a Registry,
    scratch: &'a mut [u8],
    ctx: Ctx<'a>,
}

impl Server {
    /// Validates `config`, binds its listen address and sets up the loop.
    pub fn bind(config: Config) -> io::Result<Server> {
        config
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let poll = Poll::new()?;
        let mut listener = listen(&config)?;
        let local_addr = listener.local_addr()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let shared = Arc::new(Shared {
            waker: Waker::new(poll.registry(), WAKER)?,
            wake_pending: AtomicBool::new(false),
            metrics: Metrics::default(),
        });
        let (command_sender, commands) = mpsc::sync_channel(COMMAND_QUEUE);
        Ok(Server {
            poll,
            events: Events::with_capacity(EVENTS_CAPACITY),
            listener,
            local_addr,
            conns: Slab::with_capacity(config.max_connections.min(SLAB_RESERVE)),
            pool: BufferPool::new(config.max_head_bytes, POOL_PREALLOCATED, POOL_MAX_IDLE),
            scratch: vec![0; SCRATCH_BYTES.max(config.max_head_bytes)].into_boxed_slice(),
            timers: TimerWheel::new(TIMER_RESOLUTION, TIMER_SLOTS, Instant::now()),
            config,
            shared,
            commands,
            command_sender,
            commands_pending: false,
            read_again: Vec::new(),
            accept_again: false,
            accept_paused_until: None,
            last_accept_warning: None,
            expired: Vec::new(),
            failed: Vec::new(),
            lifecycle: Lifecycle::Running,
        })
    }

    /// The address the listener is bound to (with the real port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A handle for other threads.
    pub fn handle(&self) -> Handle {
        Handle {
            commands: self.command_sender.clone(),
            shared: Arc::clone(&self.shared),
        }
    }

    /// The server's counters now.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// The open WebSocket connections.
    pub fn connections(&self) -> impl Iterator<Item = ConnectionInfo<'_>> {
        self.conns
            .iter()
            .filter(|(_, conn)| conn.is_open())
            .map(|(id, conn)| ConnectionInfo {
                id,
                target: conn.target(),
            })
    }

    /// Whether a shutdown finished: every connection is closed, or the
    /// close timeout passed.
    pub fn is_finished(&self) -> bool {
        match self.lifecycle {
            Lifecycle::Running => false,
            Lifecycle::Draining { deadline } => self.conns.is_empty() || Instant::now() >= deadline,
        }
    }

    /// Runs the loop until a shutdown finishes, then drops what is left.
    pub fn run(&mut self) -> io::Result<()> {
        while !self.is_finished() {
            self.poll_once(None)?;
        }
        self.close_all(CloseReason::Shutdown);
        Ok(())
    }

    /// One loop iteration: waits for readiness (at most `timeout`, or until
    /// the next deadline; `None` waits as long as nothing is due), then
    /// handles every event, due deadline and queued command.
    pub fn poll_once(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let timeout = self.poll_timeout(timeout, Instant::now());
        if let Err(e) = self.poll.poll(&mut self.events, timeout) {
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        let now = Instant::now();
        let events = std::mem::replace(&mut self.events, Events::with_capacity(0));
        for event in events.iter() {
            match event.token() {
                LISTENER => self.accept(now),
                WAKER => self.commands_pending = true,
                Token(key) => {
                    let hangup = event.is_read_closed() || event.is_error();
                    let ready = Ready {
                        read: event.is_readable() || hangup,
                        write: event.is_writable() || event.is_write_closed(),
                        edge: !hangup,
                    };
                    self.on_conn_event(key, ready, now);
                }
            }
        }
        self.events = events;
        self.retry_reads(now);
        self.expire_deadlines(now);
        self.resume_accepting(now);
        if self.commands_pending {
            self.drain_commands(now);
        }
        let metrics = &self.shared.metrics;
        Metrics::set(&metrics.buffers_lent, self.pool.lent() as u64);
        Metrics::set(&metrics.buffers_idle, self.pool.idle() as u64);
        Ok(())
    }

    /// Encodes a message once and offers it to every open connection.
    /// Refused (and counted) when larger than `max_message_bytes`.
    pub fn broadcast(&mut self, kind: MessageKind, payload: &[u8]) -> Result<(), MessageTooBig> {
        let shared = Arc::clone(&self.shared);
        let metrics = &shared.metrics;
        if payload.len() as u64 > self.config.max_message_bytes {
            Metrics::incr(&metrics.broadcasts_rejected);
            log::warn!(
                "broadcast of {} bytes refused: over the {}-byte message limit",
                payload.len(),
                self.config.max_message_bytes
            );
            return Err(MessageTooBig);
        }
        Metrics::incr(&metrics.broadcasts);
        let frame = SharedFrame::encode(kind.opcode(), payload);
        let mut failed = std::mem::take(&mut self.failed);
        let (mut delivered, mut queued, mut dropped) = (0, 0, 0);
        let parts = self.parts(Instant::now());
        let mut ctx = parts.ctx;
        for (key, conn) in parts.conns.iter_mut() {
            match conn.deliver(key, &frame, &mut ctx) {
                Delivery::Skipped | Delivery::SlowConsumer => {}
                Delivery::Written => delivered += 1,
                Delivery::Queued => {
                    delivered += 1;
                    queued += 1;
                }
                Delivery::Dropped => dropped += 1,
                Delivery::Close(reason) => failed.push((key, reason)),
            }
            if !sync_interest(parts.registry, key, conn) {
                failed.push((key, CloseReason::Abnormal));
            }
        }
        Metrics::add(&metrics.broadcast_deliveries, delivered);
        Metrics::add(&metrics.write_would_block, queued);
        Metrics::add(&metrics.slow_consumer_drops, dropped);
        for (key, reason) in failed.drain(..) {
            self.close(key, reason);
        }
        self.failed = failed;
        Ok(())
    }

    /// How long the next poll may wait.
    fn poll_timeout(&self, requested: Option<Duration>, now: Instant) -> Option<Duration> {
        if self.commands_pending || self.accept_again || !self.read_again.is_empty() {
            return Some(Duration::ZERO);
        }
        let lifecycle_deadline = match self.lifecycle {
            Lifecycle::Draining { deadline } => Some(deadline),
            Lifecycle::Running => None,
        };
        [requested, self.timers.next_timeout(now)]
            .into_iter()
            .chain(
                [self.accept_paused_until, lifecycle_deadline]
                    .map(|at| at.map(|at| at.saturating_duration_since(now))),
            )
            .flatten()
            .min()
    }

    /// Borrows the loop's parts apart so a connection can be handled while
    /// the slab, registry and pool are all in use.
    fn parts(&mut self, now: Instant) -> Parts<'_> {
        Parts {
            conns: &mut self.conns,
            registry: self.poll.registry(),
            scratch: &mut self.scratch,
            ctx: Ctx {
                config: &self.config,
                pool: &mut self.pool,
                timers: &mut self.timers,
                metrics: &self.shared.metrics,
                now,
            },
        }
    }

    fn on_conn_event(&mut self, key: usize, ready: Ready, now: Instant) {
        let parts = self.parts(now);
        let mut ctx = parts.ctx;
        let Some(conn) = parts.conns.get_mut(key) else {
            return; // A spurious event for a connection already closed.
        };
        let mut verdict = Verdict::Keep;
        if ready.write {
            verdict = conn.on_writable(key, parts.scratch, &mut ctx);
        }
        if ready.read && verdict == Verdict::Keep {
            verdict = conn.on_readable(key, ready.edge, parts.scratch, &mut ctx);
        }
        self.settle(key, verdict);
    }

    /// Acts on a handler's verdict: close, schedule another read, and keep
    /// the writable interest in step with the output queue.
    fn settle(&mut self, key: usize, verdict: Verdict) {
        match verdict {
            Verdict::Close(reason) => return self.close(key, reason),
            Verdict::ReadAgain => self.read_again.push(key),
            Verdict::Keep => {}
        }
        let registry = self.poll.registry();
        if let Some(conn) = self.conns.get_mut(key) {
            if !sync_interest(registry, key, conn) {
                self.close(key, CloseReason::Abnormal);
            }
        }
    }

    fn close(&mut self, key: usize, reason: CloseReason) {
        let Some(mut conn) = self.conns.try_remove(key) else {
            return;
        };
        conn.release(&mut self.pool, &mut self.timers);
        let metrics = &self.shared.metrics;
        Metrics::incr(reason.counter(metrics));
        Metrics::decr(&metrics.connections_open);
        log::debug!("connection {key} closed: {reason:?}");
    }

    fn close_all(&mut self, reason: CloseReason) {
        let keys: Vec<usize> = self.conns.iter().map(|(key, _)| key).collect();
        for key in keys {
            self.close(key, reason);
        }
    }

    /// Accepts until the backlog is empty, the per-wake cap is reached, or
    /// file descriptors run out (then pauses instead of spinning).
    fn accept(&mut self, now: Instant) {
        self.accept_again = false;
        if self.accept_paused_until.is_some() || self.lifecycle != Lifecycle::Running {
            return;
        }
        for _ in 0..ACCEPTS_PER_WAKE {
            match self.listener.accept() {
                Ok((stream, _)) => self.admit(stream, now),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_resource_exhaustion(&e) => return self.pause_accepting(&e, now),
                Err(e) => {
                    Metrics::incr(&self.shared.metrics.accept_errors);
                    log::debug!("accept failed: {e}");
                }
            }
        }
        self.accept_again = true;
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

    fn resume_accepting(&mut self, now: Instant) {
        match self.accept_paused_until {
            Some(until) if now >= until => {
                self.accept_paused_until = None;
                self.accept(now);
            }
            None if self.accept_again => self.accept(now),
            _ => {}
        }
    }

    /// Takes a new TCP connection into the slab, or refuses it with 503
    /// when the server is full.
    fn admit(&mut self, mut stream: TcpStream, now: Instant) {
        let metrics = &self.shared.metrics;
        Metrics::incr(&metrics.connections_accepted);
        if self.conns.len() >= self.config.max_connections {
            Metrics::incr(&metrics.rejected_at_capacity);
            refuse_at_capacity(stream, &mut self.scratch);
            return;
        }
        let key = self.conns.vacant_key();
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, Token(key), Interest::READABLE)
        {
            Metrics::incr(&metrics.accept_errors);
            log::warn!("register failed: {e}");
            return;
        }
        Metrics::incr(&metrics.connections_open);
        let mut ctx = self.parts(now).ctx;
        let conn = Conn::accepted(stream, key, &mut ctx);
        self.conns.insert(conn);
        // The request arrived with the connection (the listener defers
        // accepting until it has): reading now saves a trip through the poll.
        self.on_conn_event(key, Ready::REGISTERED, now);
    }

    fn retry_reads(&mut self, now: Instant) {
        let mut keys = std::mem::take(&mut self.read_again);
        for key in keys.drain(..) {
            self.on_conn_event(key, Ready::RETRY_READ, now);
        }
        if self.read_again.is_empty() {
            self.read_again = keys;
        }
    }

    fn expire_deadlines(&mut self, now: Instant) {
        let mut due = std::mem::take(&mut self.expired);
        self.timers.expire(now, &mut due);
        for (key, tick) in due.drain(..) {
            let Some(conn) = self.conns.get_mut(key).filter(|conn| conn.is_due(tick)) else {
                continue; // Stale: re-armed, cleared, or the slot was reused.
            };
            let verdict = conn.on_deadline(&mut self.timers);
            self.settle(key, verdict);
        }
        self.expired = due;
    }

    fn drain_commands(&mut self, now: Instant) {
        self.shared.wake_pending.store(false, Ordering::Release);
        self.commands_pending = false;
        for _ in 0..COMMANDS_PER_ITERATION {
            match self.commands.try_recv() {
                Ok(Command::Broadcast(kind, payload)) => {
                    let _ = self.broadcast(kind, &payload);
                }
                Ok(Command::Shutdown) => self.begin_shutdown(now),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return,
            }
        }
        self.commands_pending = true;
    }

    /// Stops accepting and starts closing every connection with 1001.
    fn begin_shutdown(&mut self, now: Instant) {
        if self.lifecycle != Lifecycle::Running {
            return;
        }
        log::info!("shutting down: closing {} connections", self.conns.len());
        self.lifecycle = Lifecycle::Draining {
            deadline: now + self.config.close_timeout,
        };
        if let Err(e) = self.poll.registry().deregister(&mut self.listener) {
            log::warn!("deregistering the listener failed: {e}");
        }
        let mut closing = Vec::with_capacity(self.conns.len());
        let parts = self.parts(now);
        let mut ctx = parts.ctx;
        for (key, conn) in parts.conns.iter_mut() {
            let verdict = if conn.is_open() {
                conn.begin_close(
                    key,
                    CloseCode::GOING_AWAY,
                    "server shutting down",
                    CloseReason::Shutdown,
                    &mut ctx,
                )
            } else {
                Verdict::Close(CloseReason::Shutdown)
            };
            closing.push((key, verdict));
        }
        for (key, verdict) in closing {
            self.settle(key, verdict);
        }
    }
}

/// The listening socket: `SO_REUSEADDR` (restarts while old connections sit
/// in TIME_WAIT), `SO_REUSEPORT` when asked, `TCP_NODELAY` (Linux copies it
/// to every accepted socket, saving a syscall per connection),
/// `TCP_DEFER_ACCEPT`, and a deep accept queue for connection bursts (the
/// kernel caps it at somaxconn).
///
/// `TCP_DEFER_ACCEPT`: the kernel hands a connection to `accept()` only
/// once its first data (the upgrade request) arrived, so one wake-up
/// accepts, reads and answers it, and the handshake's bare ACK wakes
/// nobody. A client that connects and sends nothing stays half-open in the
/// kernel (no descriptor, no slab slot) for about `DEFER_ACCEPT_SECS`;
/// then the kernel resends its SYN-ACK, the client's answer completes the
/// connection, and it is accepted and given `handshake_timeout` like any
/// other.
fn listen(config: &Config) -> io::Result<TcpListener> {
    let socket = Socket::new(
        Domain::for_address(config.listen),
        Type::STREAM.nonblocking(),
        None,
    )?;
    socket.set_reuse_address(true)?;
    if config.reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_tcp_nodelay(true)?;
    const DEFER_ACCEPT_SECS: libc::c_int = 1;
    let defer = DEFER_ACCEPT_SECS;
    // SAFETY: the descriptor is open for the duration of the call (`socket`
    // owns it), and the option value is a live `c_int` whose exact size is
    // passed along; setsockopt only reads it. Neither socket2 nor rustix
    // wraps TCP_DEFER_ACCEPT (std's wrapper is unstable).
    let set = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&socket),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&defer as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    socket.bind(&config.listen.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// Registers or drops writable interest when the connection's output
/// queue changed between empty and not; `false` if the registry failed.
fn sync_interest(registry: &Registry, key: usize, conn: &mut Conn) -> bool {
    let Some(want_writable) = conn.interest_change() else {
        return true;
    };
    let interest = if want_writable {
        Interest::READABLE | Interest::WRITABLE
    } else {
        Interest::READABLE
    };
    match registry.reregister(conn.stream_mut(), Token(key), interest) {
        Ok(()) => true,
        Err(e) => {
            log::debug!("reregister failed: {e}");
            false
        }
    }
}

/// Out of file descriptors or kernel memory: retrying at once would spin.
fn is_resource_exhaustion(e: &io::Error) -> bool {
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    const ENOBUFS: i32 = 105;
    const ENOMEM: i32 = 12;
    matches!(e.raw_os_error(), Some(ENFILE | EMFILE | ENOBUFS | ENOMEM))
}

/// Best effort 503 for a connection over `max_connections`: read what the
/// client sent (so closing does not reset the response away), answer, close.
fn refuse_at_capacity(mut stream: TcpStream, scratch: &mut [u8]) {
    let _ = stream.read(scratch);
    let mut response = [0u8; MAX_RESPONSE_LEN];
    let len = Rejection::ServiceUnavailable.write_response(&mut response);
    let _ = stream.write(&response[..len]);
    let _ = stream.shutdown(Shutdown::Write);
}

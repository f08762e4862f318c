//! The loop as a value: one `mio::Poll`, the listener (and an optional
//! metrics listener), a `Slab` of connections, the buffer pool, the timer
//! wheel, the heartbeat sweep and the command channel.
//! [`Server::poll_once`] is one step, waiting at most the caller's
//! timeout; [`Server::run`] loops until shutdown. A [`Handle`] broadcasts
//! and shuts down from any thread.
//!
//! Like Redis' `ae`, the loop has file events (sockets) and time events:
//! connection deadlines on the wheel, the heartbeat slices, the pool trim
//! and the periodic stats line. The nearest one sets the alarm (a timerfd
//! in the poll, see `alarm`); with none pending the loop sleeps until a
//! socket or a command wakes it.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use slab::Slab;

mod accept;
mod alarm;
mod batching;
pub(crate) mod conn;
mod delivery;
mod endpoints;
mod fanout;
mod feed;
mod frames;
mod handle;
mod heartbeat;
mod history;
mod housekeeping;
mod key;
mod nonblocking;
pub(crate) mod output;
mod owed;
mod per_ip;
mod pool;
mod ring;
mod routes;
mod targeted;
mod timer;
mod upstream;

use crate::config::{Config, ConfigError};
use crate::ops::metrics::{LoopHistogram, LoopMax, Metrics, MetricsSnapshot, Tally};
use crate::ops::sys;
use crate::protocol::commands::{ConnRef, Recipients};
use crate::protocol::ws::{CloseCode, MessageKind};
use accept::{listen, Door};
use handle::Shared;
pub use handle::{BroadcastError, Handle, MessageTooBig, ServerGone, UpstreamReader};
pub use history::SharedHistory;
use housekeeping::StatsLine;
use key::ConnKey;

use crate::server::alarm::Alarm;
use crate::server::batching::Batching;
use crate::server::conn::{Assemblies, CloseReason, Conn, Ctx, DeflateScratch, Verdict};
use crate::server::fanout::Stream;
use crate::server::feed::{Action, Command, Feed, Gate, Taken};
use crate::server::frames::SharedFrames;
use crate::server::heartbeat::Heartbeat;
use crate::server::history::{Bounds, History, Replay};
use crate::server::key::Serials;
use crate::server::owed::Unfinished;
use crate::server::per_ip::PerIpLimit;
use crate::server::pool::BufferPool;
use crate::server::routes::Routes;
use crate::server::targeted::Targeted;
use crate::server::timer::{Tick, TimerWheel};
use crate::server::upstream::{Outbox, Shelf};

const LISTENER: Token = Token(usize::MAX);
const WAKER: Token = Token(usize::MAX - 1);
const METRICS_LISTENER: Token = Token(usize::MAX - 2);
const ALARM: Token = Token(usize::MAX - 3);

/// Readiness events taken per poll.
const EVENTS_CAPACITY: usize = 1024;
/// Size of the loop's one read buffer; every connection reads into it.
const SCRATCH_BYTES: usize = 64 * 1024;
/// Frames in one broadcast batch, at most (a single larger message goes
/// alone): about what a loopback socket takes in one write.
const MAX_BATCH_BYTES: usize = 64 * 1024;
/// Timer wheel resolution and size (100 ms × 1024 = 102 s per rotation).
const TIMER_RESOLUTION: Duration = Duration::from_millis(100);
const TIMER_SLOTS: usize = 1024;
/// Slab slots reserved up front (address space only: untouched pages cost
/// no memory), so growing to many connections never copies the slab.
const SLAB_RESERVE: usize = 1 << 20;
/// Input buffers allocated at start, and kept idle at most.
const POOL_PREALLOCATED: usize = 64;
const POOL_MAX_IDLE: usize = 1024;

/// An open WebSocket connection, as seen from the embedding program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionInfo<'a> {
    /// The connection's key, as `conn` commands and
    /// [`Recipients::Conn`] address it.
    pub key: ConnRef,
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

/// Why [`Server::bind`] failed.
#[derive(Debug)]
pub enum BindError {
    /// A setting is out of range.
    Config(ConfigError),
    /// Listening, or setting up the poll, failed (the message names the
    /// address).
    Io(io::Error),
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BindError::Config(e) => e.fmt(f),
            BindError::Io(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for BindError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BindError::Config(e) => Some(e),
            BindError::Io(e) => Some(e),
        }
    }
}

/// A WebSocket push server: one thread, one poll loop.
///
/// ```no_run
/// use wspush::{Config, Server};
///
/// let mut server = Server::bind(Config::default())?;
/// println!("listening on {}", server.local_addr());
/// let handle = server.handle();
/// std::thread::spawn(move || -> Result<(), wspush::BroadcastError> {
///     handle.broadcast_text("hello, everyone")?;
///     Ok(handle.shutdown()?)
/// });
/// server.run()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Server {
    poll: Poll,
    /// Rings for the next time event.
    alarm: Alarm,
    events: Events,
    listener: TcpListener,
    local_addr: SocketAddr,
    metrics_listener: Option<TcpListener>,
    conns: Slab<Conn>,
    /// One more than the highest key ever used: the heartbeat sweeps `0..key_bound`.
    key_bound: usize,
    heartbeat: Heartbeat,
    per_ip: Option<PerIpLimit>,
    pool: BufferPool,
    scratch: Box<[u8]>,
    /// See [`Ctx::replies`].
    replies: Vec<u8>,
    /// See [`Ctx::deflate`].
    deflate: DeflateScratch,
    /// Client ids and channel subscriptions.
    routes: Routes,
    /// Messages and closes for some connections, on their way.
    targeted: Targeted,
    /// The serial of the next connection (see [`ConnRef`]).
    serials: Serials,
    /// Client messages on their way to the upstream reader, if they go there.
    upstream: Option<Outbox>,
    /// Connections whose reading waits for the upstream reader.
    upstream_waiting: Vec<ConnKey>,
    /// The body of the last `/metrics` answer, its capacity kept.
    page: Vec<u8>,
    timers: TimerWheel,
    config: Config,
    shared: Arc<Shared>,
    /// Broadcasts queued for the loop.
    feed: Feed,
    command_sender: Sender<Command>,
    /// Broadcasts may have arrived on the channel (the waker fired).
    commands_pending: bool,
    /// Broadcasts framed into batches so far.
    commands_taken: u64,
    /// The broadcast batches, and the pass carrying them to the connections.
    stream: Stream,
    /// When the loop saw a handle's shutdown request.
    shutdown_seen: Option<Instant>,
    /// Connections that used their read budget with input left.
    read_again: Vec<ConnKey>,
    /// Accepting stopped at its cap with connections left in the backlog
    /// (per [`Door`]).
    accept_again: [bool; 2],
    /// Accepting is paused (file descriptors ran out) until then.
    accept_paused_until: Option<Instant>,
    last_accept_warning: Option<Instant>,
    /// Reused buffers for deadlines due, and for verdicts a delivery
    /// slice leaves to act on.
    expired: Vec<(ConnKey, Tick)>,
    unsettled: Vec<(ConnKey, Verdict)>,
    /// See [`Ctx::gathered`].
    gathered: Vec<SharedFrames>,
    /// See [`Ctx::messages`].
    messages: Assemblies,
    /// The positions given out and the history kept (see [`Ctx::history`]).
    history: History,
    /// See [`Ctx::replays`].
    replays: Vec<(ConnKey, Replay)>,
    /// See [`Ctx::unfinished`].
    unfinished: Option<Unfinished>,
    lifecycle: Lifecycle,
    tally: Tally,
    loop_max: LoopMax,
    /// When the last poll returned, until its iteration is counted.
    busy_since: Option<Instant>,
    /// When the pool next gives back buffers that sat unused (only while
    /// it has surplus, or freed buffers the allocator still holds).
    next_trim: Option<Instant>,
    /// The pool's count of freed buffers when the allocator last returned memory.
    released_at_last_return: u64,
    stats: Option<StatsLine>,
    batching: Batching,
}

impl Drop for Server {
    /// Tells the handles that their requests have no one to go to, and
    /// how many broadcasts it took from them (the rest were abandoned).
    fn drop(&mut self) {
        let shared = &self.shared;
        shared
            .broadcasts_taken
            .store(self.commands_taken, Ordering::Relaxed);
        shared.gone.store(true, Ordering::Release);
        shared.gate.close();
        if let Some(upstream) = &mut self.upstream {
            upstream.hand_over();
        }
        shared.shelf.close();
    }
}

/// The parts of a server a connection handler works with, borrowed apart.
struct Parts<'a> {
    conns: &'a mut Slab<Conn>,
    registry: &'a Registry,
    scratch: &'a mut [u8],
    ctx: Ctx<'a>,
}

impl Server {
    /// Validates `config`, binds its listen address (and its metrics
    /// address, if any) and sets up the loop.
    pub fn bind(config: Config) -> Result<Server, BindError> {
        config.validate().map_err(BindError::Config)?;
        Server::open(config).map_err(BindError::Io)
    }

    /// [`Server::bind`] once the configuration is known to be valid.
    fn open(config: Config) -> io::Result<Server> {
        let poll = Poll::new()?;
        let mut listener = listen(config.listen, config.reuse_port).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot listen on {}: {e}", config.listen))
        })?;
        let local_addr = listener.local_addr()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let metrics_listener = match config.metrics_listen {
            Some(addr) => {
                let mut metrics_listener = listen(addr, false).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("cannot listen on {addr} for metrics: {e}"),
                    )
                })?;
                poll.registry().register(
                    &mut metrics_listener,
                    METRICS_LISTENER,
                    Interest::READABLE,
                )?;
                Some(metrics_listener)
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            waker: Waker::new(poll.registry(), WAKER)?,
            wake_pending: AtomicBool::new(false),
            broadcasts_queued: AtomicU64::new(0),
            broadcasts_taken: AtomicU64::new(0),
            gate: Gate::new(config.max_pending_bytes),
            max_message_bytes: config.max_message_bytes,
            deflate_min_bytes: config.deflate.then_some(config.deflate_min_bytes),
            shutdown_after: AtomicU64::new(u64::MAX),
            gone: AtomicBool::new(false),
            metrics: Metrics::default(),
            loop_histogram: LoopHistogram::default(),
            shelf: Arc::new(Shelf::new()),
        });
        let upstream = config
            .upstream
            .map(|up| Outbox::new(up, Arc::clone(&shared.shelf)));
        let (command_sender, commands) = mpsc::channel();
        let now = Instant::now();
        let batching = Batching::new(config.batch_delay);
        let bounds = Bounds {
            messages: config.history_messages,
            bytes: config.history_bytes,
            age: config.history_age,
        };
        let history = match config.history_fd {
            Some(fd) => History::shared(sys::inherited_fd(fd)?, config.first_position)?,
            None => {
                let epoch = config.epoch.unwrap_or_default();
                History::new(epoch, config.first_position, bounds)?
            }
        };
        Ok(Server {
            alarm: Alarm::new(poll.registry(), ALARM)?,
            poll,
            events: Events::with_capacity(EVENTS_CAPACITY),
            listener,
            local_addr,
            metrics_listener,
            conns: Slab::with_capacity(config.max_connections.min(SLAB_RESERVE)),
            key_bound: 0,
            heartbeat: Heartbeat::new(config.ping_interval, config.idle_timeout, now),
            per_ip: config.max_connections_per_ip.map(PerIpLimit::new),
            pool: BufferPool::new(config.max_head_bytes, POOL_PREALLOCATED, POOL_MAX_IDLE),
            scratch: vec![0; SCRATCH_BYTES.max(config.max_head_bytes)].into_boxed_slice(),
            replies: Vec::with_capacity(SCRATCH_BYTES),
            deflate: DeflateScratch::default(),
            routes: Routes::new(config.max_channels),
            targeted: Targeted::default(),
            serials: Serials::default(),
            upstream,
            upstream_waiting: Vec::new(),
            page: Vec::new(),
            timers: TimerWheel::new(TIMER_RESOLUTION, TIMER_SLOTS, now),
            stats: config.stats_interval.map(|every| StatsLine {
                every,
                next_at: now + every,
                last: MetricsSnapshot::default(),
            }),
            config,
            shared,
            feed: Feed::new(commands),
            command_sender,
            commands_pending: false,
            commands_taken: 0,
            stream: Stream::default(),
            shutdown_seen: None,
            read_again: Vec::new(),
            accept_again: [false; 2],
            accept_paused_until: None,
            last_accept_warning: None,
            expired: Vec::new(),
            unsettled: Vec::new(),
            gathered: Vec::new(),
            messages: Assemblies::new(),
            history,
            replays: Vec::new(),
            unfinished: None,
            lifecycle: Lifecycle::Running,
            tally: Tally::default(),
            loop_max: LoopMax::default(),
            busy_since: None,
            next_trim: None,
            released_at_last_return: 0,
            batching,
        })
    }

    /// The address the listener is bound to (with the real port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address `/metrics` is served on when it has a listener of its own.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// The reader of what clients send, when [`Config::upstream`] is set:
    /// the lines of the `upstream` format, taken in order from any thread.
    pub fn upstream(&self) -> Option<UpstreamReader> {
        self.upstream.as_ref().map(|_| UpstreamReader {
            shared: Arc::clone(&self.shared),
        })
    }

    /// A handle for other threads.
    pub fn handle(&self) -> Handle {
        Handle {
            commands: self.command_sender.clone(),
            shared: Arc::clone(&self.shared),
        }
    }

    /// The server's counters now, read one by one while the loop runs. Byte
    /// and frame counts (`bytes_written`, `frames_sent`, `queued_bytes`)
    /// are published once per loop iteration, so they may lag the
    /// connection counts by that iteration's work.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.snapshot()
    }

    /// The open WebSocket connections.
    pub fn connections(&self) -> impl Iterator<Item = ConnectionInfo<'_>> {
        self.conns
            .iter()
            .filter(|(_, conn)| conn.is_open())
            .map(|(slot, conn)| ConnectionInfo {
                key: conn.conn_ref(ConnKey(slot), self.config.instance),
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
        // Uncount what the last closes left queued.
        self.publish_metrics(Instant::now());
        Ok(())
    }

    /// One loop iteration: waits for readiness (at most `timeout`, or until
    /// the next deadline; `None` waits as long as nothing is due), then
    /// handles every event, due deadline and queued command.
    pub fn poll_once(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let before_poll = Instant::now();
        let handled = self.record_iteration(before_poll);
        let timeout = self.poll_timeout(timeout, before_poll)?;
        let timeout = self.wait_for_batch(timeout, handled);
        if let Err(e) = self.poll.poll(&mut self.events, timeout) {
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        let now = Instant::now();
        self.busy_since = Some(now);
        let events = std::mem::replace(&mut self.events, Events::with_capacity(0));
        self.batching.observe(events.iter().count());
        for event in events.iter() {
            match event.token() {
                LISTENER => self.accept(Door::Main, now),
                METRICS_LISTENER => self.accept(Door::Metrics, now),
                WAKER => self.commands_pending = true,
                ALARM => self.alarm.rang(),
                Token(key) => {
                    let hangup = event.is_read_closed() || event.is_error();
                    let ready = Ready {
                        read: event.is_readable() || hangup,
                        write: event.is_writable() || event.is_write_closed(),
                        edge: !hangup,
                    };
                    self.on_conn_event(ConnKey(key), ready, now);
                }
            }
        }
        self.events = events;
        self.retry_reads(now);
        self.expire_deadlines(now);
        self.sweep_heartbeats(now);
        self.resume_accepting(now);
        if self.commands_pending {
            self.shared.wake_pending.store(false, Ordering::Release);
            self.commands_pending = false;
            self.feed.take_arrivals();
        }
        self.advance_broadcasts(now);
        self.housekeeping(now);
        Ok(())
    }

    /// Queues a message for every open connection, from the loop's own
    /// thread. It is framed with whatever else is waiting, and a pass over
    /// the connections starts at once if none is under way (a pass over
    /// more than [`Config::fanout_budget`] connections goes on in the next
    /// [`Server::poll_once`] calls). Refused (and counted) when larger
    /// than `max_message_bytes`.
    pub fn broadcast(&mut self, kind: MessageKind, payload: &[u8]) -> Result<(), MessageTooBig> {
        let shared = &self.shared;
        check_message_limit(payload, shared.max_message_bytes, &shared.metrics)?;
        shared.broadcasts_queued.fetch_add(1, Ordering::AcqRel);
        let action = shared.send_action(Recipients::All, kind, payload.to_vec());
        shared.gate.force_acquire(action.cost());
        let now = Instant::now();
        self.feed.push(Command {
            action,
            queued_at: now,
            seq: None,
        });
        if self.delivering() {
            self.frame_waiting();
        } else {
            self.advance_broadcasts(now);
        }
        // Outside an iteration: what the slice did is published here.
        self.publish_metrics(now);
        Ok(())
    }

    /// Moves the broadcasts along, one step per loop iteration: frames
    /// what is waiting into a batch, and carries the batches one slice
    /// further (starting a pass if a connection may be owed one). Once a
    /// handle asked for a shutdown, sends what was queued before it (for
    /// at most half the shutdown timeout), then begins the shutdown.
    fn advance_broadcasts(&mut self, now: Instant) {
        if self.lifecycle != Lifecycle::Running {
            return self.abandon_commands();
        }
        let shutdown_after = self.shared.shutdown_after.load(Ordering::Acquire);
        if shutdown_after != u64::MAX {
            let seen = *self.shutdown_seen.get_or_insert(now);
            let flush_until = seen + self.config.shutdown_timeout / 2;
            if self.commands_taken >= shutdown_after || now >= flush_until {
                // Nothing more is framed; what was goes out first.
                self.abandon_commands();
                if !self.delivering() {
                    return self.begin_shutdown(now);
                }
                return self.deliver_slice(now);
            }
        }
        self.frame_waiting();
        self.deliver_slice(now);
    }

    /// Takes the commands waiting (up to those queued before a shutdown,
    /// if one was asked for), in order: broadcasts are framed into batches
    /// at the end of the stream, messages for some connections into
    /// batches addressed to them (as are closes), subscription changes
    /// are made. Delivery carries them on (see `delivery`).
    fn frame_waiting(&mut self) {
        let shutdown_after = self.shared.shutdown_after.load(Ordering::Acquire);
        loop {
            let allowed = shutdown_after.saturating_sub(self.commands_taken);
            let Some(taken) = self.feed.next(MAX_BATCH_BYTES, allowed, &mut self.history) else {
                break;
            };
            let metrics = &self.shared.metrics;
            match taken {
                Taken::Batch(batch) => {
                    self.shared.gate.release(batch.cost);
                    let count = batch.frames.count() as u64;
                    self.commands_taken += count;
                    Metrics::add(&metrics.broadcasts, count);
                    Metrics::incr(&metrics.broadcast_batches);
                    let now = Instant::now();
                    self.history
                        .keep(&batch.to, &batch.frames, &batch.positions, now);
                    if self.targeted.has_parked() {
                        self.release_framed(self.history.current().seq);
                    }
                    match batch.to {
                        Recipients::All => self.stream.push(batch.frames),
                        to => self.address_frames(&to, batch.frames),
                    }
                }
                Taken::Control(action, cost) => {
                    self.shared.gate.release(cost);
                    self.commands_taken += 1;
                    match action {
                        Action::Subscribe { on, id, channels } => {
                            self.change_subscription(on, &id, &channels)
                        }
                        Action::Close { whom, code, reason } => {
                            self.address_close(&whom, code, &reason)
                        }
                        Action::Send { .. } => unreachable!("sends come framed"),
                    }
                }
            }
        }
    }

    /// After a poll that found several events, whose handling took
    /// `handled`, waits what is left of the batch delay (within `timeout`)
    /// so that the next poll collects what arrives meanwhile; returns what
    /// is left of `timeout`.
    fn wait_for_batch(&mut self, timeout: Option<Duration>, handled: Duration) -> Option<Duration> {
        let wait = self.batching.wait_before_poll(timeout, handled);
        if wait.is_zero() {
            return timeout;
        }
        std::thread::sleep(wait);
        Metrics::incr(&self.shared.metrics.loop_batch_waits);
        timeout.map(|t| t - wait)
    }

    /// How long the next poll may wait: not at all when work is pending,
    /// else as long as the caller allows; the alarm is set for the next
    /// time event, and its ring ends the wait.
    fn poll_timeout(
        &mut self,
        requested: Option<Duration>,
        now: Instant,
    ) -> io::Result<Option<Duration>> {
        let accept_pending =
            self.accept_again.contains(&true) && self.accept_paused_until.is_none();
        let broadcasting = self.delivering() || !self.feed.is_empty();
        let work_pending = broadcasting || accept_pending || !self.read_again.is_empty();
        let sweep_pending = self.heartbeat_due(now) && !broadcasting;
        if self.commands_pending || work_pending || sweep_pending {
            return Ok(Some(Duration::ZERO));
        }
        if let Some(at) = self.next_time_event() {
            self.alarm.ring_by(at, now)?;
        }
        Ok(requested)
    }

    /// The earliest time event: a connection's deadline, the heartbeat
    /// sweep, the end of an accept pause or of the shutdown, the pool's
    /// trim or the stats line.
    fn next_time_event(&self) -> Option<Instant> {
        let (lifecycle_deadline, heartbeat) = match self.lifecycle {
            Lifecycle::Draining { deadline } => (Some(deadline), None),
            Lifecycle::Running => (
                None,
                (!self.conns.is_empty()).then(|| self.heartbeat.next_at()),
            ),
        };
        [
            self.timers.next_at(),
            self.accept_paused_until,
            lifecycle_deadline,
            heartbeat,
            self.next_trim,
            self.stats.as_ref().map(|s| s.next_at),
        ]
        .into_iter()
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
                tally: &mut self.tally,
                replies: &mut self.replies,
                routes: &mut self.routes,
                upstream: self.upstream.as_mut(),
                deflate: &mut self.deflate,
                gathered: &mut self.gathered,
                messages: &mut self.messages,
                now,
                next_batch: self.stream.next_seq(),
                history: &self.history,
                replays: &mut self.replays,
                unfinished: &mut self.unfinished,
            },
        }
    }

    fn on_conn_event(&mut self, key: ConnKey, ready: Ready, now: Instant) {
        let parts = self.parts(now);
        let mut ctx = parts.ctx;
        let Some(conn) = parts.conns.get_mut(key.0) else {
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
    fn settle(&mut self, key: ConnKey, verdict: Verdict) {
        if !self.replays.is_empty() {
            self.address_replays();
        }
        match verdict {
            Verdict::Close(reason) => return self.close(key, reason),
            Verdict::Serve(endpoint) => {
                let answered = self.serve(key, endpoint);
                return self.settle(key, answered);
            }
            Verdict::ReadAgain => self.read_again.push(key),
            Verdict::AwaitUpstream => self.upstream_waiting.push(key),
            Verdict::Keep => {}
        }
        let registry = self.poll.registry();
        if let Some(conn) = self.conns.get_mut(key.0) {
            if !sync_interest(registry, key, conn) {
                return self.close(key, CloseReason::Abnormal);
            }
            if self.targeted.has_parked() && conn.queued_bytes() == 0 {
                // Its queue drained: its replay goes on.
                if let Some(mark) = self.targeted.unpark(key.slot(), conn.serial()) {
                    conn.mark_walk(mark);
                }
            }
        }
    }

    fn close(&mut self, key: ConnKey, reason: CloseReason) {
        let Some(conn) = self.conns.try_remove(key.0) else {
            return;
        };
        self.targeted.forget(key.slot());
        if let Some(per_ip) = &mut self.per_ip {
            per_ip.release(key);
        }
        let mut ctx = self.parts(Instant::now()).ctx;
        conn.close(key, reason, &mut ctx);
    }

    fn close_all(&mut self, reason: CloseReason) {
        let keys: Vec<usize> = self.conns.iter().map(|(key, _)| key).collect();
        for key in keys {
            self.close(ConnKey(key), reason);
        }
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

    /// Empties the queue without sending: counts and logs what it held.
    fn abandon_commands(&mut self) {
        let (abandoned, cost) = self.feed.discard_all();
        self.shared.gate.release(cost);
        if abandoned > 0 {
            Metrics::add(&self.shared.metrics.broadcasts_abandoned, abandoned);
            log::warn!("{abandoned} queued broadcasts not sent: the server is shutting down");
        }
    }

    /// Stops accepting and starts closing every connection with 1001; gives
    /// up on them the shutdown timeout after the request was seen.
    fn begin_shutdown(&mut self, now: Instant) {
        if self.lifecycle != Lifecycle::Running {
            return;
        }
        log::info!("shutting down: closing {} connections", self.conns.len());
        self.lifecycle = Lifecycle::Draining {
            deadline: self.shutdown_seen.unwrap_or(now) + self.config.shutdown_timeout,
        };
        let registry = self.poll.registry();
        for listener in std::iter::once(&mut self.listener).chain(&mut self.metrics_listener) {
            if let Err(e) = registry.deregister(listener) {
                log::warn!("deregistering a listener failed: {e}");
            }
        }
        let mut closing = Vec::with_capacity(self.conns.len());
        let parts = self.parts(now);
        let mut ctx = parts.ctx;
        for (key, conn) in parts.conns.iter_mut() {
            let verdict = if conn.is_open() {
                conn.begin_close(
                    ConnKey(key),
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
            self.settle(ConnKey(key), verdict);
        }
    }
}

/// Whether a broadcast fits the message limit; one that does not is
/// counted and logged.
pub(super) fn check_message_limit(
    payload: &[u8],
    limit: u64,
    metrics: &Metrics,
) -> Result<(), MessageTooBig> {
    if payload.len() as u64 <= limit {
        return Ok(());
    }
    Metrics::incr(&metrics.broadcasts_rejected);
    let refused = MessageTooBig {
        len: payload.len(),
        limit,
    };
    log::warn!("broadcast refused: {refused}");
    Err(refused)
}

/// Registers or drops writable interest when the connection's output
/// queue changed between empty and not; `false` if the registry failed.
pub(super) fn sync_interest(registry: &Registry, key: ConnKey, conn: &mut Conn) -> bool {
    let Some(want_writable) = conn.interest_change() else {
        return true;
    };
    let interest = if want_writable {
        Interest::READABLE | Interest::WRITABLE
    } else {
        Interest::READABLE
    };
    match registry.reregister(conn.stream_mut(), key.into(), interest) {
        Ok(()) => true,
        Err(e) => {
            log::debug!("reregister failed: {e}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_left_over_while_accepting_is_paused_do_not_keep_the_loop_awake() {
        let mut server = Server::bind(Config::default()).unwrap();
        let now = Instant::now();
        // One listener hit its per-wake cap, then the other ran out of
        // file descriptors in the same turn.
        server.accept_again = [true, false];
        server.accept_paused_until = Some(now + accept::ACCEPT_PAUSE);
        assert_eq!(server.poll_timeout(None, now).unwrap(), None);
        server.accept_paused_until = None;
        assert_eq!(
            server.poll_timeout(None, now).unwrap(),
            Some(Duration::ZERO)
        );
    }
}

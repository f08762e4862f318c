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
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Interest, Registry, Token};
use slab::Slab;

mod accept;
mod address;
mod alarm;
mod batching;
mod buffers;
mod clock;
pub(crate) mod conn;
mod connections;
mod delivery;
mod endpoints;
mod fanout;
mod feed;
mod frames;
mod handle;
mod heartbeat;
mod history;
mod intake;
mod key;
mod lifecycle;
mod nonblocking;
pub(crate) mod output;
mod owed;
mod per_ip;
mod pool;
mod records;
mod report;
mod ring;
mod routes;
mod sockets;
mod targeted;
mod timer;
mod upstream;

use crate::config::{Config, ConfigError};
use crate::ops::metrics::{LoopHistogram, Metrics, MetricsSnapshot};
use crate::protocol::commands::{ConnRef, Recipients};
use crate::protocol::http::Endpoint;
use crate::protocol::ws::{CloseCode, MessageKind};
use accept::{Accepted, ACCEPTS_PER_WAKE};
use address::Directory;
use buffers::Buffers;
use clock::Clock;
use connections::Connections;
use delivery::Delivery;
use handle::Shared;
pub use handle::{BroadcastError, Handle, MessageTooBig, ServerGone, UpstreamReader};
pub use history::SharedHistory;
use intake::Intake;
use key::ConnKey;
use lifecycle::Lifecycle;
use records::Records;
use report::Report;
use sockets::{Door, Sockets, ALARM, LISTENER, METRICS_LISTENER, WAKER};

use crate::server::conn::{CloseReason, Conn, Ctx, Verdict};
use crate::server::feed::{Action, Command, Gate, Taken};
use crate::server::upstream::{Outbox, Shelf};

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
///
/// The loop is made of parts, each owning what one kind of work needs;
/// a step borrows the parts it uses, and a connection handler gets its
/// [`Ctx`] split from several of them (see [`Server::handling`]).
#[derive(Debug)]
pub struct Server {
    /// Limits and modes.
    config: Config,
    /// The poll, its events and the listeners.
    sockets: Sockets,
    /// The connections and the reading that waits.
    conns: Connections,
    /// What the handlers borrow: the read buffer, replies, the pool, ...
    buffers: Buffers,
    /// The routes, the history and the replays asked of it.
    records: Records,
    /// The stream and its pass, the targeted items and their walk.
    delivery: Delivery,
    /// The commands queued by handles.
    intake: Intake,
    /// Deadlines, the heartbeat, the alarm, batching.
    clock: Clock,
    /// Running or draining, and whether accepting is paused.
    lifecycle: Lifecycle,
    /// The state shared with the handles, the counts and the stats line.
    report: Report,
}

impl Drop for Server {
    /// Tells the handles that their requests have no one to go to, and
    /// how many broadcasts it took from them (the rest were abandoned).
    fn drop(&mut self) {
        let shared = &self.report.shared;
        shared
            .broadcasts_taken
            .store(self.intake.taken(), Ordering::Relaxed);
        shared.gone.store(true, Ordering::Release);
        shared.gate.close();
        if let Some(upstream) = &mut self.conns.upstream {
            upstream.hand_over();
        }
        shared.shelf.close();
    }
}

/// The parts of a server a connection handler (or a delivery slice)
/// works with, borrowed apart.
struct Handling<'a> {
    conns: &'a mut Slab<Conn>,
    registry: &'a Registry,
    scratch: &'a mut [u8],
    ctx: Ctx<'a>,
    delivery: &'a mut Delivery,
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
        let sockets = Sockets::open(&config)?;
        let shared = Arc::new(Shared {
            waker: sockets.waker()?,
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
        let now = Instant::now();
        Ok(Server {
            clock: Clock::new(&config, sockets.registry(), now)?,
            conns: Connections::new(&config, upstream),
            buffers: Buffers::new(&config),
            records: Records::new(&config)?,
            delivery: Delivery::default(),
            intake: Intake::new(),
            lifecycle: Lifecycle::new(),
            report: Report::new(shared, &config, now),
            sockets,
            config,
        })
    }

    /// The address the listener is bound to (with the real port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.sockets.local_addr()
    }

    /// The address `/metrics` is served on when it has a listener of its own.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.sockets.metrics_addr()
    }

    /// The reader of what clients send, when [`Config::upstream`] is set:
    /// the lines of the `upstream` format, taken in order from any thread.
    pub fn upstream(&self) -> Option<UpstreamReader> {
        self.conns.upstream.as_ref().map(|_| UpstreamReader {
            shared: Arc::clone(&self.report.shared),
        })
    }

    /// A handle for other threads.
    pub fn handle(&self) -> Handle {
        Handle {
            commands: self.intake.sender(),
            shared: Arc::clone(&self.report.shared),
        }
    }

    /// The server's counters now, read one by one while the loop runs. Byte
    /// and frame counts (`bytes_written`, `frames_sent`, `queued_bytes`)
    /// are published once per loop iteration, so they may lag the
    /// connection counts by that iteration's work.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.report.shared.snapshot()
    }

    /// The open WebSocket connections.
    pub fn connections(&self) -> impl Iterator<Item = ConnectionInfo<'_>> {
        self.conns
            .slab
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
        self.lifecycle.is_finished(self.conns.is_empty())
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
        let handled = self.report.record_iteration(before_poll);
        let timeout = self.poll_timeout(timeout, before_poll)?;
        let timeout = self
            .clock
            .wait_for_batch(timeout, handled, self.report.metrics());
        let Some(events) = self.sockets.wait(timeout)? else {
            return Ok(());
        };
        let now = Instant::now();
        self.report.busy_from(now);
        self.clock.observe(events.iter().count());
        for event in events.iter() {
            match event.token() {
                LISTENER => self.accept(Door::Main, now),
                METRICS_LISTENER => self.accept(Door::Metrics, now),
                WAKER => self.intake.woken(),
                ALARM => self.clock.rang(),
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
        self.sockets.put_back(events);
        self.retry_reads(now);
        self.expire_deadlines(now);
        self.sweep_heartbeats(now);
        self.resume_accepting(now);
        self.intake.take_arrivals(&self.report.shared);
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
        let shared = &self.report.shared;
        check_message_limit(payload, shared.max_message_bytes, &shared.metrics)?;
        shared.broadcasts_queued.fetch_add(1, Ordering::AcqRel);
        let action = shared.send_action(Recipients::All, kind, payload.to_vec());
        shared.gate.force_acquire(action.cost());
        let now = Instant::now();
        self.intake.push(Command {
            action,
            queued_at: now,
            seq: None,
        });
        if self.delivery.delivering() {
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
        if !self.lifecycle.is_running() {
            return self.intake.abandon(&self.report.shared);
        }
        if let Some(all_taken) = self.intake.shutdown_asked(&self.report.shared) {
            let seen = self.lifecycle.shutdown_seen(now);
            let flush_until = seen + self.config.shutdown_timeout / 2;
            if all_taken || now >= flush_until {
                // Nothing more is framed; what was goes out first.
                self.intake.abandon(&self.report.shared);
                if !self.delivery.delivering() {
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
        let shared = &self.report.shared;
        let shutdown_after = shared.shutdown_after.load(Ordering::Acquire);
        let history = &mut self.records.history;
        let mut dir = Directory::new(
            &mut self.delivery,
            &mut self.conns.slab,
            &mut self.records.routes,
            self.config.instance,
            &shared.metrics,
        );
        while let Some(taken) = self.intake.next(shutdown_after, shared, history) {
            match taken {
                Taken::Batch(batch) => {
                    let now = Instant::now();
                    history.keep(&batch.to, &batch.frames, &batch.positions, now);
                    if dir.targeted.has_parked() {
                        dir.release_framed(history.current().seq);
                    }
                    match batch.to {
                        Recipients::All => dir.stream.push(batch.frames),
                        to => dir.address_frames(&to, batch.frames),
                    }
                }
                Taken::Control(action, _) => match action {
                    Action::Subscribe { on, id, channels } => {
                        dir.change_subscription(on, &id, &channels)
                    }
                    Action::Close { whom, code, reason } => dir.address_close(&whom, code, &reason),
                    Action::Send { .. } => unreachable!("sends come framed"),
                },
            }
        }
    }

    /// How long the next poll may wait: not at all when work is pending,
    /// else as long as the caller allows; the alarm is set for the next
    /// time event, and its ring ends the wait.
    fn poll_timeout(
        &mut self,
        requested: Option<Duration>,
        now: Instant,
    ) -> io::Result<Option<Duration>> {
        let accept_pending = self.lifecycle.accepts_pending();
        let broadcasting = self.delivery.delivering() || self.intake.is_waiting();
        let work_pending = broadcasting || accept_pending || self.conns.reads_pending();
        let sweep_pending = self.clock.heartbeat_due(now, self.sweeping()) && !broadcasting;
        if self.intake.is_woken() || work_pending || sweep_pending {
            return Ok(Some(Duration::ZERO));
        }
        if let Some(at) = self.next_time_event() {
            self.clock.ring_by(at, now)?;
        }
        Ok(requested)
    }

    /// The earliest time event: a connection's deadline, the heartbeat
    /// sweep, the end of an accept pause or of the shutdown, the pool's
    /// trim or the stats line.
    fn next_time_event(&self) -> Option<Instant> {
        let [paused_until, draining_until] = self.lifecycle.next_at();
        [
            self.clock.next_at(self.sweeping()),
            paused_until,
            draining_until,
            self.buffers.next_trim(),
            self.report.stats_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether the heartbeat sweeps: the loop runs and holds connections.
    fn sweeping(&self) -> bool {
        self.lifecycle.is_running() && !self.conns.is_empty()
    }

    /// Borrows the loop's parts apart so a connection can be handled while
    /// the slab, registry and pool are all in use: the one place a [`Ctx`]
    /// is made.
    fn handling(&mut self, now: Instant) -> Handling<'_> {
        let Server {
            config,
            sockets,
            conns,
            buffers,
            records,
            delivery,
            clock,
            report,
            ..
        } = self;
        Handling {
            conns: &mut conns.slab,
            registry: sockets.registry(),
            scratch: &mut buffers.scratch,
            ctx: Ctx {
                config,
                pool: &mut buffers.pool,
                timers: &mut clock.timers,
                metrics: &report.shared.metrics,
                tally: &mut report.tally,
                replies: &mut buffers.replies,
                routes: &mut records.routes,
                upstream: conns.upstream.as_mut(),
                deflate: &mut buffers.deflate,
                gathered: &mut buffers.gathered,
                messages: &mut buffers.messages,
                now,
                next_batch: delivery.stream.next_seq(),
                history: &records.history,
                replays: &mut records.replays,
                unfinished: &mut buffers.unfinished,
            },
            delivery,
        }
    }

    fn on_conn_event(&mut self, key: ConnKey, ready: Ready, now: Instant) {
        let handling = self.handling(now);
        let mut ctx = handling.ctx;
        let Some(conn) = handling.conns.get_mut(key.0) else {
            return; // A spurious event for a connection already closed.
        };
        let mut verdict = Verdict::Keep;
        if ready.write {
            verdict = conn.on_writable(key, handling.scratch, &mut ctx);
        }
        if ready.read && verdict == Verdict::Keep {
            verdict = conn.on_readable(key, ready.edge, handling.scratch, &mut ctx);
        }
        self.settle(key, verdict);
    }

    /// Acts on a handler's verdict: close, schedule another read, and keep
    /// the writable interest in step with the output queue.
    fn settle(&mut self, key: ConnKey, verdict: Verdict) {
        if !self.records.replays.is_empty() {
            let mut dir = Directory::new(
                &mut self.delivery,
                &mut self.conns.slab,
                &mut self.records.routes,
                self.config.instance,
                &self.report.shared.metrics,
            );
            dir.address_replays(&mut self.records.replays);
        }
        match verdict {
            Verdict::Close(reason) => return self.close(key, reason),
            Verdict::Serve(endpoint) => {
                let answered = self.serve(key, endpoint);
                return self.settle(key, answered);
            }
            Verdict::ReadAgain => self.conns.read_again(key),
            Verdict::AwaitUpstream => self.conns.await_upstream(key),
            Verdict::Keep => {}
        }
        let registry = self.sockets.registry();
        let targeted = &mut self.delivery.targeted;
        if let Some(conn) = self.conns.slab.get_mut(key.0) {
            if !sync_interest(registry, key, conn) {
                return self.close(key, CloseReason::Abnormal);
            }
            if targeted.has_parked() && conn.queued_bytes() == 0 {
                // Its queue drained: its replay goes on.
                if let Some(mark) = targeted.unpark(key.slot(), conn.serial()) {
                    conn.mark_walk(mark);
                }
            }
        }
    }

    fn close(&mut self, key: ConnKey, reason: CloseReason) {
        let Some(conn) = self.conns.remove(key) else {
            return;
        };
        self.delivery.targeted.forget(key.slot());
        let mut ctx = self.handling(Instant::now()).ctx;
        conn.close(key, reason, &mut ctx);
    }

    fn close_all(&mut self, reason: CloseReason) {
        let keys: Vec<usize> = self.conns.slab.iter().map(|(key, _)| key).collect();
        for key in keys {
            self.close(ConnKey(key), reason);
        }
    }

    fn retry_reads(&mut self, now: Instant) {
        let mut keys = self.conns.take_reads();
        for key in keys.drain(..) {
            self.on_conn_event(key, Ready::RETRY_READ, now);
        }
        self.conns.reads_done(keys);
    }

    /// Stops accepting and starts closing every connection with 1001; gives
    /// up on them the shutdown timeout after the request was seen.
    fn begin_shutdown(&mut self, now: Instant) {
        if !self
            .lifecycle
            .begin_draining(now, self.config.shutdown_timeout)
        {
            return;
        }
        log::info!("shutting down: closing {} connections", self.conns.len());
        self.sockets.stop_listening();
        let mut closing = Vec::with_capacity(self.conns.len());
        let handling = self.handling(now);
        let mut ctx = handling.ctx;
        for (key, conn) in handling.conns.iter_mut() {
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

    /// Accepts at `door` until the backlog is empty, the per-wake cap is
    /// reached, or file descriptors run out (then pauses instead of
    /// spinning); each connection is read at once.
    fn accept(&mut self, door: Door, now: Instant) {
        if !self.lifecycle.begin_accepting(door) {
            return;
        }
        for _ in 0..ACCEPTS_PER_WAKE {
            let metrics = &self.report.shared.metrics;
            let scratch = &mut self.buffers.scratch;
            match accept::accept_one(
                door,
                &self.sockets,
                &mut self.conns,
                scratch,
                &self.config,
                metrics,
            ) {
                Accepted::Admitted(key) => self.on_accepted(key, now),
                Accepted::Refused => {}
                Accepted::Empty => return,
                Accepted::Exhausted(e) => {
                    let open = self.conns.len();
                    return self.lifecycle.pause_accepting(&e, now, open, metrics);
                }
            }
        }
        self.lifecycle.accept_again(door);
    }

    /// The request arrived with the connection (the listener defers
    /// accepting until it has): reading now saves a trip through the poll.
    fn on_accepted(&mut self, key: ConnKey, now: Instant) {
        let handling = self.handling(now);
        let mut ctx = handling.ctx;
        let verdict = handling.conns[key.0].on_accepted(key, handling.scratch, &mut ctx);
        self.settle(key, verdict);
    }

    /// Accepts again where connections were left, once a pause is over.
    fn resume_accepting(&mut self, now: Instant) {
        let again = self.lifecycle.resume_accepting(now);
        for door in [Door::Main, Door::Metrics] {
            if again[door as usize] {
                self.accept(door, now);
            }
        }
    }

    /// Answers `endpoint` on connection `key` (see `endpoints`).
    fn serve(&mut self, key: ConnKey, endpoint: Endpoint) -> Verdict {
        if endpoint == Endpoint::Metrics {
            // Include what this loop iteration has gathered so far.
            self.publish_metrics(Instant::now());
        }
        let mut page = std::mem::take(&mut self.report.page);
        let answer = endpoints::answer(
            endpoint,
            &self.report.shared,
            self.config.degraded,
            &mut page,
        );
        let handling = self.handling(Instant::now());
        let mut ctx = handling.ctx;
        let verdict = match handling.conns.get_mut(key.0) {
            Some(conn) => conn.respond(answer.status, answer.content_type, answer.body, &mut ctx),
            None => Verdict::Keep,
        };
        self.report.page = page;
        verdict
    }

    fn expire_deadlines(&mut self, now: Instant) {
        let mut due = self.clock.due_deadlines(now);
        for (key, tick) in due.drain(..) {
            let conn = self.conns.slab.get_mut(key.0);
            let Some(conn) = conn.filter(|conn| conn.is_due(tick)) else {
                continue; // Stale: re-armed, cleared, or the slot was reused.
            };
            let verdict = conn.on_deadline(&mut self.clock.timers);
            self.settle(key, verdict);
        }
        self.clock.deadlines_done(due);
    }

    /// Runs the heartbeat slice that is due (at most
    /// [`Config::fanout_budget`] keys; the rest in the next iterations):
    /// pings, and closes connections silent for the idle timeout. While a
    /// broadcast is on its way to every connection (and a little after)
    /// the sweep is postponed instead, up to one interval a pass (see
    /// `heartbeat`). Messages for some connections do not postpone it: the
    /// others get no data meanwhile, and a proxy in front of them sees
    /// only the pings.
    fn sweep_heartbeats(&mut self, now: Instant) {
        let state = (self.sweeping(), self.delivery.stream.is_busy());
        let bounds = (self.conns.key_bound(), self.config.fanout_budget);
        let Some(due) = self.clock.heartbeat_keys(now, state, bounds) else {
            return;
        };
        let ping = self.clock.heartbeat.ping().clone();
        let close_after = self.clock.heartbeat.close_after();
        for key in due {
            let handling = self.handling(now);
            let mut ctx = handling.ctx;
            let Some(conn) = handling.conns.get_mut(key) else {
                continue;
            };
            let verdict =
                conn.on_heartbeat(ConnKey(key), &ping, close_after, handling.scratch, &mut ctx);
            self.settle(ConnKey(key), verdict);
        }
    }

    /// The end of every loop iteration: give idle pool buffers back, keep
    /// the history's bounds, hand the upstream lines over, publish the
    /// metrics, and log the stats line when it is due.
    fn housekeeping(&mut self, now: Instant) {
        self.buffers.trim_pool(now);
        self.records.upkeep(now);
        self.conns.hand_over_upstream();
        self.publish_metrics(now);
        self.report.log_stats(now);
    }

    /// Publishes what the loop counts on its own (see [`Report::publish`]).
    fn publish_metrics(&mut self, now: Instant) {
        let queue_age = self.intake.oldest_age(now);
        self.report
            .publish(&self.buffers.pool, &self.records, queue_age);
    }

    /// Carries every delivery one slice further (see `delivery`), then
    /// acts on the verdicts.
    fn deliver_slice(&mut self, now: Instant) {
        let key_bound = self.conns.key_bound();
        let handling = self.handling(now);
        let conns = (handling.conns, key_bound);
        let mut unsettled = handling
            .delivery
            .slice(conns, handling.registry, handling.ctx);
        for (key, verdict) in unsettled.drain(..) {
            self.settle(key, verdict);
        }
        self.delivery.settled(unsettled);
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
        server.lifecycle.accept_again(Door::Main);
        let exhausted = io::Error::from_raw_os_error(24);
        let metrics = &server.report.shared.metrics;
        server
            .lifecycle
            .pause_accepting(&exhausted, now, 0, metrics);
        assert_eq!(server.poll_timeout(None, now).unwrap(), None);
        server
            .lifecycle
            .resume_accepting(now + lifecycle::ACCEPT_PAUSE);
        assert_eq!(
            server.poll_timeout(None, now).unwrap(),
            Some(Duration::ZERO)
        );
    }
}

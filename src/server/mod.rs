//! The loop as a value made of a few parts, each in a module of its own:
//! the sockets (the `mio::Poll`, the listener and an optional metrics
//! listener), the connections (a `Slab`), the buffers handlers borrow, the
//! records (routes, history), the walk (every duty toward the
//! connections), the intake of commands, the clock, the lifecycle and the
//! report (metrics). Each step borrows the
//! parts it needs; `dispatch` runs connection handlers on them.
//! [`Server::poll_once`] is one step, waiting at most the caller's
//! timeout; [`Server::run`] loops until shutdown. A [`Handle`] broadcasts
//! and shuts down from any thread.
//!
//! Like Redis' `ae`, the loop has file events (sockets) and time events:
//! connection deadlines on the wheel, the heartbeat slices and a drain's
//! steps (both carried out by the walk), the pool trim and the periodic
//! stats line. The nearest one sets the alarm (a timerfd
//! in the poll, see `time::alarm`); with none pending the loop sleeps until a
//! socket or a command wakes it.
//!
//! The modules, from the bottom up (each names only those below it, or
//! its own folder's):
//! - `key`, `frames` (frames encoded once, shared), `routes` (ids and
//!   channels);
//! - `history/` (positions, and the ring of what was sent), `owed` (the
//!   words a delivery visit is given in), `net/` (the poll's `sockets`, `nonblocking` calls,
//!   a connection's output `queue`, the input buffer `pool`), `time/`
//!   (the alarm, the deadline wheel, heartbeats, batching), `handle/`
//!   (other threads' way in: the handle, the `feed` and `intake` of
//!   commands; and `upstream`, client messages out);
//! - `conn/`, a connection's state machine;
//! - the loop's parts over the connections: `admit/` (accepting, the
//!   slab of connections, the per-address limit, the room), `lifecycle/`
//!   (running, draining, closing; a drain's pace), `buffers`, `records`,
//!   `report`, `endpoints`, `handover` (connections moved to a
//!   successor process, or from the process this one replaces);
//! - `walk/`, everything delivery is: the broadcast `stream`, the
//!   `targeted` items and the `directory` that addresses them, and the one
//!   budgeted walk with its cursor over the keys (`sweep`), on which every
//!   duty toward a connection is done;
//! - `dispatch` (handlers run on the parts, their verdicts acted on) and
//!   this file, the loop itself.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Token;

mod admit;
mod buffers;
pub(crate) mod conn;
mod dispatch;
mod endpoints;
mod frames;
mod handle;
mod handover;
mod history;
mod key;
mod lifecycle;
mod net;
mod owed;
mod presence;
mod records;
mod reexec;
mod report;
mod routes;
mod time;
mod walk;

use crate::config::{Config, ConfigError};
use crate::ops::board::CountersHome;
use crate::ops::metrics::MetricsSnapshot;
use crate::protocol::commands::{ConnRef, Recipients};
use crate::protocol::ws::MessageKind;
use admit::connections::Connections;
use admit::room::Room;
use buffers::Buffers;
use handle::intake::Intake;
#[cfg(feature = "internals")]
pub use handle::tally::UpstreamTally;
use handle::Shared;
pub use handle::{BroadcastError, Handle, MessageTooBig, ServerGone, UpstreamReader};
pub use history::SharedHistory;
use key::ConnKey;
pub use lifecycle::handover::{Suspended, TakeOverError, HANDOVER_TIMEOUT};
use lifecycle::{Ending, Lifecycle};
pub use net::channel::introduce_successor;
pub use net::sockets::listen;
use net::sockets::{
    Door, Ready, Sockets, ALARM, ASKING, LISTENER, METRICS_LISTENER, SUCCESSOR, WAKER,
};
use records::Records;
use report::Report;
#[cfg(feature = "internals")]
pub use time::host::host_memory;
use time::host::HostDelivery;
use time::Clock;
use walk::directory::Directory;
use walk::Walk;

use crate::server::conn::CloseReason;
use crate::server::handle::feed::{Action, Gate, Queued, Taken};
use crate::server::handle::upstream::{Outbox, Shelf};

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
/// ```
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
/// context split from several of them (see `dispatch`).
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
    /// The routes and the history.
    records: Records,
    /// The stream and its pass, the targeted items and their walk.
    walk: Walk,
    /// The commands queued by handles.
    intake: Intake,
    /// Deadlines, the heartbeat, the alarm, batching.
    clock: Clock,
    /// Running or draining, and whether accepting is paused.
    lifecycle: Lifecycle,
    /// Whether there is room for another connection, and who is told.
    room: Room,
    /// The state shared with the handles, the counts and the stats line.
    report: Report,
    /// A successor's socket, and its ask.
    handover: lifecycle::handover::Handover,
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

impl Server {
    /// Validates `config`, binds its listen address (and its metrics
    /// address, if any) and sets up the loop.
    pub fn bind(config: Config) -> Result<Server, BindError> {
        config.validate().map_err(BindError::Config)?;
        Server::open(config, None).map_err(BindError::Io)
    }

    /// A server on `listener`, a listening socket made elsewhere (by
    /// [`listen`], in a supervisor that holds the listeners of its
    /// instances so that a replacement takes over the very socket, or
    /// handed over by a service manager); [`Config::listen`] and
    /// [`Config::reuse_port`] are not used for it. Validates `config` and
    /// binds its metrics address, if any.
    pub fn from_listener(
        config: Config,
        listener: std::net::TcpListener,
    ) -> Result<Server, BindError> {
        config.validate().map_err(BindError::Config)?;
        Server::open(config, Some(listener)).map_err(BindError::Io)
    }

    /// [`Server::bind`] once the configuration is known to be valid.
    fn open(config: Config, listener: Option<std::net::TcpListener>) -> io::Result<Server> {
        let records = Records::new(&config)?;
        Server::open_with(config, listener, records)
    }

    /// [`Server::open`] with `records` made already.
    fn open_with(
        config: Config,
        listener: Option<std::net::TcpListener>,
        records: Records,
    ) -> io::Result<Server> {
        let sockets = Sockets::open(&config, listener)?;
        let shared = Arc::new(Shared {
            waker: sockets.waker()?,
            wake_pending: AtomicBool::new(false),
            broadcasts_queued: AtomicU64::new(0),
            broadcasts_taken: AtomicU64::new(0),
            gate: Gate::new(config.max_pending_bytes),
            max_message_bytes: config.max_message_bytes,
            compression: config.compression(),
            shutdown_after: AtomicU64::new(u64::MAX),
            suspend_after: AtomicU64::new(u64::MAX),
            drain_asked: AtomicU8::new(0),
            drain_paced: !config.drain_time.is_zero(),
            gone: AtomicBool::new(false),
            counters: CountersHome::new(config.metrics_board.as_ref())?,
            shelf: Arc::new(Shelf::new()),
        });
        let upstream = config
            .upstream
            .map(|up| Outbox::new(up, Arc::clone(&shared.shelf)));
        let now = Instant::now();
        let host = HostDelivery::memory(config.host_fd.as_deref())?;
        Ok(Server {
            clock: Clock::new(&config, sockets.registry(), host, now)?,
            conns: Connections::new(&config, upstream),
            buffers: Buffers::new(&config),
            records,
            walk: Walk::default(),
            intake: Intake::new(),
            lifecycle: Lifecycle::new(),
            room: Room::new(),
            report: Report::new(shared, &config, now)?,
            handover: lifecycle::handover::Handover::default(),
            sockets,
            config,
        })
    }

    /// Calls `watch(false)` when the server becomes full (it holds
    /// [`Config::max_connections`]; new connections get 503), and
    /// `watch(true)` when it has room again (1% of the limit free), on the
    /// loop's thread: for a supervisor that steers new connections away
    /// from a full server whose listener it handed in
    /// ([`Server::from_listener`]). A server that bound its own listener
    /// with [`Config::reuse_port`] also leaves its group while full.
    pub fn watch_room(&mut self, watch: impl FnMut(bool) + Send + 'static) {
        self.room.watch(Box::new(watch));
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
                SUCCESSOR => self.on_control(),
                ASKING => self.on_successor(now),
                Token(key) => self.on_conn_event(ConnKey(key), Ready::from(event), now),
            }
        }
        self.sockets.put_back(events);
        self.retry_reads(now);
        self.expire_deadlines(now);
        self.resume_accepting(now);
        self.drain(now);
        self.intake.take_arrivals(&self.report.shared);
        self.advance_broadcasts(now);
        self.walk_step(now);
        self.carry_handover(now);
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
        shared.check_message_limit(payload)?;
        shared.broadcasts_queued.fetch_add(1, Ordering::AcqRel);
        let action = shared.send_action(Recipients::All, kind, payload.to_vec());
        shared.gate.force_acquire(action.cost());
        let now = Instant::now();
        self.intake.push(Queued {
            action,
            queued_at: now,
            seq: None,
        });
        if self.walk.delivering() {
            self.frame_waiting();
        } else {
            self.advance_broadcasts(now);
            self.walk_step(now);
        }
        // Outside an iteration: what the step did is published here.
        self.publish_metrics(now);
        Ok(())
    }

    /// Moves the broadcasts along, once per loop iteration, before the
    /// walk's step carries them: frames what is waiting into a batch (not
    /// while closing). Once a handle asked for a shutdown, frames what was
    /// queued before it (for at most half the shutdown timeout), then,
    /// once it is delivered, begins the shutdown.
    fn advance_broadcasts(&mut self, now: Instant) {
        if !self.lifecycle.is_serving() {
            return self.intake.abandon(&self.report.shared);
        }
        if self
            .handover
            .holds_input(self.records.history.current().seq)
        {
            // The successor frames what comes next.
            return;
        }
        if let Some(all_taken) = self.intake.shutdown_asked(&self.report.shared) {
            self.lifecycle.see_shutdown(now);
            let flush_until = self.lifecycle.flush_deadline(self.config.shutdown_timeout);
            let flushing = flush_until.is_some_and(|until| now < until);
            if !all_taken && flushing {
                self.frame_waiting();
            }
            let all_taken = self.intake.shutdown_asked(&self.report.shared) == Some(true);
            if all_taken || !flushing {
                // Nothing more is framed; what was goes out first.
                self.intake.abandon(&self.report.shared);
                if !self.walk.delivering() {
                    self.close_everything(now, Ending::Shutdown);
                }
            }
            return;
        }
        self.frame_waiting();
    }

    /// A shutdown was asked for and what was queued before it is framed:
    /// the closing sweep begins once its delivery is done, with no wait.
    fn closing_due(&self) -> bool {
        self.lifecycle.is_serving() && self.intake.shutdown_asked(&self.report.shared) == Some(true)
    }

    /// Takes the commands waiting (up to those queued before a shutdown,
    /// if one was asked for), in order: broadcasts are framed into batches
    /// at the end of the stream, messages for some connections into
    /// batches addressed to them (as are closes), subscription changes
    /// are made. The walk carries them on (see `walk`).
    fn frame_waiting(&mut self) {
        let shared = &self.report.shared;
        let shutdown_after = shared.shutdown_after.load(Ordering::Acquire);
        let history = &mut self.records.history;
        let mut dir = Directory::new(
            &mut self.walk,
            &mut self.conns.slab,
            &mut self.records.routes,
            self.config.instance,
            &shared.counters.metrics,
        );
        while let Some(taken) = self.intake.next(shutdown_after, shared, history) {
            match taken {
                Taken::Batch(batch) => {
                    let now = Instant::now();
                    history.keep(&batch.to, &batch.frames, now);
                    dir.release_framed_through(history.current().seq);
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
                    Action::Advance { through } => {
                        history.advance(through);
                        dir.release_framed_through(history.current().seq);
                    }
                    Action::Lost { from, through } => {
                        history.advance(through);
                        dir.release_framed_through(history.current().seq);
                        dir.stream.push(history.gap_frames(from, through));
                    }
                    Action::Ask { query, reply } => (reply.0)(presence::answer(
                        &query,
                        dir.routes,
                        dir.conns,
                        dir.instance,
                    )),
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
        let broadcasting = self.walk.delivering() || self.intake.is_waiting();
        let work_pending = broadcasting
            || accept_pending
            || self.conns.reads_pending()
            || self.walk.closing_pending()
            || self.closing_due();
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
    /// sweep, the end of an accept pause, a step of a drain, the end of a
    /// shutdown's flush or of the shutdown, the pool's trim, the end of a
    /// resume's wait or the stats line.
    fn next_time_event(&self) -> Option<Instant> {
        let [paused_until, lifecycle_at] = self.lifecycle.next_at(Instant::now());
        [
            self.clock.next_at(self.sweeping()),
            paused_until,
            lifecycle_at,
            self.lifecycle.flush_deadline(self.config.shutdown_timeout),
            self.buffers.next_trim(),
            self.walk.targeted.next_overdue(),
            self.report.stats_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether the heartbeat sweeps: the loop serves connections and holds
    /// some.
    fn sweeping(&self) -> bool {
        self.lifecycle.is_serving() && !self.conns.is_empty()
    }

    /// The end of every loop iteration: follow the room (see `admit::room`), give
    /// idle pool buffers back, keep the history's bounds, hand the upstream lines over, publish the
    /// metrics, and log the stats line when it is due.
    fn housekeeping(&mut self, now: Instant) {
        self.keep_room();
        self.keep_group(now);
        self.buffers.trim_pool(now);
        self.records.upkeep(now, &self.conns.slab);
        self.conns.hand_over_upstream();
        self.publish_metrics(now);
        self.report.log_stats(now);
    }

    /// Follows the room while running (see [`Room::update`]): the
    /// watcher, if any, is told at once when the server becomes full or
    /// has room again.
    pub(super) fn keep_room(&mut self) {
        if !self.lifecycle.is_running() {
            return;
        }
        let (open, max) = (self.conns.len(), self.config.max_connections);
        match self.room.update(open, max) {
            Some(false) => log::info!("full ({open} of {max} connections)"),
            Some(true) => log::info!("room again ({open} of {max} connections)"),
            None => {}
        }
    }

    /// A full server that bound its own listener in an `SO_REUSEPORT`
    /// group leaves the group (the others take the new connections) and
    /// joins it again once it has room. Done at the end of a loop
    /// iteration, after the accepts, so that the connections already in
    /// its backlog are taken (closing a listener resets them), or at once
    /// when the server is at its very limit.
    pub(super) fn keep_group(&mut self, now: Instant) {
        if !self.lifecycle.is_running() || !self.sockets.may_leave_group(self.config.reuse_port) {
            return;
        }
        let closed = self.sockets.main_closed();
        if self.room.is_full() && !closed {
            self.sockets.close(Door::Main);
            log::info!("out of the SO_REUSEPORT group until there is room");
        } else if closed && self.room.may_rejoin(now) {
            match self.sockets.reopen_main(true) {
                Ok(()) => log::info!("back in the SO_REUSEPORT group"),
                Err(e) => self.room.rejoin_failed(&e, now),
            }
        }
    }

    /// Publishes what the loop counts on its own (see [`Report::publish`]).
    fn publish_metrics(&mut self, now: Instant) {
        let queue_age = self.intake.oldest_age(now);
        self.report
            .publish(&self.buffers.pool, &self.records, queue_age);
    }
}

#[cfg(test)]
mod tests;

//! One client connection: a state machine over its phases, driven by
//! readiness events, broadcasts and its deadline. Every handler returns a
//! [`Verdict`] that the loop acts on in one place, and every byte the
//! connection writes goes through one output path, `Conn::send`, which
//! answers with one [`Sent`].
//!
//! ```text
//! Handshake ──101──▶ Open ──server closes (1001/1008)──▶ CloseSent
//!     │               │                                     │
//!     │ 4xx, or a     │ client close / protocol error       │ client close
//!     │ /healthz,     │                                     │
//!     │ /metrics or demo page answer                        │
//!     ▼               ▼                                     ▼
//!   Lingering: flush what is queued, half-close (FIN), read until EOF ──▶ closed
//! ```
//!
//! The module is cut by stage: this file holds the connection, its phases,
//! its deadlines and heartbeat visits; `handshake` the request and its
//! answer; `input` what is read (frames decoded, messages inflated, then
//! sent upstream, echoed or answered); `output` what is written (the one
//! send path, with the connection's wire as its parameter);
//! `visit` what a delivery visit gives it; `close` how it ends and
//! `reason` why; `wire` what its transport makes of each of those;
//! `aside` what it holds only while busy, out of its slot.

use std::time::{Duration, Instant};

use mio::net::TcpStream;

use crate::config::Config;
use crate::ops::metrics::{Counters, Metrics, Tally};
use crate::protocol::commands::ConnRef;
use crate::protocol::http::{Endpoint, Endpoints, Method};
use crate::protocol::names::ClientIdRef;
use crate::protocol::target::RequestTarget;
use crate::protocol::ws::inflate::Inflater;
use crate::protocol::ws::Decoder;
use crate::server::frames::SharedFrames;
use crate::server::handle::upstream::Outbox;
use crate::server::history::{History, Replay};
use crate::server::key::ConnKey;
use crate::server::net::pool::BufferPool;
use crate::server::net::queue::{OutQueue, Sent};
use crate::server::owed::{Left, Seq, WalkMark};
use crate::server::routes::Routes;
use crate::server::time::heartbeat::{Liveness, Visit};
use crate::server::time::timer::{Deadline, Tick, TimerWheel};

mod aside;
mod close;
mod handshake;
mod input;
mod moved;
mod output;
mod reason;
#[cfg(test)]
mod rig;
mod visit;
mod wire;

pub use aside::Aside;
pub use reason::CloseReason;
use wire::{DeflateUse, Outgoing, Wire};

/// What the loop must do with a connection after a handler ran: one
/// value carries everything the loop is to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Keep it; wait for its next event.
    Keep,
    /// Keep it, and run its read handler again soon: it used its read
    /// budget with more input waiting.
    ReadAgain,
    /// It asked for this plain HTTP endpoint (by `GET` or `HEAD`) and is
    /// lingering: the loop, which holds what the answer reports, renders
    /// it and hands it to [`Conn::respond`].
    Serve(Endpoint, Method),
    /// Keep it, and read it again once the upstream reader has caught up
    /// (reading clients is paused until then).
    AwaitUpstream,
    /// Keep it: it upgraded resuming. The loop addresses it this replay
    /// (before anything live) and reads it again (its client may have
    /// sent frames right after the request).
    Replay(Box<Replay>),
    /// Drop the TCP connection now.
    Close(CloseReason),
}

/// What a delivery visit leaves: a verdict, or (the connection kept) what
/// it could not give of its items, for the walk to take back.
pub type Visited = Result<Verdict, Left>;

/// A duty toward one connection besides what the deliveries owe it, each
/// done through [`Conn::owe`] on the walk, and settled in the loop's one
/// place.
#[derive(Debug, Clone, Copy)]
pub enum Duty<'a> {
    /// A heartbeat visit: `ping`, or the idle close after `close_after`
    /// silent visits (see [`Conn::on_heartbeat`]).
    Ping {
        /// The shared ping.
        ping: &'a SharedFrames,
        /// Silent visits before the idle close.
        close_after: u16,
    },
    /// The closing sweep's close, for `reason` with `why`: an open
    /// connection is sent its close (after what it has queued), one still
    /// in its handshake is dropped, one already closing is left to finish.
    Close {
        /// What the close frame says.
        why: &'static str,
        /// Why it closes.
        reason: CloseReason,
    },
    /// A drain's close, its client told to reconnect after `delay` (see
    /// [`Conn::begin_drain_close`]).
    Drain {
        /// When its client should come back.
        delay: Duration,
    },
    /// The close (1013) of a connection whose replay waited, in vain, for
    /// this loop to reach the position it resumed from.
    Ahead,
}

impl Verdict {
    /// The verdict after a send: close if the socket failed, else keep.
    fn after(sent: Result<Sent, CloseReason>) -> Verdict {
        match sent {
            Ok(_) => Verdict::Keep,
            Err(reason) => Verdict::Close(reason),
        }
    }
}

/// The phases of a connection, each with only its own data.
#[derive(Debug)]
enum Phase {
    /// Reading the HTTP request; what it may ask for depends on the listener.
    Handshake(Endpoints),
    /// Upgraded: frames flow both ways.
    Open(Decoder),
    /// The server sent a close frame; client frames are read (data
    /// discarded) until the client's close arrives.
    CloseSent {
        decoder: Decoder,
        reason: CloseReason,
    },
    /// Nothing more will be queued: flush, half-close, then discard input
    /// until the client closes too or the deadline passes.
    Lingering {
        reason: CloseReason,
        write_shut: bool,
        /// It was a WebSocket connection (it is counted as one until it
        /// closes), not a plain HTTP request.
        upgraded: bool,
    },
}

/// The loop's permessage-deflate work space, its buffers' capacity kept
/// between messages (each at most about `--max-message-bytes`): the
/// input stage inflates with it, the output stage compresses echoes.
#[derive(Debug, Default)]
pub struct DeflateScratch {
    /// The one inflater of compressed client messages.
    inflater: Inflater,
    /// Where a compressed client message is inflated.
    inflated: Vec<u8>,
    /// Where an echo is compressed.
    compressed: Vec<u8>,
}

/// The loop-owned resources a handler may use.
pub struct Ctx<'a> {
    /// Limits and modes.
    pub config: &'a Config,
    /// Where partial input and echo messages are buffered.
    pub pool: &'a mut BufferPool,
    /// Deadlines.
    pub timers: &'a mut TimerWheel,
    /// Counters.
    pub counters: &'a Counters,
    /// Counts gathered during this loop iteration.
    pub tally: &'a mut Tally,
    /// Frames of a connection's own that answer what one read brought
    /// (echoes, pongs), gathered to go out in one `write()` once the read
    /// is processed: a read holding many messages costs one system call,
    /// not one per message. Empty between reads; its capacity is the
    /// loop's, allocated once.
    pub replies: &'a mut Vec<u8>,
    /// Client ids and channel subscriptions.
    pub routes: &'a mut Routes,
    /// Where client messages go, when they go upstream.
    pub upstream: Option<&'a mut Outbox>,
    /// The loop's permessage-deflate work space.
    pub deflate: &'a mut DeflateScratch,
    /// What connections hold only while busy (output not taken yet,
    /// input not consumed yet, messages being assembled), out of their
    /// slots.
    pub aside: &'a mut Aside,
    /// The frames a delivery visit gathers for one connection, as
    /// references. Empty between visits; its capacity is kept.
    pub gathered: &'a mut Vec<SharedFrames>,
    /// The time this loop iteration started.
    pub now: Instant,
    /// The broadcast batch the loop frames next: where a connection that
    /// upgrades now starts.
    pub next_batch: Seq,
    /// The positions given out and the history kept.
    pub history: &'a History,
}

/// A connection's yes-or-no state, a bit each, so that they take one
/// byte of its slot.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Flags(u8);

impl Flags {
    /// The socket is registered for writability (output is pending).
    const WRITABLE_INTEREST: u8 = 1;
    /// Reading stopped because output backed up (echo backpressure).
    const READ_PAUSED: u8 = 1 << 1;
    /// Received bytes not consumed yet wait in [`Aside`]'s `held`.
    const HOLDING: u8 = 1 << 2;
    /// A message is being assembled from several pieces in [`Aside`]'s
    /// `messages`.
    const ASSEMBLING: u8 = 1 << 3;
    /// It asked for positions: it gets each message as its position, a
    /// space and the payload.
    const POSITIONS: u8 = 1 << 4;
    /// Targeted items wait for it (see `walk::targeted`), in the walk of
    /// the parity [`Flags::WALK_PARITY`] gives.
    const WALK_MARKED: u8 = 1 << 5;
    /// The parity of the walk its targeted items wait for.
    const WALK_PARITY: u8 = 1 << 6;
    /// Output waits in [`Aside`]'s `queues` for the socket to take it.
    const QUEUED: u8 = 1 << 7;

    /// Whether `flag` is set.
    fn has(self, flag: u8) -> bool {
        self.0 & flag != 0
    }

    /// Sets `flag` to `on`.
    fn set(&mut self, flag: u8, on: bool) {
        if on {
            self.0 |= flag;
        } else {
            self.0 &= !flag;
        }
    }

    /// Clears `flag`; whether it was set.
    fn take(&mut self, flag: u8) -> bool {
        let was = self.has(flag);
        self.set(flag, false);
        was
    }
}

/// One client connection.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    phase: Phase,
    /// The first broadcast batch of the loop's stream it has not been
    /// offered yet.
    next_batch: Seq,
    /// When the current phase times out, if it can; while open, when its
    /// signed token is to be closed.
    deadline: Deadline,
    /// Its yes-or-no state, in one byte.
    flags: Flags,
    /// Heartbeat state while open (two bytes that fit in padding).
    liveness: Liveness,
    /// How its messages go on the wire (with what permessage-deflate,
    /// negotiated at the upgrade, gives it).
    wire: Wire,
    /// Its serial: which connection of those that held its slot it is.
    serial: u32,
    target: RequestTarget,
}

impl Conn {
    /// A freshly accepted connection, waiting for its request; `endpoints`
    /// says what the listener it came from serves. It has no deadline
    /// until [`Conn::on_accepted`] finds the request incomplete.
    pub fn accepted(stream: TcpStream, endpoints: Endpoints, serial: u32) -> Conn {
        Conn {
            stream,
            phase: Phase::Handshake(endpoints),
            next_batch: Seq::default(),
            deadline: Deadline::default(),
            flags: Flags::default(),
            liveness: Liveness::default(),
            wire: Wire::WebSocket(DeflateUse::Off),
            serial,
            target: RequestTarget::default(),
        }
    }

    /// The first read, right after the socket was accepted and registered:
    /// the request usually came with the connection (the listener defers
    /// accepting until data arrives), and only a connection still waiting
    /// for it gets the handshake deadline, so most never touch the timer
    /// wheel. A short read ends it, as after an edge: whatever arrives
    /// after the registration raises an event.
    pub fn on_accepted(&mut self, key: ConnKey, scratch: &mut [u8], ctx: &mut Ctx<'_>) -> Verdict {
        let verdict = self.on_readable(key, true, scratch, ctx);
        let waiting = matches!(self.phase, Phase::Handshake(_));
        if waiting && !matches!(verdict, Verdict::Close(_)) {
            self.arm_after(key, ctx.config.handshake_timeout, ctx);
        }
        verdict
    }

    /// The socket, for (re)registration.
    pub fn stream_mut(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// The request target (path and query) of the upgrade request; empty
    /// until the handshake completes.
    pub fn target(&self) -> &str {
        self.target.as_str()
    }

    /// Its client id, if it has one.
    pub fn id(&self) -> Option<ClientIdRef<'_>> {
        self.target.id()
    }

    /// Whether the connection is upgraded and not closing.
    pub fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open(_))
    }

    /// Whether the connection was upgraded (open or closing): it is a
    /// WebSocket connection, counted as such until it is closed.
    pub fn is_websocket(&self) -> bool {
        matches!(
            self.phase,
            Phase::Open(_) | Phase::CloseSent { .. } | Phase::Lingering { upgraded: true, .. }
        )
    }

    /// How it reads its messages.
    pub fn transport(&self) -> crate::protocol::presence::Transport {
        use crate::protocol::presence::Transport;
        match self.wire {
            Wire::WebSocket(_) => Transport::WebSocket,
            Wire::EventStream => Transport::EventStream,
        }
    }

    /// Whether it is closing: its close was sent, or it lingers until its
    /// client goes (its deadline ends it either way).
    pub fn is_closing(&self) -> bool {
        self.closing_reason().is_some()
    }

    /// Why it is closing, if it is.
    pub fn closing_reason(&self) -> Option<CloseReason> {
        match self.phase {
            Phase::CloseSent { reason, .. } | Phase::Lingering { reason, .. } => Some(reason),
            Phase::Handshake(_) | Phase::Open(_) => None,
        }
    }

    /// The first broadcast batch it has not had yet, if it is open.
    pub fn next_batch(&self) -> Option<Seq> {
        self.is_open().then_some(self.next_batch)
    }

    /// Its serial (see [`Serials`](crate::server::key::Serials)).
    pub fn serial(&self) -> u32 {
        self.serial
    }

    /// Its key as `conn` commands and upstream lines give it.
    pub fn conn_ref(&self, key: ConnKey, instance: u32) -> ConnRef {
        ConnRef {
            instance,
            slot: key.slot(),
            serial: self.serial,
        }
    }

    /// Whether output waits for its socket to take it.
    pub fn has_queued(&self) -> bool {
        self.flags.has(Flags::QUEUED)
    }

    /// Output bytes queued, not yet taken by the socket.
    fn queued_bytes(&self, key: ConnKey, aside: &Aside) -> usize {
        if !self.has_queued() {
            return 0;
        }
        aside.queues.get(&key).map_or(0, OutQueue::queued_bytes)
    }

    /// The walk its targeted items wait for, if any.
    pub fn walk_mark(&self) -> WalkMark {
        match (
            self.flags.has(Flags::WALK_MARKED),
            self.flags.has(Flags::WALK_PARITY),
        ) {
            (false, _) => WalkMark::Unmarked,
            (true, parity) => WalkMark::Walk(parity),
        }
    }

    /// Marks it as waiting for a walk (or for none).
    pub fn mark_walk(&mut self, mark: WalkMark) {
        let (marked, parity) = match mark {
            WalkMark::Unmarked => (false, false),
            WalkMark::Walk(parity) => (true, parity),
        };
        self.flags.set(Flags::WALK_MARKED, marked);
        self.flags.set(Flags::WALK_PARITY, parity);
    }

    /// Whether `tick` is this connection's current deadline (timer entries
    /// for deadlines that were re-armed or cleared are stale).
    pub fn is_due(&self, tick: Tick) -> bool {
        self.deadline.is(tick)
    }

    /// The connection's deadline passed: the handshake or the close took
    /// too long, or its token expires.
    pub fn on_deadline(&mut self, key: ConnKey, ctx: &mut Ctx<'_>) -> Verdict {
        self.deadline.clear(ctx.timers);
        match self.phase {
            Phase::Handshake(_) => Verdict::Close(CloseReason::HandshakeTimeout),
            Phase::CloseSent { reason, .. } | Phase::Lingering { reason, .. } => {
                Verdict::Close(reason)
            }
            Phase::Open(_) => {
                let expired = CloseReason::TokenExpired;
                self.begin_close(key, "token expired", expired, ctx)
            }
        }
    }

    /// Does `duty` toward the connection (see [`Duty`]).
    pub fn owe(
        &mut self,
        key: ConnKey,
        duty: Duty<'_>,
        scratch: &mut [u8],
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        match duty {
            Duty::Ping { ping, close_after } => {
                self.on_heartbeat(key, ping, close_after, scratch, ctx)
            }
            Duty::Close { why, reason } if self.is_open() => {
                self.begin_close(key, why, reason, ctx)
            }
            // Closing already: its own deadline ends it.
            Duty::Close { .. } if self.is_closing() => Verdict::Keep,
            Duty::Close { reason, .. } => Verdict::Close(reason),
            Duty::Drain { delay } => self.begin_drain_close(key, delay, ctx),
            Duty::Ahead if self.is_open() => {
                self.mark_walk(WalkMark::Unmarked);
                let why = "position ahead of this server";
                self.begin_close(key, why, CloseReason::Ahead, ctx)
            }
            Duty::Ahead => Verdict::Keep,
        }
    }

    /// A heartbeat visit (see [`Liveness::visit`]): a connection silent
    /// too long is closed with 1001, others get the shared ping unless
    /// their queue has no room for it (they are behind already; the
    /// silence count runs on).
    ///
    /// Silence is judged by what the loop has read, and a loaded loop can
    /// be behind its readiness events (one poll hands over at most 1,024):
    /// so before closing, the socket is read, and a client whose pong was
    /// waiting there is kept.
    fn on_heartbeat(
        &mut self,
        key: ConnKey,
        ping: &SharedFrames,
        close_after: u16,
        scratch: &mut [u8],
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        if !self.is_open() {
            return Verdict::Keep;
        }
        let mut visit = self.wire.heartbeat(&mut self.liveness, close_after);
        if visit == Visit::Close {
            let verdict = self.on_readable(key, false, scratch, ctx);
            if verdict != Verdict::Keep || !self.is_open() {
                return verdict;
            }
            if self.liveness.heard_since_visit() {
                visit = self.liveness.visit(close_after);
            }
        }
        match visit {
            Visit::Skip => return Verdict::Keep,
            Visit::Ping => {}
            Visit::Close => {
                log::debug!("connection {key} idle: closing");
                return self.begin_close(key, "idle timeout", CloseReason::IdleTimeout, ctx);
            }
        }
        let ping = self.wire.frames(ping, false, &ctx.counters.metrics);
        match self.send(key, Outgoing::Shared(std::slice::from_ref(ping)), ctx) {
            Err(reason) => Verdict::Close(reason),
            Ok(Sent::Dropped { .. }) => Verdict::Keep,
            Ok(Sent::Written | Sent::Queued) => {
                Metrics::incr(&ctx.counters.metrics.pings_sent);
                Verdict::Keep
            }
        }
    }

    /// Arms its deadline `after` from now at the soonest (a timeout: the
    /// peer has that long).
    fn arm_after(&mut self, key: ConnKey, after: Duration, ctx: &mut Ctx<'_>) {
        let tick = ctx.timers.tick_at(ctx.now + after);
        self.deadline.arm(ctx.timers, key, tick);
    }

    /// Arms its deadline `within` from now at the latest, as the wheel's
    /// ticks fall (a bound: the wait is never longer).
    fn arm_within(&mut self, key: ConnKey, within: Duration, ctx: &mut Ctx<'_>) {
        let tick = ctx.timers.tick_before(ctx.now + within);
        self.deadline.arm(ctx.timers, key, tick);
    }
}

#[cfg(test)]
mod tests;

//! One client connection: a state machine over its phases, driven by
//! readiness events, broadcasts and its deadline. Every handler returns a
//! [`Verdict`] that the loop acts on in one place, and every byte the
//! connection writes goes through one output path, [`Conn::send`], which
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

use std::net::Shutdown;
use std::time::{Duration, Instant};

use mio::net::TcpStream;

use crate::config::{Config, SlowConsumerPolicy};
use crate::ops::metrics::{Metrics, Tally};
use crate::protocol::commands::ConnRef;
use crate::protocol::http::{self, Endpoint, Endpoints, MAX_RESPONSE_LEN};
use crate::protocol::target::RequestTarget;
use crate::protocol::ws::header::MAX_HEADER_LEN;
use crate::protocol::ws::{
    CloseCode, Decoder, Event, FrameHeader, MessageKind, OpCode, ProtocolError,
};
use crate::server::fanout::Seq;
use crate::server::frames::SharedFrames;
use crate::server::heartbeat::{Liveness, Visit};
use crate::server::history::{seq_of, History, Replay};
use crate::server::key::ConnKey;
use crate::server::nonblocking::{read_some, Progress};
use crate::server::output::{OutQueue, Sent};
use crate::server::owed::{Item, Owed, Unfinished};
use crate::server::pool::{BufferPool, PooledBuf};
use crate::server::routes::Routes;
use crate::server::targeted::WalkMark;
use crate::server::timer::{Deadline, Tick, TimerWheel};
use crate::server::upstream::{Offered, Outbox};

mod deflate;
mod handshake;

pub use deflate::{DeflateScratch, DeflateUse};

/// Bytes read from one connection per readiness event before the loop
/// serves the others (the rest is read on the next iteration).
const READ_BUDGET: usize = 1 << 20;

/// Why a connection ended; each reason has its own counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The close handshake completed; the client's code (1005: it gave none).
    Normal(CloseCode),
    /// The server failed the connection with this code (1002, 1007, 1009).
    Failed(CloseCode),
    /// The output queue went over its limit (1008).
    SlowConsumer,
    /// Nothing was heard from the client for the idle timeout (1001).
    IdleTimeout,
    /// The upgrade request did not arrive in time.
    HandshakeTimeout,
    /// The upgrade request was refused with an HTTP error.
    Rejected,
    /// A plain HTTP request (`/healthz`, `/metrics`, the demo page) was answered.
    Http,
    /// The server is shutting down (1001).
    Shutdown,
    /// A publisher closed it (`close`, or `Handle::close`) with this code.
    Publisher(CloseCode),
    /// The TCP connection ended without a close handshake.
    Abnormal,
}

impl CloseReason {
    /// The counter this reason is recorded in.
    pub fn counter(self, metrics: &Metrics) -> &std::sync::atomic::AtomicU64 {
        match self {
            CloseReason::Normal(_) => &metrics.closed_normal,
            CloseReason::Failed(CloseCode::INVALID_PAYLOAD) => &metrics.closed_invalid_payload,
            CloseReason::Failed(CloseCode::MESSAGE_TOO_BIG) => &metrics.closed_message_too_big,
            CloseReason::Failed(_) => &metrics.closed_protocol_error,
            CloseReason::SlowConsumer => &metrics.closed_slow_consumer,
            CloseReason::IdleTimeout => &metrics.closed_idle_timeout,
            CloseReason::Http => &metrics.closed_http,
            CloseReason::HandshakeTimeout => &metrics.closed_handshake_timeout,
            CloseReason::Rejected => &metrics.closed_rejected,
            CloseReason::Shutdown => &metrics.closed_shutdown,
            CloseReason::Publisher(_) => &metrics.closed_publisher,
            CloseReason::Abnormal => &metrics.closed_abnormal,
        }
    }
}

impl CloseReason {
    /// The close code a WebSocket connection ended with, as upstream
    /// `close` lines give it: the one sent or received, 1006 when the
    /// connection just ended.
    pub fn code(self) -> CloseCode {
        match self {
            CloseReason::Normal(code)
            | CloseReason::Failed(code)
            | CloseReason::Publisher(code) => code,
            CloseReason::SlowConsumer => CloseCode::POLICY_VIOLATION,
            CloseReason::IdleTimeout | CloseReason::Shutdown => CloseCode::GOING_AWAY,
            CloseReason::HandshakeTimeout
            | CloseReason::Rejected
            | CloseReason::Http
            | CloseReason::Abnormal => CloseCode(1006),
        }
    }
}

/// What the loop must do with a connection after a handler ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Keep it; wait for its next event.
    Keep,
    /// Keep it, and run its read handler again soon: it used its read
    /// budget with more input waiting.
    ReadAgain,
    /// It asked for this plain HTTP endpoint and is lingering: the loop,
    /// which holds what the answer reports, renders it and hands it to
    /// [`Conn::respond`].
    Serve(Endpoint),
    /// Keep it, and read it again once the upstream reader has caught up
    /// (reading clients is paused until then).
    AwaitUpstream,
    /// Drop the TCP connection now.
    Close(CloseReason),
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

/// Everything a connection writes, each through [`Conn::send`].
#[derive(Debug, Clone, Copy)]
enum Outgoing<'a> {
    /// A frame answering what the current read brought (a pong, an echo),
    /// its header and payload: gathered with the others in
    /// [`Ctx::replies`], written once the read is processed.
    Reply(FrameHeader, &'a [u8]),
    /// A frame of its own that goes out now (a close): header and payload.
    Frame(FrameHeader, &'a [u8]),
    /// An HTTP response: head and body.
    Response(&'a [u8], &'a [u8]),
    /// Broadcast batches or the ping, shared with other connections:
    /// [`Sent::Dropped`] for those the queue has no room for.
    Shared(&'a [SharedFrames]),
    /// The gathered replies, at the end of a read.
    Replies,
    /// What is queued, now that the socket is writable.
    Queued,
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

/// The messages of positioned `frames` after position `through`: all of
/// them, some (copied), or none.
fn after_position(frames: &SharedFrames, through: u64) -> Option<SharedFrames> {
    let positions = || frames.payloads().map(seq_of);
    if positions().last()? <= through {
        return None;
    }
    match positions().take_while(|&seq| seq <= through).count() {
        0 => Some(frames.clone()),
        given => Some(frames.skip(given)),
    }
}

/// Messages being assembled from several pieces, by connection.
pub type Assemblies = std::collections::HashMap<ConnKey, PooledBuf>;

/// The loop-owned resources a handler may use.
pub struct Ctx<'a> {
    /// Limits and modes.
    pub config: &'a Config,
    /// Where partial input and echo messages are buffered.
    pub pool: &'a mut BufferPool,
    /// Deadlines.
    pub timers: &'a mut TimerWheel,
    /// Counters.
    pub metrics: &'a Metrics,
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
    /// The messages being assembled from several pieces (echoed, sent
    /// upstream or inflated), by connection: few connections have one, so
    /// the buffer is not in every connection's slot.
    pub messages: &'a mut Assemblies,
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
    /// Replays asked for by connections that upgraded, for the loop to
    /// address to them.
    pub replays: &'a mut Vec<(ConnKey, Replay)>,
    /// What a delivery visit left of the connection's items, if it could
    /// not give them all (a replay larger than its queue has room for).
    pub unfinished: &'a mut Option<Unfinished>,
}

/// One client connection.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    phase: Phase,
    out: OutQueue,
    /// Received bytes not consumed yet (a partial request head or frame).
    input: Option<PooledBuf>,
    /// When the current phase times out, if it can.
    deadline: Deadline,
    /// The socket is registered for writability (output is pending).
    writable_interest: bool,
    /// Reading stopped because output backed up (echo backpressure).
    read_paused: bool,
    /// A message is being assembled from several pieces in the loop's
    /// [`Ctx::messages`].
    assembling: bool,
    /// Heartbeat state while open (two bytes that fit in padding).
    liveness: Liveness,
    /// What permessage-deflate, negotiated at the upgrade, gives it.
    deflate: DeflateUse,
    /// It asked for positions: it gets each message as its position, a
    /// space and the payload.
    positions: bool,
    /// The walk its targeted items wait for, if any (see `targeted`).
    walk: WalkMark,
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
            out: OutQueue::default(),
            input: None,
            deadline: Deadline::default(),
            writable_interest: false,
            read_paused: false,
            assembling: false,
            liveness: Liveness::default(),
            deflate: DeflateUse::Off,
            positions: false,
            walk: None,
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
            self.arm(key, ctx.config.handshake_timeout, ctx);
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
    pub fn id(&self) -> Option<&str> {
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

    /// The first broadcast batch it has not had yet, if it is open.
    pub fn next_batch(&self) -> Option<Seq> {
        self.is_open().then(|| self.out.next_batch())
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

    /// Output bytes queued, not yet taken by the socket.
    pub fn queued_bytes(&self) -> usize {
        self.out.queued_bytes()
    }

    /// The walk its targeted items wait for, if any.
    pub fn walk_mark(&self) -> WalkMark {
        self.walk
    }

    /// Marks it as waiting for a walk (or for none).
    pub fn mark_walk(&mut self, mark: WalkMark) {
        self.walk = mark;
    }

    /// Returns `Some(want)` when the writable interest must change to `want`.
    pub fn interest_change(&mut self) -> Option<bool> {
        let want = !self.out.is_empty();
        (want != self.writable_interest).then(|| {
            self.writable_interest = want;
            want
        })
    }

    /// Whether `tick` is this connection's current deadline (timer entries
    /// for deadlines that were re-armed or cleared are stale).
    pub fn is_due(&self, tick: Tick) -> bool {
        self.deadline.is(tick)
    }

    /// Ends the connection (the loop has taken it out of the slab): clears
    /// its deadline, takes it out of the routes, returns its buffers to
    /// the pool, uncounts its queued output (counting the frames
    /// discarded), counts the close by `reason` and takes it off its
    /// gauge. The socket closes as it drops.
    pub fn close(mut self, key: ConnKey, reason: CloseReason, ctx: &mut Ctx<'_>) {
        let metrics = ctx.metrics;
        self.deadline.clear(ctx.timers);
        if self.is_websocket() {
            ctx.routes.leave(key.slot(), self.target.id());
            if let Some(upstream) = ctx.upstream.as_deref_mut() {
                let conn = self.conn_ref(key, ctx.config.instance);
                upstream.closed(conn, self.target.id(), reason.code());
            }
        }
        self.discard_output(true, ctx.tally);
        if let Some(input) = self.input.take() {
            ctx.pool.give_back(input);
        }
        self.drop_message(key, ctx);
        Metrics::incr(reason.counter(metrics));
        Metrics::decr(if self.is_websocket() {
            &metrics.connections_open
        } else {
            &metrics.connections_http
        });
        if self.deflate != DeflateUse::Off {
            Metrics::decr(&metrics.connections_deflate);
        }
        log::debug!("connection {key} closed: {reason:?}");
    }

    /// The socket is readable: read until it is drained (or the read
    /// budget is used), feeding the bytes to the current phase.
    ///
    /// `edge` says the call answers a readiness event that reported no
    /// hang-up, or is the first read after the socket was registered: then
    /// a short read proves the socket drained, because Linux epoll reports
    /// every later arrival (data or FIN) as a new edge (and a registration
    /// reports what is already there), and the read that would only say
    /// WouldBlock is skipped (one syscall per event). Otherwise reading
    /// goes on until WouldBlock.
    pub fn on_readable(
        &mut self,
        key: ConnKey,
        edge: bool,
        scratch: &mut [u8],
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        let mut budget = READ_BUDGET;
        while budget > 0 {
            let upstream_paused = ctx.upstream.as_ref().is_some_and(|u| u.is_paused());
            if upstream_paused && !matches!(self.phase, Phase::Handshake(_)) {
                return Verdict::AwaitUpstream;
            }
            self.read_paused = self.output_backed_up(ctx.config);
            if self.read_paused {
                // Echo backpressure: resume when the queue drains.
                return Verdict::Keep;
            }
            let room = self
                .input
                .as_ref()
                .map_or(scratch.len(), |buf| buf.capacity() - buf.len())
                .min(scratch.len());
            debug_assert!(room > 0, "bug: a lent input buffer is never full");
            let n = match read_some(&mut self.stream, &mut scratch[..room]) {
                Ok(Progress::Done(n)) => n,
                Ok(Progress::WouldBlock) => return Verdict::Keep,
                Ok(Progress::Eof) => return self.on_eof(),
                Err(e) => {
                    log::debug!("read failed: {e}");
                    return Verdict::Close(CloseReason::Abnormal);
                }
            };
            budget = budget.saturating_sub(n);
            self.liveness.heard();
            let verdict = self.consume(key, &mut scratch[..n], ctx);
            if verdict != Verdict::Keep {
                return verdict;
            }
            if edge && n < room {
                return Verdict::Keep;
            }
        }
        Verdict::ReadAgain
    }

    /// The socket is writable: flush the queue; a drained queue may let
    /// the connection half-close or resume reading.
    pub fn on_writable(&mut self, key: ConnKey, scratch: &mut [u8], ctx: &mut Ctx<'_>) -> Verdict {
        match self.send(Outgoing::Queued, ctx) {
            Err(reason) => Verdict::Close(reason),
            Ok(Sent::Written) if self.read_paused => self.on_readable(key, false, scratch, ctx),
            Ok(_) => Verdict::Keep,
        }
    }

    /// Answers the endpoint it asked for (see [`Verdict::Serve`]) with
    /// `200 OK` and `body`, then reads on, discarding, until the client
    /// goes.
    pub fn respond(
        &mut self,
        status: http::PageStatus,
        content_type: &str,
        body: &[u8],
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        debug_assert!(
            matches!(
                self.phase,
                Phase::Lingering {
                    reason: CloseReason::Http,
                    ..
                }
            ),
            "bug: only a plain HTTP request is answered with a body"
        );
        let mut head = [0u8; MAX_RESPONSE_LEN];
        let len = http::write_page_head(status, content_type, body.len(), &mut head);
        match self.send(Outgoing::Response(&head[..len], body), ctx) {
            // Reading stopped at the request to let the loop answer it.
            Ok(_) => Verdict::ReadAgain,
            Err(reason) => Verdict::Close(reason),
        }
    }

    /// The connection's deadline passed.
    pub fn on_deadline(&mut self, timers: &mut TimerWheel) -> Verdict {
        self.deadline.clear(timers);
        match self.phase {
            Phase::Handshake(_) => Verdict::Close(CloseReason::HandshakeTimeout),
            Phase::CloseSent { reason, .. } | Phase::Lingering { reason, .. } => {
                Verdict::Close(reason)
            }
            Phase::Open(_) => Verdict::Keep,
        }
    }

    /// A delivery visit (see `delivery`): writes what this connection is
    /// owed, in order, with one `writev`: the stream's batches it has not
    /// had, each of its own items after the batches framed before it, and
    /// the batches after them up to `owed.up_to`. A close among its items
    /// goes out after what precedes it, and the rest is not sent. Counts
    /// what became of the messages: delivered, or missed.
    pub fn deliver(&mut self, key: ConnKey, owed: Owed<'_>, ctx: &mut Ctx<'_>) -> Verdict {
        if !self.is_open() {
            return Verdict::Keep;
        }
        let full = self.deflate == DeflateUse::Full;
        let positions = self.positions;
        let mut gathered = std::mem::take(ctx.gathered);
        // After a replay, what it gave (up to `skip`) is not given again.
        let mut skip = None;
        let gather = |gathered: &mut Vec<SharedFrames>, frames: &[SharedFrames], skip| {
            let frames = frames.iter().map(|f| f.for_connection(full, positions));
            match skip {
                None => gathered.extend(frames.cloned()),
                Some(through) => gathered.extend(frames.filter_map(|f| after_position(f, through))),
            }
        };
        let mut cursor = self.out.next_batch();
        let mut close = None;
        for (at, item) in owed.items.iter().map(|a| &a.item).enumerate() {
            gather(
                &mut gathered,
                owed.stream.between(cursor, item.after()),
                skip,
            );
            cursor = item.after();
            match item {
                Item::Frames { frames, .. } => {
                    gather(&mut gathered, std::slice::from_ref(frames), skip)
                }
                Item::Close { code, reason, .. } => {
                    close = Some((*code, reason));
                    break;
                }
                Item::Replay { after, replay } => {
                    let pending: usize = gathered.iter().map(|f| f.bytes().len()).sum();
                    let used = self.out.queued_bytes() + pending;
                    let room = ctx.config.max_queued_bytes.saturating_sub(used);
                    let progress = ctx.history.gather(replay, full, room, &mut gathered);
                    if progress.overrun {
                        Metrics::incr(&ctx.metrics.replay_overruns);
                    }
                    // Not all given yet, or the client is ahead of this
                    // loop (it waits until the loop has framed as far).
                    let framed = ctx.history.current().seq;
                    let more = progress
                        .more
                        .or((replay.through > framed).then_some(framed));
                    if let Some(from) = more {
                        let replay = Replay {
                            from: from.max(replay.from),
                            ..replay.clone()
                        };
                        let item = Item::Replay {
                            after: *after,
                            replay,
                        };
                        *ctx.unfinished = Some(Unfinished { at, item });
                        break;
                    }
                    skip = Some(replay.through);
                }
            }
        }
        if close.is_none() && ctx.unfinished.is_none() {
            gather(&mut gathered, owed.stream.between(cursor, owed.up_to), skip);
            cursor = owed.up_to;
        }
        self.out.set_next_batch(cursor);
        let mut verdict = Verdict::Keep;
        if !gathered.is_empty() {
            verdict = self.deliver_frames(key, &gathered, ctx);
            gathered.clear();
        }
        *ctx.gathered = gathered;
        match close {
            Some((code, reason)) if verdict == Verdict::Keep => {
                self.begin_close(key, code, reason, CloseReason::Publisher(code), ctx)
            }
            _ => verdict,
        }
    }

    /// [`Conn::deliver`] of the frames this connection gets.
    fn deliver_frames(
        &mut self,
        key: ConnKey,
        owed: &[SharedFrames],
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        let messages = |frames: &[SharedFrames]| frames.iter().map(|f| f.count() as u64).sum();
        match self.send(Outgoing::Shared(owed), ctx) {
            Err(reason) => return Verdict::Close(reason),
            Ok(Sent::Written) => ctx.tally.broadcast_deliveries += messages(owed),
            Ok(Sent::Queued) => {
                ctx.tally.broadcast_deliveries += messages(owed);
                ctx.tally.write_would_block += 1;
            }
            Ok(Sent::Dropped { kept }) => {
                let (taken, missed) = owed.split_at(kept);
                ctx.tally.broadcast_deliveries += messages(taken);
                ctx.tally.slow_consumer_drops += messages(missed);
                ctx.tally.write_would_block += 1;
                return self.on_slow_consumer(key, messages(missed), ctx);
            }
        }
        Verdict::Keep
    }

    /// Broadcasts found its queue full: under policy `drop` it misses
    /// them; under `close` its output not started yet is discarded and it
    /// is closed with 1008.
    fn on_slow_consumer(&mut self, key: ConnKey, missed: u64, ctx: &mut Ctx<'_>) -> Verdict {
        match ctx.config.slow_consumer {
            SlowConsumerPolicy::Drop => {
                log::debug!(
                    "slow consumer {key}: {} bytes queued, {missed} broadcasts dropped for it",
                    self.out.queued_bytes(),
                );
                Verdict::Keep
            }
            SlowConsumerPolicy::Close => {
                let dropped = self.discard_output(false, ctx.tally);
                log::debug!(
                    "slow consumer {key}: {} bytes queued, {dropped} frames dropped, closing",
                    self.out.queued_bytes()
                );
                self.begin_close(
                    key,
                    CloseCode::POLICY_VIOLATION,
                    "slow consumer",
                    CloseReason::SlowConsumer,
                    ctx,
                )
            }
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
    pub fn on_heartbeat(
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
        let mut visit = self.liveness.visit(close_after);
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
                return self.begin_close(
                    key,
                    CloseCode::GOING_AWAY,
                    "idle timeout",
                    CloseReason::IdleTimeout,
                    ctx,
                );
            }
        }
        match self.send(Outgoing::Shared(std::slice::from_ref(ping)), ctx) {
            Err(reason) => Verdict::Close(reason),
            Ok(Sent::Dropped { .. }) => Verdict::Keep,
            Ok(Sent::Written | Sent::Queued) => {
                Metrics::incr(&ctx.metrics.pings_sent);
                Verdict::Keep
            }
        }
    }

    /// Starts a server-initiated close: sends a close frame after whatever
    /// is queued, then waits (bounded by the close timeout) for the
    /// client's close.
    pub fn begin_close(
        &mut self,
        key: ConnKey,
        code: CloseCode,
        why: &str,
        reason: CloseReason,
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        let Phase::Open(decoder) = self.phase else {
            return Verdict::Keep;
        };
        self.phase = Phase::CloseSent { decoder, reason };
        self.arm(key, ctx.config.close_timeout, ctx);
        self.send_close(code, why, ctx)
    }

    /// Feeds freshly read bytes (held back partial input first) to the
    /// current phase, and keeps what it could not consume yet.
    fn consume(&mut self, key: ConnKey, fresh: &mut [u8], ctx: &mut Ctx<'_>) -> Verdict {
        let verdict = self.consume_gathering(key, fresh, ctx);
        match (verdict, self.send(Outgoing::Replies, ctx)) {
            (Verdict::Close(_), _) => verdict,
            (_, Err(reason)) => Verdict::Close(reason),
            (_, Ok(_)) => verdict,
        }
    }

    /// [`Conn::consume`] up to the write of the gathered replies.
    fn consume_gathering(&mut self, key: ConnKey, fresh: &mut [u8], ctx: &mut Ctx<'_>) -> Verdict {
        let Some(mut held) = self.input.take() else {
            let (used, verdict) = self.process(key, fresh, 0, ctx);
            if used < fresh.len() && !matches!(verdict, Verdict::Close(_)) {
                let mut held = ctx.pool.lend();
                held.extend_from_slice(&fresh[used..]);
                self.input = Some(held);
            }
            return verdict;
        };
        let seen = held.len();
        held.extend_from_slice(fresh);
        let (used, verdict) = self.process(key, &mut held, seen, ctx);
        held.drain(..used);
        if held.is_empty() || matches!(verdict, Verdict::Close(_)) {
            ctx.pool.give_back(held);
        } else {
            self.input = Some(held);
        }
        verdict
    }

    /// Runs the current phase over `bytes`, of which the first `seen` were
    /// held over from earlier reads; returns how many were consumed.
    fn process(
        &mut self,
        key: ConnKey,
        bytes: &mut [u8],
        seen: usize,
        ctx: &mut Ctx<'_>,
    ) -> (usize, Verdict) {
        let mut pos = 0;
        if let Phase::Handshake(endpoints) = self.phase {
            let (used, verdict) = self.handshake(key, endpoints, bytes, seen, ctx);
            if matches!(self.phase, Phase::Lingering { .. }) {
                // Answered: whatever the client sent after the head is read
                // and discarded until it goes, never held.
                return (bytes.len(), verdict);
            }
            if verdict != Verdict::Keep || !self.is_open() {
                return (used, verdict);
            }
            // Bytes after the head are the first frames (pipelined).
            pos = used;
        }
        loop {
            let decoded = match &mut self.phase {
                Phase::Open(decoder) | Phase::CloseSent { decoder, .. } => decoder.decode(
                    &mut bytes[pos..],
                    ctx.config.max_message_bytes,
                    self.deflate != DeflateUse::Off,
                ),
                Phase::Handshake(_) | Phase::Lingering { .. } => {
                    return (bytes.len(), Verdict::Keep)
                }
            };
            let event = match decoded {
                Ok((used, Some(event))) => {
                    pos += used;
                    event
                }
                Ok((used, None)) => return (pos + used, Verdict::Keep),
                Err(error) => return (bytes.len(), self.fail(key, error, ctx)),
            };
            let verdict = self.on_event(key, event, ctx);
            if verdict != Verdict::Keep {
                return (pos, verdict);
            }
        }
    }

    /// Acts on one event from the client.
    fn on_event(&mut self, key: ConnKey, event: Event<'_>, ctx: &mut Ctx<'_>) -> Verdict {
        let closing = !self.is_open();
        match event {
            Event::Data {
                kind,
                payload,
                last,
                compressed,
            } => {
                if last {
                    Metrics::incr(&ctx.metrics.messages_received);
                }
                let wanted = ctx.config.echo || ctx.upstream.is_some();
                // A compressed message is inflated even if it is dropped:
                // its size and its text are checked as a plain one's are.
                if (wanted || compressed) && !closing {
                    return self.on_data(key, kind, payload, last, compressed, ctx);
                }
                Verdict::Keep
            }
            Event::Ping(payload) if !closing => {
                Metrics::incr(&ctx.metrics.pings_received);
                self.reply(OpCode::Pong, payload, false, ctx)
            }
            Event::Ping(_) | Event::Pong(_) => Verdict::Keep,
            Event::Close(frame) => {
                let reason = match self.phase {
                    Phase::CloseSent { reason, .. } => reason,
                    _ => CloseReason::Normal(frame.map_or(CloseCode(1005), |f| f.code)),
                };
                self.linger(key, reason, ctx);
                if closing {
                    // Our close went out before; nothing more to send.
                    return Verdict::after(self.send(Outgoing::Queued, ctx));
                }
                // Echo the status code (§5.5.1); no code in, no code out.
                let code = frame.map(|f| f.code.0.to_be_bytes());
                let payload = code.as_ref().map_or(&[][..], |c| &c[..]);
                let close = FrameHeader::server(OpCode::Close, payload.len() as u64);
                Verdict::after(self.send(Outgoing::Frame(close, payload), ctx))
            }
        }
    }

    /// A piece of a data message, when messages are echoed or written
    /// upstream, or are compressed: pieces are gathered in a pooled buffer
    /// until the message is complete (one that arrived in one piece is
    /// used straight from the input).
    fn on_data(
        &mut self,
        key: ConnKey,
        kind: MessageKind,
        payload: &[u8],
        last: bool,
        compressed: bool,
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        if last && !self.assembling {
            return self.on_whole(key, kind, payload, compressed, ctx);
        }
        let pool = &mut *ctx.pool;
        let message = ctx.messages.entry(key).or_insert_with(|| pool.lend());
        message.extend_from_slice(payload);
        self.assembling = !last;
        if !last {
            return Verdict::Keep;
        }
        let message = ctx.messages.remove(&key).expect("just assembled");
        let verdict = self.on_whole(key, kind, &message, compressed, ctx);
        ctx.pool.give_back(message);
        verdict
    }

    /// A whole data message: written upstream, and echoed in echo mode.
    fn on_message(
        &mut self,
        key: ConnKey,
        kind: MessageKind,
        message: &[u8],
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        if let Some(upstream) = ctx.upstream.as_deref_mut() {
            let conn = self.conn_ref(key, ctx.config.instance);
            match upstream.message(conn, self.target.id(), kind, message) {
                Offered::Taken => Metrics::incr(&ctx.metrics.upstream_messages),
                Offered::TakenPausing => {
                    Metrics::incr(&ctx.metrics.upstream_messages);
                    Metrics::incr(&ctx.metrics.upstream_pauses);
                    log::debug!("upstream a bound behind: reading clients paused");
                }
                Offered::Dropped => Metrics::incr(&ctx.metrics.upstream_dropped),
            }
        }
        if !ctx.config.echo {
            return Verdict::Keep;
        }
        Metrics::incr(&ctx.metrics.messages_echoed);
        self.echo(kind, message, ctx)
    }

    /// Answers what the current read brought with a frame (compressed:
    /// with RSV1 set), gathered with the read's other replies.
    fn reply(
        &mut self,
        opcode: OpCode,
        payload: &[u8],
        compressed: bool,
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        let header = FrameHeader::server_message(opcode, payload.len() as u64, compressed);
        Verdict::after(self.send(Outgoing::Reply(header, payload), ctx))
    }

    /// Fails the connection: a close frame with the error's code, then linger.
    fn fail(&mut self, key: ConnKey, error: ProtocolError, ctx: &mut Ctx<'_>) -> Verdict {
        log::debug!("protocol error from {}: {error:?}", self.target());
        let code = error.close_code();
        let already_closing = !self.is_open();
        self.linger(key, CloseReason::Failed(code), ctx);
        if already_closing {
            return Verdict::after(self.send(Outgoing::Queued, ctx));
        }
        self.send_close(code, error.reason(), ctx)
    }

    /// Enters the lingering phase with its deadline; drops a half-built message.
    fn linger(&mut self, key: ConnKey, reason: CloseReason, ctx: &mut Ctx<'_>) {
        self.drop_message(key, ctx);
        self.phase = Phase::Lingering {
            reason,
            write_shut: false,
            upgraded: self.is_websocket(),
        };
        self.arm(key, ctx.config.close_timeout, ctx);
    }

    fn send_close(&mut self, code: CloseCode, why: &str, ctx: &mut Ctx<'_>) -> Verdict {
        let mut payload = [0u8; 2 + 123];
        payload[..2].copy_from_slice(&code.0.to_be_bytes());
        let why = &why.as_bytes()[..why.len().min(123)];
        payload[2..2 + why.len()].copy_from_slice(why);
        let payload = &payload[..2 + why.len()];
        let header = FrameHeader::server(OpCode::Close, payload.len() as u64);
        let close = Outgoing::Frame(header, payload);
        Verdict::after(self.send(close, ctx))
    }

    /// The connection's one output path: writes `out` after whatever was
    /// gathered and queued before it (so replies to a read go out before
    /// any frame that follows them, in the same `writev`), counts what it
    /// wrote and queued, and, lingering with nothing left to write,
    /// half-closes. A failed socket is `Err` with the reason to close.
    fn send(&mut self, out: Outgoing<'_>, ctx: &mut Ctx<'_>) -> Result<Sent, CloseReason> {
        let mut header = [0u8; MAX_HEADER_LEN];
        if let Outgoing::Reply(frame, payload) = out {
            let len = frame.encode(&mut header);
            if let Some(sent) = self.gather(&[&header[..len], payload], ctx)? {
                return Ok(sent);
            }
        }
        let replies: &[u8] = ctx.replies;
        if matches!(out, Outgoing::Replies) && replies.is_empty() {
            // Nothing written, nothing to half-close after: a connection
            // that just asked for an endpoint lingers until the loop has
            // handed it the answer (`Verdict::Serve`).
            return Ok(Sent::taken(&self.out));
        }
        let before = self.out.queued_bytes();
        let (sent, offered, frames) = match out {
            Outgoing::Reply(frame, payload) | Outgoing::Frame(frame, payload) => {
                let len = frame.encode(&mut header);
                let parts = [replies, &header[..len], payload];
                let sent = self.out.send_private(&parts, &mut self.stream);
                (sent, total_len(&parts), 1)
            }
            Outgoing::Response(head, body) => {
                let parts = [replies, head, body];
                let sent = self.out.send_private(&parts, &mut self.stream);
                (sent, total_len(&parts), 0)
            }
            Outgoing::Replies => {
                let sent = self.out.send_private(&[replies], &mut self.stream);
                (sent, replies.len(), 0)
            }
            Outgoing::Shared(shared) => {
                let limit = ctx.config.max_queued_bytes;
                let sent = self
                    .write_ahead(replies)
                    .and_then(|()| self.out.send_shared(shared, limit, &mut self.stream));
                let taken = match sent {
                    Ok(Sent::Dropped { kept }) => &shared[..kept],
                    _ => shared,
                };
                let offered = replies.len() + taken.iter().map(|f| f.bytes().len()).sum::<usize>();
                let frames = taken.iter().map(SharedFrames::count).sum();
                (sent, offered, frames)
            }
            Outgoing::Queued => {
                let sent = self
                    .write_ahead(replies)
                    .and_then(|()| self.out.flush(&mut self.stream));
                (sent, replies.len(), 0)
            }
        };
        ctx.replies.clear();
        let sent = sent.map_err(|e| {
            log::debug!("write failed: {e}");
            CloseReason::Abnormal
        })?;
        ctx.tally.frames_sent += frames as u64;
        let after = self.out.queued_bytes();
        ctx.tally.wrote(before + offered - after, before, after);
        self.half_close_when_flushed()?;
        Ok(sent)
    }

    /// Writes (or queues) the gathered replies ahead of what [`Conn::send`]
    /// writes next with a call of its own.
    fn write_ahead(&mut self, replies: &[u8]) -> std::io::Result<()> {
        if !replies.is_empty() {
            self.out.send_private(&[replies], &mut self.stream)?;
        }
        Ok(())
    }

    /// Adds a reply frame to the gathered replies, writing those first
    /// when it does not fit behind them; `None` when it is larger than the
    /// gathering buffer and must go out on its own, without the copy.
    fn gather(&mut self, frame: &[&[u8]], ctx: &mut Ctx<'_>) -> Result<Option<Sent>, CloseReason> {
        let len = total_len(frame);
        if len > ctx.replies.capacity() - ctx.replies.len() {
            self.send(Outgoing::Replies, ctx)?;
        }
        if len > ctx.replies.capacity() {
            return Ok(None);
        }
        ctx.tally.frames_sent += 1;
        frame
            .iter()
            .for_each(|part| ctx.replies.extend_from_slice(part));
        Ok(Some(Sent::Queued))
    }

    /// Discards queued output, what is not started yet or (`all`: the
    /// connection is going) everything, counting its frames as discarded;
    /// returns how many.
    fn discard_output(&mut self, all: bool, tally: &mut Tally) -> usize {
        let before = self.out.queued_bytes();
        let dropped = if all {
            std::mem::take(&mut self.out).queued_frames()
        } else {
            self.out.drop_unstarted()
        };
        tally.wrote(0, before, self.out.queued_bytes());
        tally.frames_discarded += dropped as u64;
        dropped
    }

    /// Gives back the buffer of a message being assembled, if any.
    fn drop_message(&mut self, key: ConnKey, ctx: &mut Ctx<'_>) {
        if std::mem::take(&mut self.assembling) {
            if let Some(message) = ctx.messages.remove(&key) {
                ctx.pool.give_back(message);
            }
        }
    }

    /// Lingering with everything written: send FIN (the server closes the
    /// TCP connection first, RFC 6455 §7.1.1) and wait for the client's.
    fn half_close_when_flushed(&mut self) -> Result<(), CloseReason> {
        if let Phase::Lingering {
            reason, write_shut, ..
        } = &mut self.phase
        {
            if !*write_shut && self.out.is_empty() {
                *write_shut = true;
                if let Err(e) = self.stream.shutdown(Shutdown::Write) {
                    log::debug!("shutdown failed: {e}");
                    return Err(*reason);
                }
            }
        }
        Ok(())
    }

    /// The client closed its side.
    fn on_eof(&mut self) -> Verdict {
        match self.phase {
            Phase::Lingering { reason, .. } | Phase::CloseSent { reason, .. } => {
                Verdict::Close(reason)
            }
            Phase::Handshake(_) | Phase::Open(_) => Verdict::Close(CloseReason::Abnormal),
        }
    }

    /// Echo backpressure: stop reading while the client is not reading
    /// what it is sent.
    fn output_backed_up(&self, config: &Config) -> bool {
        self.out.queued_bytes() > config.max_queued_bytes
    }

    fn arm(&mut self, key: ConnKey, after: Duration, ctx: &mut Ctx<'_>) {
        let tick = ctx.timers.tick_at(ctx.now + after);
        self.deadline.arm(ctx.timers, key, tick);
    }
}

/// The bytes in `parts`.
fn total_len(parts: &[&[u8]]) -> usize {
    parts.iter().map(|p| p.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::position::Epoch;
    use crate::server::fanout::Stream;
    use crate::server::history::Bounds;
    use std::io::{Read, Write};

    /// One upgraded connection over a loopback pair, with the loop's parts
    /// it needs, driven by hand (no poll): so a test decides when the loop
    /// reads.
    struct Rig {
        conn: Conn,
        client: std::net::TcpStream,
        config: Config,
        pool: BufferPool,
        timers: TimerWheel,
        metrics: Metrics,
        tally: Tally,
        scratch: Vec<u8>,
        replies: Vec<u8>,
        routes: Routes,
        deflate: DeflateScratch,
        gathered: Vec<SharedFrames>,
        messages: Assemblies,
        history: History,
        replays: Vec<(ConnKey, Replay)>,
        unfinished: Option<Unfinished>,
    }

    const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

    impl Rig {
        /// A connection just accepted; nothing read yet.
        fn accepted() -> Rig {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (accepted, _) = listener.accept().unwrap();
            accepted.set_nonblocking(true).unwrap();
            let config = Config::default();
            let pool = BufferPool::new(config.max_head_bytes, 0, 4);
            let timers = TimerWheel::new(Duration::from_millis(100), 16, Instant::now());
            let (metrics, tally) = Default::default();
            let endpoints = Endpoints {
                websocket: true,
                metrics: false,
                demo: false,
            };
            let conn = Conn::accepted(TcpStream::from_std(accepted), endpoints, 1);
            Rig {
                conn,
                client,
                config,
                pool,
                timers,
                metrics,
                tally,
                scratch: vec![0; 64 * 1024],
                replies: Vec::with_capacity(64 * 1024),
                routes: Routes::new(16),
                deflate: DeflateScratch::default(),
                gathered: Vec::new(),
                messages: Assemblies::new(),
                history: History::new(
                    Epoch(1),
                    1,
                    Bounds {
                        messages: 0,
                        bytes: 0,
                        age: Duration::from_secs(1),
                    },
                )
                .unwrap(),
                replays: Vec::new(),
                unfinished: None,
            }
        }

        /// A connection that sent its request and got the 101.
        fn upgraded() -> Rig {
            let mut rig = Rig::accepted();
            rig.client.write_all(REQUEST).unwrap();
            assert_eq!(
                rig.drive(|conn, scratch, ctx| conn.on_readable(ConnKey(0), false, scratch, ctx)),
                Verdict::Keep
            );
            assert!(rig.conn.is_open());
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                head.push(rig.client_byte());
            }
            assert!(head.starts_with(b"HTTP/1.1 101"));
            rig
        }

        /// Runs `handler` on the connection with a context over the rig's parts.
        fn drive(
            &mut self,
            handler: impl FnOnce(&mut Conn, &mut [u8], &mut Ctx<'_>) -> Verdict,
        ) -> Verdict {
            let mut ctx = Ctx {
                config: &self.config,
                pool: &mut self.pool,
                timers: &mut self.timers,
                metrics: &self.metrics,
                tally: &mut self.tally,
                replies: &mut self.replies,
                routes: &mut self.routes,
                upstream: None,
                deflate: &mut self.deflate,
                messages: &mut self.messages,
                gathered: &mut self.gathered,
                now: Instant::now(),
                next_batch: Seq(0),
                history: &self.history,
                replays: &mut self.replays,
                unfinished: &mut self.unfinished,
            };
            handler(&mut self.conn, &mut self.scratch, &mut ctx)
        }

        /// A delivery visit offering `frames` as the one batch the
        /// connection is owed.
        fn offer(&mut self, frames: &SharedFrames) -> Verdict {
            let mut stream = Stream::starting_at(self.conn.out.next_batch());
            stream.push(frames.clone());
            let up_to = stream.next_seq();
            let owed = Owed {
                stream: &stream,
                items: &[],
                up_to,
            };
            self.drive(|conn, _, ctx| conn.deliver(ConnKey(0), owed, ctx))
        }

        /// A heartbeat visit closing after 3 silent visits (ping interval
        /// 30 s, idle timeout 60 s).
        fn visit(&mut self) -> Verdict {
            let ping = SharedFrames::encode(OpCode::Ping, b"");
            self.drive(|conn, scratch, ctx| conn.on_heartbeat(ConnKey(0), &ping, 3, scratch, ctx))
        }

        /// Waits (at most 5 s) until `len` bytes the client sent are
        /// readable on the connection's socket.
        fn wait_until_readable(&mut self, len: usize) {
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut buf = vec![0u8; len];
            while !matches!(self.conn.stream.peek(&mut buf), Ok(n) if n >= len) {
                assert!(Instant::now() < deadline, "{len} bytes never arrived");
                std::thread::yield_now();
            }
        }

        fn client_byte(&mut self) -> u8 {
            let mut byte = [0u8];
            self.client.read_exact(&mut byte).unwrap();
            byte[0]
        }

        /// The first two bytes of the next frame the client gets.
        fn client_frame_start(&mut self) -> [u8; 2] {
            [self.client_byte(), self.client_byte()]
        }
    }

    #[test]
    fn bytes_pipelined_after_an_answered_request_are_discarded_not_held() {
        let mut rig = Rig::accepted();
        let mut request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        let head_len = request.len();
        request.resize(head_len + 20_000, b'x');
        rig.client.write_all(&request).unwrap();
        let read = |rig: &mut Rig| {
            rig.drive(|conn, scratch, ctx| conn.on_readable(ConnKey(0), false, scratch, ctx))
        };
        // The read stops at the request, which goes to the loop to answer.
        assert_eq!(read(&mut rig), Verdict::Serve(Endpoint::Health));
        assert!(rig.conn.input.is_none(), "nothing held after the request");
        let answered = rig
            .drive(|conn, _, ctx| conn.respond(http::PageStatus::Ok, "text/plain", b"ok\n", ctx));
        assert_eq!(answered, Verdict::ReadAgain, "what follows is read on");
        for _ in 0..2 {
            assert_eq!(read(&mut rig), Verdict::Keep);
            assert!(rig.conn.input.is_none(), "nothing held after the answer");
        }
        let mut answer = Vec::new();
        rig.client.read_to_end(&mut answer).unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"));
        assert!(answer.ends_with(b"\r\n\r\nok\n"), "then a half-close");
    }

    #[test]
    fn only_a_connection_still_waiting_for_its_request_gets_a_deadline() {
        let mut rig = Rig::accepted();
        rig.client.write_all(&REQUEST[..20]).unwrap();
        let verdict = rig.drive(|conn, scratch, ctx| conn.on_accepted(ConnKey(0), scratch, ctx));
        assert_eq!(verdict, Verdict::Keep);
        assert!(!rig.conn.is_open());
        assert!(rig.timers.next_at().is_some());

        let mut rig = Rig::accepted();
        rig.client.write_all(REQUEST).unwrap();
        let give_up = Instant::now() + Duration::from_secs(5);
        while rig.conn.stream.peek(&mut [0]).is_err() {
            // Until the request is there, as at accept.
            assert!(Instant::now() < give_up, "the request never arrived");
            std::thread::yield_now();
        }
        let verdict = rig.drive(|conn, scratch, ctx| conn.on_accepted(ConnKey(0), scratch, ctx));
        assert_eq!(verdict, Verdict::Keep);
        assert!(rig.conn.is_open());
        assert_eq!(rig.timers.next_at(), None);
    }

    #[test]
    fn a_pong_the_loop_has_not_read_yet_keeps_the_connection() {
        let mut rig = Rig::upgraded();
        assert_eq!(rig.visit(), Verdict::Keep, "first visit: skipped");
        assert_eq!(rig.visit(), Verdict::Keep, "second: pinged");
        assert_eq!(rig.client_frame_start(), [0x89, 0x00]);
        // The client answers, but the loop is behind and has not read it
        // when the third visit comes.
        rig.client.write_all(&[0x8A, 0x80, 1, 2, 3, 4]).unwrap();
        rig.wait_until_readable(6);
        assert_eq!(rig.visit(), Verdict::Keep);
        assert!(rig.conn.is_open(), "closed although its pong had arrived");
        assert_eq!(
            rig.client_frame_start(),
            [0x89, 0x00],
            "pinged again instead"
        );
    }

    #[test]
    fn a_client_silent_for_the_idle_timeout_is_closed_with_1001() {
        let mut rig = Rig::upgraded();
        for _ in 0..2 {
            assert_eq!(rig.visit(), Verdict::Keep);
        }
        assert_eq!(rig.client_frame_start(), [0x89, 0x00]);
        rig.visit();
        assert!(!rig.conn.is_open());
        assert_eq!(rig.client_frame_start(), [0x88, 2 + 12]);
        let mut payload = [0u8; 14];
        rig.client.read_exact(&mut payload).unwrap();
        assert_eq!(&payload, b"\x03\xe9idle timeout");
    }

    /// A masked client frame (mask 1 2 3 4) with a payload under 126 bytes.
    fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [1u8, 2, 3, 4];
        let mut frame = vec![0x80 | opcode, 0x80 | payload.len() as u8];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
        frame
    }

    #[test]
    fn replies_to_one_read_go_out_in_order_and_before_the_close() {
        let mut rig = Rig::upgraded();
        // Room for one 22-byte pong at a time: the gathered replies are
        // written when the next does not fit, and a pong larger than the
        // room goes out on its own, all in order.
        rig.replies = Vec::with_capacity(40);
        let payloads: Vec<Vec<u8>> = [20, 20, 20, 125, 3, 0]
            .iter()
            .enumerate()
            .map(|(i, &len)| vec![b'a' + i as u8; len])
            .collect();
        let mut wire: Vec<u8> = payloads.iter().flat_map(|p| client_frame(0x9, p)).collect();
        wire.extend(client_frame(0x8, &1000u16.to_be_bytes()));
        rig.client.write_all(&wire).unwrap();
        rig.wait_until_readable(wire.len());
        rig.drive(|conn, scratch, ctx| conn.on_readable(ConnKey(0), false, scratch, ctx));
        assert!(rig.replies.is_empty(), "the replies were written");
        for payload in &payloads {
            assert_eq!(rig.client_frame_start(), [0x8A, payload.len() as u8]);
            let mut got = vec![0u8; payload.len()];
            rig.client.read_exact(&mut got).unwrap();
            assert_eq!(&got, payload);
        }
        assert_eq!(rig.client_frame_start(), [0x88, 2], "the close comes last");
        let mut code = [0u8; 2];
        rig.client.read_exact(&mut code).unwrap();
        assert_eq!(u16::from_be_bytes(code), 1000);
        let mut rest = Vec::new();
        rig.client.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "then the half-close: {rest:?}");
    }

    /// Reads what the client got until `len` bytes came, in another
    /// thread (the test thread keeps driving the connection).
    fn read_in_background(
        client: &std::net::TcpStream,
        len: usize,
    ) -> std::thread::JoinHandle<Vec<u8>> {
        let mut client = client.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut got = vec![0u8; len];
            client.read_exact(&mut got).unwrap();
            got
        })
    }

    #[test]
    fn writable_interest_follows_the_queue_between_empty_and_not() {
        let mut rig = Rig::upgraded();
        rig.config.max_queued_bytes = 64 << 20;
        assert_eq!(rig.conn.interest_change(), None, "nothing queued yet");
        let written_before = rig.tally.bytes_written;
        // More than the socket buffers take while the client reads nothing.
        let big = SharedFrames::encode(OpCode::Binary, &vec![7u8; 16 << 20]);
        let small = SharedFrames::encode(OpCode::Text, b"after");
        for frames in [&big, &small] {
            assert_eq!(rig.offer(frames), Verdict::Keep);
        }
        assert_eq!(rig.tally.broadcast_deliveries, 2);
        assert_eq!(rig.tally.write_would_block, 2, "both queued");
        assert_eq!(rig.conn.interest_change(), Some(true));
        assert_eq!(rig.conn.interest_change(), None, "only on a change");
        assert_eq!(rig.conn.next_batch(), Some(Seq(2)));

        let total = big.bytes().len() + small.bytes().len();
        let reader = read_in_background(&rig.client, total);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !rig.conn.out.is_empty() {
            assert!(Instant::now() < deadline, "the queue never drained");
            let verdict =
                rig.drive(|conn, scratch, ctx| conn.on_writable(ConnKey(0), scratch, ctx));
            assert_eq!(verdict, Verdict::Keep);
            std::thread::yield_now();
        }
        assert_eq!(rig.conn.interest_change(), Some(false));
        assert_eq!(rig.conn.interest_change(), None);
        let got = reader.join().unwrap();
        assert_eq!(&got[got.len() - 7..], b"\x81\x05after", "in order, whole");
        assert_eq!(rig.tally.queued_bytes, 0, "every queued byte uncounted");
        assert_eq!(rig.tally.bytes_written - written_before, total as u64);
    }

    #[test]
    fn a_full_queue_drops_broadcasts_or_closes_by_policy() {
        for policy in [SlowConsumerPolicy::Drop, SlowConsumerPolicy::Close] {
            let mut rig = Rig::upgraded();
            rig.config.max_queued_bytes = 1 << 20;
            rig.config.slow_consumer = policy;
            let frame = SharedFrames::encode(OpCode::Binary, &vec![1u8; 256 << 10]);
            let mut verdict = Verdict::Keep;
            let mut offered = 0u32;
            while rig.tally.slow_consumer_drops == 0 {
                assert!(offered < 1000, "the queue never filled");
                offered += 1;
                verdict = rig.offer(&frame);
            }
            assert_eq!(rig.tally.slow_consumer_drops, 1, "{policy:?}");
            assert_eq!(
                rig.tally.broadcast_deliveries + 1,
                u64::from(offered),
                "{policy:?}: each offered one delivered or dropped"
            );
            match policy {
                SlowConsumerPolicy::Drop => {
                    assert_eq!(verdict, Verdict::Keep);
                    assert!(rig.conn.is_open());
                    assert_eq!(rig.tally.frames_discarded, 0);
                }
                SlowConsumerPolicy::Close => {
                    assert_eq!(verdict, Verdict::Keep, "closing, the close frame queued");
                    assert!(!rig.conn.is_open());
                    assert!(rig.tally.frames_discarded > 0, "unstarted frames discarded");
                    assert_eq!(
                        rig.conn.out.queued_frames(),
                        2,
                        "the started one and the close"
                    );
                }
            }
        }
    }

    /// The per-connection budget: a slab slot is at most 104 bytes, all
    /// an idle connection costs in user space (its serial included; an
    /// id or a channel adds a record in the routes). mio's `TcpStream` is
    /// 4 bytes in a release build; a debug build's carries a selector id
    /// besides (16 bytes with padding), which the budget allows for.
    #[test]
    fn connection_state_is_small() {
        use std::mem::size_of;
        let socket_extra = size_of::<TcpStream>() - 4;
        let budget = (104 + socket_extra).next_multiple_of(8);
        assert!(
            size_of::<Conn>() <= budget,
            "a slot of {} bytes, over {budget}",
            size_of::<Conn>()
        );
        assert!(size_of::<Phase>() <= 28 && size_of::<OutQueue>() <= 24);
    }
}

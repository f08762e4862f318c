//! The handle: how other threads talk to a running loop (broadcast, shut
//! down, read metrics), and the state the loop shares with them.

pub(crate) mod feed;
pub(crate) mod intake;
#[cfg(feature = "internals")]
pub(crate) mod tally;
pub(crate) mod upstream;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

use mio::Waker;

use crate::config::Compression;
use crate::ops::board::CountersHome;
use crate::ops::metrics::{Metrics, MetricsSnapshot};
use crate::protocol::commands::{self, Recipients, MAX_CHANNEL_LIST_LEN, MAX_REASON_LEN};
use crate::protocol::names::{ChannelName, ClientId};
use crate::protocol::presence::{Answer, Query};
use crate::protocol::ws::{compress, CloseCode, MessageKind};
use crate::server::handle::feed::{Action, Gate, Queued, Reply};
use crate::server::handle::upstream::Shelf;

/// [`Shared::drain_asked`]: a drain, announced, after the grace.
pub(super) const DRAIN: u8 = 1;
/// [`Shared::drain_asked`]: a hand-over, neither announced nor waited for.
pub(super) const HAND_OVER: u8 = 2;

/// State shared between the loop and its handles.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) waker: Waker,
    /// A wake-up is on its way; further senders need not wake again.
    pub(super) wake_pending: AtomicBool,
    /// Broadcasts queued so far (by handles, counted as a send begins,
    /// and by the loop itself).
    pub(super) broadcasts_queued: AtomicU64,
    /// Broadcasts the loop sent (framed into a batch), as of its drop.
    pub(super) broadcasts_taken: AtomicU64,
    /// The byte bound on broadcasts queued and not yet framed.
    pub(super) gate: Gate,
    /// Broadcasts over this many bytes are refused as they are queued.
    pub(super) max_message_bytes: u64,
    /// Which messages are compressed as they are queued (if a connection
    /// negotiated permessage-deflate).
    pub(super) compression: Compression,
    /// How many queued broadcasts go out before the shutdown a handle asked
    /// for (`u64::MAX`: none asked). Kept beside the queue, so that asking
    /// never blocks behind a full one.
    pub(super) shutdown_after: AtomicU64,
    /// How many queued broadcasts go out before this process suspends
    /// for its next image ([`Handle::suspend`]; `u64::MAX`: not asked).
    pub(super) suspend_after: AtomicU64,
    /// What a handle asked of a drain: [`DRAIN`] ([`Handle::drain`]) or
    /// [`HAND_OVER`] ([`Handle::hand_over`]); 0 for neither.
    pub(super) drain_asked: AtomicU8,
    /// A drain closes at a pace (its drain time is not zero); else it is
    /// a shutdown.
    pub(super) drain_paced: bool,
    /// The server was dropped: nothing will read the queue any more.
    pub(super) gone: AtomicBool,
    /// Everything the server counts: in its own memory, or in its slot
    /// of the host's metrics board.
    pub(super) counters: CountersHome,
    /// Upstream lines handed over by the loop, for the reader.
    pub(super) shelf: Arc<Shelf>,
}

#[cfg(feature = "internals")]
impl tally::Holds for Shared {
    fn counters(&self) -> &crate::ops::metrics::Counters {
        &self.counters
    }
}

impl Shared {
    /// Whether a broadcast fits the message limit; one that does not is
    /// counted and logged.
    pub(super) fn check_message_limit(&self, payload: &[u8]) -> Result<(), MessageTooBig> {
        let limit = self.max_message_bytes;
        if payload.len() as u64 <= limit {
            return Ok(());
        }
        Metrics::incr(&self.counters.metrics.broadcasts_rejected);
        let refused = MessageTooBig {
            len: payload.len(),
            limit,
        };
        log::warn!("broadcast refused: {refused}");
        Err(refused)
    }

    /// The command that sends `payload` to `to`: compressed too, once,
    /// when permessage-deflate is on, the message is large enough, and
    /// some open connection negotiated it.
    pub(super) fn send_action(
        &self,
        to: Recipients,
        kind: MessageKind,
        payload: Vec<u8>,
    ) -> Action {
        let worth = self.compression.worth(payload.len())
            && self
                .counters
                .metrics
                .connections_deflate
                .load(Ordering::Relaxed)
                > 0;
        let deflated = worth.then(|| {
            Metrics::incr(&self.counters.metrics.broadcasts_compressed);
            compress::deflate_message(&payload)
        });
        Action::Send {
            to,
            kind,
            payload,
            deflated,
        }
    }

    /// Every counter now; the broadcast queue's bytes as they are this
    /// moment (the loop publishes the gauge only when it runs), and once
    /// the server is dropped, what was left queued as abandoned.
    pub(super) fn snapshot(&self) -> MetricsSnapshot {
        let mut metrics = self.counters.metrics.snapshot();
        metrics.broadcast_queue_bytes = self.gate.bytes() as u64;
        metrics.broadcast_producers_waiting = self.gate.waiters() as u64;
        if self.gone.load(Ordering::Acquire) {
            let queued = self.broadcasts_queued.load(Ordering::Acquire);
            let taken = self.broadcasts_taken.load(Ordering::Relaxed);
            metrics.broadcasts_abandoned = queued - taken;
        }
        metrics
    }
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

/// A broadcast larger than `max_message_bytes`; it was not sent (and was
/// counted in `broadcasts_rejected`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageTooBig {
    /// The message's size, in bytes.
    pub len: usize,
    /// The limit it is over.
    pub limit: u64,
}

impl std::fmt::Display for MessageTooBig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a broadcast of {} bytes is over the {}-byte message limit",
            self.len, self.limit
        )
    }
}

impl std::error::Error for MessageTooBig {}

/// Why a handle's message or command was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BroadcastError {
    /// It is over the message limit.
    TooBig(MessageTooBig),
    /// The loop has stopped.
    Gone(ServerGone),
    /// A close code a server may not send, or a reason over 123 bytes.
    BadClose,
    /// A list of channels over [`crate::MAX_CHANNEL_LIST_LEN`]
    /// bytes.
    ChannelListTooLong,
}

impl std::fmt::Display for BroadcastError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BroadcastError::TooBig(e) => e.fmt(f),
            BroadcastError::Gone(e) => e.fmt(f),
            BroadcastError::BadClose => f.write_str(
                "a close code is 1000-1003, 1007-1011 or 3000-4999, with at most 123 bytes of reason",
            ),
            BroadcastError::ChannelListTooLong => write!(
                f,
                "a list of channels is at most {MAX_CHANNEL_LIST_LEN} bytes"
            ),
        }
    }
}

impl std::error::Error for BroadcastError {}

impl From<MessageTooBig> for BroadcastError {
    fn from(e: MessageTooBig) -> Self {
        BroadcastError::TooBig(e)
    }
}

impl From<ServerGone> for BroadcastError {
    fn from(e: ServerGone) -> Self {
        BroadcastError::Gone(e)
    }
}

/// Talks to a running server from any thread: broadcast, shut down, read
/// metrics. Cheap to clone.
///
/// ```
/// use wspush::{Config, Server};
///
/// let mut server = Server::bind(Config::default())?;
/// let url = format!("ws://{}/", server.local_addr());
/// let handle = server.handle();
/// let loop_thread = std::thread::spawn(move || server.run());
///
/// // The 101 has come once `connect` returns: the client is open, and a
/// // broadcast queued from now on reaches it.
/// let (mut client, _) = tungstenite::connect(url)?;
/// handle.broadcast_text("hello")?;
/// assert_eq!(client.read()?.into_text()?.as_str(), "hello");
/// assert_eq!(handle.metrics().broadcasts, 1);
///
/// handle.shutdown()?; // the client gets a 1001 close
/// loop_thread.join().expect("the loop ran")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Handle {
    pub(super) commands: Sender<Queued>,
    pub(super) shared: Arc<Shared>,
}

impl Handle {
    /// Queues a text message for every open connection. Blocks while the
    /// loop is `max_pending_bytes` behind (backpressure), so do not call it
    /// from the loop's own thread; use [`Server::broadcast`](crate::server::Server::broadcast) there. A
    /// message over `max_message_bytes` is not queued: it is counted in
    /// `broadcasts_rejected`, logged, and [`BroadcastError::TooBig`].
    pub fn broadcast_text(&self, text: impl Into<String>) -> Result<(), BroadcastError> {
        self.broadcast(MessageKind::Text, text.into().into_bytes())
    }

    /// Queues a binary message for every open connection (see [`Handle::broadcast_text`]).
    pub fn broadcast_binary(&self, bytes: impl Into<Vec<u8>>) -> Result<(), BroadcastError> {
        self.broadcast(MessageKind::Binary, bytes.into())
    }

    /// Asks the loop to shut down: stop accepting, close every connection
    /// with 1001 after what is already queued for it, and let
    /// [`Server::run`](crate::server::Server::run) return once they are closed or the shutdown timeout
    /// passed. Broadcasts queued before it still go out first, for at most
    /// half the shutdown timeout (the loop may be far behind); the rest,
    /// and any queued after it, are counted in `broadcasts_abandoned`.
    /// Never blocks.
    pub fn shutdown(&self) -> Result<(), ServerGone> {
        self.after_queued(&self.shared.shutdown_after)
    }

    /// Asks the loop to drain, for a deploy: `/healthz` answers 503
    /// `draining` at once, connections are still accepted for
    /// [`Config::drain_grace`](crate::config::Config::drain_grace) (load balancers
    /// take note), then accepting stops (an `SO_REUSEPORT` group's other
    /// members take the new connections) and the open connections are
    /// closed with 1012 evenly over [`Config::drain_time`](crate::config::Config::drain_time),
    /// each after what was sent to it, and a client with positions told
    /// before its close to reconnect after a short random delay.
    /// Broadcasts go on meanwhile. Then [`Server::run`](crate::server::Server::run)
    /// returns as after a shutdown. With a drain time of zero, the same as
    /// [`Handle::shutdown`]; a shutdown asked during a drain closes what
    /// is left at once. Never blocks.
    pub fn drain(&self) -> Result<(), ServerGone> {
        if !self.shared.drain_paced {
            return self.shutdown();
        }
        if self.shared.gone.load(Ordering::Acquire) {
            return Err(ServerGone);
        }
        self.shared.drain_asked.fetch_max(DRAIN, Ordering::AcqRel);
        self.wake()
    }

    #[cfg(feature = "internals")]
    /// Asks the loop to hand its clients over to a replacement that
    /// already listens beside it (the same socket, or the same
    /// `SO_REUSEPORT` group): a [`Handle::drain`] without its announcement
    /// or grace. The listeners are closed at once (`/healthz` and
    /// `/metrics` are the replacement's now), and the connections closed
    /// at the pace of the drain time. Never blocks.
    pub fn hand_over(&self) -> Result<(), ServerGone> {
        if !self.shared.drain_paced {
            return self.shutdown();
        }
        if self.shared.gone.load(Ordering::Acquire) {
            return Err(ServerGone);
        }
        self.shared.drain_asked.store(HAND_OVER, Ordering::Release);
        self.wake()
    }

    /// Asks the loop to stop for a re-exec of this process, after every
    /// command queued before it: it finishes their delivery, takes every
    /// open connection apart as a handover to a successor would (see
    /// [`Server::take_suspended`](crate::server::Server::take_suspended)),
    /// keeps the listener open for the next image, closes what could not
    /// move with 1001, and [`Server::run`](crate::server::Server::run)
    /// returns. The caller stops its input first: whatever is queued
    /// after this is not sent. Never blocks.
    pub fn suspend(&self) -> Result<(), ServerGone> {
        self.after_queued(&self.shared.suspend_after)
    }

    /// Asks the loop for what `mark` stands for once every broadcast
    /// queued so far is taken (the earliest such ask wins), and wakes it.
    fn after_queued(&self, mark: &AtomicU64) -> Result<(), ServerGone> {
        if self.shared.gone.load(Ordering::Acquire) {
            return Err(ServerGone);
        }
        let queued = self.shared.broadcasts_queued.load(Ordering::Acquire);
        mark.fetch_min(queued, Ordering::AcqRel);
        self.wake()
    }

    /// The server's counters now, read one by one while the loop runs. Byte
    /// and frame counts (`bytes_written`, `frames_sent`, `queued_bytes`)
    /// are published once per loop iteration, so they may lag the
    /// connection counts by that iteration's work. Once the server is
    /// dropped, `broadcasts_abandoned` also counts what was still queued.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.snapshot()
    }

    /// Counts an input line the caller skipped instead of broadcasting it
    /// (not UTF-8, or too long), in `input_lines_rejected`: nothing is
    /// dropped uncounted.
    #[cfg(feature = "internals")]
    pub fn count_rejected_input(&self) {
        Metrics::incr(&self.shared.counters.metrics.input_lines_rejected);
    }

    /// Records that a feed of this server's input (a Redis subscription)
    /// was lost: counted in `feed_outages`, and `/healthz` reports the
    /// server degraded until [`Handle::feed_restored`].
    #[cfg(feature = "internals")]
    pub fn feed_lost(&self) {
        let metrics = &self.shared.counters.metrics;
        Metrics::incr(&metrics.feed_outages);
        Metrics::incr(&metrics.feeds_down);
    }

    /// Records that a lost feed is back after `outage` (a feed not
    /// recorded lost leaves `feeds_down` as it is).
    #[cfg(feature = "internals")]
    pub fn feed_restored(&self, outage: std::time::Duration) {
        let metrics = &self.shared.counters.metrics;
        Metrics::add(&metrics.feed_outage_ms, outage.as_millis() as u64);
        let _ = metrics
            .feeds_down
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    #[cfg(feature = "internals")]
    /// Records that the Redis stream no longer held entries not read yet
    /// (positions `from` to `to`, both included): counted in
    /// `stream_gaps` (the stream's reader logs it, once per host). Every
    /// connection with positions is told the gap, in order with the
    /// messages around it, and the next message is positioned after it;
    /// a resume across them is told the gap too (see
    /// [`SharedHistory::mark_missing`](crate::SharedHistory::mark_missing)).
    pub fn stream_gap(&self, from: u64, to: u64) -> Result<(), ServerGone> {
        Metrics::incr(&self.shared.counters.metrics.stream_gaps);
        self.queue(Action::Lost { from, through: to }, None)
    }

    /// Sets how many processes this instance had before this one under
    /// its supervisor (restarts after a death, replacements in rolling
    /// restarts and upgrades): `wspush_instance_restarts`.
    #[cfg(feature = "internals")]
    pub fn set_instance_restarts(&self, earlier: u64) {
        self.shared
            .counters
            .metrics
            .instance_restarts
            .store(earlier, Ordering::Relaxed);
    }

    /// Sets how far the entries read are behind the stream's last, by
    /// their ids' milliseconds.
    #[cfg(feature = "internals")]
    pub fn stream_lag(&self, lag: std::time::Duration) {
        let lag = lag.as_millis().try_into().unwrap_or(u64::MAX);
        self.shared
            .counters
            .metrics
            .stream_lag_ms
            .store(lag, Ordering::Relaxed);
    }

    #[cfg(feature = "internals")]
    /// Positions up to `seq` were given out by the source without a
    /// message for this server (kept in the history only, or lost): the
    /// next message is positioned after it, in order with what was queued
    /// before.
    pub fn advance_to(&self, seq: u64) -> Result<(), ServerGone> {
        self.queue(Action::Advance { through: seq }, None)
    }

    /// Sends a message to `to`, after everything queued before it:
    /// [`Handle::broadcast_text`] for everyone, or to the subscribers of
    /// channels, the connections of a client id, or one connection. Waits
    /// while the queue is full, like a broadcast.
    pub fn send(
        &self,
        to: Recipients,
        kind: MessageKind,
        payload: impl Into<Vec<u8>>,
    ) -> Result<(), BroadcastError> {
        self.send_numbered(None, to, kind, payload)
    }

    /// [`Handle::send`] of a message its source numbered `seq`: its
    /// position is `seq` (or, if that is not after the last position
    /// given out, the next one). A source that numbers its messages the
    /// same way for every server (as the binary numbers its input lines)
    /// gives every server the same positions, so a client may resume on
    /// any of them.
    pub fn send_at(
        &self,
        seq: u64,
        to: Recipients,
        kind: MessageKind,
        payload: impl Into<Vec<u8>>,
    ) -> Result<(), BroadcastError> {
        self.send_numbered(Some(seq), to, kind, payload)
    }

    fn send_numbered(
        &self,
        seq: Option<u64>,
        to: Recipients,
        kind: MessageKind,
        payload: impl Into<Vec<u8>>,
    ) -> Result<(), BroadcastError> {
        let payload = payload.into();
        let shared = &self.shared;
        shared.check_message_limit(&payload)?;
        if let Recipients::Channels(names) = &to {
            if !commands::channel_list_fits(names) {
                return Err(BroadcastError::ChannelListTooLong);
            }
        }
        Ok(self.queue(shared.send_action(to, kind, payload), seq)?)
    }

    /// Subscribes the connections of client `id` to `channels` (those
    /// open when the loop takes the command).
    pub fn subscribe(
        &self,
        id: ClientId,
        channels: impl Into<Box<[ChannelName]>>,
    ) -> Result<(), ServerGone> {
        self.change_subscription(true, id, channels.into())
    }

    /// Unsubscribes the connections of client `id` from `channels`.
    pub fn unsubscribe(
        &self,
        id: ClientId,
        channels: impl Into<Box<[ChannelName]>>,
    ) -> Result<(), ServerGone> {
        self.change_subscription(false, id, channels.into())
    }

    /// Asks the loop who is connected: `reply` gets its answer once the
    /// loop takes the query (after every command queued before it), on
    /// the loop's thread, so it must hand the answer on without waiting.
    pub fn ask(
        &self,
        query: Query,
        reply: impl Fn(Answer) + Send + Sync + 'static,
    ) -> Result<(), ServerGone> {
        let reply = Reply(Arc::new(reply));
        self.queue(Action::Ask { query, reply }, None)
    }

    fn change_subscription(
        &self,
        on: bool,
        id: ClientId,
        channels: Box<[ChannelName]>,
    ) -> Result<(), ServerGone> {
        self.queue(Action::Subscribe { on, id, channels }, None)
    }

    /// Closes the connections of `whom` with a close frame carrying
    /// `code` and `reason`, after what was queued for them before.
    pub fn close(
        &self,
        whom: Recipients,
        code: CloseCode,
        reason: &str,
    ) -> Result<(), BroadcastError> {
        if !commands::may_send(code) || reason.len() > MAX_REASON_LEN {
            return Err(BroadcastError::BadClose);
        }
        let action = Action::Close {
            whom,
            code,
            reason: reason.into(),
        };
        Ok(self.queue(action, None)?)
    }

    fn broadcast(&self, kind: MessageKind, payload: Vec<u8>) -> Result<(), BroadcastError> {
        self.send(Recipients::All, kind, payload)
    }

    /// Queues `action` (numbered `seq` by its source) for the loop,
    /// waiting for room.
    fn queue(&self, action: Action, seq: Option<u64>) -> Result<(), ServerGone> {
        let shared = &self.shared;
        let queued = &shared.broadcasts_queued;
        queued.fetch_add(1, Ordering::AcqRel);
        let cost = action.cost();
        if shared.gate.acquire(cost).is_err() {
            queued.fetch_sub(1, Ordering::AcqRel);
            return Err(ServerGone);
        }
        let command = Queued {
            action,
            queued_at: Instant::now(),
            seq,
        };
        if self.commands.send(command).is_err() {
            shared.gate.release(cost);
            queued.fetch_sub(1, Ordering::AcqRel);
            return Err(ServerGone);
        }
        self.wake()
    }

    fn wake(&self) -> Result<(), ServerGone> {
        if !self.shared.wake_pending.swap(true, Ordering::AcqRel) {
            self.shared.waker.wake().map_err(|_| ServerGone)?;
        }
        Ok(())
    }
}

/// The reader of the upstream lines (see [`Server::upstream`](crate::server::Server::upstream)).
#[derive(Debug, Clone)]
pub struct UpstreamReader {
    pub(super) shared: Arc<Shared>,
}

impl UpstreamReader {
    /// Waits for lines and moves all that are there into `lines` (emptied
    /// first): whole lines, in order. `false` once the server is gone and
    /// every line was read.
    pub fn read(&self, lines: &mut Vec<u8>) -> bool {
        let shared = &self.shared;
        shared.shelf.take(lines, || {
            let _ = shared.waker.wake();
        })
    }

    /// Counts lines the caller read but could not pass on (its output
    /// failed), in `upstream_dropped`: nothing is lost uncounted.
    pub fn count_dropped(&self, lines: u64) {
        Metrics::add(&self.shared.counters.metrics.upstream_dropped, lines);
    }

    /// How a writer of these lines counts its work in the server's
    /// `/metrics`.
    #[cfg(feature = "internals")]
    pub fn tally(&self) -> tally::UpstreamTally {
        tally::UpstreamTally::new(Arc::clone(&self.shared) as Arc<dyn tally::Holds>)
    }
}

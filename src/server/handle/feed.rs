//! Commands on their way into the loop: [`Handle`](crate::server::Handle)s queue
//! them from any thread (messages, to everyone or to some, subscription
//! changes, closes), the loop takes them in order and frames the messages
//! waiting side by side with the same recipients into one batch.
//!
//! The queue is bounded by bytes ([`Gate`]): a producer that gets
//! `max_pending_bytes` ahead of the loop waits for room, so a feed faster
//! than the fan-out slows down its source (standard input stops being
//! read) instead of growing memory or dropping anything. The loop never
//! waits on the gate; it only gives room back.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::protocol::commands::{self, Recipients};
use crate::protocol::names::{ChannelName, ClientId};
use crate::protocol::presence::{Answer, Query};
use crate::protocol::ws::{CloseCode, MessageKind};
use crate::server::frames::{encoded_len, SharedFrames, ToFrame};
use crate::server::history::History;

/// Bytes a queued broadcast is charged besides its payload: its slot in
/// the channel and the loop's queue, its `Vec` and its time stamp. So even
/// empty messages cannot queue without bound.
pub const COMMAND_OVERHEAD: usize = 64;

/// What a command asks the loop to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send a message.
    Send {
        /// Who gets it.
        to: Recipients,
        /// Text or binary.
        kind: MessageKind,
        /// The message.
        payload: Vec<u8>,
        /// The message compressed for the connections that negotiated
        /// permessage-deflate, when it is worth it (see [`Config::deflate_min_bytes`](crate::config::Config::deflate_min_bytes)).
        deflated: Option<Box<[u8]>>,
    },
    /// Subscribe (`true`) or unsubscribe a client's connections.
    Subscribe {
        /// Subscribe, or unsubscribe.
        on: bool,
        /// The client id.
        id: ClientId,
        /// The channels.
        channels: Box<[ChannelName]>,
    },
    /// Close connections with a close frame.
    Close {
        /// Whose.
        whom: Recipients,
        /// The close code.
        code: CloseCode,
        /// The reason (at most 123 bytes).
        reason: String,
    },
    /// The source gave out positions up to `through` without a message
    /// here (kept in the history only, or lost): the next message is
    /// positioned after it. (Only the `internals` handle sends it.)
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    Advance {
        /// The last position given out.
        through: u64,
    },
    /// The source lost positions `from` to `through` (both included):
    /// every connection with positions is told the gap, in order, and the
    /// next message is positioned after it. (Only the `internals` handle
    /// sends it.)
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    Lost {
        /// The first position lost.
        from: u64,
        /// The last.
        through: u64,
    },
    /// Answer a presence query, from what the loop holds once it takes
    /// it (after every command queued before).
    Ask {
        /// What is asked.
        query: Query,
        /// Where the answer goes.
        reply: Reply,
    },
}

/// Where the loop gives a presence answer: called once, on the loop's
/// thread, so it must not wait (it hands the answer on).
#[derive(Clone)]
pub struct Reply(pub Arc<dyn Fn(Answer) + Send + Sync>);

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reply")
    }
}

/// Two replies are the same when they are the same function.
impl PartialEq for Reply {
    fn eq(&self, other: &Reply) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Reply {}

impl Action {
    /// What it is charged against the byte bound.
    pub fn cost(&self) -> usize {
        COMMAND_OVERHEAD
            + match self {
                Action::Send {
                    to,
                    payload,
                    deflated,
                    ..
                } => payload.len() + deflated.as_ref().map_or(0, |d| d.len()) + to.names_len(),
                Action::Subscribe { id, channels, .. } => {
                    id.as_str().len() + commands::names_len(channels)
                }
                Action::Close { whom, reason, .. } => whom.names_len() + reason.len(),
                Action::Advance { .. } | Action::Lost { .. } => 0,
                Action::Ask { query, .. } => query.line().len(),
            }
    }
}

/// A command a handle queued for the loop (the feed's, not the command
/// language's [`Command`](crate::Command)).
#[derive(Debug)]
pub struct Queued {
    /// What to do.
    pub action: Action,
    /// When it was queued (for the age of the oldest pending command).
    pub queued_at: Instant,
    /// A message's number from its source, for its position (`None`: the
    /// next); see [`History::assign`].
    pub seq: Option<u64>,
}

impl Queued {
    /// What it is charged against the byte bound.
    pub fn cost(&self) -> usize {
        self.action.cost()
    }

    /// The recipients, if it sends a message.
    fn sends_to(&self) -> Option<&Recipients> {
        match &self.action {
            Action::Send { to, .. } => Some(to),
            _ => None,
        }
    }
}

/// The queue was closed: the server is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// The byte bound on broadcasts queued but not yet framed, shared by the
/// handles (which take room, waiting for it) and the loop (which gives it
/// back). Waiting uses a condition variable, and the loop touches its lock
/// only when a producer is waiting.
#[derive(Debug)]
pub struct Gate {
    limit: usize,
    bytes: AtomicUsize,
    /// Producers waiting for room (or about to).
    waiters: AtomicUsize,
    closed: AtomicBool,
    lock: Mutex<()>,
    room: Condvar,
}

impl Gate {
    /// A gate letting at most `limit` bytes wait.
    pub fn new(limit: usize) -> Gate {
        Gate {
            limit,
            bytes: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            lock: Mutex::new(()),
            room: Condvar::new(),
        }
    }

    /// Takes `cost` bytes of room, waiting while there is not enough. An
    /// empty queue always has room, so one broadcast larger than the bound
    /// still goes (alone).
    pub fn acquire(&self, cost: usize) -> Result<(), Closed> {
        if self.try_acquire(cost)? {
            return Ok(());
        }
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let taken = loop {
            match self.try_acquire(cost) {
                Ok(false) => {}
                done => break done,
            }
            guard = self.room.wait(guard).unwrap_or_else(|e| e.into_inner());
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        taken.map(|_| ())
    }

    /// Takes `cost` bytes whatever the bound (the loop's own broadcasts:
    /// the loop cannot wait for itself).
    pub fn force_acquire(&self, cost: usize) {
        self.bytes.fetch_add(cost, Ordering::SeqCst);
    }

    /// Gives back `cost` bytes, waking the producers waiting for room.
    pub fn release(&self, cost: usize) {
        if cost == 0 {
            return;
        }
        self.bytes.fetch_sub(cost, Ordering::SeqCst);
        self.wake_waiters();
    }

    /// Refuses every later `acquire`, and wakes those waiting.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake_waiters();
    }

    /// Bytes queued now.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Producers waiting for room now (counted just before their last
    /// check, so one counted here waits unless room is given back).
    pub fn waiters(&self) -> usize {
        self.waiters.load(Ordering::SeqCst)
    }

    fn try_acquire(&self, cost: usize) -> Result<bool, Closed> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Closed);
        }
        let fits = |bytes: usize| bytes == 0 || bytes + cost <= self.limit;
        let update = |bytes: usize| fits(bytes).then_some(bytes + cost);
        Ok(self
            .bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, update)
            .is_ok())
    }

    /// A waiter registers (under the lock) before its last check, so one
    /// that checked too early is already counted here and is woken.
    fn wake_waiters(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.room.notify_all();
        }
    }
}

/// A batch framed from the front of the queue.
#[derive(Debug)]
pub struct Batch {
    /// Who the messages are for (all of them the same).
    pub to: Recipients,
    /// The messages' frames, back to back (with their positions too).
    pub frames: SharedFrames,
    /// Bytes given back to the gate for them.
    pub cost: usize,
}

/// What the front of the queue came to.
#[derive(Debug)]
pub enum Taken {
    /// Messages framed together.
    Batch(Batch),
    /// A subscription change or a close, and what it cost.
    Control(Action, usize),
}

/// The loop's side: broadcasts taken from the channel, oldest first.
#[derive(Debug)]
pub struct Feed {
    receiver: Receiver<Queued>,
    queue: VecDeque<Queued>,
}

impl Feed {
    /// The loop's end of the channel the handles send on.
    pub fn new(receiver: Receiver<Queued>) -> Feed {
        Feed {
            receiver,
            queue: VecDeque::new(),
        }
    }

    /// Moves what arrived on the channel into the queue.
    pub fn take_arrivals(&mut self) {
        self.queue.extend(self.receiver.try_iter());
    }

    /// Queues a broadcast of the loop's own.
    pub fn push(&mut self, command: Queued) {
        self.queue.push_back(command);
    }

    /// Nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// How long the oldest waiting broadcast has waited.
    pub fn oldest_age(&self, now: Instant) -> Duration {
        self.queue.front().map_or(Duration::ZERO, |c| {
            now.saturating_duration_since(c.queued_at)
        })
    }

    /// Takes the command at the front: a subscription change or a close
    /// alone, or the messages there for the same recipients framed into
    /// one batch, as many as fit in `max_bytes` of frames (at least one)
    /// and at most `max_count` commands, each given its position by
    /// `history`. `None` when nothing is waiting or `max_count` is 0.
    pub fn next(
        &mut self,
        max_bytes: usize,
        max_count: u64,
        history: &mut History,
    ) -> Option<Taken> {
        if max_count == 0 {
            return None;
        }
        let front = self.queue.front()?;
        let Some(to) = front.sends_to() else {
            let command = self.queue.pop_front().expect("a front");
            let cost = command.cost();
            return Some(Taken::Control(command.action, cost));
        };
        let mut count = 0;
        let mut size = 0;
        let max_count = max_count.try_into().unwrap_or(usize::MAX);
        for command in self.queue.iter().take(max_count) {
            let Action::Send {
                to: next, payload, ..
            } = &command.action
            else {
                break;
            };
            size += encoded_len(payload.len());
            if next != to || (count > 0 && size > max_bytes) {
                break;
            }
            count += 1;
        }
        let to = to.clone();
        let positions: Vec<_> = self
            .queue
            .range(..count)
            .map(|c| history.assign(c.seq))
            .collect();
        let sends = self
            .queue
            .range(..count)
            .zip(&positions)
            .map(|(c, position)| match &c.action {
                Action::Send {
                    kind,
                    payload,
                    deflated,
                    ..
                } => ToFrame {
                    opcode: kind.opcode(),
                    payload,
                    deflated: deflated.as_deref(),
                    position: Some(*position),
                },
                _ => unreachable!("only sends are framed"),
            });
        let input_at = self
            .queue
            .front()
            .map_or_else(Instant::now, |c| c.queued_at);
        let frames = SharedFrames::encode_batch(sends).input_at(input_at);
        let cost = self.queue.drain(..count).map(|c| c.cost()).sum();
        Some(Taken::Batch(Batch { to, frames, cost }))
    }

    /// Empties the queue and the channel without sending; returns how many
    /// broadcasts and bytes were thrown away.
    pub fn discard_all(&mut self) -> (u64, usize) {
        self.take_arrivals();
        let count = self.queue.len() as u64;
        let cost = self.queue.drain(..).map(|c| c.cost()).sum();
        (count, cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;

    fn send(to: Recipients, payload: &str) -> Queued {
        Queued {
            action: Action::Send {
                to,
                kind: MessageKind::Text,
                payload: payload.as_bytes().to_vec(),
                deflated: None,
            },
            queued_at: Instant::now(),
            seq: None,
        }
    }

    /// Positions for tests that do not look at them.
    fn positions() -> History {
        let bounds = crate::server::history::Bounds {
            messages: 0,
            bytes: 0,
            age: Duration::from_secs(1),
        };
        History::new(crate::protocol::position::Epoch(1), 1, bounds).unwrap()
    }

    fn text(payload: &str) -> Queued {
        send(Recipients::All, payload)
    }

    fn batch(taken: Option<Taken>) -> Batch {
        match taken {
            Some(Taken::Batch(batch)) => batch,
            other => panic!("not a batch: {other:?}"),
        }
    }

    #[test]
    fn batches_take_what_fits_in_order_and_at_least_one() {
        let (sender, receiver) = mpsc::channel();
        let mut feed = Feed::new(receiver);
        for payload in ["a", "bb", "ccc", &"d".repeat(200)] {
            sender.send(text(payload)).unwrap();
        }
        assert!(
            feed.next(1 << 20, u64::MAX, &mut positions()).is_none(),
            "not taken yet"
        );
        feed.take_arrivals();
        // 3 + 4 + 5 = 12 bytes of frames fit in 12; the 204-byte one does not.
        let first = batch(feed.next(12, u64::MAX, &mut positions()));
        assert_eq!(first.frames.bytes(), b"\x81\x01a\x81\x02bb\x81\x03ccc");
        assert_eq!(first.cost, 6 + 3 * COMMAND_OVERHEAD);
        // Alone, a batch may be larger than the bound.
        let big = batch(feed.next(12, u64::MAX, &mut positions()));
        assert_eq!((big.frames.count(), big.frames.bytes().len()), (1, 204));
        assert!(feed.next(12, u64::MAX, &mut positions()).is_none());
    }

    #[test]
    fn a_batch_stops_at_the_count_it_is_allowed() {
        let (sender, receiver) = mpsc::channel();
        let mut feed = Feed::new(receiver);
        for _ in 0..5 {
            sender.send(text("x")).unwrap();
        }
        feed.take_arrivals();
        assert!(feed.next(1 << 20, 0, &mut positions()).is_none());
        assert_eq!(
            batch(feed.next(1 << 20, 2, &mut positions()))
                .frames
                .count(),
            2
        );
        assert_eq!(feed.discard_all(), (3, 3 * (1 + COMMAND_OVERHEAD)));
        assert!(feed.is_empty());
    }

    #[test]
    fn a_batch_holds_messages_for_the_same_recipients_and_stops_at_a_control() {
        let (sender, receiver) = mpsc::channel();
        let mut feed = Feed::new(receiver);
        let news = || Recipients::channels(&["news"]);
        let close = Action::Close {
            whom: Recipients::id("bob"),
            code: CloseCode::NORMAL,
            reason: "bye".into(),
        };
        for command in [
            send(news(), "a"),
            send(news(), "b"),
            text("c"),
            send(news(), "d"),
            Queued {
                action: close.clone(),
                queued_at: Instant::now(),
                seq: None,
            },
            send(news(), "e"),
        ] {
            sender.send(command).unwrap();
        }
        feed.take_arrivals();
        let first = batch(feed.next(1 << 20, u64::MAX, &mut positions()));
        assert_eq!(
            (first.to, first.frames.bytes()),
            (news(), &b"\x81\x01a\x81\x01b"[..])
        );
        assert_eq!(first.cost, 2 * (1 + 4 + COMMAND_OVERHEAD));
        assert_eq!(
            batch(feed.next(1 << 20, u64::MAX, &mut positions())).to,
            Recipients::All
        );
        assert_eq!(
            batch(feed.next(1 << 20, u64::MAX, &mut positions()))
                .frames
                .count(),
            1
        );
        match feed.next(1 << 20, u64::MAX, &mut positions()) {
            Some(Taken::Control(action, cost)) => {
                assert_eq!(cost, 3 + 3 + COMMAND_OVERHEAD);
                assert_eq!(action, close);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            batch(feed.next(1 << 20, u64::MAX, &mut positions()))
                .frames
                .bytes(),
            b"\x81\x01e"
        );
    }

    #[test]
    fn a_full_gate_holds_a_producer_until_room_is_given_back() {
        let gate = Arc::new(Gate::new(100));
        gate.acquire(60).unwrap();
        gate.acquire(40).unwrap();
        let waiting = {
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || gate.acquire(50))
        };
        while gate.waiters.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        assert_eq!(gate.bytes(), 100, "the waiting producer took nothing");
        gate.release(40);
        assert_eq!(gate.bytes(), 60, "60 + 50 is over the bound: still waiting");
        gate.release(60);
        waiting.join().unwrap().unwrap();
        assert_eq!(gate.bytes(), 50);
    }

    #[test]
    fn an_empty_gate_takes_one_broadcast_over_the_bound() {
        let gate = Gate::new(10);
        gate.acquire(1000).unwrap();
        assert_eq!(gate.bytes(), 1000);
        gate.release(1000);
        assert_eq!(gate.bytes(), 0);
    }

    #[test]
    fn closing_the_gate_wakes_and_refuses_producers() {
        let gate = Arc::new(Gate::new(10));
        gate.acquire(10).unwrap();
        let waiting = {
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || gate.acquire(5))
        };
        while gate.waiters.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        gate.close();
        assert_eq!(waiting.join().unwrap(), Err(Closed));
        assert_eq!(gate.acquire(1), Err(Closed));
    }
}

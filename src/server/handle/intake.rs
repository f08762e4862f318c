//! The way into the loop from its handles: the command channel, the
//! queue the loop takes commands from, and the count of those taken.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Sender};
use std::time::{Duration, Instant};

use crate::ops::metrics::Metrics;
use crate::server::handle::feed::{Feed, Queued, Taken};
use crate::server::handle::Shared;
use crate::server::history::History;

/// Frames in one broadcast batch, at most (a single larger message goes
/// alone): about what a loopback socket takes in one write.
const MAX_BATCH_BYTES: usize = 64 * 1024;

/// The commands queued for the loop, from handles or its own broadcasts.
#[derive(Debug)]
pub(crate) struct Intake {
    /// Broadcasts queued for the loop.
    feed: Feed,
    /// The channel's sending end, cloned into every handle.
    sender: Sender<Queued>,
    /// Broadcasts may have arrived on the channel (the waker fired).
    pending: bool,
    /// Broadcasts framed into batches so far.
    taken: u64,
}

impl Intake {
    /// A new channel with nothing on it.
    pub(crate) fn new() -> Intake {
        let (sender, commands) = mpsc::channel();
        Intake {
            feed: Feed::new(commands),
            sender,
            pending: false,
            taken: 0,
        }
    }

    /// Where a handle sends its commands.
    pub(crate) fn sender(&self) -> Sender<Queued> {
        self.sender.clone()
    }

    /// How many commands the loop has taken.
    pub(crate) fn taken(&self) -> u64 {
        self.taken
    }

    /// A handle's waker fired: commands may be on the channel.
    pub(crate) fn woken(&mut self) {
        self.pending = true;
    }

    /// The waker fired and its commands are not taken in yet.
    pub(crate) fn is_woken(&self) -> bool {
        self.pending
    }

    /// Commands wait in the queue.
    pub(crate) fn is_waiting(&self) -> bool {
        !self.feed.is_empty()
    }

    /// How long the oldest waiting command has waited.
    pub(crate) fn oldest_age(&self, now: Instant) -> Duration {
        self.feed.oldest_age(now)
    }

    /// After the waker fired: moves what arrived on the channel into the
    /// queue, and lets the handles wake the loop again.
    pub(crate) fn take_arrivals(&mut self, shared: &Shared) {
        if self.pending {
            shared.wake_pending.store(false, Ordering::Release);
            self.pending = false;
            self.feed.take_arrivals();
        }
    }

    /// Queues a broadcast of the loop's own.
    pub(crate) fn push(&mut self, command: Queued) {
        self.feed.push(command);
    }

    /// Whether a handle asked for a shutdown, and if so whether every
    /// command queued before it was taken.
    pub(crate) fn shutdown_asked(&self, shared: &Shared) -> Option<bool> {
        let shutdown_after = shared.shutdown_after.load(Ordering::Acquire);
        (shutdown_after != u64::MAX).then_some(self.taken >= shutdown_after)
    }

    /// The next command from the front of the queue (see [`Feed::next`]),
    /// as long as it was queued before `shutdown_after` commands: its room
    /// is given back at the gate and it is counted as taken.
    pub(crate) fn next(
        &mut self,
        shutdown_after: u64,
        shared: &Shared,
        history: &mut History,
    ) -> Option<Taken> {
        let allowed = shutdown_after.saturating_sub(self.taken);
        let taken = self.feed.next(MAX_BATCH_BYTES, allowed, history)?;
        let metrics = &shared.counters.metrics;
        match &taken {
            Taken::Batch(batch) => {
                shared.gate.release(batch.cost);
                let count = batch.frames.count() as u64;
                self.taken += count;
                Metrics::add(&metrics.broadcasts, count);
                Metrics::incr(&metrics.broadcast_batches);
            }
            Taken::Control(_, cost) => {
                shared.gate.release(*cost);
                self.taken += 1;
            }
        }
        Some(taken)
    }

    /// Empties the queue without sending: counts and logs what it held.
    pub(crate) fn abandon(&mut self, shared: &Shared) {
        let (abandoned, cost) = self.feed.discard_all();
        shared.gate.release(cost);
        if abandoned > 0 {
            Metrics::add(&shared.counters.metrics.broadcasts_abandoned, abandoned);
            log::warn!("{abandoned} queued broadcasts not sent: the server is shutting down");
        }
    }
}

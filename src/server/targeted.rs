//! Messages and closes for some connections: a channel's subscribers, a
//! client id's connections, one connection. They never go through the
//! pass over every connection. As the loop takes them from the feed, each
//! is addressed to its recipients, found through the routes; at the end of
//! the framing step every recipient is written once, everything it is
//! owed in order: the broadcast batches framed before each of its
//! messages (taken from the stream, so the pass finds it up to date), then
//! the message, all with one `writev` of shared buffers.

use std::sync::Arc;

use crate::protocol::ws::CloseCode;
use crate::server::conn::{CloseReason, Verdict};
use crate::server::fanout::Seq;
use crate::server::feed::Recipients;
use crate::server::frames::SharedFrames;
use crate::server::key::ConnKey;
use crate::server::routes::Slot;
use crate::server::{sync_interest, Server};

/// What a recipient is owed, after every broadcast batch before `after`.
#[derive(Debug)]
enum Item {
    /// Frames shared with the other recipients.
    Frames { after: Seq, frames: SharedFrames },
    /// A close frame with this code and reason.
    Close {
        after: Seq,
        code: CloseCode,
        reason: Arc<str>,
    },
}

/// The framing step's targeted work, and the loop's scratch space for it
/// (its capacity kept from step to step).
#[derive(Debug, Default)]
pub(super) struct Targeted {
    /// Each recipient's items with the order they were addressed in.
    items: Vec<(Slot, u32, Item)>,
    /// The recipients of the message being addressed.
    recipients: Vec<Slot>,
    /// One connection's frames, being gathered for its write.
    owed: Vec<SharedFrames>,
}

impl Targeted {
    /// Whether anything waits to be delivered.
    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl Server {
    /// Addresses a batch of messages to `to`'s open connections now.
    pub(super) fn address_frames(&mut self, to: &Recipients, frames: SharedFrames) {
        let after = self.stream.next_seq();
        self.find_recipients(to);
        let targeted = &mut self.targeted;
        for &slot in &targeted.recipients {
            let item = Item::Frames {
                after,
                frames: frames.clone(),
            };
            let order = targeted.items.len() as u32;
            targeted.items.push((slot, order, item));
        }
    }

    /// Addresses a close to `whom`'s open connections now.
    pub(super) fn address_close(&mut self, whom: &Recipients, code: CloseCode, reason: &str) {
        let after = self.stream.next_seq();
        self.find_recipients(whom);
        let reason: Arc<str> = reason.into();
        let targeted = &mut self.targeted;
        for &slot in &targeted.recipients {
            let item = Item::Close {
                after,
                code,
                reason: Arc::clone(&reason),
            };
            let order = targeted.items.len() as u32;
            targeted.items.push((slot, order, item));
        }
    }

    /// Subscribes (or unsubscribes) client `id`'s open connections.
    pub(super) fn change_subscription(&mut self, on: bool, id: &str, channels: &[String]) {
        self.find_recipients(&Recipients::Id(id.to_string()));
        let metrics = &self.shared.metrics;
        for &slot in &self.targeted.recipients {
            for channel in channels {
                if !on {
                    self.routes.unsubscribe(slot, Some(id), channel);
                } else if self.routes.subscribe(slot, Some(id), channel).is_err() {
                    crate::ops::metrics::Metrics::incr(&metrics.subscriptions_refused);
                    log::warn!("subscription of {id} to {channel} refused: at the channel limit");
                }
            }
        }
    }

    /// Puts the open connections `to` names into `targeted.recipients`,
    /// each once; counts a command that names none.
    fn find_recipients(&mut self, to: &Recipients) {
        let recipients = &mut self.targeted.recipients;
        recipients.clear();
        let conns = &self.conns;
        let open = |slot: &Slot| conns.get(*slot as usize).is_some_and(|c| c.is_open());
        match to {
            Recipients::All => {
                recipients.extend(
                    conns
                        .iter()
                        .filter(|(_, c)| c.is_open())
                        .map(|(k, _)| k as Slot),
                );
            }
            Recipients::Channels(channels) => {
                for channel in channels {
                    recipients.extend(self.routes.subscribers(channel).iter().filter(|s| open(s)));
                }
                if channels.len() > 1 {
                    recipients.sort_unstable();
                    recipients.dedup();
                }
            }
            Recipients::Id(id) => {
                let id_of = |slot: Slot| conns.get(slot as usize).and_then(|c| c.id());
                recipients.extend(self.routes.holders(id, id_of).filter(|s| open(s)));
            }
            Recipients::Conn(conn) => {
                let slot = ConnKey(conn.slot as usize);
                if conn.instance == self.config.instance
                    && self.serials.get(slot) == conn.serial
                    && open(&conn.slot)
                {
                    recipients.push(conn.slot);
                }
            }
        }
        if recipients.is_empty() {
            crate::ops::metrics::Metrics::incr(&self.shared.metrics.commands_unmatched);
        }
    }

    /// Writes every recipient what the framing step addressed to it, once.
    pub(super) fn deliver_targeted(&mut self, now: std::time::Instant) {
        if self.targeted.is_empty() {
            return;
        }
        let mut items = std::mem::take(&mut self.targeted.items);
        let mut owed = std::mem::take(&mut self.targeted.owed);
        // By recipient, each one's items in the order addressed (an
        // unstable sort on both allocates nothing).
        items.sort_unstable_by_key(|&(slot, order, _)| (slot, order));
        let stream = std::mem::take(&mut self.stream);
        let mut failed = std::mem::take(&mut self.failed);
        let parts = self.parts(now);
        let mut ctx = parts.ctx;
        for group in items.chunk_by(|a, b| a.0 == b.0) {
            let key = ConnKey(group[0].0 as usize);
            let Some(conn) = parts.conns.get_mut(key.0) else {
                continue;
            };
            let Some(mut cursor) = conn.next_batch() else {
                continue; // Closed meanwhile.
            };
            let mut verdict = Verdict::Keep;
            owed.clear();
            for (_, _, item) in group {
                let after = match item {
                    Item::Frames { after, .. } | Item::Close { after, .. } => *after,
                };
                owed.extend(stream.between(cursor, after).iter().cloned());
                cursor = after;
                match item {
                    Item::Frames { frames, .. } => owed.push(frames.clone()),
                    Item::Close { code, reason, .. } => {
                        verdict = conn.deliver(key, &owed, cursor, &mut ctx);
                        owed.clear();
                        if verdict == Verdict::Keep {
                            verdict = conn.begin_close(
                                key,
                                *code,
                                reason,
                                CloseReason::Publisher(*code),
                                &mut ctx,
                            );
                        }
                        break;
                    }
                }
            }
            if !owed.is_empty() {
                verdict = conn.deliver(key, &owed, cursor, &mut ctx);
            }
            if let Verdict::Close(reason) = verdict {
                failed.push((key, reason));
            } else if !sync_interest(parts.registry, key, conn) {
                failed.push((key, CloseReason::Abnormal));
            }
        }
        owed.clear();
        items.clear();
        self.targeted.items = items;
        self.targeted.owed = owed;
        self.stream = stream;
        for (key, reason) in failed.drain(..) {
            self.close(key, reason);
        }
        self.failed = failed;
    }
}

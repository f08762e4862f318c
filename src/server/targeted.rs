//! Messages and closes for some connections: a channel's subscribers, a
//! client id's connections, one connection. They never go through the
//! pass over every connection. As the loop takes them from the feed, each
//! is addressed to its recipients, found through the routes, as an item
//! "after stream batch N, this". A walk then visits the recipients in key
//! order, a budgeted slice per loop iteration like the pass (see
//! `delivery`), and gives each one everything it is owed in one visit: the
//! broadcast batches framed before each of its items, its items, and the
//! batches after them.
//!
//! Items addressed while a walk is under way wait for the next walk, in
//! order. A connection with items waiting is marked with the walk that
//! holds its last ones (a parity bit, see [`WalkMark`]): the pass leaves it
//! alone, so that no broadcast framed after an item reaches it first, and
//! a visit of the walk before gives it the batches only up to the next
//! walk's first item.

use std::ops::Range;
use std::sync::Arc;

use crate::ops::metrics::Metrics;
use crate::protocol::ws::CloseCode;
use crate::server::fanout::Seq;
use crate::server::feed::Recipients;
use crate::server::frames::SharedFrames;
use crate::server::key::ConnKey;
use crate::server::owed::{Addressed, Item};
use crate::server::routes::Slot;
use crate::server::Server;

/// Which walk a connection's last items are in: the connection keeps the
/// walk's parity while it has items waiting (one byte in its padding).
pub type WalkMark = Option<bool>;

/// The targeted items on their way, and the loop's scratch space for
/// addressing them (capacities kept from step to step).
#[derive(Debug, Default)]
pub(super) struct Targeted {
    /// The walk under way: its items by recipient (slot, then serial),
    /// each recipient's in the order addressed.
    walk: Vec<Addressed>,
    /// The first item of the walk not visited yet.
    at: usize,
    /// Items addressed since the walk began, in order: the next walk's.
    next: Vec<Addressed>,
    /// The parity of the walk under way.
    generation: bool,
    /// The earliest stream batch a connection with items waiting may
    /// still be owed (the stream keeps it).
    floor: Option<Seq>,
    /// The recipients of the command being addressed.
    recipients: Vec<Slot>,
}

/// One recipient's turn in a walk: the connection that held `slot` when
/// the items were addressed, and where its items are in the walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Turn {
    pub slot: Slot,
    pub serial: u32,
    pub items: Range<usize>,
}

impl Targeted {
    /// Nothing waits to be delivered.
    pub(super) fn is_idle(&self) -> bool {
        self.at == self.walk.len() && self.next.is_empty()
    }

    /// The mark of a connection given an item now (the next walk's).
    pub(super) fn next_mark(&self) -> WalkMark {
        Some(!self.generation)
    }

    /// Whether a connection marked `mark` also has items in the next
    /// walk (and so may be given the batches only up to [`Targeted::next_after`]).
    pub(super) fn waits_for_next(&self, mark: WalkMark) -> bool {
        mark == self.next_mark()
    }

    /// The stream batch the next walk's first item comes before.
    pub(super) fn next_after(&self) -> Option<Seq> {
        self.next.first().map(|a| a.item.after())
    }

    /// The earliest batch a connection with items waiting may be owed.
    pub(super) fn floor(&self) -> Option<Seq> {
        self.floor
    }

    /// Adds `item` for the connection `serial` in `slot`, whose next
    /// stream batch is `cursor`; `earlier` picks the earlier of two
    /// batch numbers.
    pub(super) fn push(
        &mut self,
        slot: Slot,
        serial: u32,
        cursor: Seq,
        item: Item,
        earlier: impl Fn(Seq, Seq) -> Seq,
    ) {
        let order = self.next.len() as u32;
        self.next.push(Addressed {
            slot,
            serial,
            order,
            item,
        });
        self.floor = Some(self.floor.map_or(cursor, |floor| earlier(floor, cursor)));
    }

    /// The next recipient's turn in the walk under way, starting the next
    /// walk when this one is done; `None` when nothing waits.
    pub(super) fn next_turn(&mut self) -> Option<Turn> {
        if self.at == self.walk.len() && !self.begin_walk() {
            return None;
        }
        let first = &self.walk[self.at];
        let (slot, serial) = (first.slot, first.serial);
        let start = self.at;
        let len = self.walk[start..]
            .iter()
            .take_while(|a| a.slot == slot && a.serial == serial)
            .count();
        self.at += len;
        Some(Turn {
            slot,
            serial,
            items: start..self.at,
        })
    }

    /// The items of the walk under way in `range` (from a [`Turn`]).
    pub(super) fn items(&self, range: Range<usize>) -> &[Addressed] {
        &self.walk[range]
    }

    /// Forgets the floor once nothing waits.
    pub(super) fn settle_floor(&mut self) {
        if self.is_idle() {
            self.floor = None;
        }
    }

    /// Makes the items addressed so far the walk under way, sorted by
    /// recipient; `false` if there are none.
    fn begin_walk(&mut self) -> bool {
        if self.next.is_empty() {
            return false;
        }
        std::mem::swap(&mut self.walk, &mut self.next);
        self.next.clear();
        self.at = 0;
        self.generation = !self.generation;
        // An unstable sort on a unique key allocates nothing.
        self.walk
            .sort_unstable_by_key(|a| (a.slot, a.serial, a.order));
        true
    }
}

impl Server {
    /// Addresses a batch of messages to `to`'s open connections now.
    pub(super) fn address_frames(&mut self, to: &Recipients, frames: SharedFrames) {
        let after = self.stream.next_seq();
        self.address(to, || Item::Frames {
            after,
            frames: frames.clone(),
        });
    }

    /// Addresses a close to `whom`'s open connections now.
    pub(super) fn address_close(&mut self, whom: &Recipients, code: CloseCode, reason: &str) {
        let after = self.stream.next_seq();
        let reason: Arc<str> = reason.into();
        self.address(whom, || Item::Close {
            after,
            code,
            reason: Arc::clone(&reason),
        });
    }

    /// Gives each of `to`'s open connections an item, and marks it as
    /// waiting for the next walk.
    fn address(&mut self, to: &Recipients, item: impl Fn() -> Item) {
        self.find_recipients(to);
        let recipients = std::mem::take(&mut self.targeted.recipients);
        let mark = self.targeted.next_mark();
        let stream = &self.stream;
        for &slot in &recipients {
            let key = ConnKey(slot as usize);
            let Some(conn) = self.conns.get_mut(key.0) else {
                continue;
            };
            let Some(cursor) = conn.next_batch() else {
                continue;
            };
            conn.mark_walk(mark);
            let serial = conn.serial();
            self.targeted
                .push(slot, serial, cursor, item(), |a, b| stream.earlier(a, b));
        }
        self.targeted.recipients = recipients;
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
                    Metrics::incr(&metrics.subscriptions_refused);
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
                let holder = conns.get(conn.slot as usize);
                if conn.instance == self.config.instance
                    && holder.is_some_and(|c| c.serial() == conn.serial)
                    && open(&conn.slot)
                {
                    recipients.push(conn.slot);
                }
            }
        }
        if recipients.is_empty() {
            Metrics::incr(&self.shared.metrics.commands_unmatched);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ws::OpCode;

    fn frames(text: &str, after: Seq) -> Item {
        Item::Frames {
            after,
            frames: SharedFrames::encode(OpCode::Text, text.as_bytes()),
        }
    }

    fn text(a: &Addressed) -> u8 {
        match &a.item {
            Item::Frames { frames, .. } => frames.bytes()[2],
            Item::Close { .. } => b'!',
        }
    }

    fn min(a: Seq, b: Seq) -> Seq {
        a.min(b)
    }

    #[test]
    fn a_walk_visits_each_recipient_once_in_key_order_with_its_items_in_order() {
        let mut targeted = Targeted::default();
        assert!(targeted.is_idle() && targeted.next_turn().is_none());
        for (slot, text) in [(5, "a"), (2, "b"), (5, "c"), (9, "d"), (2, "e")] {
            targeted.push(slot, 1, 0, frames(text, 0), min);
        }
        let mut visits = Vec::new();
        while let Some(turn) = targeted.next_turn() {
            let texts: Vec<u8> = targeted.items(turn.items).iter().map(text).collect();
            visits.push((turn.slot, String::from_utf8(texts).unwrap()));
        }
        assert_eq!(
            visits,
            [(2, "be".into()), (5, "ac".into()), (9, "d".into())]
        );
        assert!(targeted.is_idle());
    }

    #[test]
    fn items_addressed_during_a_walk_wait_for_the_next_one_under_the_other_mark() {
        let mut targeted = Targeted::default();
        let first = targeted.next_mark();
        targeted.push(1, 7, 3, frames("a", 3), min);
        targeted.push(2, 7, 3, frames("b", 3), min);
        let turn = targeted.next_turn().unwrap();
        assert_eq!(turn.slot, 1);
        // The walk is under way: a new item waits for the next one.
        assert!(!targeted.waits_for_next(first));
        let second = targeted.next_mark();
        assert_ne!(first, second);
        targeted.push(2, 7, 4, frames("c", 5), min);
        assert!(targeted.waits_for_next(second));
        assert_eq!(targeted.next_after(), Some(5));
        assert_eq!(targeted.floor(), Some(3));
        let turn = targeted.next_turn().unwrap();
        assert_eq!((turn.slot, turn.items.len()), (2, 1), "b only");
        let turn = targeted.next_turn().unwrap();
        assert_eq!(text(&targeted.items(turn.items)[0]), b'c');
        assert_eq!(targeted.next_mark(), first, "marks alternate");
        assert!(targeted.next_turn().is_none());
        targeted.settle_floor();
        assert_eq!(targeted.floor(), None);
    }

    #[test]
    fn a_later_connection_in_the_same_slot_has_a_turn_of_its_own() {
        let mut targeted = Targeted::default();
        targeted.push(4, 1, 0, frames("a", 0), min);
        targeted.push(4, 2, 0, frames("b", 0), min);
        let old = targeted.next_turn().unwrap();
        let new = targeted.next_turn().unwrap();
        assert_eq!((old.slot, old.serial, new.slot, new.serial), (4, 1, 4, 2));
        assert_eq!(text(&targeted.items(new.items)[0]), b'b');
    }
}

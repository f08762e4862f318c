//! Messages and closes for some connections: a channel's subscribers, a
//! client id's connections, one connection. They never go through the
//! pass over every connection. As the loop takes them from the feed, each
//! is addressed to its recipients, found through the routes (see
//! `directory`), as an item
//! "after stream batch N, this". A walk then visits the recipients in key
//! order, a budgeted slice per loop iteration like the pass (see
//! `walk`), and gives each one everything it is owed in one visit: the
//! broadcast batches framed before each of its items, its items, and the
//! batches after them.
//!
//! Items addressed while a walk is under way join it when their recipient
//! is ahead of it (as a broadcast framed during a pass reaches the
//! connections ahead of the pass in that pass), so that a burst taken in
//! several steps still costs each recipient one visit; items for
//! recipients the walk has passed wait for the next walk, in order. A
//! connection with items waiting is marked with the walk that holds its
//! last ones (a parity bit, see [`WalkMark`]): the pass leaves it alone,
//! so that no broadcast framed after an item reaches it first, and a visit
//! of the walk before gives it the batches only up to the next walk's
//! first item.

use crate::server::owed::{Addressed, Item, Seq, WalkMark};
use crate::server::routes::Slot;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::time::Instant;

/// The targeted items on their way, and the loop's scratch space for
/// addressing them (capacities kept from step to step).
#[derive(Debug, Default)]
pub(crate) struct Targeted {
    /// The walk under way: its items by recipient (slot, then serial),
    /// each recipient's in the order addressed.
    walk: Vec<Addressed>,
    /// The first item of the walk not visited yet.
    at: usize,
    /// Items addressed since the walk's last turn to recipients it has
    /// not reached: they join it at its next turn.
    joining: Vec<Addressed>,
    /// Items addressed since the walk began to recipients it has passed,
    /// in order: the next walk's.
    next: Vec<Addressed>,
    /// The order of the next item addressed.
    order: u32,
    /// The parity of the walk under way.
    generation: bool,
    /// The earliest stream batch a connection with items waiting may
    /// still be owed (the stream keeps it).
    floor: Option<Seq>,
    /// The recipients of the command being addressed (see `directory`).
    pub(crate) recipients: Vec<Slot>,
    /// Connections whose replay waits (see
    /// [`Left`](crate::server::owed::Left)), by slot. Such a
    /// connection takes no part in walks meanwhile, and items addressed
    /// to it join those it has parked here.
    parked: HashMap<Slot, Parked>,
    /// The connections parked until the loop frames a position, with
    /// when they stop waiting, earliest first (entries of those released
    /// since are skipped when they come up).
    waits: VecDeque<(Instant, Slot, u32)>,
}

/// Room kept for waits once none is left (more is given back).
const WAITS_KEPT: usize = 64;

/// What a connection's replay waits for before it goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// Its queue to drain (the socket took what it was given).
    Drained,
    /// The loop to have framed up to `through` (the client came from an
    /// instance or host further on), by `by` at the latest (see
    /// [`Targeted::overdue`]).
    Framed {
        /// The last position the client had.
        through: u64,
        /// When it stops waiting.
        by: Instant,
    },
}

/// A connection's items left, waiting.
#[derive(Debug)]
struct Parked {
    serial: u32,
    items: Vec<Addressed>,
    until: Until,
}

/// One recipient's turn in a walk: the connection that held `slot` when
/// the items were addressed, and where its items are in the walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Turn {
    pub slot: Slot,
    pub serial: u32,
    pub items: Range<usize>,
}

impl Targeted {
    /// Nothing waits to be delivered.
    pub(crate) fn is_idle(&self) -> bool {
        self.at == self.walk.len() && self.next.is_empty() && self.joining.is_empty()
    }

    /// The mark of a connection with items in the next walk.
    fn next_mark(&self) -> WalkMark {
        WalkMark::Walk(!self.generation)
    }

    /// Whether a connection marked `mark` also has items in the next
    /// walk (and so may be given the batches only up to [`Targeted::next_after`]).
    pub(crate) fn waits_for_next(&self, mark: WalkMark) -> bool {
        mark == self.next_mark()
    }

    /// The stream batch the next walk's first item comes before.
    pub(crate) fn next_after(&self) -> Option<Seq> {
        self.next.first().map(|a| a.item.after())
    }

    /// The earliest batch a connection with items waiting may be owed.
    pub(crate) fn floor(&self) -> Option<Seq> {
        self.floor
    }

    /// Adds `item` for the connection `serial` in `slot`, now marked
    /// `mark`, whose next stream batch is `cursor`; `earlier` picks the
    /// earlier of two batch numbers. Returns the connection's mark: the
    /// walk under way's if the item joins it, else the next one's.
    pub(crate) fn push(
        &mut self,
        (slot, serial, mark): (Slot, u32, WalkMark),
        cursor: Seq,
        item: Item,
        earlier: impl Fn(Seq, Seq) -> Seq,
    ) -> WalkMark {
        let addressed = Addressed {
            slot,
            serial,
            order: self.order,
            item,
        };
        self.order = self.order.wrapping_add(1);
        self.floor = Some(self.floor.map_or(cursor, |floor| earlier(floor, cursor)));
        if let Some(parked) = self.parked.get_mut(&slot).filter(|p| p.serial == serial) {
            parked.items.push(addressed);
            return mark;
        }
        let ahead = self.walk.get(self.at).is_some_and(|a| slot >= a.slot);
        if ahead && mark != self.next_mark() {
            self.joining.push(addressed);
            WalkMark::Walk(self.generation)
        } else {
            self.next.push(addressed);
            self.next_mark()
        }
    }

    /// The next recipient's turn in the walk under way (with the items
    /// that joined it), starting the next walk when this one is done;
    /// `None` when nothing waits.
    pub(crate) fn next_turn(&mut self) -> Option<Turn> {
        if !self.joining.is_empty() {
            self.walk.drain(..self.at);
            self.at = 0;
            self.walk.append(&mut self.joining);
            Targeted::sort(&mut self.walk);
        }
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
    pub(crate) fn items(&self, range: Range<usize>) -> &[Addressed] {
        &self.walk[range]
    }

    /// Forgets the floor (and restarts the order) once nothing waits.
    pub(crate) fn settle_floor(&mut self) {
        if self.is_idle() && self.parked.is_empty() {
            self.floor = None;
            self.order = 0;
        }
    }

    /// Takes back what a visit left of a connection's items: parked
    /// until what `park` says, or for the next walk. Returns the
    /// connection's mark.
    pub(crate) fn leave(
        &mut self,
        (slot, serial, mark): (Slot, u32, WalkMark),
        items: Vec<Addressed>,
        park: Option<Until>,
    ) -> WalkMark {
        if let Some(until) = park {
            if let Until::Framed { by, .. } = until {
                self.waits.push_back((by, slot, serial));
            }
            let parked = Parked {
                serial,
                items,
                until,
            };
            self.parked.insert(slot, parked);
            return match mark {
                WalkMark::Unmarked => WalkMark::Walk(self.generation),
                marked => marked,
            };
        }
        for addressed in items {
            self.next.push(Addressed {
                order: self.order,
                ..addressed
            });
            self.order = self.order.wrapping_add(1);
        }
        self.next_mark()
    }

    /// The items the connection `serial` in `slot` parked until its
    /// queue drained, if any, now for the next walk; returns the
    /// connection's mark then.
    pub(crate) fn unpark(&mut self, slot: Slot, serial: u32) -> Option<WalkMark> {
        let parked = self.parked.get(&slot)?;
        if parked.serial != serial || parked.until != Until::Drained {
            return None;
        }
        let parked = self.parked.remove(&slot).expect("parked");
        Some(self.leave((slot, serial, WalkMark::Unmarked), parked.items, None))
    }

    /// The connections whose items waited for the loop to frame up to
    /// `framed` or less: their items are now for the next walk. Returns
    /// each one's slot, serial and mark then.
    pub(crate) fn framed(&mut self, framed: u64) -> Vec<(Slot, u32, WalkMark)> {
        let due =
            |p: &Parked| matches!(p.until, Until::Framed { through, .. } if through <= framed);
        let slots: Vec<Slot> = self
            .parked
            .iter()
            .filter(|(_, p)| due(p))
            .map(|(slot, _)| *slot)
            .collect();
        let mut marked = Vec::with_capacity(slots.len());
        for slot in slots {
            let parked = self.parked.remove(&slot).expect("parked");
            let mark = self.leave(
                (slot, parked.serial, WalkMark::Unmarked),
                parked.items,
                None,
            );
            marked.push((slot, parked.serial, mark));
        }
        marked
    }

    /// When the first connection parked until a position is framed stops
    /// waiting, if one is (perhaps one released since: the loop then
    /// finds none overdue).
    pub(crate) fn next_overdue(&self) -> Option<Instant> {
        self.waits.front().map(|&(by, ..)| by)
    }

    /// The connections that waited for the loop to frame a position until
    /// `now` in vain, each one's slot and serial: their items are dropped
    /// (the loop closes them). A client that came with a position this
    /// loop does not reach within the wait (one a host further on gave it,
    /// while this one's feed is cut off) tries again later, perhaps
    /// elsewhere, rather than be kept waiting for good.
    pub(crate) fn overdue(&mut self, now: Instant) -> Vec<(Slot, u32)> {
        let mut overdue = Vec::new();
        while let Some(&(by, slot, serial)) = self.waits.front().filter(|w| w.0 <= now) {
            self.waits.pop_front();
            let waited = |p: &Parked| {
                p.serial == serial && matches!(p.until, Until::Framed { by: b, .. } if b == by)
            };
            if self.parked.get(&slot).is_some_and(waited) {
                self.parked.remove(&slot);
                overdue.push((slot, serial));
            }
        }
        if self.waits.is_empty() {
            self.waits.shrink_to(WAITS_KEPT);
        }
        overdue
    }

    /// Forgets what was parked for the connection in `slot` (closed).
    pub(crate) fn forget(&mut self, slot: Slot) {
        self.parked.remove(&slot);
    }

    /// Whether some connection's items are parked.
    pub(crate) fn has_parked(&self) -> bool {
        !self.parked.is_empty()
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
        Targeted::sort(&mut self.walk);
        true
    }

    /// By recipient, each one's items in the order addressed (an
    /// unstable sort on a unique key allocates nothing).
    fn sort(items: &mut [Addressed]) {
        items.sort_unstable_by_key(|a| (a.slot, a.serial, a.order));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ws::OpCode;
    use crate::server::frames::SharedFrames;

    fn frames(text: &str, after: Seq) -> Item {
        Item::Frames {
            after,
            frames: SharedFrames::encode(OpCode::Text, text.as_bytes()),
        }
    }

    fn text(a: &Addressed) -> u8 {
        match &a.item {
            Item::Frames { frames, .. } => frames.bytes()[2],
            Item::Close { .. } | Item::Replay { .. } => b'!',
        }
    }

    fn min(a: Seq, b: Seq) -> Seq {
        Seq(a.0.min(b.0))
    }

    #[test]
    fn a_walk_visits_each_recipient_once_in_key_order_with_its_items_in_order() {
        let mut targeted = Targeted::default();
        assert!(targeted.is_idle() && targeted.next_turn().is_none());
        for (slot, text) in [(5, "a"), (2, "b"), (5, "c"), (9, "d"), (2, "e")] {
            targeted.push(
                (slot, 1, WalkMark::Unmarked),
                Seq(0),
                frames(text, Seq(0)),
                min,
            );
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
    fn items_addressed_during_a_walk_join_it_ahead_of_it_and_wait_for_the_next_behind() {
        let mut targeted = Targeted::default();
        let first = targeted.push((1, 7, WalkMark::Unmarked), Seq(3), frames("a", Seq(3)), min);
        let two = targeted.push((2, 7, WalkMark::Unmarked), Seq(3), frames("b", Seq(3)), min);
        assert_eq!(first, two);
        targeted.push((3, 7, WalkMark::Unmarked), Seq(3), frames("c", Seq(3)), min);
        let turn = targeted.next_turn().unwrap();
        assert_eq!(turn.slot, 1);
        // The walk is at slot 2: slot 1 is behind it, slots 2 and 4 ahead.
        let behind = targeted.push((1, 7, first), Seq(4), frames("d", Seq(5)), min);
        assert_ne!(behind, first, "the next walk's");
        assert!(targeted.waits_for_next(behind));
        assert_eq!(
            targeted.push((2, 7, two), Seq(4), frames("e", Seq(5)), min),
            two
        );
        assert_eq!(
            targeted.push((4, 7, WalkMark::Unmarked), Seq(4), frames("f", Seq(5)), min),
            first
        );
        assert_eq!(targeted.next_after(), Some(Seq(5)));
        assert_eq!(targeted.floor(), Some(Seq(3)));
        let mut visits = Vec::new();
        while let Some(turn) = targeted.next_turn() {
            let texts: Vec<u8> = targeted.items(turn.items).iter().map(text).collect();
            visits.push((turn.slot, String::from_utf8(texts).unwrap()));
        }
        let expected = [(2, "be"), (3, "c"), (4, "f"), (1, "d")];
        assert_eq!(
            visits,
            expected.map(|(slot, texts)| (slot, texts.to_string()))
        );
        targeted.settle_floor();
        assert_eq!(targeted.floor(), None);
        assert!(targeted.is_idle());
    }

    #[test]
    fn a_later_connection_in_the_same_slot_has_a_turn_of_its_own() {
        let mut targeted = Targeted::default();
        targeted.push((4, 1, WalkMark::Unmarked), Seq(0), frames("a", Seq(0)), min);
        targeted.push((4, 2, WalkMark::Unmarked), Seq(0), frames("b", Seq(0)), min);
        let old = targeted.next_turn().unwrap();
        let new = targeted.next_turn().unwrap();
        assert_eq!((old.slot, old.serial, new.slot, new.serial), (4, 1, 4, 2));
        assert_eq!(text(&targeted.items(new.items)[0]), b'b');
    }
}

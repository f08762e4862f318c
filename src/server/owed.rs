//! The words a delivery visit is given in, below the connection that
//! takes it (the walk that gives it, and everything else of delivery, is
//! `walk`): the broadcast batches a connection has not had yet, up to a
//! point, and its own items (a message for some connections, a close, the
//! replay of what it missed), each placed after the batches framed before
//! it was addressed; what a visit could not give; and the two marks a
//! connection keeps of its place in the walk.

use std::sync::Arc;

use crate::protocol::ws::CloseCode;
use crate::server::frames::SharedFrames;
use crate::server::history::Replay;
use crate::server::routes::Slot;

/// A batch's number. Numbers wrap around; a connection is never owed more
/// than the batches kept, so distances stay small. Four bytes in each
/// connection's slot (its next one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seq(pub u32);

impl Seq {
    /// The number `n` batches after this one.
    pub fn plus(self, n: usize) -> Seq {
        Seq(self.0.wrapping_add(n as u32))
    }

    /// How many batches this one is after `from` (counting round the wrap).
    pub fn since(self, from: Seq) -> usize {
        self.0.wrapping_sub(from.0) as usize
    }
}

/// Which walk a connection's last items are in: the connection keeps the
/// walk's parity while it has items waiting (one byte in its padding).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WalkMark {
    /// No items wait for it.
    #[default]
    Unmarked,
    /// Its last items are in the walk of this parity.
    Walk(bool),
}

impl WalkMark {
    /// Whether items wait for it.
    pub fn is_marked(self) -> bool {
        self != WalkMark::Unmarked
    }
}

/// A connection's own item, after every stream batch before `after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// Frames shared with the other recipients.
    Frames {
        /// The stream batch framed next when it was addressed.
        after: Seq,
        /// The messages, framed once for every recipient.
        frames: SharedFrames,
    },
    /// A close frame with this code and reason.
    Close {
        /// The stream batch framed next when it was addressed.
        after: Seq,
        /// The close code.
        code: CloseCode,
        /// The reason, shared by the recipients.
        reason: Arc<str>,
    },
    /// The messages of the history a resuming connection missed, before
    /// its live ones (a visit may give part of them: see
    /// [`Left`]).
    Replay {
        /// The stream batch it started at, when it upgraded.
        after: Seq,
        /// What is left of the replay.
        replay: Replay,
    },
}

impl Item {
    /// The stream batch it comes before.
    pub fn after(&self) -> Seq {
        match self {
            Item::Frames { after, .. } | Item::Close { after, .. } | Item::Replay { after, .. } => {
                *after
            }
        }
    }
}

/// What a visit could not give of a connection's items: the replay at
/// `at` among them, from position `from` on (more than its queue had room
/// for, or ahead of this loop), and the items after it. The walk takes
/// them back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    /// Where the replay is among the items the visit was given.
    pub at: usize,
    /// The first position of the replay not given.
    pub from: u64,
}

/// The broadcast batches a visit may give: a window of the stream, whose
/// first batch is numbered `first`.
#[derive(Debug, Clone, Copy)]
pub struct Batches<'a> {
    /// The number of `log[0]`.
    pub first: Seq,
    /// The batches kept.
    pub log: &'a [SharedFrames],
}

impl<'a> Batches<'a> {
    /// The batches from `from` up to (not including) `to`.
    pub fn between(&self, from: Seq, to: Seq) -> &'a [SharedFrames] {
        let start = from.since(self.first);
        let end = to.since(self.first);
        debug_assert!(
            start <= end && end <= self.log.len(),
            "bug: outside the stream"
        );
        &self.log[start.min(end)..end.min(self.log.len())]
    }
}

/// An item addressed to one connection: its slot, the serial of the
/// connection that held the slot then (a later one in the same slot gets
/// none of it), and the order it was addressed in.
#[derive(Debug, Clone)]
pub struct Addressed {
    /// The recipient's slot.
    pub slot: Slot,
    /// The recipient's serial (see [`Conn::serial`](crate::server::conn::Conn::serial)).
    pub serial: u32,
    /// The order of addressing, among the items of one walk.
    pub order: u32,
    /// What it gets.
    pub item: Item,
}

/// What one visit gives a connection.
#[derive(Debug, Clone, Copy)]
pub struct Owed<'a> {
    /// The broadcast batches.
    pub batches: Batches<'a>,
    /// Its own items, in the order addressed (empty on the pass).
    pub items: &'a [Addressed],
    /// The stream batches before this one are given, those from it on
    /// wait for a later visit.
    pub up_to: Seq,
}

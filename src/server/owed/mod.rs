//! What a connection is owed when a delivery visits it (see `deliver`):
//! the broadcast batches of the `stream` it has not had yet, up to a
//! point, and its own items (`targeted`: a message for some connections,
//! a close, the replay of what it missed), each placed after the batches
//! framed before it was addressed.

pub(crate) mod stream;
pub(crate) mod targeted;

use std::sync::Arc;

use crate::protocol::ws::CloseCode;
use crate::server::frames::SharedFrames;
use crate::server::history::Replay;
use crate::server::owed::stream::{Seq, Stream};
use crate::server::routes::Slot;

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
    /// [`Unfinished`]).
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

/// What a visit left of a connection's items: the first of them not
/// given in full (a replay, what is left of it), and those after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    /// Where the items left begin among those the visit was given.
    pub at: usize,
    /// What is left of that item.
    pub item: Item,
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
    pub stream: &'a Stream,
    /// Its own items, in the order addressed (empty on the pass).
    pub items: &'a [Addressed],
    /// The stream batches before this one are given, those from it on
    /// wait for a later visit.
    pub up_to: Seq,
}

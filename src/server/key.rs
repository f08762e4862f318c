//! The name of a connection: its key in the loop.

use mio::Token;

use crate::protocol::commands::ConnRef;

/// A connection's key: its slot in the slab and its token in the poll.
/// Unique among one server's connections while it is open; a later
/// connection may get it again after it closes. Shown as a number in logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ConnKey(pub(crate) usize);

impl std::fmt::Display for ConnKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<ConnKey> for Token {
    fn from(key: ConnKey) -> Token {
        Token(key.0)
    }
}

impl ConnKey {
    /// The slot, as the routes index it.
    pub(crate) fn slot(self) -> u32 {
        self.0 as u32
    }
}

/// Which connection holds each slot: a number per slot, new for every
/// connection that takes it, so that a key given out earlier (an
/// upstream line's) never reaches a later connection in the same slot.
#[derive(Debug, Default)]
pub(crate) struct Serials {
    by_slot: Vec<u32>,
    next: u32,
}

impl Serials {
    /// Room for `slots` slots to begin with, as the slab reserves: growing
    /// a large vector leaves the old one's memory behind.
    pub(crate) fn with_capacity(slots: usize) -> Serials {
        Serials {
            by_slot: Vec::with_capacity(slots),
            next: 0,
        }
    }

    /// Gives the connection that now holds `slot` its serial.
    pub(crate) fn assign(&mut self, slot: ConnKey) -> u32 {
        if self.by_slot.len() <= slot.0 {
            self.by_slot.resize(slot.0 + 1, 0);
        }
        self.next = self.next.wrapping_add(1);
        self.by_slot[slot.0] = self.next;
        self.next
    }

    /// The key of the connection in `slot` of instance `instance`.
    pub(crate) fn conn_ref(&self, slot: ConnKey, instance: u32) -> ConnRef {
        ConnRef {
            instance,
            slot: slot.0 as u32,
            serial: self.get(slot),
        }
    }

    /// The serial of the connection in `slot`.
    pub(crate) fn get(&self, slot: ConnKey) -> u32 {
        self.by_slot.get(slot.0).copied().unwrap_or(0)
    }
}

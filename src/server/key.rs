//! The name of a connection: its key in the loop.

use mio::Token;

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

/// Serials for connections: a number new for every connection, kept in
/// the connection, so that a key given out earlier (an upstream line's)
/// never reaches a later connection in the same slot. They start at a
/// random number, so that the processes that hold one instance number in
/// turn (a restart, a replacement beside a draining one) do not give out
/// the same keys.
#[derive(Debug)]
pub(crate) struct Serials {
    next: u32,
}

impl Default for Serials {
    fn default() -> Serials {
        use std::hash::{BuildHasher, Hasher};
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Serials {
            next: random as u32,
        }
    }
}

impl Serials {
    /// The serial of the next connection.
    pub(crate) fn assign(&mut self) -> u32 {
        self.next = self.next.wrapping_add(1);
        self.next
    }
}

//! The name of a connection: its key in the loop.

use mio::Token;

/// A connection's key: its slot in the slab and its token in the poll.
/// Unique among one server's connections while it is open; a later
/// connection may get it again after it closes. Shown as a number in logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnKey(pub(crate) usize);

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

//! What a connection holds only while it is busy, kept out of its slot:
//! the bytes of a request head or frame not consumed yet, and a message
//! being assembled from several pieces. Few connections hold either at
//! once, so each lives in a table keyed by the connection, and the slot
//! keeps one bit for it ([`Flags`](super::Flags)): an idle connection's
//! slot stays small, and its walk never looks here.
//!
//! An entry is the connection's until it gives it back, and a connection
//! gives back everything it holds when it closes, so a slot taken again
//! finds nothing of its earlier holder.

use std::collections::HashMap;

use crate::server::key::ConnKey;
use crate::server::net::pool::PooledBuf;

/// The loop's tables of what connections hold aside, by connection.
#[derive(Debug, Default)]
pub struct Aside {
    /// Received bytes not consumed yet (a partial request head or frame).
    pub(super) held: HashMap<ConnKey, PooledBuf>,
    /// Messages being assembled from several pieces (echoed, sent
    /// upstream or inflated).
    pub(super) messages: HashMap<ConnKey, PooledBuf>,
}

impl Aside {
    /// Connections holding input, and messages being assembled.
    #[cfg(test)]
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.held.len(), self.messages.len())
    }
}

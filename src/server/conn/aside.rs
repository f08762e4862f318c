//! What a connection holds only while it is busy, kept out of its slot:
//! output its socket has not taken yet, the bytes of a request head or
//! frame not consumed yet, and a message being assembled from several
//! pieces. Few connections hold any of them at once, so each lives in a
//! table keyed by the connection, and the slot keeps one bit for it
//! ([`Flags`](super::Flags)): an idle connection's slot stays small, and
//! a walk looks here only for a connection whose bit says so.
//!
//! An entry is the connection's until it gives it back, and a connection
//! gives back everything it holds when it closes, so a slot taken again
//! finds nothing of its earlier holder.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::server::key::ConnKey;
use crate::server::net::pool::PooledBuf;
use crate::server::net::queue::OutQueue;

/// A table by connection.
pub(super) type ByKey<T> = HashMap<ConnKey, T, BuildHasherDefault<KeyHasher>>;

/// The loop's tables of what connections hold aside, by connection.
#[derive(Debug, Default)]
pub struct Aside {
    /// Output queues that are not empty.
    pub(super) queues: ByKey<OutQueue>,
    /// Received bytes not consumed yet (a partial request head or frame).
    pub(super) held: ByKey<PooledBuf>,
    /// Messages being assembled from several pieces (echoed, sent
    /// upstream or inflated).
    pub(super) messages: ByKey<PooledBuf>,
}

/// Hashes a connection's key, a slot number the loop gives out, by one
/// multiplication (Fibonacci hashing): the table's buckets come from the
/// low bits and its tags from the top ones, and both vary with every bit
/// of the slot. Keys are not the peers' to choose, so no keyed hash is
/// needed against flooding.
#[derive(Debug, Default)]
pub(super) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl Aside {
    /// Connections holding input, and messages being assembled.
    #[cfg(test)]
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.held.len(), self.messages.len())
    }

    /// Connections with output queued.
    #[cfg(test)]
    pub(super) fn queues(&self) -> usize {
        self.queues.len()
    }
}

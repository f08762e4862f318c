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

    /// A number of the connection's own (the connection `serial` in this
    /// slot), spread evenly over `u32`: where it falls within a range
    /// that each connection picks a point of (its token's close, its
    /// event stream's `retry:`), so that connections made together do
    /// not act together. The slot and serial are mixed whole (splitmix64's
    /// finalizer): consecutive slots and serials, as a fresh server gives
    /// out, would XOR to one value for dozens of connections at a time.
    pub(crate) fn own_point(self, serial: u32) -> u32 {
        let mut x = (u64::from(self.slot()) << 32) | u64::from(serial);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((x ^ (x >> 31)) >> 32) as u32
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_made_together_get_points_spread_over_the_range() {
        // A fresh server gives consecutive slots with consecutive serials
        // from a random start; whatever the start (one whose low bits are
        // all zero among them), 40 connections fall in every tenth of the
        // range but a few.
        for first in [0u32, 63, 1 << 20, u32::MAX - 20, 0x9e37_79b9] {
            let mut tenths = [0u32; 10];
            for k in 0..40u32 {
                let point = ConnKey(k as usize).own_point(first.wrapping_add(k + 1));
                tenths[((u64::from(point) * 10) >> 32) as usize] += 1;
            }
            let used = tenths.iter().filter(|&&n| n > 0).count();
            assert!(used >= 7, "start {first}: {tenths:?}");
            assert!(tenths.iter().all(|&n| n <= 12), "start {first}: {tenths:?}");
        }
    }
}

//! `--max-connections-per-ip`: how many connections each client address
//! holds. Kept beside the slab (indexed by connection key) rather than in
//! each connection, so a server without the limit pays nothing for it.

use crate::server::key::ConnKey;
use std::collections::HashMap;
use std::net::IpAddr;

/// Connection counts per client address, with a limit.
#[derive(Debug)]
pub struct PerIpLimit {
    limit: usize,
    counts: HashMap<IpAddr, usize>,
    /// The address each connection key was admitted for.
    by_key: Vec<Option<IpAddr>>,
}

/// The address already holds its maximum number of connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverLimit;

impl PerIpLimit {
    /// Allows `limit` connections per address.
    pub fn new(limit: usize) -> PerIpLimit {
        PerIpLimit {
            limit,
            counts: HashMap::new(),
            by_key: Vec::new(),
        }
    }

    /// Counts connection `key` from `ip`, unless `ip` is at the limit.
    pub fn admit(&mut self, key: ConnKey, ip: IpAddr) -> Result<(), OverLimit> {
        let count = self.counts.entry(ip).or_insert(0);
        if *count >= self.limit {
            return Err(OverLimit);
        }
        *count += 1;
        let index = key.0;
        if self.by_key.len() <= index {
            self.by_key.resize(index + 1, None);
        }
        debug_assert!(
            self.by_key[index].is_none(),
            "bug: key {key} admitted twice"
        );
        self.by_key[index] = Some(ip);
        Ok(())
    }

    /// Forgets connection `key` (a key never admitted is ignored).
    pub fn release(&mut self, key: ConnKey) {
        let Some(ip) = self.by_key.get_mut(key.0).and_then(Option::take) else {
            return;
        };
        if let Some(count) = self.counts.get_mut(&ip) {
            *count -= 1;
            if *count == 0 {
                self.counts.remove(&ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_address_up_to_the_limit_and_forgets_on_release() {
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "::1".parse().unwrap());
        let mut limit = PerIpLimit::new(2);
        assert_eq!(limit.admit(ConnKey(0), a), Ok(()));
        assert_eq!(limit.admit(ConnKey(5), a), Ok(()));
        assert_eq!(limit.admit(ConnKey(1), a), Err(OverLimit));
        assert_eq!(limit.admit(ConnKey(1), b), Ok(()));
        assert_eq!((limit.counts[&a], limit.counts[&b]), (2, 1));
        limit.release(ConnKey(0));
        limit.release(ConnKey(0));
        limit.release(ConnKey(99));
        assert_eq!(limit.counts[&a], 1);
        assert_eq!(limit.admit(ConnKey(0), a), Ok(()));
        for key in [0, 1, 5] {
            limit.release(ConnKey(key));
        }
        assert!(
            limit.counts.is_empty(),
            "no entry is kept for a gone address"
        );
    }
}

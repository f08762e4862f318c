//! What the connections received: the [`Ledger`] every receipt comes back
//! to, and the [`Checks`] that judge each connection's messages.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::client::receipts::Event;
use crate::observe::format::grouped;
use crate::observe::stats;

/// Sequence number of the closing `all` of `fanout` (messages count from 1).
pub const SENTINEL: u32 = 0;

/// Where the receipts of one message stand.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Arrival {
    pub(super) count: u32,
    pub(super) first_ns: u64,
    pub(super) last_ns: u64,
}

/// Every receipt of a run's connections, by connection and by message.
#[derive(Debug)]
pub struct Ledger {
    /// Sequence numbers each connection received, in order.
    pub(super) per_conn: Vec<Vec<u32>>,
    pub(super) per_seq: HashMap<u32, Arrival>,
    /// Connections that failed after the setup.
    pub(super) lost: BTreeSet<u64>,
    lost_kinds: BTreeMap<String, u64>,
    pub(super) corrupt: u64,
    pub(super) received: u64,
    pub(super) last_ns: u64,
    /// Send-to-receipt times of the messages (not the sentinel).
    pub(super) histogram: Histogram<u64>,
}

impl Ledger {
    /// An empty ledger for `conns` connections.
    pub fn new(conns: u64) -> Ledger {
        Ledger {
            per_conn: vec![Vec::new(); conns as usize],
            per_seq: HashMap::new(),
            lost: BTreeSet::new(),
            lost_kinds: BTreeMap::new(),
            corrupt: 0,
            received: 0,
            last_ns: 0,
            histogram: stats::new_histogram(),
        }
    }

    /// Records what a worker reported.
    pub fn absorb(&mut self, event: Event) {
        match event {
            Event::Got(receipts) => {
                for (conn, seq, sent_ns, recv_ns) in receipts {
                    if let Some(seqs) = self.per_conn.get_mut(conn as usize) {
                        seqs.push(seq);
                    }
                    let a = self.per_seq.entry(seq).or_default();
                    a.count += 1;
                    if a.first_ns == 0 {
                        a.first_ns = recv_ns;
                    }
                    a.last_ns = a.last_ns.max(recv_ns);
                    self.received += 1;
                    self.last_ns = self.last_ns.max(recv_ns);
                    if seq != SENTINEL {
                        let ns = recv_ns
                            .saturating_sub(sent_ns)
                            .clamp(1, stats::MAX_LATENCY_NS);
                        self.histogram.record(ns).expect("clamped into range");
                    }
                }
            }
            Event::Lost { conn, why } => {
                self.lost.insert(conn);
                *self.lost_kinds.entry(why).or_default() += 1;
            }
            Event::Corrupt { .. } => self.corrupt += 1,
        }
    }

    pub(super) fn count(&self, seq: u32) -> u32 {
        self.per_seq.get(&seq).map_or(0, |a| a.count)
    }

    /// Of `conns`, those still open.
    pub(super) fn alive(&self, conns: &[u64]) -> u32 {
        conns.iter().filter(|c| !self.lost.contains(c)).count() as u32
    }
}

/// Delivery checks over the connections of a run: each had a list of
/// messages to get, in order.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Checks {
    /// Deliveries expected.
    pub expected: u64,
    /// Messages received (all of them).
    pub received: u64,
    /// Expected deliveries that did not happen.
    pub missing: u64,
    /// Messages a connection got that were not for it.
    pub unexpected: u64,
    /// Messages a connection got more than once.
    pub duplicates: u64,
    /// Connections whose messages came in another order.
    pub out_of_order: u64,
    /// Payloads that were not a message.
    pub corrupt: u64,
    /// Connections that failed after the setup (not checked).
    pub lost: u64,
}

impl Checks {
    /// Whether every delivery was right.
    pub fn clean(&self) -> bool {
        self.missing == 0
            && self.unexpected == 0
            && self.duplicates == 0
            && self.out_of_order == 0
            && self.corrupt == 0
    }

    /// Adds what one connection got against what it should have, in order.
    pub fn add(&mut self, got: &[u32], expected: &[u32]) {
        self.expected += expected.len() as u64;
        self.received += got.len() as u64;
        let wanted: BTreeSet<u32> = expected.iter().copied().collect();
        let mut seen: BTreeMap<u32, u64> = BTreeMap::new();
        for &g in got {
            *seen.entry(g).or_default() += 1;
        }
        for (g, &n) in &seen {
            if !wanted.contains(g) {
                self.unexpected += n;
            } else if n > 1 {
                self.duplicates += n - 1;
            }
        }
        self.missing += wanted.iter().filter(|e| !seen.contains_key(e)).count() as u64;
        // Order: the first receipt of each expected message, against the
        // expected ones that came.
        let mut firsts = Vec::with_capacity(expected.len());
        let mut placed = BTreeSet::new();
        for &g in got {
            if wanted.contains(&g) && placed.insert(g) {
                firsts.push(g);
            }
        }
        let came: Vec<u32> = expected
            .iter()
            .copied()
            .filter(|e| seen.contains_key(e))
            .collect();
        if firsts != came {
            self.out_of_order += 1;
        }
    }

    /// One line.
    pub(super) fn render(&self) -> String {
        format!(
            "{} of {} expected; missing {}, not theirs {}, duplicates {}, out of order {}, corrupt {}, connections lost {}{}",
            grouped(self.received),
            grouped(self.expected),
            self.missing,
            self.unexpected,
            self.duplicates,
            self.out_of_order,
            self.corrupt,
            self.lost,
            if self.clean() { " (clean)" } else { " (NOT CLEAN)" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_count_what_went_wrong() {
        let mut c = Checks::default();
        c.add(&[1, 2, 3, 0], &[1, 2, 3, 0]);
        assert!(c.clean());
        assert_eq!((c.expected, c.received), (4, 4));
        c.add(&[0], &[0]);
        c.add(&[], &[]);
        assert!(c.clean());

        let mut c = Checks::default();
        c.add(&[5, 0], &[0]);
        assert_eq!(c.unexpected, 1);
        assert!(!c.clean());

        let mut c = Checks::default();
        c.add(&[1, 1, 3], &[1, 2, 3]);
        assert_eq!((c.missing, c.duplicates, c.out_of_order), (1, 1, 0));

        let mut c = Checks::default();
        c.add(&[2, 1], &[1, 2]);
        assert_eq!((c.missing, c.out_of_order), (0, 1));
        c.add(&[], &[7]);
        assert_eq!(c.missing, 1);
    }
}

//! What the clients observe while messages arrive: per-message progress,
//! delivery anomalies, the latency histogram, and connection failures by kind.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use crate::message::Stamp;

/// Highest latency the histogram records exactly (60 s); larger values are clamped.
const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// Progress of one broadcast message across all connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageProgress {
    /// When the line was written to the server ([`crate::sys::now_ns`]).
    pub sent_ns: u64,
    /// Connections that were open when it was sent.
    pub expected: u32,
    /// Connections that have received it (in order or after a skip).
    pub received: u32,
    /// Time of the first receipt recorded, 0 while nobody has received it.
    pub first_ns: u64,
    /// Latest receipt so far, 0 while nobody has received it.
    pub last_ns: u64,
}

/// How a delivery relates to what its connection had received before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The next message in sequence.
    Next,
    /// A later message than the next one: some were skipped.
    Skipped,
    /// A message this connection already got, or an earlier one it skipped.
    Duplicate,
}

/// Everything the clients observe while messages arrive.
#[derive(Debug)]
pub struct Tally {
    messages: Vec<MessageProgress>,
    latency: Histogram<u64>,
    /// Deliveries that repeat or go back in the sequence.
    pub duplicates: u64,
    /// Deliveries that jumped ahead in the sequence.
    pub out_of_order: u64,
    /// Messages that were not a valid stamp, or named a message never sent.
    pub corrupt: u64,
    /// Connection failures by kind.
    pub failures: BTreeMap<String, u64>,
}

impl Default for Tally {
    fn default() -> Self {
        Self::new()
    }
}

impl Tally {
    /// An empty tally.
    pub fn new() -> Self {
        Tally {
            messages: Vec::new(),
            latency: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)
                .expect("valid histogram bounds"),
            duplicates: 0,
            out_of_order: 0,
            corrupt: 0,
            failures: BTreeMap::new(),
        }
    }

    /// Registers message `seq` (which must be the next one) as sent at
    /// `sent_ns` to `expected` open connections.
    pub fn sent(&mut self, seq: u32, sent_ns: u64, expected: u32) {
        assert_eq!(
            seq as usize,
            self.messages.len() + 1,
            "messages are sent in order"
        );
        self.messages.push(MessageProgress {
            sent_ns,
            expected,
            received: 0,
            first_ns: 0,
            last_ns: 0,
        });
    }

    /// Progress of message `seq` (from 1), if it was sent.
    pub fn message(&self, seq: u32) -> Option<&MessageProgress> {
        self.messages.get((seq as usize).checked_sub(1)?)
    }

    /// Progress of every message sent so far, in order.
    pub fn messages(&self) -> &[MessageProgress] {
        &self.messages
    }

    /// Latency from send to receipt over all deliveries, in nanoseconds.
    pub fn latency(&self) -> &Histogram<u64> {
        &self.latency
    }

    /// Records a delivery received at `received_ns`; returns false (and counts
    /// it as corrupt) if it names a message that was never sent.
    pub fn delivered(&mut self, stamp: Stamp, order: Order, received_ns: u64) -> bool {
        let Some(progress) = (stamp.seq as usize)
            .checked_sub(1)
            .and_then(|i| self.messages.get_mut(i))
        else {
            self.corrupt += 1;
            return false;
        };
        match order {
            Order::Duplicate => {
                self.duplicates += 1;
                return true;
            }
            Order::Skipped => self.out_of_order += 1,
            Order::Next => {}
        }
        progress.received += 1;
        if progress.first_ns == 0 {
            progress.first_ns = received_ns;
        }
        progress.last_ns = progress.last_ns.max(received_ns);
        let latency = received_ns
            .saturating_sub(stamp.sent_ns)
            .clamp(1, MAX_LATENCY_NS);
        self.latency.record(latency).expect("latency within bounds");
        true
    }

    /// Deliveries that never happened: for every message, the connections
    /// open when it was sent that have not received it.
    pub fn lost(&self) -> u64 {
        self.messages
            .iter()
            .map(|m| u64::from(m.expected.saturating_sub(m.received)))
            .sum()
    }

    /// Counts one connection failure of `kind`.
    pub fn failed(&mut self, kind: String) {
        *self.failures.entry(kind).or_insert(0) += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(seq: u32, sent_ns: u64) -> Stamp {
        Stamp { seq, sent_ns }
    }

    #[test]
    fn tracks_first_and_last_receipt_and_latency() {
        let mut tally = Tally::new();
        tally.sent(1, 1_000, 3);
        assert!(tally.delivered(stamp(1, 1_000), Order::Next, 5_000));
        assert!(tally.delivered(stamp(1, 1_000), Order::Next, 3_000));
        let m = tally.message(1).unwrap();
        assert_eq!((m.received, m.first_ns, m.last_ns), (2, 5_000, 5_000));
        assert_eq!(tally.latency().len(), 2);
        assert_eq!(tally.latency().min(), 2_000);
        assert_eq!(tally.lost(), 1);
    }

    #[test]
    fn anomalies_are_counted() {
        let mut tally = Tally::new();
        tally.sent(1, 10, 1);
        tally.sent(2, 20, 1);
        assert!(tally.delivered(stamp(2, 20), Order::Skipped, 30));
        assert!(tally.delivered(stamp(1, 10), Order::Duplicate, 40));
        assert!(!tally.delivered(stamp(3, 30), Order::Next, 50));
        assert!(!tally.delivered(stamp(0, 30), Order::Next, 50));
        assert_eq!(
            (tally.out_of_order, tally.duplicates, tally.corrupt),
            (1, 1, 2)
        );
        assert_eq!(tally.message(1).unwrap().received, 0);
        assert_eq!(tally.message(2).unwrap().received, 1);
        assert!(tally.message(0).is_none());
        assert_eq!(tally.lost(), 1);
    }

    #[test]
    fn failures_by_kind() {
        let mut tally = Tally::new();
        tally.failed("connect: refused".into());
        tally.failed("connect: refused".into());
        tally.failed("closed".into());
        assert_eq!(tally.failures["connect: refused"], 2);
        assert_eq!(tally.failures["closed"], 1);
    }
}

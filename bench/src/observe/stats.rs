//! What the clients observe: per-message receipts, delivery anomalies, the
//! latency histogram and connection failures by kind; kept by each worker
//! in a [`Tally`] and merged by the coordinator from [`Observed`] summaries.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest latency the histogram records exactly (60 s); larger values are clamped.
pub const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// An empty latency histogram (ns, 3 significant digits).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid histogram bounds")
}

/// Receipts of one broadcast message by a set of connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipts {
    /// Connections that were open when it was sent.
    pub expected: u32,
    /// Connections that have received it (in order or after a skip).
    pub received: u32,
    /// Time of the earliest receipt ([`crate::observe::sys::now_ns`]), 0 if none.
    pub first_ns: u64,
    /// Time of the latest receipt, 0 if none.
    pub last_ns: u64,
}

impl Receipts {
    /// Adds another set of connections' receipts of the same message.
    pub fn merge(&mut self, other: &Receipts) {
        self.expected += other.expected;
        self.received += other.received;
        self.first_ns = match (self.first_ns, other.first_ns) {
            (0, t) | (t, 0) => t,
            (a, b) => a.min(b),
        };
        self.last_ns = self.last_ns.max(other.last_ns);
    }

    fn record(&mut self, now: u64) {
        self.received += 1;
        if self.first_ns == 0 {
            self.first_ns = now;
        }
        self.last_ns = self.last_ns.max(now);
    }
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

/// Everything a set of connections observed, in a form that can travel
/// between processes and be merged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    /// Receipts of each message, `messages[seq - 1]`.
    pub messages: Vec<Receipts>,
    /// Latency histogram as `(value ns, count)` pairs.
    pub latency: Vec<(u64, u64)>,
    /// Deliveries that repeat or go back in the sequence.
    pub duplicates: u64,
    /// Deliveries that jumped ahead in the sequence.
    pub out_of_order: u64,
    /// Messages that were not a valid stamp, or named a message never sent.
    pub corrupt: u64,
    /// What the message payloads came to: on the wire and plain.
    #[serde(default)]
    pub payloads: Payloads,
    /// Connection failures by kind.
    pub failures: BTreeMap<String, u64>,
    /// What connections that asked for positions were told first, by
    /// status (`position`, `recovered`, `gap`, `unknown`).
    #[serde(default)]
    pub statuses: BTreeMap<String, u64>,
}

/// Message payloads received: how many, how many compressed
/// (permessage-deflate), and their bytes on the wire and once inflated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payloads {
    /// Data messages received.
    pub messages: u64,
    /// Of those, the compressed ones.
    pub compressed: u64,
    /// Their payload bytes as received.
    pub wire_bytes: u64,
    /// Their payload bytes inflated.
    pub plain_bytes: u64,
}

impl Payloads {
    /// Counts one message of `wire` payload bytes, `plain` once inflated.
    pub fn add(&mut self, wire: usize, plain: usize, compressed: bool) {
        self.messages += 1;
        self.compressed += u64::from(compressed);
        self.wire_bytes += wire as u64;
        self.plain_bytes += plain as u64;
    }

    /// Adds another set's counts.
    pub fn merge(&mut self, other: &Payloads) {
        self.messages += other.messages;
        self.compressed += other.compressed;
        self.wire_bytes += other.wire_bytes;
        self.plain_bytes += other.plain_bytes;
    }

    /// Bytes on the wire over bytes plain (1 when nothing was compressed).
    pub fn ratio(&self) -> f64 {
        if self.plain_bytes == 0 {
            return 1.0;
        }
        self.wire_bytes as f64 / self.plain_bytes as f64
    }
}

impl Observed {
    /// Adds another set of connections' observations.
    pub fn merge(&mut self, other: &Observed) {
        if self.messages.len() < other.messages.len() {
            self.messages
                .resize(other.messages.len(), Receipts::default());
        }
        for (mine, theirs) in self.messages.iter_mut().zip(&other.messages) {
            mine.merge(theirs);
        }
        self.latency.extend_from_slice(&other.latency);
        self.duplicates += other.duplicates;
        self.out_of_order += other.out_of_order;
        self.corrupt += other.corrupt;
        self.payloads.merge(&other.payloads);
        for (kind, n) in &other.failures {
            *self.failures.entry(kind.clone()).or_insert(0) += n;
        }
        for (status, n) in &other.statuses {
            *self.statuses.entry(status.clone()).or_insert(0) += n;
        }
    }

    /// The latency histogram (ns).
    pub fn histogram(&self) -> Histogram<u64> {
        histogram_of(&self.latency)
    }

    /// Deliveries that never happened: for every message, the connections
    /// open when it was sent that did not receive it.
    pub fn lost(&self) -> u64 {
        self.messages
            .iter()
            .map(|m| u64::from(m.expected.saturating_sub(m.received)))
            .sum()
    }

    /// Connection failures of every kind together.
    pub fn failed(&self) -> u64 {
        self.failures.values().sum()
    }
}

/// A stream being collected: messages `first .. first + count`, sent
/// without waiting for each other; their deliveries and latencies are
/// counted apart from the messages sent one at a time.
#[derive(Debug)]
struct Stream {
    first: u32,
    count: u32,
    received: u64,
    last_ns: u64,
    latency: Histogram<u64>,
    /// When dropped connections were dialed again during it.
    redials_ns: Vec<u64>,
    /// Ranges of its messages whose latency is also kept apart, each with
    /// its histogram.
    windows: Vec<((u32, u32), Histogram<u64>)>,
}

/// What the connections of a worker saw of a stream.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamReceipts {
    /// Deliveries of the stream's messages.
    pub received: u64,
    /// Time of the latest of them ([`crate::observe::sys::now_ns`]), 0 if none.
    pub last_ns: u64,
    /// Their latency histogram as `(value ns, count)` pairs.
    pub latency: Vec<(u64, u64)>,
    /// When dropped connections were dialed again during the stream
    /// ([`crate::observe::sys::now_ns`]).
    #[serde(default)]
    pub redials_ns: Vec<u64>,
    /// The latency of each range of messages kept apart, as pairs.
    #[serde(default)]
    pub windows: Vec<Vec<(u64, u64)>>,
}

impl StreamReceipts {
    /// Adds another worker's receipts of the same stream.
    pub fn merge(&mut self, other: &StreamReceipts) {
        self.received += other.received;
        self.last_ns = self.last_ns.max(other.last_ns);
        self.latency.extend_from_slice(&other.latency);
        self.redials_ns.extend_from_slice(&other.redials_ns);
        if self.windows.len() < other.windows.len() {
            self.windows.resize(other.windows.len(), Vec::new());
        }
        for (mine, theirs) in self.windows.iter_mut().zip(&other.windows) {
            mine.extend_from_slice(theirs);
        }
    }

    /// The latency histogram (ns) of range `index` kept apart, if any.
    pub fn window_histogram(&self, index: usize) -> Option<Histogram<u64>> {
        self.windows.get(index).map(|pairs| histogram_of(pairs))
    }

    /// The most redials in any second of the stream (windows sliding by
    /// 100 ms), and how many there were in all.
    pub fn redial_peak(&self) -> (u64, u64) {
        let mut at = self.redials_ns.clone();
        at.sort_unstable();
        let peak = at
            .iter()
            .map(|&from| {
                at.partition_point(|&t| t < from + 1_000_000_000)
                    - at.partition_point(|&t| t < from)
            })
            .max()
            .unwrap_or(0);
        (peak as u64, at.len() as u64)
    }

    /// The latency histogram (ns).
    pub fn histogram(&self) -> Histogram<u64> {
        histogram_of(&self.latency)
    }
}

/// A histogram from `(value, count)` pairs.
fn histogram_of(pairs: &[(u64, u64)]) -> Histogram<u64> {
    let mut h = new_histogram();
    for &(value, count) in pairs {
        h.saturating_record_n(value, count);
    }
    h
}

/// A histogram as `(value, count)` pairs.
fn pairs_of(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

/// What one set of connections observes while messages arrive.
#[derive(Debug)]
pub struct Tally {
    messages: Vec<Receipts>,
    /// Latency of the messages sent one at a time.
    latency: Histogram<u64>,
    stream: Option<Stream>,
    duplicates: u64,
    out_of_order: u64,
    corrupt: u64,
    payloads: Payloads,
    failures: BTreeMap<String, u64>,
    statuses: BTreeMap<String, u64>,
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
            latency: new_histogram(),
            stream: None,
            duplicates: 0,
            out_of_order: 0,
            corrupt: 0,
            payloads: Payloads::default(),
            failures: BTreeMap::new(),
            statuses: BTreeMap::new(),
        }
    }

    /// Announces message `seq` (which must be the next one), about to be
    /// sent to `expected` open connections.
    pub fn arm(&mut self, seq: u32, expected: u32) {
        assert_eq!(
            seq as usize,
            self.messages.len() + 1,
            "messages are sent in order"
        );
        self.messages.push(Receipts {
            expected,
            ..Receipts::default()
        });
    }

    /// Announces a stream of `count` messages from `first` (the next one),
    /// about to be sent to `expected` open connections without waiting for
    /// each other. Their latencies go to the stream's own histogram.
    pub fn arm_stream(&mut self, first: u32, count: u32, expected: u32) {
        for seq in first..first + count {
            self.arm(seq, expected);
        }
        self.stream = Some(Stream {
            first,
            count,
            received: 0,
            last_ns: 0,
            latency: new_histogram(),
            redials_ns: Vec::new(),
            windows: Vec::new(),
        });
    }

    /// Keeps the latency of the armed stream's messages in each of
    /// `ranges` (`start..end` sequence numbers) apart too.
    pub fn keep_apart(&mut self, ranges: Vec<(u32, u32)>) {
        if let Some(stream) = &mut self.stream {
            stream.windows = ranges.into_iter().map(|r| (r, new_histogram())).collect();
        }
    }

    /// A dropped connection is dialed again at `now_ns`: counted in the
    /// stream under way, if any.
    pub fn redialed(&mut self, now_ns: u64) {
        if let Some(stream) = &mut self.stream {
            stream.redials_ns.push(now_ns);
        }
    }

    /// The first sequence number of the stream, if one was armed.
    pub fn stream_first(&self) -> Option<u32> {
        self.stream.as_ref().map(|s| s.first)
    }

    /// Deliveries of the stream's messages so far (0 without a stream).
    pub fn stream_received(&self) -> u64 {
        self.stream.as_ref().map_or(0, |s| s.received)
    }

    /// Everything observed of the stream; it stays armed.
    pub fn stream_receipts(&self) -> StreamReceipts {
        self.stream
            .as_ref()
            .map_or_else(StreamReceipts::default, |s| StreamReceipts {
                received: s.received,
                last_ns: s.last_ns,
                latency: pairs_of(&s.latency),
                redials_ns: s.redials_ns.clone(),
                windows: s.windows.iter().map(|(_, h)| pairs_of(h)).collect(),
            })
    }

    /// Receipts of message `seq` (from 1), if it was announced.
    pub fn receipts(&self, seq: u32) -> Option<&Receipts> {
        self.messages.get((seq as usize).checked_sub(1)?)
    }

    /// Records a delivery of message `seq`, sent at `sent_ns` and received
    /// at `received_ns`; returns false (and counts
    /// it as corrupt) if it names a message that was never announced.
    pub fn delivered(&mut self, seq: u32, sent_ns: u64, order: Order, received_ns: u64) -> bool {
        let Some(receipts) = (seq as usize)
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
        receipts.record(received_ns);
        let latency = received_ns.saturating_sub(sent_ns).clamp(1, MAX_LATENCY_NS);
        match &mut self.stream {
            Some(s) if (s.first..s.first + s.count).contains(&seq) => {
                s.received += 1;
                s.last_ns = s.last_ns.max(received_ns);
                s.latency.saturating_record(latency);
                for ((start, end), h) in &mut s.windows {
                    if (*start..*end).contains(&seq) {
                        h.saturating_record(latency);
                    }
                }
            }
            _ => self.latency.saturating_record(latency),
        }
        true
    }

    /// Counts a payload that is not a valid message.
    pub fn corrupt(&mut self) {
        self.corrupt += 1;
    }

    /// Counts a message payload received (see [`Payloads::add`]).
    pub fn payload(&mut self, wire: usize, plain: usize, compressed: bool) {
        self.payloads.add(wire, plain, compressed);
    }

    /// Counts one connection failure of `kind`.
    pub fn failed(&mut self, kind: String) {
        *self.failures.entry(kind).or_insert(0) += 1;
    }

    /// Counts a status message a connection was told.
    pub fn status(&mut self, status: &str) {
        *self.statuses.entry(status.to_string()).or_insert(0) += 1;
    }

    /// Connection failures so far, all kinds together.
    pub fn failures(&self) -> u64 {
        self.failures.values().sum()
    }

    /// Everything observed so far, ready to travel and merge.
    pub fn observed(&self) -> Observed {
        Observed {
            messages: self.messages.clone(),
            latency: pairs_of(&self.latency),
            duplicates: self.duplicates,
            out_of_order: self.out_of_order,
            corrupt: self.corrupt,
            payloads: self.payloads,
            failures: self.failures.clone(),
            statuses: self.statuses.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_redial_peak_is_the_most_in_any_second() {
        const S: u64 = 1_000_000_000;
        let receipts = StreamReceipts {
            // 3 in the first second, then 4 within 0.9 s across the
            // boundary of the second and third.
            redials_ns: vec![
                0,
                S / 2,
                S - 1,
                2 * S - 100,
                2 * S,
                2 * S + 1,
                2 * S + S / 2,
            ],
            ..StreamReceipts::default()
        };
        assert_eq!(receipts.redial_peak(), (4, 7));
        assert_eq!(StreamReceipts::default().redial_peak(), (0, 0));
    }

    #[test]
    fn tracks_first_and_last_receipt_and_latency() {
        let mut tally = Tally::new();
        tally.arm(1, 3);
        assert!(tally.delivered(1, 1_000, Order::Next, 5_000));
        assert!(tally.delivered(1, 1_000, Order::Next, 3_000));
        let m = tally.receipts(1).unwrap();
        assert_eq!((m.received, m.first_ns, m.last_ns), (2, 5_000, 5_000));
        let observed = tally.observed();
        assert_eq!(observed.histogram().len(), 2);
        assert_eq!(observed.histogram().min(), 2_000);
        assert_eq!(observed.lost(), 1);
    }

    #[test]
    fn anomalies_are_counted() {
        let mut tally = Tally::new();
        tally.arm(1, 1);
        tally.arm(2, 1);
        assert!(tally.delivered(2, 20, Order::Skipped, 30));
        assert!(tally.delivered(1, 10, Order::Duplicate, 40));
        assert!(!tally.delivered(3, 30, Order::Next, 50));
        assert!(!tally.delivered(0, 30, Order::Next, 50));
        tally.corrupt();
        let o = tally.observed();
        assert_eq!((o.out_of_order, o.duplicates, o.corrupt), (1, 1, 3));
        assert_eq!(o.messages[0].received, 0);
        assert_eq!(o.messages[1].received, 1);
        assert!(tally.receipts(0).is_none());
        assert_eq!(o.lost(), 1);
    }

    #[test]
    fn ranges_of_a_stream_kept_apart_have_their_own_latency_across_workers() {
        let stream_of = |latencies: &[(u32, u64)]| {
            let mut tally = Tally::new();
            tally.arm_stream(1, 6, 1);
            tally.keep_apart(vec![(1, 3), (3, 5)]);
            for &(seq, latency) in latencies {
                tally.delivered(seq, 1_000, Order::Next, 1_000 + latency);
            }
            tally.stream_receipts()
        };
        let mut merged = stream_of(&[(1, 10), (2, 20), (3, 300), (5, 7)]);
        merged.merge(&stream_of(&[(4, 400), (6, 9)]));
        let before = merged.window_histogram(0).unwrap();
        let during = merged.window_histogram(1).unwrap();
        assert_eq!((before.len(), before.max()), (2, 20));
        assert_eq!((during.len(), during.min(), during.max()), (2, 300, 400));
        assert!(merged.window_histogram(2).is_none());
        assert_eq!(merged.histogram().len(), 6, "all of them, as before");
    }

    #[test]
    fn a_stream_keeps_its_own_receipts_and_latency() {
        let mut tally = Tally::new();
        tally.arm(1, 2);
        tally.delivered(1, 100, Order::Next, 200);
        tally.arm_stream(2, 3, 2);
        for seq in 2..=4 {
            tally.delivered(seq, 1_000, Order::Next, 1_000 + 10 * u64::from(seq));
        }
        // A late delivery of the message sent alone is not the stream's.
        tally.delivered(1, 100, Order::Next, 5_000);
        let stream = tally.stream_receipts();
        assert_eq!((stream.received, stream.last_ns), (3, 1_040));
        assert_eq!(stream.histogram().len(), 3);
        assert_eq!(stream.histogram().max(), 40);
        assert_eq!(tally.observed().histogram().len(), 2, "the lone ones");
        assert_eq!(tally.observed().messages.len(), 4);
        assert_eq!(
            tally.observed().lost(),
            3,
            "one connection got none of the stream"
        );
        let mut merged = StreamReceipts::default();
        merged.merge(&stream);
        merged.merge(&stream);
        assert_eq!((merged.received, merged.histogram().len()), (6, 6));
    }

    #[test]
    fn failures_by_kind() {
        let mut tally = Tally::new();
        tally.failed("refused".into());
        tally.failed("refused".into());
        tally.failed("reset".into());
        assert_eq!(tally.failures(), 3);
        let o = tally.observed();
        assert_eq!(o.failures["refused"], 2);
        assert_eq!(o.failed(), 3);
    }

    #[test]
    fn observations_merge_across_workers() {
        let mut a = Tally::new();
        a.arm(1, 2);
        a.delivered(1, 100, Order::Next, 1_100);
        a.delivered(1, 100, Order::Next, 1_300);
        a.failed("timeout".into());
        let mut b = Tally::new();
        b.arm(1, 2);
        b.arm(2, 2);
        b.delivered(1, 100, Order::Next, 900);
        b.delivered(2, 5_000, Order::Skipped, 7_000);
        b.failed("timeout".into());

        let mut merged = Observed::default();
        merged.merge(&a.observed());
        merged.merge(&b.observed());
        assert_eq!(
            merged.messages[0],
            Receipts {
                expected: 4,
                received: 3,
                first_ns: 900,
                last_ns: 1_300
            }
        );
        assert_eq!(merged.messages[1].received, 1);
        assert_eq!(merged.lost(), 1 + 1);
        assert_eq!(merged.out_of_order, 1);
        assert_eq!(merged.failures["timeout"], 2);
        let h = merged.histogram();
        assert_eq!(h.len(), 4);
        assert_eq!(h.min(), 800);
        assert!(h.max() >= 2_000 && h.max() < 2_002);
    }
}

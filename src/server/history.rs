//! Positions and history: every message the loop frames gets the next
//! position of its source, and the batches framed are kept, as framed
//! (with positions, compressed too), within bounds of count, bytes and
//! age, so that a client coming back with `?since=` is given what it
//! missed, from the same shared buffers, and told honestly whether that
//! is everything.
//!
//! A batch holds messages for the same recipients; the history keeps
//! batches whole, with the positions of their first and last messages,
//! so a resume finds its place with a binary search, and only a batch cut
//! by its `since` is copied.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::protocol::position::{Epoch, Position, Status};
use crate::protocol::ws::OpCode;
use crate::server::feed::Recipients;
use crate::server::frames::SharedFrames;

/// What the history may hold at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Messages (0: no history).
    pub messages: usize,
    /// Bytes of frames (the positioned frames and their compressed ones).
    pub bytes: usize,
    /// How long a message is kept.
    pub age: Duration,
}

/// A batch kept: its messages' positions, recipients and frames.
#[derive(Debug)]
struct Entry {
    first: u64,
    last: u64,
    at: Instant,
    to: Recipients,
    frames: SharedFrames,
    bytes: usize,
}

/// What a resuming connection was addressed as at its upgrade: the
/// messages of the history it is given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Filter {
    /// Its client id.
    pub id: Option<Box<str>>,
    /// Its channels.
    pub channels: Box<[Box<str>]>,
}

impl Filter {
    /// Whether messages for `to` were for it.
    fn wants(&self, to: &Recipients) -> bool {
        match to {
            Recipients::All => true,
            Recipients::Channels(names) => names
                .iter()
                .any(|n| self.channels.iter().any(|c| **c == **n)),
            Recipients::Id(id) => self.id.as_deref() == Some(id.as_str()),
            // A connection of its own, which is gone: a resume is another.
            Recipients::Conn(_) => false,
        }
    }
}

/// A connection's replay: the messages after `from` up to `through`
/// (positions in the current epoch) that its filter wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Given up to here.
    pub from: u64,
    /// To be given up to here (the last position before its live messages).
    pub through: u64,
    /// Which messages it is given.
    pub filter: Arc<Filter>,
}

/// How far one visit of a replay got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Given up to this position, with more left (`None`: done).
    pub more: Option<u64>,
    /// The history no longer held all that was left: the connection was
    /// told of the gap (a status message) and given what it holds.
    pub overrun: bool,
}

/// The positions given out and the history kept.
#[derive(Debug)]
pub struct History {
    epoch: Epoch,
    /// The last position given out (one before the first, before any).
    last: u64,
    /// Every message up to here is gone (or was never known here): a
    /// `since` before it is a gap.
    forgotten: u64,
    bounds: Bounds,
    entries: VecDeque<Entry>,
    messages: usize,
    bytes: usize,
    /// When a gap was last logged, and the gaps met since.
    gap_logged: Cell<Option<Instant>>,
    gaps_unlogged: Cell<u64>,
}

/// Batches one visit of a replay looks at, at most.
pub const SCAN_PER_VISIT: usize = 4096;

/// A gap is logged at most this often (with the count of those between).
const GAP_LOG_EVERY: Duration = Duration::from_secs(60);

impl History {
    /// A history of `epoch` whose first position will be `first`.
    pub fn new(epoch: Epoch, first: u64, bounds: Bounds) -> History {
        let before = first.saturating_sub(1);
        History {
            epoch,
            last: before,
            forgotten: before,
            bounds,
            entries: VecDeque::new(),
            messages: 0,
            bytes: 0,
            gap_logged: Cell::new(None),
            gaps_unlogged: Cell::new(0),
        }
    }

    /// The position for a message numbered `asked` by its source (`None`:
    /// the next one), never one given out before.
    pub fn assign(&mut self, asked: Option<u64>) -> Position {
        let next = self.last.saturating_add(1);
        self.last = asked.map_or(next, |asked| asked.max(next));
        self.current()
    }

    /// The last position given out.
    pub fn current(&self) -> Position {
        Position {
            epoch: self.epoch,
            seq: self.last,
        }
    }

    /// Keeps a batch just framed (its messages numbered `first..=last`),
    /// then drops the oldest batches over the bounds.
    pub fn keep(
        &mut self,
        first: u64,
        last: u64,
        to: &Recipients,
        frames: &SharedFrames,
        now: Instant,
    ) {
        if self.bounds.messages == 0 {
            self.forgotten = last;
            return;
        }
        let Some(frames) = frames.positioned() else {
            return;
        };
        let bytes = frames.len_with_deflated();
        self.messages += frames.count();
        self.bytes += bytes;
        self.entries.push_back(Entry {
            first,
            last,
            at: now,
            to: to.clone(),
            frames: frames.clone(),
            bytes,
        });
        self.evict(now);
    }

    /// Drops the oldest messages while the history is over a bound: whole
    /// batches, but the first messages of a batch only when that is all
    /// the count bound asks.
    pub fn evict(&mut self, now: Instant) {
        let bounds = self.bounds;
        while let Some(oldest) = self.entries.front_mut() {
            let excess = self.messages.saturating_sub(bounds.messages);
            let whole = self.bytes > bounds.bytes
                || now.saturating_duration_since(oldest.at) > bounds.age
                || excess >= oldest.frames.count();
            if whole {
                let oldest = self.entries.pop_front().expect("a front");
                self.messages -= oldest.frames.count();
                self.bytes -= oldest.bytes;
                self.forgotten = oldest.last;
                continue;
            }
            if excess > 0 {
                let seqs: Vec<u64> = oldest.frames.payloads().map(seq_of).collect();
                oldest.frames = oldest.frames.skip(excess);
                oldest.first = seqs[excess];
                self.forgotten = seqs[excess - 1];
                let bytes = oldest.frames.len_with_deflated();
                self.bytes -= oldest.bytes - bytes;
                oldest.bytes = bytes;
                self.messages -= excess;
            }
            break;
        }
    }

    /// What a client resuming after `since` (as given) is told, and the
    /// replay it gets, if any.
    pub fn resume(&self, since: &[u8], now: Instant) -> (Status, Option<(u64, u64)>) {
        let current = self.current();
        let since = match Position::parse(since) {
            Some(since) if since.epoch == self.epoch && since.seq <= self.last => since.seq,
            _ => return (Status::Unknown { current }, None),
        };
        let replay = |from: u64| (from < self.last).then_some((from, self.last));
        if since >= self.forgotten {
            return (Status::Recovered { current }, replay(since));
        }
        let from = self.oldest();
        self.log_gap(from, now);
        (Status::Gap { from, current }, replay(self.forgotten))
    }

    /// The oldest position held, or the next to be given out.
    fn oldest(&self) -> Position {
        Position {
            epoch: self.epoch,
            seq: self
                .entries
                .front()
                .map_or(self.last.saturating_add(1), |e| e.first),
        }
    }

    /// Logs a resume that met a gap: the first, then at most one line
    /// per [`GAP_LOG_EVERY`] with the count of those since.
    fn log_gap(&self, from: Position, now: Instant) {
        self.gaps_unlogged.set(self.gaps_unlogged.get() + 1);
        if self
            .gap_logged
            .get()
            .is_some_and(|at| now.saturating_duration_since(at) < GAP_LOG_EVERY)
        {
            return;
        }
        log::warn!(
            "{} resume(s) asked for more than the history holds (it reaches back to {from}; \
             see --history-messages, --history-bytes, --history-age)",
            self.gaps_unlogged.get()
        );
        self.gap_logged.set(Some(now));
        self.gaps_unlogged.set(0);
    }

    /// Gathers into `out` the frames of `replay` a connection gets
    /// (compressed if `deflate`), up to about `room` bytes and
    /// [`SCAN_PER_VISIT`] batches looked at. If the history has dropped
    /// some of what was left, a gap status goes first.
    pub fn gather(
        &self,
        replay: &Replay,
        deflate: bool,
        room: usize,
        out: &mut Vec<SharedFrames>,
    ) -> Progress {
        let mut from = replay.from;
        let overrun = from < self.forgotten;
        if overrun {
            let status = Status::Gap {
                from: self.oldest(),
                current: self.current(),
            };
            out.push(SharedFrames::encode(
                OpCode::Text,
                status.message().as_bytes(),
            ));
            from = self.forgotten;
        }
        let start = self.entries.partition_point(|e| e.last <= from);
        let mut taken = 0;
        for (scanned, entry) in self.entries.range(start..).enumerate() {
            if from >= replay.through {
                break;
            }
            if taken >= room || scanned == SCAN_PER_VISIT {
                return Progress {
                    more: Some(from),
                    overrun,
                };
            }
            if replay.filter.wants(&entry.to) {
                let frames = match from >= entry.first {
                    true => {
                        let before = entry.frames.payloads().take_while(|p| seq_of(*p) <= from);
                        entry.frames.skip(before.count())
                    }
                    false => entry.frames.clone(),
                };
                let frames = frames.for_connection(deflate, false).clone();
                taken += frames.bytes().len();
                out.push(frames);
            }
            from = entry.last;
        }
        Progress {
            more: None,
            overrun,
        }
    }

    /// Messages held now.
    pub fn messages(&self) -> usize {
        self.messages
    }

    /// Bytes of frames held now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// The position of a positioned message, from its payload (a stored
/// block first if it is compressed).
fn seq_of((payload, compressed): (&[u8], bool)) -> u64 {
    let text = if compressed { &payload[5..] } else { payload };
    let printed = &text[..text.iter().position(|&b| b == b' ').unwrap_or(0)];
    Position::parse(printed).map_or(0, |p| p.seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::frames::Message;

    const EPOCH: Epoch = Epoch(0xabc);

    fn bounds(messages: usize, bytes: usize, age_secs: u64) -> Bounds {
        Bounds {
            messages,
            bytes,
            age: Duration::from_secs(age_secs),
        }
    }

    /// Frames `texts` into one batch, as the feed does, and keeps it.
    fn keep(history: &mut History, texts: &[&str], to: Recipients, at: Instant) {
        let positions: Vec<Position> = texts.iter().map(|_| history.assign(None)).collect();
        let frames =
            SharedFrames::encode_batch(texts.iter().zip(&positions).map(|(t, p)| Message {
                opcode: OpCode::Text,
                payload: t.as_bytes(),
                deflated: None,
                position: Some(*p),
            }));
        let (first, last) = (positions[0].seq, positions[positions.len() - 1].seq);
        history.keep(first, last, &to, &frames, at);
    }

    /// The payloads a replay of everything after `from` gives, for `filter`.
    fn replay(history: &History, from: u64, filter: Filter) -> Vec<String> {
        let replay = Replay {
            from,
            through: history.current().seq,
            filter: Arc::new(filter),
        };
        let mut out = Vec::new();
        let progress = history.gather(&replay, false, usize::MAX, &mut out);
        assert_eq!(progress.more, None);
        out.iter()
            .flat_map(|f| {
                f.payloads()
                    .map(|(p, _)| String::from_utf8(p.to_vec()).unwrap())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn since(seq: u64) -> Vec<u8> {
        Position { epoch: EPOCH, seq }.to_string().into_bytes()
    }

    #[test]
    fn the_count_bound_drops_the_oldest_messages_even_within_a_batch() {
        let now = Instant::now();
        let mut history = History::new(EPOCH, 1, bounds(3, 1 << 20, 60));
        keep(&mut history, &["a", "b"], Recipients::All, now);
        keep(&mut history, &["c", "d"], Recipients::All, now);
        assert_eq!(history.messages(), 3);
        assert_eq!(
            replay(&history, 1, Filter::default()),
            [
                "0000000000000abc.2 b",
                "0000000000000abc.3 c",
                "0000000000000abc.4 d"
            ]
        );
        let (status, replayed) = history.resume(&since(0), now);
        assert_eq!(
            status,
            Status::Gap {
                from: Position {
                    epoch: EPOCH,
                    seq: 2
                },
                current: Position {
                    epoch: EPOCH,
                    seq: 4
                },
            }
        );
        assert_eq!(replayed, Some((1, 4)), "from what the history holds");
        let (status, replayed) = history.resume(&since(1), now);
        assert!(matches!(status, Status::Recovered { .. }), "{status:?}");
        assert_eq!(replayed, Some((1, 4)));
        keep(&mut history, &["e", "f", "g", "h"], Recipients::All, now);
        assert_eq!(history.messages(), 3, "a batch over the bound is cut too");
        assert_eq!(
            replay(&history, 5, Filter::default()),
            [
                "0000000000000abc.6 f",
                "0000000000000abc.7 g",
                "0000000000000abc.8 h"
            ]
        );
    }

    #[test]
    fn the_byte_and_age_bounds_drop_the_oldest_batches() {
        let now = Instant::now();
        let frame = "0000000000000abc.1 x".len() + 2;
        let mut history = History::new(EPOCH, 1, bounds(100, 2 * frame, 60));
        for text in ["x", "y", "z"] {
            keep(&mut history, &[text], Recipients::All, now);
        }
        assert_eq!((history.messages(), history.bytes()), (2, 2 * frame));
        assert_eq!(
            replay(&history, 1, Filter::default()),
            ["0000000000000abc.2 y", "0000000000000abc.3 z"]
        );

        let mut history = History::new(EPOCH, 1, bounds(100, 1 << 20, 10));
        keep(&mut history, &["old"], Recipients::All, now);
        keep(
            &mut history,
            &["new"],
            Recipients::All,
            now + Duration::from_secs(6),
        );
        history.evict(now + Duration::from_secs(11));
        assert_eq!(
            replay(&history, 1, Filter::default()),
            ["0000000000000abc.2 new"]
        );
        history.evict(now + Duration::from_secs(17));
        assert_eq!(history.messages(), 0);
        let (status, replayed) = history.resume(&since(1), now);
        assert_eq!(
            status,
            Status::Gap {
                from: Position {
                    epoch: EPOCH,
                    seq: 3
                },
                current: Position {
                    epoch: EPOCH,
                    seq: 2
                },
            },
            "nothing held: the reach is the next position"
        );
        assert_eq!(replayed, None, "nothing to replay");
    }

    #[test]
    fn a_replay_follows_the_filter_and_starts_inside_a_batch() {
        let now = Instant::now();
        let mut history = History::new(EPOCH, 1, bounds(100, 1 << 20, 60));
        let channels =
            |names: &[&str]| Recipients::Channels(names.iter().map(|n| n.to_string()).collect());
        keep(&mut history, &["1", "2", "3"], channels(&["a"]), now);
        keep(&mut history, &["4"], channels(&["b", "a"]), now);
        keep(&mut history, &["5"], Recipients::Id("ann".into()), now);
        keep(&mut history, &["6"], Recipients::Id("bob".into()), now);
        keep(&mut history, &["7"], channels(&["c"]), now);
        keep(&mut history, &["8"], Recipients::All, now);
        let ann = Filter {
            id: Some("ann".into()),
            channels: vec!["a".into()].into(),
        };
        assert_eq!(
            replay(&history, 1, ann),
            [
                "0000000000000abc.2 2",
                "0000000000000abc.3 3",
                "0000000000000abc.4 4",
                "0000000000000abc.5 5",
                "0000000000000abc.8 8"
            ]
        );
        let c = Filter {
            id: None,
            channels: vec!["c".into()].into(),
        };
        assert_eq!(
            replay(&history, 0, c),
            ["0000000000000abc.7 7", "0000000000000abc.8 8"]
        );
    }

    #[test]
    fn a_replay_goes_a_room_at_a_time_and_a_gap_is_told_if_it_falls_behind() {
        let now = Instant::now();
        let mut history = History::new(EPOCH, 1, bounds(4, 1 << 20, 60));
        for text in ["a", "b", "c", "d"] {
            keep(&mut history, &[text], Recipients::All, now);
        }
        let mut replay = Replay {
            from: 0,
            through: 4,
            filter: Arc::new(Filter::default()),
        };
        let mut out = Vec::new();
        let progress = history.gather(&replay, false, 1, &mut out);
        assert_eq!(
            progress,
            Progress {
                more: Some(1),
                overrun: false
            }
        );
        assert_eq!(out.len(), 1);
        replay.from = 1;
        keep(&mut history, &["e", "f"], Recipients::All, now);
        out.clear();
        let progress = history.gather(&replay, false, usize::MAX, &mut out);
        assert_eq!(
            progress,
            Progress {
                more: None,
                overrun: true
            }
        );
        let texts: Vec<Vec<u8>> = out
            .iter()
            .map(|f| f.payloads().next().unwrap().0.to_vec())
            .collect();
        assert_eq!(
            texts,
            [
                &br#"{"status":"gap","from":"0000000000000abc.3","position":"0000000000000abc.6"}"#
                    [..],
                b"0000000000000abc.3 c",
                b"0000000000000abc.4 d",
            ],
            "the gap, then from what is held, up to where it was to end"
        );
    }

    #[test]
    fn positions_follow_their_source_and_never_go_back() {
        let mut history = History::new(EPOCH, 10, bounds(0, 0, 1));
        assert_eq!(history.current().seq, 9);
        assert_eq!(history.assign(None).seq, 10);
        assert_eq!(history.assign(Some(15)).seq, 15);
        assert_eq!(
            history.assign(Some(12)).seq,
            16,
            "never one given out before"
        );
        let (status, _) = history.resume(&since(16), Instant::now());
        assert!(matches!(status, Status::Recovered { .. }));
        let (status, _) = history.resume(&since(17), Instant::now());
        assert!(matches!(status, Status::Unknown { .. }), "never given out");
    }
}

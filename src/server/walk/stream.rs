//! The broadcast stream, and what its passes have covered.
//!
//! Broadcasts are framed into numbered batches as the loop takes them
//! (what arrived together goes into one batch). Every open connection
//! remembers the number of the first batch it has not had yet. A pass is
//! one lap of the walk's cursor over every connection (see `sweep`), a
//! slice per loop iteration, giving each one every batch it is owed,
//! with one `writev`: a connection the lap reaches gets even the batches
//! framed after the pass began, so no line waits for a whole fan-out
//! before its own starts. Once a pass is over, every connection has every
//! batch framed before it began, and those batches are dropped; if more
//! came meanwhile, another pass begins.
//!
//! A connection that upgrades starts at the next batch to be framed: it
//! gets exactly the broadcasts the loop takes after its upgrade.
//!
//! A connection waiting for the walk over targeted items is left to that
//! walk, which gives it the batches too (see `targeted`): the stream
//! keeps what such a connection may still be owed until the walk is done.

use crate::server::frames::SharedFrames;
use crate::server::owed::{Batches, Seq};

/// The batches some connection may still be owed, and the pass under way.
#[derive(Debug, Default)]
pub struct Stream {
    /// `log[i]` is batch `first + i`.
    log: Vec<SharedFrames>,
    first: Seq,
    /// The batches before this one reach every connection in the pass
    /// under way, if one is.
    pass: Option<Seq>,
    /// Every open connection has every batch before this one.
    delivered: Seq,
}

impl Stream {
    /// The number the next batch framed gets (what a connection that
    /// upgrades now starts at).
    pub fn next_seq(&self) -> Seq {
        self.first.plus(self.log.len())
    }

    /// Adds a batch at the end of the stream.
    pub fn push(&mut self, frames: SharedFrames) {
        self.log.push(frames);
    }

    /// The batches kept, for a visit to take from.
    pub fn batches(&self) -> Batches<'_> {
        Batches {
            first: self.first,
            log: &self.log,
        }
    }

    /// The batches from `from` up to (not including) `to`.
    #[cfg(test)]
    fn between(&self, from: Seq, to: Seq) -> &[SharedFrames] {
        self.batches().between(from, to)
    }

    /// Whether some connection may be owed a batch, or a pass is under way.
    pub fn is_busy(&self) -> bool {
        self.pass.is_some() || self.delivered != self.next_seq()
    }

    /// Starts a pass if some connection may be owed a batch and none is
    /// under way (`true`: the walk's cursor is to go a lap for it).
    pub fn begin_pass(&mut self) -> bool {
        let begins = self.pass.is_none() && self.delivered != self.next_seq();
        if begins {
            self.pass = Some(self.next_seq());
        }
        begins
    }

    /// Whether a pass is under way.
    pub fn in_pass(&self) -> bool {
        self.pass.is_some()
    }

    /// The lap visited every key: every connection it does not leave to
    /// the targeted walk has the batches the pass covered, and the next
    /// pass may begin. Returns the batches it brought every connection.
    pub fn end_pass(&mut self) -> &[SharedFrames] {
        let before = self.delivered;
        if let Some(covered) = self.pass.take() {
            self.delivered = covered;
        }
        self.batches().between(before, self.delivered)
    }

    /// Drops the batches every connection has had: those the last pass
    /// covered, but none from `floor` on (what a connection left to the
    /// targeted walk may still be owed).
    pub fn trim(&mut self, floor: Option<Seq>) {
        let keep_from = floor.map_or(self.delivered, |f| self.earlier(f, self.delivered));
        let done = keep_from.since(self.first).min(self.log.len());
        self.log.drain(..done);
        self.first = self.first.plus(done);
    }

    /// The earlier of two batch numbers still in the stream (or just past
    /// its end).
    pub fn earlier(&self, a: Seq, b: Seq) -> Seq {
        if a.since(self.first) <= b.since(self.first) {
            a
        } else {
            b
        }
    }

    /// Batches kept now.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.log.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ws::OpCode;

    fn batch(text: &str) -> SharedFrames {
        SharedFrames::encode(OpCode::Text, text.as_bytes())
    }

    fn texts(frames: &[SharedFrames]) -> Vec<u8> {
        frames.iter().map(|f| f.bytes()[2]).collect()
    }

    #[test]
    fn a_connection_reached_by_a_pass_gets_every_batch_framed_so_far() {
        let mut stream = Stream::default();
        assert!(!stream.is_busy() && !stream.begin_pass());
        let early = stream.next_seq();
        stream.push(batch("a"));
        assert!(stream.is_busy());
        assert!(stream.begin_pass());
        assert!(!stream.begin_pass(), "under way");
        // Key 0 is visited now; then "b" is framed; key 1 later in the pass.
        assert_eq!(texts(stream.between(early, stream.next_seq())), b"a");
        let after_a = stream.next_seq();
        stream.push(batch("b"));
        assert_eq!(
            texts(stream.between(early, stream.next_seq())),
            b"ab",
            "key 1 gets both at once"
        );
        assert_eq!(texts(stream.between(after_a, stream.next_seq())), b"b");
        assert_eq!(texts(stream.end_pass()), b"a", "everyone's now");
        stream.trim(None);
        assert_eq!(stream.kept(), 1, "a is dropped, b is not yet everyone's");
        // Key 0 still lacks b: the next pass brings it.
        assert!(stream.begin_pass());
        assert_eq!(texts(stream.between(after_a, stream.next_seq())), b"b");
        assert_eq!(texts(stream.end_pass()), b"b");
        stream.trim(None);
        assert_eq!(stream.kept(), 0);
        assert!(!stream.is_busy() && !stream.begin_pass());
    }

    #[test]
    fn a_connection_that_upgrades_now_is_owed_only_later_batches() {
        let mut stream = Stream::default();
        stream.push(batch("a"));
        stream.begin_pass();
        let joined = stream.next_seq();
        assert!(stream.between(joined, stream.next_seq()).is_empty());
        stream.push(batch("b"));
        assert_eq!(texts(stream.between(joined, stream.next_seq())), b"b");
    }

    #[test]
    fn numbers_wrap_around() {
        let mut stream = Stream {
            first: Seq(u32::MAX - 1),
            delivered: Seq(u32::MAX - 1),
            ..Stream::default()
        };
        let start = stream.next_seq();
        for text in ["x", "y", "z"] {
            stream.push(batch(text));
        }
        assert_eq!(stream.next_seq(), Seq(1));
        assert_eq!(texts(stream.between(start, stream.next_seq())), b"xyz");
        assert_eq!(
            texts(stream.between(Seq(u32::MAX), stream.next_seq())),
            b"yz"
        );
        assert_eq!(texts(stream.between(Seq(0), stream.next_seq())), b"z");
        stream.begin_pass();
        stream.end_pass();
        stream.trim(None);
        assert_eq!((stream.kept(), stream.is_busy()), (0, false));
    }

    #[test]
    fn batches_a_connection_left_to_the_walk_may_need_are_kept() {
        let mut stream = Stream::default();
        let waiting = stream.next_seq();
        stream.push(batch("a"));
        stream.push(batch("b"));
        assert_eq!(stream.earlier(stream.next_seq(), waiting), waiting);
        assert_eq!(stream.earlier(waiting, stream.next_seq()), waiting);
        stream.begin_pass();
        stream.end_pass();
        stream.trim(Some(waiting));
        assert_eq!(stream.kept(), 2, "the walk's connection has neither");
        assert_eq!(texts(stream.between(waiting, stream.next_seq())), b"ab");
        stream.trim(Some(waiting.plus(1)));
        assert_eq!(stream.kept(), 1);
        stream.trim(None);
        assert_eq!((stream.kept(), stream.is_busy()), (0, false));
    }
}

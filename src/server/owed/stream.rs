//! The broadcast stream and the pass that carries it to every connection.
//!
//! Broadcasts are framed into numbered batches as the loop takes them
//! (what arrived together goes into one batch). Every open connection
//! remembers the number of the first batch it has not had yet. A pass
//! visits the connections in key order, a slice per loop iteration, and
//! gives each one every batch it is owed, with one `writev`: a connection
//! the pass reaches gets even the batches framed after the pass began, so
//! no line waits for a whole fan-out before its own starts. Once a pass
//! is over, every connection has every batch framed before it began, and
//! those batches are dropped; if more came meanwhile, another pass begins.
//!
//! A connection that upgrades starts at the next batch to be framed: it
//! gets exactly the broadcasts the loop takes after its upgrade.
//!
//! A connection waiting for the walk over targeted items is left to that
//! walk, which gives it the batches too (see `targeted`): the stream
//! keeps what such a connection may still be owed until the walk is done.

use crate::server::frames::SharedFrames;

/// A batch's number. Numbers wrap around; a connection is never owed more
/// than the batches kept, so distances stay small. Four bytes in each
/// connection's slot (its next one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seq(pub u32);

impl Seq {
    /// The number `n` batches after this one.
    pub fn plus(self, n: usize) -> Seq {
        Seq(self.0.wrapping_add(n as u32))
    }

    /// How many batches this one is after `from` (counting round the wrap).
    pub fn since(self, from: Seq) -> usize {
        self.0.wrapping_sub(from.0) as usize
    }
}

/// The batches some connection may still be owed, and the pass under way.
#[derive(Debug, Default)]
pub struct Stream {
    /// `log[i]` is batch `first + i`.
    log: Vec<SharedFrames>,
    first: Seq,
    pass: Option<Pass>,
    /// Every open connection has every batch before this one.
    delivered: Seq,
}

/// A pass over the connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// The next key to visit.
    pub cursor: usize,
    /// The batches before this one reach every connection in this pass.
    covered: Seq,
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

    /// The batches from `from` up to (not including) `to`.
    pub fn between(&self, from: Seq, to: Seq) -> &[SharedFrames] {
        let start = from.since(self.first);
        let end = to.since(self.first);
        debug_assert!(
            start <= end && end <= self.log.len(),
            "bug: outside the stream"
        );
        &self.log[start.min(end)..end.min(self.log.len())]
    }

    /// Whether some connection may be owed a batch, or a pass is under way.
    pub fn is_busy(&self) -> bool {
        self.pass.is_some() || self.delivered != self.next_seq()
    }

    /// Starts a pass if some connection may be owed a batch and none is
    /// under way; returns the pass under way.
    pub fn begin_pass(&mut self) -> Option<Pass> {
        if self.pass.is_none() && self.delivered != self.next_seq() {
            self.pass = Some(Pass {
                cursor: 0,
                covered: self.next_seq(),
            });
        }
        self.pass
    }

    /// Moves the pass's cursor to `key`.
    pub fn advance(&mut self, key: usize) {
        if let Some(pass) = &mut self.pass {
            pass.cursor = key;
        }
    }

    /// The pass reached the last key: every connection it does not leave
    /// to the targeted walk has the batches it covered, and the next pass
    /// may begin.
    pub fn end_pass(&mut self) {
        if let Some(pass) = self.pass.take() {
            self.delivered = pass.covered;
        }
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

    /// A stream whose next batch is `first` (as after that many).
    #[cfg(test)]
    pub fn starting_at(first: Seq) -> Stream {
        Stream {
            first,
            delivered: first,
            ..Stream::default()
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
        assert!(!stream.is_busy() && stream.begin_pass().is_none());
        let early = stream.next_seq();
        stream.push(batch("a"));
        assert!(stream.is_busy());
        let pass = stream.begin_pass().unwrap();
        assert_eq!(pass.cursor, 0);
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
        stream.end_pass();
        stream.trim(None);
        assert_eq!(stream.kept(), 1, "a is dropped, b is not yet everyone's");
        // Key 0 still lacks b: the next pass brings it.
        assert!(stream.begin_pass().is_some());
        assert_eq!(texts(stream.between(after_a, stream.next_seq())), b"b");
        stream.end_pass();
        stream.trim(None);
        assert_eq!(stream.kept(), 0);
        assert!(!stream.is_busy() && stream.begin_pass().is_none());
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

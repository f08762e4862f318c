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

use crate::server::frames::SharedFrames;

/// A batch's number. Numbers wrap around; a connection is never owed more
/// than the batches kept, so distances stay small.
pub type Seq = u32;

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
        self.first.wrapping_add(self.log.len() as Seq)
    }

    /// Adds a batch at the end of the stream.
    pub fn push(&mut self, frames: SharedFrames) {
        self.log.push(frames);
    }

    /// The batches a connection that has had everything before `next` is
    /// owed, oldest first.
    pub fn owed(&self, next: Seq) -> &[SharedFrames] {
        let from = next.wrapping_sub(self.first) as usize;
        debug_assert!(
            from <= self.log.len(),
            "bug: a connection ahead of the stream"
        );
        &self.log[from.min(self.log.len())..]
    }

    /// The batches from `from` up to (not including) `to`.
    pub fn between(&self, from: Seq, to: Seq) -> &[SharedFrames] {
        let start = from.wrapping_sub(self.first) as usize;
        let end = to.wrapping_sub(self.first) as usize;
        debug_assert!(
            start <= end && end <= self.log.len(),
            "bug: outside the stream"
        );
        &self.log[start.min(end)..end.min(self.log.len())]
    }

    /// The pass under way, if any.
    pub fn pass(&self) -> Option<Pass> {
        self.pass
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

    /// The pass reached the last key: the batches it covered are dropped
    /// (every connection has them), and the next pass may begin.
    pub fn end_pass(&mut self) {
        let Some(pass) = self.pass.take() else {
            return;
        };
        let done = pass.covered.wrapping_sub(self.first) as usize;
        self.log.drain(..done.min(self.log.len()));
        self.first = pass.covered;
        self.delivered = pass.covered;
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
        assert_eq!(texts(stream.owed(early)), b"a");
        let after_a = stream.next_seq();
        stream.push(batch("b"));
        assert_eq!(texts(stream.owed(early)), b"ab", "key 1 gets both at once");
        assert_eq!(texts(stream.owed(after_a)), b"b");
        stream.end_pass();
        assert_eq!(stream.kept(), 1, "a is dropped, b is not yet everyone's");
        // Key 0 still lacks b: the next pass brings it.
        assert!(stream.begin_pass().is_some());
        assert_eq!(texts(stream.owed(after_a)), b"b");
        stream.end_pass();
        assert_eq!(stream.kept(), 0);
        assert!(!stream.is_busy() && stream.begin_pass().is_none());
    }

    #[test]
    fn a_connection_that_upgrades_now_is_owed_only_later_batches() {
        let mut stream = Stream::default();
        stream.push(batch("a"));
        stream.begin_pass();
        let joined = stream.next_seq();
        assert!(stream.owed(joined).is_empty());
        stream.push(batch("b"));
        assert_eq!(texts(stream.owed(joined)), b"b");
    }

    #[test]
    fn numbers_wrap_around() {
        let mut stream = Stream {
            first: Seq::MAX - 1,
            delivered: Seq::MAX - 1,
            ..Stream::default()
        };
        let start = stream.next_seq();
        for text in ["x", "y", "z"] {
            stream.push(batch(text));
        }
        assert_eq!(stream.next_seq(), 1);
        assert_eq!(texts(stream.owed(start)), b"xyz");
        assert_eq!(texts(stream.owed(Seq::MAX)), b"yz");
        assert_eq!(texts(stream.owed(0)), b"z");
        stream.begin_pass();
        stream.end_pass();
        assert_eq!((stream.kept(), stream.is_busy()), (0, false));
    }
}

//! A connection's output queue, which holds references to shared frames
//! (see [`SharedFrames`]).
//!
//! A connection whose socket takes a buffer whole keeps nothing. One that
//! takes part of it keeps a reference and an offset; buffers that arrive
//! while it is behind are queued as references. Payload bytes are never
//! copied per connection.
//!
//! A buffer may hold several frames back to back (a batch of broadcasts
//! queued together): a socket then takes all of them with one `write`.

use std::collections::VecDeque;
use std::io::{self, Write};

use crate::server::frames::SharedFrames;
use crate::server::net::nonblocking::{write_until_blocked, MAX_IOV};

/// What became of output offered to a queue: every [`OutQueue`] send
/// and flush answers with one of these (after uWebSockets' `send`,
/// which answers SUCCESS, BACKPRESSURE or DROPPED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// The socket took everything; nothing is queued.
    Written,
    /// Taken, but not all of it is on the socket yet: the rest waits in
    /// the queue until the socket is writable (backpressure).
    Queued,
    /// Not all taken: the queue would have gone over its limit. The
    /// first `kept` buffers offered were written or queued, in order; the
    /// rest were refused (all of them when `kept` is 0).
    Dropped {
        /// Buffers taken before the first refused one.
        kept: usize,
    },
}

impl Sent {
    /// What a send that `queue` took came to: written, or partly queued.
    pub fn taken(queue: &OutQueue) -> Sent {
        if queue.is_empty() {
            Sent::Written
        } else {
            Sent::Queued
        }
    }
}

/// Buffers queued behind the head, allocated only while a connection is
/// more than one buffer behind.
#[derive(Debug, Default)]
struct Backlog {
    buffers: VecDeque<SharedFrames>,
    bytes: usize,
    /// Frames in `buffers`.
    frames: usize,
}

/// A connection's pending output: the buffer being written with how much of
/// it went out, then the buffers behind it. Empty, it owns no heap memory.
#[derive(Debug, Default)]
pub struct OutQueue {
    head: Option<SharedFrames>,
    /// Bytes of `head` already written (frames are under 4 GiB, see
    /// [`MAX_MESSAGE_LIMIT`](crate::MAX_MESSAGE_LIMIT)).
    written: u32,
    backlog: Option<Box<Backlog>>,
}

impl OutQueue {
    /// Nothing is waiting to be written.
    pub fn is_empty(&self) -> bool {
        self.head.is_none()
    }

    /// Frames not written whole yet (those of a partly written head count).
    pub fn queued_frames(&self) -> usize {
        self.head.as_ref().map_or(0, SharedFrames::count)
            + self.backlog.as_ref().map_or(0, |b| b.frames)
    }

    /// Bytes waiting to be written.
    pub fn queued_bytes(&self) -> usize {
        let head = self
            .head
            .as_ref()
            .map_or(0, |f| f.bytes().len() - self.written as usize);
        head + self.backlog.as_ref().map_or(0, |b| b.bytes)
    }

    /// Sends shared buffers, in order: written straight away (one `writev`
    /// for up to [`MAX_IOV`] of them) when nothing is queued, else queued
    /// by reference; what the socket does not take is queued by reference
    /// too, as long as the queue stays within `limit` bytes. The first
    /// buffer that would take it over, and every one after it, are refused
    /// ([`Sent::Dropped`]), except a buffer the socket took part of: that
    /// one is always finished.
    pub fn send_shared(
        &mut self,
        frames: &[SharedFrames],
        limit: usize,
        w: &mut impl Write,
    ) -> io::Result<Sent> {
        if !self.is_empty() {
            return Ok(self.queue_within(frames, 0, limit));
        }
        let mut rest = frames;
        while !rest.is_empty() {
            let chunk = &rest[..rest.len().min(MAX_IOV)];
            let mut parts: [&[u8]; MAX_IOV] = [&[]; MAX_IOV];
            for (part, frame) in parts.iter_mut().zip(chunk) {
                *part = frame.bytes();
            }
            let mut left = write_until_blocked(w, &parts[..chunk.len()])?;
            let mut whole = 0;
            for frame in chunk {
                let len = frame.bytes().len();
                if left < len {
                    break;
                }
                left -= len;
                whole += 1;
            }
            if whole < chunk.len() {
                // The first one not written whole is finished later; those
                // after it are queued while they fit.
                self.head = Some(rest[whole].clone());
                self.written = left as u32;
                let done = frames.len() - rest.len() + whole + 1;
                return Ok(self.queue_within(&frames[done..], done, limit));
            }
            rest = &rest[chunk.len()..];
        }
        Ok(Sent::Written)
    }

    /// Queues `frames` (after `before` buffers of the same send, already
    /// taken) while the queue stays within `limit` bytes.
    fn queue_within(&mut self, frames: &[SharedFrames], before: usize, limit: usize) -> Sent {
        let mut queued = self.queued_bytes();
        for (i, frame) in frames.iter().enumerate() {
            queued += frame.bytes().len();
            if queued > limit {
                return Sent::Dropped { kept: before + i };
            }
            self.push(frame.clone());
        }
        Sent::Queued
    }

    /// Sends bytes of this connection's own (a handshake response, pong,
    /// close or echo): written straight away when nothing is queued, and
    /// only what the socket did not take is copied into the queue. Never
    /// [`Sent::Dropped`]: a connection's own bytes answer what it sent, and
    /// reading stops while its queue is over the limit.
    pub fn send_private(&mut self, parts: &[&[u8]], w: &mut impl Write) -> io::Result<Sent> {
        if !self.is_empty() {
            self.push(SharedFrames::from_parts(parts));
            return Ok(Sent::Queued);
        }
        let n = write_until_blocked(w, parts)?;
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if n < total {
            let rest = unwritten(parts, n);
            self.head = Some(SharedFrames::from_parts(&rest[..]));
        }
        Ok(Sent::taken(self))
    }

    /// Writes queued frames, several per `writev`, until the queue is
    /// empty ([`Sent::Written`]) or the socket would block
    /// ([`Sent::Queued`]).
    pub fn flush(&mut self, w: &mut impl Write) -> io::Result<Sent> {
        while let Some(head) = &self.head {
            let mut parts: [&[u8]; MAX_IOV] = [&[]; MAX_IOV];
            parts[0] = &head.bytes()[self.written as usize..];
            let mut count = 1;
            if let Some(backlog) = &self.backlog {
                for (part, buffer) in parts[1..].iter_mut().zip(&backlog.buffers) {
                    *part = buffer.bytes();
                    count += 1;
                }
            }
            let wanted: usize = parts[..count].iter().map(|p| p.len()).sum();
            let n = write_until_blocked(w, &parts[..count])?;
            self.advance(n);
            if n < wanted {
                return Ok(Sent::Queued);
            }
        }
        Ok(Sent::Written)
    }

    /// Drops every buffer not yet started, keeping a partly written head
    /// so the stream stays a sequence of whole frames (its frames are all
    /// sent). Returns the frames dropped.
    pub fn drop_unstarted(&mut self) -> usize {
        let dropped = self.backlog.take().map_or(0, |b| b.frames);
        if self.written > 0 {
            return dropped;
        }
        dropped + self.head.take().map_or(0, |head| head.count())
    }

    fn push(&mut self, frame: SharedFrames) {
        if self.head.is_none() {
            self.head = Some(frame);
            self.written = 0;
            return;
        }
        let backlog = self.backlog.get_or_insert_with(Default::default);
        backlog.bytes += frame.bytes().len();
        backlog.frames += frame.count();
        backlog.buffers.push_back(frame);
    }

    /// Marks `n` more bytes as written, moving past finished buffers.
    fn advance(&mut self, mut n: usize) {
        while let Some(head) = &self.head {
            let left = head.bytes().len() - self.written as usize;
            if n < left {
                self.written += n as u32;
                return;
            }
            n -= left;
            self.written = 0;
            self.head = self.backlog.as_mut().and_then(|b| b.buffers.pop_front());
            if let (Some(next), Some(backlog)) = (&self.head, &mut self.backlog) {
                backlog.bytes -= next.bytes().len();
                backlog.frames -= next.count();
            }
            if self.backlog.as_ref().is_some_and(|b| b.buffers.is_empty()) {
                self.backlog = None;
            }
        }
        debug_assert_eq!(n, 0, "bug: wrote more bytes than were queued");
    }
}

/// The parts of `parts` after the first `n` bytes.
fn unwritten<'a>(parts: &[&'a [u8]], mut n: usize) -> Vec<&'a [u8]> {
    let mut rest = Vec::with_capacity(parts.len());
    for part in parts {
        let skip = n.min(part.len());
        n -= skip;
        rest.push(&part[skip..]);
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ws::OpCode;
    use crate::testing::ThrottledWriter;

    fn writer(budget: usize) -> ThrottledWriter {
        ThrottledWriter {
            budget,
            ..Default::default()
        }
    }

    #[test]
    fn batches_count_their_frames_queued_and_dropped() {
        let batch = SharedFrames::encode_all([(OpCode::Text, &b"ab"[..]), (OpCode::Text, b"cd")]);
        let mut q = OutQueue::default();
        let mut w = writer(3);
        q.send_shared(std::slice::from_ref(&batch), 100, &mut w)
            .unwrap();
        q.send_shared(std::slice::from_ref(&batch), 100, &mut w)
            .unwrap();
        q.send_shared(std::slice::from_ref(&batch), 100, &mut w)
            .unwrap();
        assert_eq!(q.queued_frames(), 6, "a partly written head counts whole");
        assert_eq!(q.queued_bytes(), 3 * 8 - 3);
        assert_eq!(q.drop_unstarted(), 4, "the two batches behind the head");
        assert_eq!(q.queued_frames(), 2);
        w.budget = 100;
        assert_eq!(q.flush(&mut w).unwrap(), Sent::Written);
        assert_eq!(w.written, b"\x81\x02ab\x81\x02cd");
    }

    #[test]
    fn a_writable_socket_takes_the_frame_and_nothing_is_kept() {
        let frame = SharedFrames::encode(OpCode::Text, b"hi");
        let mut q = OutQueue::default();
        let mut w = writer(100);
        let sent = q.send_shared(std::slice::from_ref(&frame), 10, &mut w);
        assert_eq!(sent.unwrap(), Sent::Written);
        assert!(q.is_empty());
        assert_eq!(w.written, frame.bytes());
        assert_eq!(frame.references(), 1, "no reference kept");
    }

    #[test]
    fn a_partial_write_keeps_a_reference_and_an_offset() {
        let frame = SharedFrames::encode(OpCode::Text, b"0123456789");
        let mut queues: Vec<OutQueue> = (0..3).map(|_| OutQueue::default()).collect();
        let mut writers: Vec<ThrottledWriter> = (0..3).map(|_| writer(5)).collect();
        for (q, w) in queues.iter_mut().zip(&mut writers) {
            let sent = q.send_shared(std::slice::from_ref(&frame), 1000, w);
            assert_eq!(sent.unwrap(), Sent::Queued);
            assert_eq!(q.queued_bytes(), 7);
            assert!(q.head.as_ref().unwrap().is(&frame), "shared, not copied");
        }
        assert_eq!(frame.references(), 4);
        for (q, w) in queues.iter_mut().zip(&mut writers) {
            w.budget = 100;
            assert_eq!(q.flush(w).unwrap(), Sent::Written);
            assert_eq!(w.written, frame.bytes());
        }
        assert_eq!(frame.references(), 1);
    }

    #[test]
    fn queued_frames_and_private_bytes_keep_their_order_and_limit() {
        let a = SharedFrames::encode(OpCode::Text, b"aaaa");
        let b = SharedFrames::encode(OpCode::Text, b"bbbb");
        let mut q = OutQueue::default();
        let mut w = writer(3);
        q.send_shared(std::slice::from_ref(&a), 12, &mut w).unwrap();
        let sent = q.send_private(&[b"\x8a", b"\x00"], &mut w);
        assert_eq!(
            sent.unwrap(),
            Sent::Queued,
            "behind the partly written frame"
        );
        q.send_shared(std::slice::from_ref(&b), 12, &mut w).unwrap();
        assert_eq!(q.queued_bytes(), 3 + 2 + 6);
        assert_eq!(
            q.send_shared(std::slice::from_ref(&b), 12, &mut w).unwrap(),
            Sent::Dropped { kept: 0 }
        );
        for budget in [1, 2, 3, 0, 100] {
            w.budget = budget;
            let drained = q.flush(&mut w).unwrap() == Sent::Written;
            assert_eq!(drained, q.is_empty());
        }
        assert_eq!(w.written, b"\x81\x04aaaa\x8a\x00\x81\x04bbbb");
        assert!(q.backlog.is_none(), "the backlog is freed once drained");
    }

    #[test]
    fn several_buffers_go_out_in_one_write_and_the_rest_is_queued_by_reference() {
        let frames: Vec<SharedFrames> = (0..40u8)
            .map(|i| SharedFrames::encode(OpCode::Text, &[b'a' + i % 26]))
            .collect();
        let mut q = OutQueue::default();
        // 40 buffers of 3 bytes: the first 32 in one writev, then 8; the
        // socket takes 100 bytes, so buffer 33 is split.
        let mut w = writer(100);
        assert_eq!(q.send_shared(&frames, 20, &mut w).unwrap(), Sent::Queued);
        assert_eq!(w.written.len(), 100);
        assert_eq!(q.queued_bytes(), 40 * 3 - 100);
        assert_eq!(q.queued_frames(), 7, "the split one and the 6 after it");
        assert!(q.head.as_ref().unwrap().is(&frames[33]), "by reference");
        w.budget = 1000;
        assert_eq!(q.flush(&mut w).unwrap(), Sent::Written);
        let expected: Vec<u8> = frames.iter().flat_map(|f| f.bytes().to_vec()).collect();
        assert_eq!(w.written, expected);
        // Behind a backlog, those that fit: 2 bytes left of the first, and
        // 32 more buffers of 3 within 100 bytes.
        let mut w = writer(1);
        q.send_shared(&frames[..1], 100, &mut w).unwrap();
        let sent = q.send_shared(&frames, 100, &mut w).unwrap();
        assert_eq!(sent, Sent::Dropped { kept: 32 });
        assert_eq!(q.queued_bytes(), 2 + 32 * 3);
    }

    #[test]
    fn what_a_socket_does_not_take_is_queued_only_within_the_limit() {
        let frames: Vec<SharedFrames> = (0..40u8)
            .map(|i| SharedFrames::encode(OpCode::Text, &[b'a' + i % 26]))
            .collect();
        let mut q = OutQueue::default();
        // The socket takes 100 bytes: 33 buffers and 1 byte of the 34th,
        // whose 2 other bytes are always finished; 2 more fit in 8 bytes.
        let mut w = writer(100);
        let sent = q.send_shared(&frames, 8, &mut w).unwrap();
        assert_eq!(sent, Sent::Dropped { kept: 36 });
        assert_eq!((q.queued_bytes(), q.queued_frames()), (8, 3));
        w.budget = 1000;
        assert_eq!(q.flush(&mut w).unwrap(), Sent::Written);
        let expected: Vec<u8> = frames[..36]
            .iter()
            .flat_map(|f| f.bytes().to_vec())
            .collect();
        assert_eq!(
            w.written, expected,
            "whole frames, in order, none after a gap"
        );
        // A limit below the split buffer's rest still finishes it.
        let mut q = OutQueue::default();
        let mut w = writer(100);
        assert_eq!(
            q.send_shared(&frames, 0, &mut w).unwrap(),
            Sent::Dropped { kept: 34 }
        );
        assert_eq!(q.queued_bytes(), 2);
    }

    #[test]
    fn private_bytes_are_copied_only_when_the_socket_is_full() {
        let mut q = OutQueue::default();
        let mut w = writer(4);
        let sent = q.send_private(&[b"HTTP", b"/1.1 101"], &mut w);
        assert_eq!(sent.unwrap(), Sent::Queued);
        assert_eq!(q.head.as_ref().unwrap().bytes(), b"/1.1 101");
        w.budget = 100;
        assert_eq!(q.flush(&mut w).unwrap(), Sent::Written);
        assert_eq!(w.written, b"HTTP/1.1 101");
    }

    #[test]
    fn dropping_unstarted_frames_keeps_a_partly_written_head() {
        let frame = SharedFrames::encode(OpCode::Text, b"abcdef");
        let mut q = OutQueue::default();
        let mut w = writer(2);
        for _ in 0..3 {
            q.send_shared(std::slice::from_ref(&frame), 100, &mut w)
                .unwrap();
        }
        assert_eq!(q.drop_unstarted(), 2);
        assert_eq!(q.queued_bytes(), 6);
        w.budget = 100;
        assert_eq!(q.flush(&mut w).unwrap(), Sent::Written);
        assert_eq!(w.written, frame.bytes());
    }
}

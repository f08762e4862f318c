//! Broadcast buffers: a frame encoded once into one shared buffer, and the
//! per-connection output queue that holds references to such frames.
//!
//! A connection whose socket takes a frame whole keeps nothing. One that
//! takes part of it keeps a reference and an offset; frames that arrive
//! while it is behind are queued as references. Payload bytes are never
//! copied per connection.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::Arc;

use crate::io::{write_until_blocked, MAX_IOV};
use crate::ws::header::MAX_HEADER_LEN;
use crate::ws::{FrameHeader, OpCode};

/// An encoded frame shared by every queue it is in (a thin pointer, so a
/// queued reference costs 8 bytes).
#[derive(Debug, Clone)]
pub struct SharedFrame(Arc<Box<[u8]>>);

impl SharedFrame {
    /// Encodes one unmasked, final frame: header and payload in one buffer.
    pub fn encode(opcode: OpCode, payload: &[u8]) -> SharedFrame {
        let mut header = [0u8; MAX_HEADER_LEN];
        let header_len = FrameHeader::server(opcode, payload.len() as u64).encode(&mut header);
        SharedFrame::from_parts(&[&header[..header_len], payload])
    }

    /// A frame (or the unwritten rest of one) from bytes already encoded.
    pub fn from_parts(parts: &[&[u8]]) -> SharedFrame {
        SharedFrame(Arc::new(parts.concat().into_boxed_slice()))
    }

    /// The encoded bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Refused by [`OutQueue::send_shared`]: the queue holds too many bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

/// Frames queued behind the head, allocated only while a connection is
/// more than one frame behind.
#[derive(Debug, Default)]
struct Backlog {
    frames: VecDeque<SharedFrame>,
    bytes: usize,
}

/// A connection's pending output: the frame being written with how much of
/// it went out, then the frames behind it. Empty, it owns no heap memory.
#[derive(Debug, Default)]
pub struct OutQueue {
    head: Option<SharedFrame>,
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

    /// Frames not written whole yet (a partly written head counts).
    pub fn queued_frames(&self) -> usize {
        usize::from(self.head.is_some()) + self.backlog.as_ref().map_or(0, |b| b.frames.len())
    }

    /// Bytes waiting to be written.
    pub fn queued_bytes(&self) -> usize {
        let head = self
            .head
            .as_ref()
            .map_or(0, |f| f.bytes().len() - self.written as usize);
        head + self.backlog.as_ref().map_or(0, |b| b.bytes)
    }

    /// Sends a shared frame: written straight away when nothing is queued,
    /// else queued by reference. Refused when the queue is not empty and
    /// would exceed `limit` bytes with it.
    pub fn send_shared(
        &mut self,
        frame: &SharedFrame,
        limit: usize,
        w: &mut impl Write,
    ) -> io::Result<Result<(), QueueFull>> {
        if !self.is_empty() {
            if self.queued_bytes() + frame.bytes().len() > limit {
                return Ok(Err(QueueFull));
            }
            self.push(frame.clone());
            return Ok(Ok(()));
        }
        let n = write_until_blocked(w, &[frame.bytes()])?;
        if n < frame.bytes().len() {
            self.head = Some(frame.clone());
            self.written = n as u32;
        }
        Ok(Ok(()))
    }

    /// Sends bytes of this connection's own (a handshake response, pong,
    /// close or echo): written straight away when nothing is queued, and
    /// only what the socket did not take is copied into the queue.
    pub fn send_private(&mut self, parts: &[&[u8]], w: &mut impl Write) -> io::Result<()> {
        if !self.is_empty() {
            self.push(SharedFrame::from_parts(parts));
            return Ok(());
        }
        let n = write_until_blocked(w, parts)?;
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if n < total {
            let rest = unwritten(parts, n);
            self.head = Some(SharedFrame::from_parts(&rest[..]));
        }
        Ok(())
    }

    /// Writes queued frames until the queue is empty (`true`) or the socket
    /// would block (`false`), several frames per `writev`.
    pub fn flush(&mut self, w: &mut impl Write) -> io::Result<bool> {
        while let Some(head) = &self.head {
            let mut parts: [&[u8]; MAX_IOV] = [&[]; MAX_IOV];
            parts[0] = &head.bytes()[self.written as usize..];
            let mut count = 1;
            if let Some(backlog) = &self.backlog {
                for (part, frame) in parts[1..].iter_mut().zip(&backlog.frames) {
                    *part = frame.bytes();
                    count += 1;
                }
            }
            let wanted: usize = parts[..count].iter().map(|p| p.len()).sum();
            let n = write_until_blocked(w, &parts[..count])?;
            self.advance(n);
            if n < wanted {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Drops every frame not yet started, keeping a partly written head so
    /// the stream stays a sequence of whole frames. Returns the frames dropped.
    pub fn drop_unstarted(&mut self) -> usize {
        let dropped = self.backlog.take().map_or(0, |b| b.frames.len());
        if self.written == 0 && self.head.take().is_some() {
            return dropped + 1;
        }
        dropped
    }

    fn push(&mut self, frame: SharedFrame) {
        if self.head.is_none() {
            self.head = Some(frame);
            self.written = 0;
            return;
        }
        let backlog = self.backlog.get_or_insert_with(Default::default);
        backlog.bytes += frame.bytes().len();
        backlog.frames.push_back(frame);
    }

    /// Marks `n` more bytes as written, moving past finished frames.
    fn advance(&mut self, mut n: usize) {
        while let Some(head) = &self.head {
            let left = head.bytes().len() - self.written as usize;
            if n < left {
                self.written += n as u32;
                return;
            }
            n -= left;
            self.written = 0;
            self.head = self.backlog.as_mut().and_then(|b| b.frames.pop_front());
            if let (Some(next), Some(backlog)) = (&self.head, &mut self.backlog) {
                backlog.bytes -= next.bytes().len();
            }
            if self.backlog.as_ref().is_some_and(|b| b.frames.is_empty()) {
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
    use crate::testing::ThrottledWriter;

    fn writer(budget: usize) -> ThrottledWriter {
        ThrottledWriter {
            budget,
            ..Default::default()
        }
    }

    #[test]
    fn encodes_header_and_payload_once() {
        let frame = SharedFrame::encode(OpCode::Text, b"hello");
        assert_eq!(frame.bytes(), b"\x81\x05hello");
        let big = SharedFrame::encode(OpCode::Binary, &[0; 300]);
        assert_eq!(&big.bytes()[..4], &[0x82, 126, 1, 44]);
    }

    #[test]
    fn a_writable_socket_takes_the_frame_and_nothing_is_kept() {
        let frame = SharedFrame::encode(OpCode::Text, b"hi");
        let mut q = OutQueue::default();
        let mut w = writer(100);
        q.send_shared(&frame, 10, &mut w).unwrap().unwrap();
        assert!(q.is_empty());
        assert_eq!(w.written, frame.bytes());
        assert_eq!(Arc::strong_count(&frame.0), 1, "no reference kept");
    }

    #[test]
    fn a_partial_write_keeps_a_reference_and_an_offset() {
        let frame = SharedFrame::encode(OpCode::Text, b"0123456789");
        let mut queues: Vec<OutQueue> = (0..3).map(|_| OutQueue::default()).collect();
        let mut writers: Vec<ThrottledWriter> = (0..3).map(|_| writer(5)).collect();
        for (q, w) in queues.iter_mut().zip(&mut writers) {
            q.send_shared(&frame, 1000, w).unwrap().unwrap();
            assert_eq!(q.queued_bytes(), 7);
            assert!(
                Arc::ptr_eq(&q.head.as_ref().unwrap().0, &frame.0),
                "shared, not copied"
            );
        }
        assert_eq!(Arc::strong_count(&frame.0), 4);
        for (q, w) in queues.iter_mut().zip(&mut writers) {
            w.budget = 100;
            assert!(q.flush(w).unwrap());
            assert_eq!(w.written, frame.bytes());
        }
        assert_eq!(Arc::strong_count(&frame.0), 1);
    }

    #[test]
    fn queued_frames_and_private_bytes_keep_their_order_and_limit() {
        let a = SharedFrame::encode(OpCode::Text, b"aaaa");
        let b = SharedFrame::encode(OpCode::Text, b"bbbb");
        let mut q = OutQueue::default();
        let mut w = writer(3);
        q.send_shared(&a, 12, &mut w).unwrap().unwrap();
        q.send_private(&[b"\x8a", b"\x00"], &mut w).unwrap();
        q.send_shared(&b, 12, &mut w).unwrap().unwrap();
        assert_eq!(q.queued_bytes(), 3 + 2 + 6);
        assert_eq!(q.send_shared(&b, 12, &mut w).unwrap(), Err(QueueFull));
        for budget in [1, 2, 3, 0, 100] {
            w.budget = budget;
            let drained = q.flush(&mut w).unwrap();
            assert_eq!(drained, q.is_empty());
        }
        assert_eq!(w.written, b"\x81\x04aaaa\x8a\x00\x81\x04bbbb");
        assert!(q.backlog.is_none(), "the backlog is freed once drained");
    }

    #[test]
    fn private_bytes_are_copied_only_when_the_socket_is_full() {
        let mut q = OutQueue::default();
        let mut w = writer(4);
        q.send_private(&[b"HTTP", b"/1.1 101"], &mut w).unwrap();
        assert_eq!(q.head.as_ref().unwrap().bytes(), b"/1.1 101");
        w.budget = 100;
        assert!(q.flush(&mut w).unwrap());
        assert_eq!(w.written, b"HTTP/1.1 101");
    }

    #[test]
    fn dropping_unstarted_frames_keeps_a_partly_written_head() {
        let frame = SharedFrame::encode(OpCode::Text, b"abcdef");
        let mut q = OutQueue::default();
        let mut w = writer(2);
        for _ in 0..3 {
            q.send_shared(&frame, 100, &mut w).unwrap().unwrap();
        }
        assert_eq!(q.drop_unstarted(), 2);
        assert_eq!(q.queued_bytes(), 6);
        w.budget = 100;
        assert!(q.flush(&mut w).unwrap());
        assert_eq!(w.written, frame.bytes());
    }
}

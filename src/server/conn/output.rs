//! The output stage: what a connection writes. Every byte goes through
//! one function, `Conn::send`, whatever it is (a reply gathered during a
//! read, a frame of its own, an HTTP answer, the shared frames a delivery
//! visit gives it, or what is queued once the socket is writable), in one
//! `write`/`writev` per call, and answers with one [`Sent`]. How a message
//! is put on the wire (framing, compression) is the connection's
//! [`Wire`](super::wire::Wire), a parameter of that path.

use std::net::Shutdown;

use super::wire::{Outgoing, OwnMessage, MAX_OWN_HEAD};
use super::{CloseReason, Conn, Ctx, Flags, Phase, Verdict};
use crate::protocol::http::{self, MAX_RESPONSE_LEN};
use crate::protocol::ws::compress::{deflate_into, Level};
use crate::protocol::ws::OpCode;
use crate::server::frames::SharedFrames;
use crate::server::key::ConnKey;
use crate::server::net::queue::{OutQueue, Sent};

impl Conn {
    /// The socket is writable: flush the queue; a drained queue may let
    /// the connection half-close or resume reading.
    pub fn on_writable(&mut self, key: ConnKey, scratch: &mut [u8], ctx: &mut Ctx<'_>) -> Verdict {
        match self.send(key, Outgoing::Queued, ctx) {
            Err(reason) => Verdict::Close(reason),
            Ok(Sent::Written) if self.flags.has(Flags::READ_PAUSED) => {
                self.on_readable(key, false, scratch, ctx)
            }
            Ok(_) => Verdict::Keep,
        }
    }

    /// Answers the endpoint it asked for (see [`Verdict::Serve`]) with
    /// `status` and `body` (its head alone for a `HEAD`), then reads on,
    /// discarding, until the client goes.
    pub fn respond(
        &mut self,
        key: ConnKey,
        status: http::PageStatus,
        content_type: &str,
        (body, method): (&[u8], http::Method),
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        debug_assert!(
            matches!(
                self.phase,
                Phase::Lingering {
                    reason: CloseReason::Http,
                    ..
                }
            ),
            "bug: only a plain HTTP request is answered with a body"
        );
        let mut head = [0u8; MAX_RESPONSE_LEN];
        let len = http::write_page_head(status, content_type, body.len(), &mut head);
        let body = if method == http::Method::Head {
            &[]
        } else {
            body
        };
        match self.send(key, Outgoing::Response(&head[..len], body), ctx) {
            // Reading stopped at the request to let the loop answer it.
            Ok(_) => Verdict::ReadAgain,
            Err(reason) => Verdict::Close(reason),
        }
    }

    /// Returns `Some(want)` when the writable interest must change to `want`.
    pub fn interest_change(&mut self) -> Option<bool> {
        let want = self.has_queued();
        (want != self.flags.has(Flags::WRITABLE_INTEREST)).then(|| {
            self.flags.set(Flags::WRITABLE_INTEREST, want);
            want
        })
    }

    /// Answers what the current read brought with a message (a pong, an
    /// echo), gathered with the read's other replies; compressed when the
    /// wire says so.
    pub(super) fn reply(
        &mut self,
        key: ConnKey,
        opcode: OpCode,
        payload: &[u8],
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        if !self.wire.compresses(opcode, payload.len(), ctx.config) {
            let reply = Outgoing::Reply(OwnMessage::plain(opcode, payload));
            return Verdict::after(self.send(key, reply, ctx));
        }
        let mut compressed = std::mem::take(&mut ctx.deflate.compressed);
        deflate_into(payload, Level::Single, &mut compressed);
        let message = OwnMessage {
            opcode,
            payload: &compressed,
            compressed: true,
        };
        let verdict = Verdict::after(self.send(key, Outgoing::Reply(message), ctx));
        ctx.deflate.compressed = compressed;
        verdict
    }

    /// The connection's one output path: writes `out` after whatever was
    /// gathered and queued before it (so replies to a read go out before
    /// any frame that follows them, in the same `writev`), counts what it
    /// wrote and queued, and, lingering with nothing left to write,
    /// half-closes. A failed socket is `Err` with the reason to close.
    /// The queue is taken from aside for the call, and put back while it
    /// is not empty.
    pub(super) fn send(
        &mut self,
        key: ConnKey,
        out: Outgoing<'_>,
        ctx: &mut Ctx<'_>,
    ) -> Result<Sent, CloseReason> {
        if let Outgoing::Reply(message) = out {
            let mut header = [0u8; MAX_OWN_HEAD];
            let (len, payload, tail) = self.wire.wrap(message, &mut header);
            if let Some(sent) = self.gather(key, &[&header[..len], payload, tail], ctx)? {
                return Ok(sent);
            }
        }
        let mut queue = self.take_queue(key, ctx);
        let sent = self.send_through(&mut queue, out, ctx);
        self.keep_queue(key, queue, ctx);
        sent
    }

    /// Its output queue, taken from aside (an empty one if it has none).
    pub(super) fn take_queue(&mut self, key: ConnKey, ctx: &mut Ctx<'_>) -> OutQueue {
        if !self.flags.take(Flags::QUEUED) {
            return OutQueue::default();
        }
        ctx.aside.queues.remove(&key).unwrap_or_default()
    }

    /// Puts `queue` back aside, unless it is empty.
    fn keep_queue(&mut self, key: ConnKey, queue: OutQueue, ctx: &mut Ctx<'_>) {
        if !queue.is_empty() {
            self.flags.set(Flags::QUEUED, true);
            ctx.aside.queues.insert(key, queue);
        }
    }

    /// [`Conn::send`] through `queue`, its output queue.
    fn send_through(
        &mut self,
        queue: &mut OutQueue,
        out: Outgoing<'_>,
        ctx: &mut Ctx<'_>,
    ) -> Result<Sent, CloseReason> {
        let replies: &[u8] = ctx.replies;
        if matches!(out, Outgoing::Replies) && replies.is_empty() {
            // Nothing written, nothing to half-close after: a connection
            // that just asked for an endpoint lingers until the loop has
            // handed it the answer (`Verdict::Serve`).
            return Ok(Sent::taken(queue));
        }
        let before = queue.queued_bytes();
        let (sent, offered, frames) = match out {
            Outgoing::Reply(message) | Outgoing::Frame(message) => {
                let mut header = [0u8; MAX_OWN_HEAD];
                let (len, payload, tail) = self.wire.wrap(message, &mut header);
                let parts = [replies, &header[..len], payload, tail];
                let sent = queue.send_private(&parts, &mut self.stream);
                (sent, total_len(&parts), 1)
            }
            Outgoing::Response(head, body) => {
                let parts = [replies, head, body];
                let sent = queue.send_private(&parts, &mut self.stream);
                (sent, total_len(&parts), 0)
            }
            Outgoing::Replies => {
                let sent = queue.send_private(&[replies], &mut self.stream);
                (sent, replies.len(), 0)
            }
            Outgoing::Shared(shared) => {
                let limit = ctx.config.max_queued_bytes;
                let sent = self
                    .write_ahead(queue, replies)
                    .and_then(|()| queue.send_shared(shared, limit, &mut self.stream));
                let taken = match sent {
                    Ok(Sent::Dropped { kept }) => &shared[..kept],
                    _ => shared,
                };
                let offered = replies.len() + taken.iter().map(|f| f.bytes().len()).sum::<usize>();
                let frames = taken.iter().map(SharedFrames::count).sum();
                (sent, offered, frames)
            }
            Outgoing::Queued => {
                let sent = self
                    .write_ahead(queue, replies)
                    .and_then(|()| queue.flush(&mut self.stream));
                (sent, replies.len(), 0)
            }
        };
        ctx.replies.clear();
        let sent = sent.map_err(|e| {
            log::debug!("write failed: {e}");
            CloseReason::Abnormal
        })?;
        ctx.tally.frames_sent += frames as u64;
        // Counted by its wire too (what was not dropped).
        self.wire.count(ctx.tally, frames as u64, 0);
        let after = queue.queued_bytes();
        ctx.tally.wrote(before + offered - after, before, after);
        self.half_close_when_flushed(queue)?;
        Ok(sent)
    }

    /// Writes (or queues) the gathered replies ahead of what [`Conn::send`]
    /// writes next with a call of its own.
    fn write_ahead(&mut self, queue: &mut OutQueue, replies: &[u8]) -> std::io::Result<()> {
        if !replies.is_empty() {
            queue.send_private(&[replies], &mut self.stream)?;
        }
        Ok(())
    }

    /// Adds a reply frame to the gathered replies, writing those first
    /// when it does not fit behind them; `None` when it is larger than the
    /// gathering buffer and must go out on its own, without the copy.
    fn gather(
        &mut self,
        key: ConnKey,
        frame: &[&[u8]],
        ctx: &mut Ctx<'_>,
    ) -> Result<Option<Sent>, CloseReason> {
        let len = total_len(frame);
        if len > ctx.replies.capacity() - ctx.replies.len() {
            self.send(key, Outgoing::Replies, ctx)?;
        }
        if len > ctx.replies.capacity() {
            return Ok(None);
        }
        ctx.tally.frames_sent += 1;
        frame
            .iter()
            .for_each(|part| ctx.replies.extend_from_slice(part));
        Ok(Some(Sent::Queued))
    }

    /// Discards queued output, what is not started yet or (`all`: the
    /// connection is going) everything, counting its frames as discarded;
    /// returns how many.
    pub(super) fn discard_output(&mut self, key: ConnKey, all: bool, ctx: &mut Ctx<'_>) -> usize {
        let mut queue = self.take_queue(key, ctx);
        let before = queue.queued_bytes();
        let dropped = if all {
            std::mem::take(&mut queue).queued_frames()
        } else {
            queue.drop_unstarted()
        };
        ctx.tally.wrote(0, before, queue.queued_bytes());
        ctx.tally.frames_discarded += dropped as u64;
        self.keep_queue(key, queue, ctx);
        dropped
    }

    /// Lingering with everything written: send FIN (the server closes the
    /// TCP connection first, RFC 6455 §7.1.1) and wait for the client's.
    fn half_close_when_flushed(&mut self, queue: &OutQueue) -> Result<(), CloseReason> {
        if let Phase::Lingering {
            reason, write_shut, ..
        } = &mut self.phase
        {
            if !*write_shut && queue.is_empty() {
                *write_shut = true;
                if let Err(e) = self.stream.shutdown(Shutdown::Write) {
                    log::debug!("shutdown failed: {e}");
                    return Err(*reason);
                }
            }
        }
        Ok(())
    }
}

/// The bytes in `parts`.
fn total_len(parts: &[&[u8]]) -> usize {
    parts.iter().map(|p| p.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::super::rig::{client_frame, read_in_background, Rig};
    use super::*;
    use crate::server::owed::Seq;
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    #[test]
    fn replies_to_one_read_go_out_in_order_and_before_the_close() {
        let mut rig = Rig::upgraded();
        // Room for one 22-byte pong at a time: the gathered replies are
        // written when the next does not fit, and a pong larger than the
        // room goes out on its own, all in order.
        rig.replies = Vec::with_capacity(40);
        let payloads: Vec<Vec<u8>> = [20, 20, 20, 125, 3, 0]
            .iter()
            .enumerate()
            .map(|(i, &len)| vec![b'a' + i as u8; len])
            .collect();
        let mut wire: Vec<u8> = payloads.iter().flat_map(|p| client_frame(0x9, p)).collect();
        wire.extend(client_frame(0x8, &1000u16.to_be_bytes()));
        rig.client.write_all(&wire).unwrap();
        rig.wait_until_readable(wire.len());
        rig.drive(|conn, scratch, ctx| conn.on_readable(ConnKey(0), false, scratch, ctx));
        assert!(rig.replies.is_empty(), "the replies were written");
        for payload in &payloads {
            assert_eq!(rig.client_frame_start(), [0x8A, payload.len() as u8]);
            let mut got = vec![0u8; payload.len()];
            rig.client.read_exact(&mut got).unwrap();
            assert_eq!(&got, payload);
        }
        assert_eq!(rig.client_frame_start(), [0x88, 2], "the close comes last");
        let mut code = [0u8; 2];
        rig.client.read_exact(&mut code).unwrap();
        assert_eq!(u16::from_be_bytes(code), 1000);
        let mut rest = Vec::new();
        rig.client.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "then the half-close: {rest:?}");
    }

    #[test]
    fn writable_interest_follows_the_queue_between_empty_and_not() {
        let mut rig = Rig::upgraded();
        rig.config.max_queued_bytes = 64 << 20;
        assert_eq!(rig.conn.interest_change(), None, "nothing queued yet");
        let written_before = rig.tally.bytes_written;
        // More than the socket buffers take while the client reads nothing.
        let big = SharedFrames::encode(OpCode::Binary, &vec![7u8; 16 << 20]);
        let small = SharedFrames::encode(OpCode::Text, b"after");
        for frames in [&big, &small] {
            assert_eq!(rig.offer(frames), Verdict::Keep);
        }
        assert_eq!(rig.tally.broadcast_deliveries, 2);
        assert_eq!(rig.tally.write_would_block, 2, "both queued");
        assert_eq!(rig.aside.queues(), 1, "the queue is aside");
        assert_eq!(rig.conn.interest_change(), Some(true));
        assert_eq!(rig.conn.interest_change(), None, "only on a change");
        assert_eq!(rig.conn.next_batch(), Some(Seq(2)));

        let total = big.bytes().len() + small.bytes().len();
        let reader = read_in_background(&rig.client, total);
        let deadline = Instant::now() + Duration::from_secs(10);
        while rig.conn.has_queued() {
            assert!(Instant::now() < deadline, "the queue never drained");
            let verdict =
                rig.drive(|conn, scratch, ctx| conn.on_writable(ConnKey(0), scratch, ctx));
            assert_eq!(verdict, Verdict::Keep);
            std::thread::yield_now();
        }
        assert_eq!(rig.conn.interest_change(), Some(false));
        assert_eq!(rig.conn.interest_change(), None);
        assert_eq!(rig.aside.queues(), 0, "a drained queue is not kept");
        let got = reader.join().unwrap();
        assert_eq!(&got[got.len() - 7..], b"\x81\x05after", "in order, whole");
        assert_eq!(rig.tally.queued_bytes, 0, "every queued byte uncounted");
        assert_eq!(rig.tally.bytes_written - written_before, total as u64);
    }
}

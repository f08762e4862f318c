//! The input stage: what a connection reads. Bytes are read into the
//! loop's scratch buffer, fed to the phase (the request head, or the frame
//! decoder), compressed messages inflated, and each message handed on:
//! upstream, echoed, or (a ping) answered with a pong among the read's
//! gathered replies.

use super::wire::{Outgoing, OwnMessage};
use super::{CloseReason, Conn, Ctx, Flags, Phase, Verdict};
use crate::ops::metrics::Metrics;
use crate::protocol::names::ClientIdRef;
use crate::protocol::ws::inflate::InflateError;
use crate::protocol::ws::{CloseCode, Event, MessageKind, OpCode, ProtocolError};
use crate::server::handle::upstream::Offered;
use crate::server::key::ConnKey;
use crate::server::net::nonblocking::{read_some, Progress};
use crate::server::net::pool::PooledBuf;

/// Bytes read from one connection per readiness event before the loop
/// serves the others (the rest is read on the next iteration).
const READ_BUDGET: usize = 1 << 20;

impl Conn {
    /// The socket is readable: read until it is drained (or the read
    /// budget is used), feeding the bytes to the current phase.
    ///
    /// `edge` says the call answers a readiness event that reported no
    /// hang-up, or is the first read after the socket was registered: then
    /// a short read proves the socket drained, because Linux epoll reports
    /// every later arrival (data or FIN) as a new edge (and a registration
    /// reports what is already there), and the read that would only say
    /// WouldBlock is skipped (one syscall per event). Otherwise reading
    /// goes on until WouldBlock.
    pub fn on_readable(
        &mut self,
        key: ConnKey,
        edge: bool,
        scratch: &mut [u8],
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        let mut budget = READ_BUDGET;
        while budget > 0 {
            let upstream_paused = ctx.upstream.as_ref().is_some_and(|u| u.is_paused());
            if upstream_paused && !matches!(self.phase, Phase::Handshake(_)) {
                return Verdict::AwaitUpstream;
            }
            let backed_up = self.output_backed_up(key, ctx);
            self.flags.set(Flags::READ_PAUSED, backed_up);
            if backed_up {
                // Echo backpressure: resume when the queue drains.
                return Verdict::Keep;
            }
            let held = self.flags.has(Flags::HOLDING);
            let room = held
                .then(|| ctx.aside.held.get(&key))
                .flatten()
                .map_or(scratch.len(), |buf| buf.capacity() - buf.len())
                .min(scratch.len());
            debug_assert!(room > 0, "bug: a lent input buffer is never full");
            let n = match read_some(&mut self.stream, &mut scratch[..room]) {
                Ok(Progress::Done(n)) => n,
                Ok(Progress::WouldBlock) => return Verdict::Keep,
                Ok(Progress::Eof) => return self.on_eof(),
                Err(e) => {
                    log::debug!("read failed: {e}");
                    return Verdict::Close(CloseReason::Abnormal);
                }
            };
            budget = budget.saturating_sub(n);
            self.liveness.heard();
            let verdict = self.consume(key, &mut scratch[..n], ctx);
            if verdict != Verdict::Keep {
                return verdict;
            }
            if edge && n < room {
                return Verdict::Keep;
            }
        }
        Verdict::ReadAgain
    }

    /// Feeds freshly read bytes (held back partial input first) to the
    /// current phase, and keeps what it could not consume yet.
    fn consume(&mut self, key: ConnKey, fresh: &mut [u8], ctx: &mut Ctx<'_>) -> Verdict {
        let verdict = self.consume_gathering(key, fresh, ctx);
        match (verdict, self.send(key, Outgoing::Replies, ctx)) {
            (verdict @ Verdict::Close(_), _) => verdict,
            (_, Err(reason)) => Verdict::Close(reason),
            (verdict, Ok(_)) => verdict,
        }
    }

    /// [`Conn::consume`] up to the write of the gathered replies.
    fn consume_gathering(&mut self, key: ConnKey, fresh: &mut [u8], ctx: &mut Ctx<'_>) -> Verdict {
        let held = self.flags.take(Flags::HOLDING);
        let Some(mut held) = held.then(|| ctx.aside.held.remove(&key)).flatten() else {
            let (used, verdict) = self.process(key, fresh, 0, ctx);
            if used < fresh.len() && !matches!(verdict, Verdict::Close(_)) {
                let mut held = ctx.pool.lend();
                held.extend_from_slice(&fresh[used..]);
                self.hold(key, held, ctx);
            }
            return verdict;
        };
        let seen = held.len();
        held.extend_from_slice(fresh);
        let (used, verdict) = self.process(key, &mut held, seen, ctx);
        held.drain(..used);
        if held.is_empty() || matches!(verdict, Verdict::Close(_)) {
            ctx.pool.give_back(held);
        } else {
            self.hold(key, held, ctx);
        }
        verdict
    }

    /// Keeps `held`, input not consumed yet, aside until more arrives.
    fn hold(&mut self, key: ConnKey, held: PooledBuf, ctx: &mut Ctx<'_>) {
        self.flags.set(Flags::HOLDING, true);
        ctx.aside.held.insert(key, held);
    }

    /// Runs the current phase over `bytes`, of which the first `seen` were
    /// held over from earlier reads; returns how many were consumed.
    fn process(
        &mut self,
        key: ConnKey,
        bytes: &mut [u8],
        seen: usize,
        ctx: &mut Ctx<'_>,
    ) -> (usize, Verdict) {
        let mut pos = 0;
        if let Phase::Handshake(endpoints) = self.phase {
            let (used, verdict) = self.handshake(key, endpoints, bytes, seen, ctx);
            if matches!(self.phase, Phase::Lingering { .. }) {
                // Answered: whatever the client sent after the head is read
                // and discarded until it goes, never held.
                return (bytes.len(), verdict);
            }
            if verdict != Verdict::Keep || !self.is_open() {
                return (used, verdict);
            }
            // Bytes after the head are the first frames (pipelined).
            pos = used;
        }
        if !self.wire.hears() {
            return (bytes.len(), Verdict::Keep);
        }
        loop {
            let decoded = match &mut self.phase {
                Phase::Open(decoder) | Phase::CloseSent { decoder, .. } => decoder.decode(
                    &mut bytes[pos..],
                    ctx.config.max_message_bytes,
                    self.wire.deflate().negotiated(),
                ),
                Phase::Handshake(_) | Phase::Lingering { .. } => {
                    return (bytes.len(), Verdict::Keep)
                }
            };
            let event = match decoded {
                Ok((used, Some(event))) => {
                    pos += used;
                    event
                }
                Ok((used, None)) => return (pos + used, Verdict::Keep),
                Err(error) => return (bytes.len(), self.fail(key, error, ctx)),
            };
            let verdict = self.on_event(key, event, ctx);
            if verdict != Verdict::Keep {
                return (pos, verdict);
            }
        }
    }

    /// Acts on one event from the client.
    fn on_event(&mut self, key: ConnKey, event: Event<'_>, ctx: &mut Ctx<'_>) -> Verdict {
        let closing = !self.is_open();
        match event {
            Event::Data {
                kind,
                payload,
                last,
                compressed,
            } => {
                if last {
                    Metrics::incr(&ctx.counters.metrics.messages_received);
                }
                // Messages are wanted echoed or upstream. A compressed
                // message is inflated even if it is dropped: its size and
                // its text are checked as a plain one's are.
                let wanted = ctx.config.echo || ctx.upstream.is_some();
                if (wanted || compressed) && !closing {
                    return self.on_data(key, kind, payload, last, compressed, ctx);
                }
                Verdict::Keep
            }
            Event::Ping(payload) if !closing => {
                Metrics::incr(&ctx.counters.metrics.pings_received);
                self.reply(key, OpCode::Pong, payload, ctx)
            }
            Event::Ping(_) | Event::Pong(_) => Verdict::Keep,
            Event::Close(frame) => {
                let reason = match self.phase {
                    Phase::CloseSent { reason, .. } => reason,
                    _ => CloseReason::Normal(frame.map_or(CloseCode(1005), |f| f.code)),
                };
                self.linger(key, reason, ctx);
                if closing {
                    // Our close went out before; nothing more to send.
                    return Verdict::after(self.send(key, Outgoing::Queued, ctx));
                }
                // Echo the status code (§5.5.1); no code in, no code out.
                let code = frame.map(|f| f.code.0.to_be_bytes());
                let payload = code.as_ref().map_or(&[][..], |c| &c[..]);
                let close = Outgoing::Frame(OwnMessage::plain(OpCode::Close, payload));
                Verdict::after(self.send(key, close, ctx))
            }
        }
    }

    /// A piece of a data message, when messages are echoed or written
    /// upstream, or are compressed: pieces are gathered in a pooled buffer
    /// until the message is complete (one that arrived in one piece is
    /// used straight from the input).
    fn on_data(
        &mut self,
        key: ConnKey,
        kind: MessageKind,
        payload: &[u8],
        last: bool,
        compressed: bool,
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        if last && !self.flags.has(Flags::ASSEMBLING) {
            return self.on_whole(key, kind, payload, compressed, ctx);
        }
        let pool = &mut *ctx.pool;
        let message = ctx.aside.messages.entry(key).or_insert_with(|| pool.lend());
        message.extend_from_slice(payload);
        self.flags.set(Flags::ASSEMBLING, !last);
        if !last {
            return Verdict::Keep;
        }
        let message = ctx.aside.messages.remove(&key).expect("just assembled");
        let verdict = self.on_whole(key, kind, &message, compressed, ctx);
        ctx.pool.give_back(message);
        verdict
    }

    /// A whole data message: written upstream, and echoed in echo mode
    /// (otherwise dropped).
    fn on_message(
        &mut self,
        key: ConnKey,
        kind: MessageKind,
        message: &[u8],
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        if let Some(upstream) = ctx.upstream.as_deref_mut() {
            let conn = self.conn_ref(key, ctx.config.instance);
            let id = self.target.id().map(ClientIdRef::as_str);
            match upstream.message(conn, id, kind, message) {
                Offered::Taken => Metrics::incr(&ctx.counters.metrics.upstream_messages),
                Offered::TakenPausing => {
                    Metrics::incr(&ctx.counters.metrics.upstream_messages);
                    Metrics::incr(&ctx.counters.metrics.upstream_pauses);
                    log::debug!("upstream a bound behind: reading clients paused");
                }
                Offered::Dropped => Metrics::incr(&ctx.counters.metrics.upstream_dropped),
            }
        }
        if !ctx.config.echo {
            return Verdict::Keep;
        }
        Metrics::incr(&ctx.counters.metrics.messages_echoed);
        self.reply(key, kind.opcode(), message, ctx)
    }

    /// A whole data message as it came: inflated first if compressed (at
    /// most `--max-message-bytes`, its text then checked), then handled.
    fn on_whole(
        &mut self,
        key: ConnKey,
        kind: MessageKind,
        payload: &[u8],
        compressed: bool,
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        if !compressed {
            return self.on_message(key, kind, payload, ctx);
        }
        let limit = usize::try_from(ctx.config.max_message_bytes).unwrap_or(usize::MAX);
        let mut inflated = std::mem::take(&mut ctx.deflate.inflated);
        let verdict = match ctx.deflate.inflater.inflate(payload, limit, &mut inflated) {
            Err(InflateError::TooBig) => self.fail(key, ProtocolError::MessageTooBig, ctx),
            Err(InflateError::Corrupt) => self.fail(key, ProtocolError::BadCompressedData, ctx),
            Ok(()) if kind == MessageKind::Text && std::str::from_utf8(&inflated).is_err() => {
                self.fail(key, ProtocolError::InvalidUtf8, ctx)
            }
            Ok(()) => self.on_message(key, kind, &inflated, ctx),
        };
        ctx.deflate.inflated = inflated;
        verdict
    }

    /// Echo backpressure: stop reading while the client is not reading
    /// what it is sent.
    fn output_backed_up(&self, key: ConnKey, ctx: &Ctx<'_>) -> bool {
        self.queued_bytes(key, ctx.aside) > ctx.config.max_queued_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::super::rig::Rig;
    use super::*;
    use crate::protocol::http::{self, Endpoint, Method};
    use std::io::{Read, Write};

    #[test]
    fn bytes_pipelined_after_an_answered_request_are_discarded_not_held() {
        let mut rig = Rig::accepted();
        let mut request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        let head_len = request.len();
        request.resize(head_len + 20_000, b'x');
        rig.client.write_all(&request).unwrap();
        let read = |rig: &mut Rig| {
            rig.drive(|conn, scratch, ctx| conn.on_readable(ConnKey(0), false, scratch, ctx))
        };
        // The read stops at the request, which goes to the loop to answer.
        assert_eq!(
            read(&mut rig),
            Verdict::Serve(Endpoint::Health, Method::Get)
        );
        assert!(
            !rig.conn.flags.has(Flags::HOLDING),
            "nothing held after the request"
        );
        let answered = rig.drive(|conn, _, ctx| {
            let body = (&b"ok\n"[..], Method::Get);
            conn.respond(ConnKey(0), http::PageStatus::Ok, "text/plain", body, ctx)
        });
        assert_eq!(answered, Verdict::ReadAgain, "what follows is read on");
        for _ in 0..2 {
            assert_eq!(read(&mut rig), Verdict::Keep);
            assert!(
                !rig.conn.flags.has(Flags::HOLDING),
                "nothing held after the answer"
            );
        }
        let mut answer = Vec::new();
        rig.client.read_to_end(&mut answer).unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"));
        assert!(answer.ends_with(b"\r\n\r\nok\n"), "then a half-close");
    }
}

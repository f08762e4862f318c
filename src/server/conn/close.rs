//! The close stage: how a connection ends. The server's close (a close
//! frame, then waiting for the client's), a protocol error's (a close with
//! its code, then lingering), the client's end of the TCP connection, and
//! the end itself, once the loop has taken the connection out of the slab:
//! its resources given back and the close counted.

use std::time::Duration;

use super::wire::{Ending, Outgoing, OwnMessage};
use super::{CloseReason, Conn, Ctx, Flags, Phase, Verdict};
use crate::ops::metrics::Metrics;
use crate::protocol::names::ClientIdRef;
use crate::protocol::ws::{CloseCode, OpCode, ProtocolError};
use crate::server::key::ConnKey;
use crate::server::net::queue::Sent;

impl Conn {
    /// Ends the connection (the loop has taken it out of the slab): clears
    /// its deadline, takes it out of the routes, returns its buffers to
    /// the pool, uncounts its queued output (counting the frames
    /// discarded), counts the close by `reason` and takes it off its
    /// gauge. The socket closes as it drops.
    pub fn close(mut self, key: ConnKey, reason: CloseReason, ctx: &mut Ctx<'_>) {
        let metrics = &ctx.counters.metrics;
        self.deadline.clear(ctx.timers);
        if self.is_websocket() {
            ctx.routes.leave(key.slot(), self.target.id());
            if let Some(upstream) = ctx.upstream.as_deref_mut() {
                let conn = self.conn_ref(key, ctx.config.instance);
                let wire = self.wire.upstream_name();
                let id = self.target.id().map(ClientIdRef::as_str);
                upstream.closed(conn, id, reason.code(), wire);
            }
        }
        self.discard_output(key, true, ctx);
        self.drop_held(key, ctx);
        self.drop_message(key, ctx);
        Metrics::incr(reason.counter(metrics));
        Metrics::decr(if self.is_websocket() {
            &metrics.connections_open
        } else {
            &metrics.connections_http
        });
        self.wire.closed(metrics);
        log::debug!("connection {key} closed: {reason:?}");
    }

    /// Starts a server-initiated close for `reason` (whose code the close
    /// frame carries, with `why`): sends a close frame after whatever is
    /// queued, then waits (bounded by the close timeout) for the client's
    /// close.
    pub fn begin_close(
        &mut self,
        key: ConnKey,
        why: &str,
        reason: CloseReason,
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        let code = reason.code();
        let Phase::Open(decoder) = self.phase else {
            return Verdict::Keep;
        };
        match self.wire.ending(reason, code, why) {
            Ending::Handshake => {
                self.phase = Phase::CloseSent { decoder, reason };
                self.arm_within(key, ctx.config.close_timeout, ctx);
                self.send_close(key, code, why, ctx)
            }
            Ending::Stream(status) => {
                let sent = match status {
                    Some(status) => self.send(key, status_message(&status), ctx),
                    None => Ok(Sent::Written),
                };
                self.linger(key, reason, ctx);
                Verdict::after(sent.and_then(|_| self.send(key, Outgoing::Queued, ctx)))
            }
        }
    }

    /// Closes it for a drain, after what is queued: a client with
    /// positions is first told to reconnect after `delay` (the hint, see
    /// [`position::reconnect_hint`](crate::protocol::position::reconnect_hint)), then every client gets 1012.
    pub fn begin_drain_close(
        &mut self,
        key: ConnKey,
        delay: Duration,
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        if !self.is_open() {
            return Verdict::Keep;
        }
        let notice = self
            .wire
            .drain_notice(delay, self.flags.has(Flags::POSITIONS));
        let mut sent = Ok(Sent::Written);
        if let Some(field) = &notice.field {
            sent = self.send(key, Outgoing::Response(field.as_bytes(), b""), ctx);
        }
        if let Some(status) = &notice.status {
            sent = sent.and_then(|_| self.send(key, status_message(status), ctx));
        }
        if let Verdict::Close(reason) = Verdict::after(sent) {
            return Verdict::Close(reason);
        }
        self.begin_close(key, "service restart", CloseReason::Drain, ctx)
    }

    /// Fails the connection: a close frame with the error's code, then linger.
    pub(super) fn fail(
        &mut self,
        key: ConnKey,
        error: ProtocolError,
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        log::debug!("protocol error from {}: {error:?}", self.target());
        let code = error.close_code();
        let already_closing = !self.is_open();
        self.linger(key, CloseReason::Failed(code), ctx);
        if already_closing {
            return Verdict::after(self.send(key, Outgoing::Queued, ctx));
        }
        self.send_close(key, code, error.reason(), ctx)
    }

    /// Enters the lingering phase with its deadline; drops a half-built message.
    pub(super) fn linger(&mut self, key: ConnKey, reason: CloseReason, ctx: &mut Ctx<'_>) {
        self.drop_message(key, ctx);
        self.phase = Phase::Lingering {
            reason,
            write_shut: false,
            upgraded: self.is_websocket(),
        };
        self.arm_within(key, ctx.config.close_timeout, ctx);
    }

    /// Sends a close frame with `code` and `why` (cut to the 123 bytes a
    /// control frame has room for).
    pub(super) fn send_close(
        &mut self,
        key: ConnKey,
        code: CloseCode,
        why: &str,
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        let mut payload = [0u8; 2 + 123];
        payload[..2].copy_from_slice(&code.0.to_be_bytes());
        let why = &why.as_bytes()[..why.len().min(123)];
        payload[2..2 + why.len()].copy_from_slice(why);
        let payload = &payload[..2 + why.len()];
        let close = Outgoing::Frame(OwnMessage::plain(OpCode::Close, payload));
        Verdict::after(self.send(key, close, ctx))
    }

    /// Gives back the buffer of a message being assembled, if any.
    pub(super) fn drop_message(&mut self, key: ConnKey, ctx: &mut Ctx<'_>) {
        if self.flags.take(Flags::ASSEMBLING) {
            if let Some(message) = ctx.aside.messages.remove(&key) {
                ctx.pool.give_back(message);
            }
        }
    }

    /// Gives back the buffer of input not consumed yet, if any.
    fn drop_held(&mut self, key: ConnKey, ctx: &mut Ctx<'_>) {
        if self.flags.take(Flags::HOLDING) {
            if let Some(held) = ctx.aside.held.remove(&key) {
                ctx.pool.give_back(held);
            }
        }
    }

    /// The client closed its side: the end its wire says of an open
    /// connection, an abnormal one of a handshake.
    pub(super) fn on_eof(&mut self) -> Verdict {
        match self.phase {
            Phase::Lingering { reason, .. } | Phase::CloseSent { reason, .. } => {
                Verdict::Close(reason)
            }
            Phase::Open(_) => Verdict::Close(self.wire.eof_reason()),
            Phase::Handshake(_) => Verdict::Close(CloseReason::Abnormal),
        }
    }
}

/// A status message (its text) of a connection's own, as it goes out.
fn status_message(status: &str) -> Outgoing<'_> {
    Outgoing::Frame(OwnMessage::plain(OpCode::Text, status.as_bytes()))
}

//! What a connection speaks on the wire, and everything that depends on
//! it: WebSocket frames (with what permessage-deflate gives it) or an
//! event stream's events. A [`Wire`] answers the upgrade with its head,
//! picks the encoding of the shared batches it takes (made once per batch
//! and wire), puts the connection's own messages in its form, says how the
//! connection closes and is kept alive, and counts what is its own. The
//! rest of `conn` calls its wire and never asks which one it is: a new
//! transport is a new variant here and a protocol module beside `sse`.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::config::Config;
use crate::ops::metrics::{Metrics, Tally};
use crate::protocol::deflate::{Agreed, MAX_WINDOW_BITS};
use crate::protocol::http::{self, Protocol, MAX_RESPONSE_LEN};
use crate::protocol::query::Resume;
use crate::protocol::ws::header::MAX_HEADER_LEN;
use crate::protocol::ws::{CloseCode, FrameHeader, OpCode};
use crate::protocol::{position, sse};
use crate::server::frames::SharedFrames;
use crate::server::time::heartbeat::{Liveness, Visit};

use super::reason::CloseReason;

/// What permessage-deflate gives a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeflateUse {
    /// Not negotiated.
    Off,
    /// Negotiated with a window under 32 KiB (`server_max_window_bits`):
    /// its compressed messages are inflated, but what it is sent goes
    /// plain, since the loop compresses with a 32 KiB window.
    Inflate,
    /// Negotiated: it inflates, and gets compressed broadcasts and echoes.
    Full,
}

impl DeflateUse {
    /// What `agreed` gives.
    pub(crate) fn of(agreed: Option<&Agreed>) -> DeflateUse {
        match agreed {
            None => DeflateUse::Off,
            Some(a) if a.server_window_bits < MAX_WINDOW_BITS => DeflateUse::Inflate,
            Some(_) => DeflateUse::Full,
        }
    }

    /// Whether permessage-deflate was negotiated at all.
    pub(crate) fn negotiated(self) -> bool {
        self != DeflateUse::Off
    }
}

/// How a connection's messages are put on the wire: the one part of a
/// connection that depends on the protocol it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wire {
    /// WebSocket frames (RFC 6455), with what permessage-deflate gives it.
    WebSocket(DeflateUse),
    /// The events of an event stream (SSE: `protocol::sse`), after a
    /// `200`; the client sends nothing.
    EventStream,
}

/// The longest head of a message of a connection's own: a frame header,
/// or an event's fields before its data.
pub(super) const MAX_OWN_HEAD: usize = 32;

/// How a connection the server closes ends, on its wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ending {
    /// The close handshake: a close frame, then the client's close.
    Handshake,
    /// The end of the stream once what is queued is written, after a
    /// status telling why (its text) where the client should know.
    Stream(Option<String>),
}

/// What a connection is told before a drain closes it: a field of the
/// wire's own to write as it is, and a status (its text).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct DrainNotice {
    /// Bytes in the wire's form, written first.
    pub(super) field: Option<String>,
    /// A status message, written after.
    pub(super) status: Option<String>,
}

impl Wire {
    /// The wire `protocol` asks for (with permessage-deflate off until
    /// [`Wire::answer`] agrees it).
    pub(super) fn of(protocol: &Protocol<'_>) -> Wire {
        match protocol {
            Protocol::WebSocket { .. } => Wire::WebSocket(DeflateUse::Off),
            Protocol::EventStream { .. } => Wire::EventStream,
        }
    }

    /// What a connection on the wire `protocol` asks for asks of
    /// positions, given what its target `asked`: an event stream always
    /// has its positions (its events' ids), and a reconnecting one
    /// resumes after the last it had (its `Last-Event-ID`).
    pub(super) fn resume(protocol: &Protocol<'_>, asked: Resume) -> Resume {
        match (protocol, asked) {
            (Protocol::WebSocket { .. }, asked) => asked,
            (Protocol::EventStream { last_event_id, .. }, asked) => match (last_event_id, asked) {
                (Some(id), _) => Resume::since(id),
                (None, since @ Resume::Since(_)) => since,
                (None, _) => Resume::Positions,
            },
        }
    }

    /// The wire `protocol` asks for, its response head appended to `head`
    /// (`retry_ms`: an event stream's first `retry:`), counted on its
    /// gauges in `metrics`.
    pub(super) fn answer(
        protocol: &Protocol<'_>,
        retry_ms: impl FnOnce() -> u32,
        head: &mut Vec<u8>,
        metrics: &Metrics,
    ) -> Wire {
        let wire = match protocol {
            Protocol::WebSocket { accept, deflate } => {
                let mut response = [0u8; MAX_RESPONSE_LEN];
                let len = http::write_accept_response(accept, deflate.as_ref(), &mut response);
                head.extend_from_slice(&response[..len]);
                Wire::WebSocket(DeflateUse::of(deflate.as_ref()))
            }
            Protocol::EventStream { origin, .. } => {
                sse::write_head(head, *origin, retry_ms());
                Wire::EventStream
            }
        };
        if let Some(gauge) = wire.gauge(metrics) {
            Metrics::incr(gauge);
        }
        if wire.deflate().negotiated() {
            Metrics::incr(&metrics.connections_deflate);
        }
        wire
    }

    /// Takes the connection, closed for good, off its gauges in `metrics`.
    pub(super) fn closed(self, metrics: &Metrics) {
        if self.gauge(metrics).is_some() {
            Metrics::incr(&metrics.closed_event_stream);
        }
        self.moved_out(metrics);
    }

    /// Its number in a handover's state (see [`Wire::from_code`]).
    pub(super) fn code(self) -> u8 {
        match self {
            Wire::WebSocket(DeflateUse::Off) => 0,
            Wire::WebSocket(DeflateUse::Inflate) => 1,
            Wire::WebSocket(DeflateUse::Full) => 2,
            Wire::EventStream => 3,
        }
    }

    /// The wire [`Wire::code`] numbered, if this build knows it.
    pub(super) fn from_code(code: u8) -> Option<Wire> {
        Some(match code {
            0 => Wire::WebSocket(DeflateUse::Off),
            1 => Wire::WebSocket(DeflateUse::Inflate),
            2 => Wire::WebSocket(DeflateUse::Full),
            3 => Wire::EventStream,
            _ => return None,
        })
    }

    /// Takes a connection that moves to another process off its gauges.
    pub(super) fn moved_out(self, metrics: &Metrics) {
        if let Some(gauge) = self.gauge(metrics) {
            Metrics::decr(gauge);
        }
        if self.deflate().negotiated() {
            Metrics::decr(&metrics.connections_deflate);
        }
    }

    /// Puts a connection that moved from another process on its gauges.
    pub(super) fn moved_in(self, metrics: &Metrics) {
        if let Some(gauge) = self.gauge(metrics) {
            Metrics::incr(gauge);
        }
        if self.deflate().negotiated() {
            Metrics::incr(&metrics.connections_deflate);
        }
    }

    /// The gauge of the connections on this wire, where they have one of
    /// their own.
    fn gauge(self, metrics: &Metrics) -> Option<&std::sync::atomic::AtomicU64> {
        match self {
            Wire::WebSocket(_) => None,
            Wire::EventStream => Some(&metrics.connections_event_stream),
        }
    }

    /// Its name in upstream events, where it is not the default WebSocket.
    pub(super) fn upstream_name(self) -> Option<&'static str> {
        match self {
            Wire::WebSocket(_) => None,
            Wire::EventStream => Some("sse"),
        }
    }

    /// What permessage-deflate gives the connection.
    pub(super) fn deflate(self) -> DeflateUse {
        match self {
            Wire::WebSocket(deflate) => deflate,
            Wire::EventStream => DeflateUse::Off,
        }
    }

    /// Whether the client speaks on it: its frames are decoded. What an
    /// event stream's client sends is read and dropped (its end still
    /// ends the stream).
    pub(super) fn hears(self) -> bool {
        matches!(self, Wire::WebSocket(_))
    }

    /// Why an open connection ended when its client closed the TCP
    /// connection: the normal end of an event stream (which has no close
    /// handshake), an abnormal one of a WebSocket.
    pub(super) fn eof_reason(self) -> CloseReason {
        match self {
            Wire::WebSocket(_) => CloseReason::Abnormal,
            Wire::EventStream => CloseReason::Normal(CloseCode::NORMAL),
        }
    }

    /// What a heartbeat visit does: a WebSocket's by its `liveness` (see
    /// [`Liveness::visit`]); an event stream's client never answers, so
    /// it gets its heartbeat (a comment) at every visit, and only a
    /// failed write ends it.
    pub(super) fn heartbeat(self, liveness: &mut Liveness, close_after: u16) -> Visit {
        match self {
            Wire::WebSocket(_) => liveness.visit(close_after),
            Wire::EventStream => Visit::Ping,
        }
    }

    /// How the server's close for `reason` (its `code`, with `why`) ends it.
    /// A stream has no close frame: it ends once what is queued is
    /// written, and the client reconnects (or goes); where the client
    /// should know why, a `closed` status says it first.
    pub(super) fn ending(self, reason: CloseReason, code: CloseCode, why: &str) -> Ending {
        match self {
            Wire::WebSocket(_) => Ending::Handshake,
            Wire::EventStream => Ending::Stream(
                matches!(
                    reason,
                    CloseReason::TokenExpired | CloseReason::Publisher(_) | CloseReason::Shutdown
                )
                .then(|| sse::closed_status(code.0, why)),
            ),
        }
    }

    /// What a connection (with `positions` or not) is told before a drain
    /// closes it, to reconnect after `delay`: a client with positions the
    /// hint (see [`position::reconnect_hint`]); an `EventSource`, which
    /// reconnects after its `retry:` delay, that delay as well.
    pub(super) fn drain_notice(self, delay: Duration, positions: bool) -> DrainNotice {
        let hint = || position::reconnect_hint(delay);
        match self {
            Wire::WebSocket(_) => DrainNotice {
                field: None,
                status: positions.then(hint),
            },
            Wire::EventStream => DrainNotice {
                field: Some(sse::retry_field(
                    delay.as_millis().min(u128::from(u32::MAX)) as u32,
                )),
                status: Some(hint()),
            },
        }
    }

    /// Counts, besides every wire's counters, `delivered` messages written
    /// or queued and `dropped` ones its queue had no room for, where the
    /// wire counts its own.
    pub(super) fn count(self, tally: &mut Tally, delivered: u64, dropped: u64) {
        if self == Wire::EventStream {
            tally.event_stream_deliveries += delivered;
            tally.event_stream_drops += dropped;
        }
    }

    /// Whether it gets compressed frames (broadcasts, replays, echoes).
    pub(super) fn compressed(self) -> bool {
        self.deflate() == DeflateUse::Full
    }

    /// Which of the shared `frames` it gets: compressed or plain, with
    /// positions or without, or as events (with their positions).
    /// Events made are counted in `metrics`.
    pub(super) fn frames<'f>(
        self,
        frames: &'f SharedFrames,
        positions: bool,
        metrics: &Metrics,
    ) -> &'f SharedFrames {
        match self {
            Wire::WebSocket(_) => frames.for_connection(self.compressed(), positions),
            Wire::EventStream => frames.events(&metrics.event_stream_batches),
        }
    }

    /// Runs `visit` with the way this wire takes shared frames (for a
    /// connection with `positions` or without): one copy of the visit for
    /// each, so that the WebSocket one carries nothing of the event
    /// stream's.
    #[inline(always)]
    pub(super) fn visit<V: WithTaking>(self, positions: bool, visit: V) -> V::Output {
        match self {
            Wire::WebSocket(_) => visit.run(Frames {
                compressed: self.compressed(),
                positions,
            }),
            Wire::EventStream => visit.run(Events),
        }
    }

    /// Whether a message of its own, `opcode` with `len` bytes, goes
    /// compressed ([`Level::Single`](crate::protocol::ws::compress::Level::Single): it is for this connection alone): a
    /// data message of `--deflate-min-bytes` or more, when it gets
    /// compressed frames.
    pub(super) fn compresses(self, opcode: OpCode, len: usize, config: &Config) -> bool {
        !opcode.is_control() && self.compressed() && config.compression().worth(len)
    }

    /// How a message of the connection's own goes out: its head (written
    /// into `head`; the length), the payload, and what follows it. A
    /// WebSocket frame's header and payload; on an event stream, a text
    /// message (a status) as the `status` event, a ping as a heartbeat,
    /// and nothing for the rest (a close is the end of the stream).
    pub(super) fn wrap<'m>(
        self,
        message: OwnMessage<'m>,
        head: &mut [u8; MAX_OWN_HEAD],
    ) -> (usize, &'m [u8], &'static [u8]) {
        let len = message.payload.len() as u64;
        match self {
            Wire::WebSocket(_) => {
                let mut header = [0u8; MAX_HEADER_LEN];
                let header_len =
                    FrameHeader::server_message(message.opcode, len, message.compressed)
                        .encode(&mut header);
                head[..header_len].copy_from_slice(&header[..header_len]);
                (header_len, message.payload, b"")
            }
            Wire::EventStream => match message.opcode {
                OpCode::Text => {
                    let status = sse::STATUS_HEAD;
                    head[..status.len()].copy_from_slice(status);
                    (status.len(), message.payload, b"\n\n")
                }
                OpCode::Ping => (0, b"", sse::HEARTBEAT),
                _ => (0, b"", b""),
            },
        }
    }
}

/// Something run with the way a wire takes shared frames (see
/// [`Wire::visit`]).
pub(super) trait WithTaking {
    /// What it gives back.
    type Output;
    /// Runs it with `taking`.
    fn run<T: Taking>(self, taking: T) -> Self::Output;
}

/// How a connection takes the shared frames it is owed.
pub(super) trait Taking: Copy {
    /// The frames it gets of `frames`.
    fn take<'f>(&self, frames: &'f SharedFrames, made: &AtomicU64) -> &'f SharedFrames;
    /// It gets compressed frames from the history.
    fn compressed(&self) -> bool;
    /// Makes what a replay gathered from the history its own.
    fn replayed(&self, gathered: &mut [SharedFrames], made: &AtomicU64);
}

/// A WebSocket's frames: compressed or plain, positioned or not.
#[derive(Debug, Clone, Copy)]
struct Frames {
    compressed: bool,
    positions: bool,
}

impl Taking for Frames {
    fn take<'f>(&self, frames: &'f SharedFrames, _: &AtomicU64) -> &'f SharedFrames {
        frames.for_connection(self.compressed, self.positions)
    }

    fn compressed(&self) -> bool {
        self.compressed
    }

    fn replayed(&self, _: &mut [SharedFrames], _: &AtomicU64) {}
}

/// An event stream's events, made from the batches' messages; `made`
/// counts each time events are made.
#[derive(Debug, Clone, Copy)]
struct Events;

impl Taking for Events {
    fn take<'f>(&self, frames: &'f SharedFrames, made: &AtomicU64) -> &'f SharedFrames {
        frames.events(made)
    }

    fn compressed(&self) -> bool {
        false
    }

    fn replayed(&self, gathered: &mut [SharedFrames], made: &AtomicU64) {
        // Events are made once per record gathered.
        for frames in gathered {
            *frames = frames.events(made).clone();
        }
    }
}

/// A message of the connection's own, as it goes out.
#[derive(Debug, Clone, Copy)]
pub(super) struct OwnMessage<'a> {
    /// What it is.
    pub(super) opcode: OpCode,
    /// Its payload (compressed if `compressed`).
    pub(super) payload: &'a [u8],
    /// The payload is compressed (permessage-deflate).
    pub(super) compressed: bool,
}

impl<'a> OwnMessage<'a> {
    /// A message of `opcode` with `payload`, not compressed.
    pub(super) fn plain(opcode: OpCode, payload: &'a [u8]) -> OwnMessage<'a> {
        OwnMessage {
            opcode,
            payload,
            compressed: false,
        }
    }
}

/// Everything a connection writes, each through `Conn::send`.
#[derive(Debug, Clone, Copy)]
pub(super) enum Outgoing<'a> {
    /// A message answering what the current read brought (a pong, an
    /// echo): gathered with the others in [`Ctx::replies`](super::Ctx::replies), written once
    /// the read is processed.
    Reply(OwnMessage<'a>),
    /// A message of its own that goes out now (a close).
    Frame(OwnMessage<'a>),
    /// An HTTP response: head and body.
    Response(&'a [u8], &'a [u8]),
    /// Broadcast batches or the ping, shared with other connections:
    /// [`Sent::Dropped`](crate::server::net::queue::Sent::Dropped) for those the queue has no room for.
    Shared(&'a [SharedFrames]),
    /// The gathered replies, at the end of a read.
    Replies,
    /// What is queued, now that the socket is writable.
    Queued,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wire_says_how_its_connection_ends_is_kept_alive_and_resumes() {
        let stream = Wire::EventStream;
        let socket = Wire::WebSocket(DeflateUse::Off);
        let code = CloseCode(4001);
        assert_eq!(
            socket.ending(CloseReason::TokenExpired, code, "x"),
            Ending::Handshake
        );
        let Ending::Stream(Some(told)) = stream.ending(CloseReason::TokenExpired, code, "expired")
        else {
            panic!("an expired stream is told why");
        };
        assert!(
            told.contains(r#""code":4001"#) && told.contains("expired"),
            "{told}"
        );
        assert_eq!(
            stream.ending(CloseReason::IdleTimeout, CloseCode(1001), "idle"),
            Ending::Stream(None)
        );
        let delay = Duration::from_millis(1500);
        assert_eq!(socket.drain_notice(delay, false), DrainNotice::default());
        let hint = position::reconnect_hint(delay);
        assert_eq!(socket.drain_notice(delay, true).status, Some(hint.clone()));
        let notice = stream.drain_notice(delay, false);
        assert_eq!(notice.field.as_deref(), Some("retry: 1500\n\n"));
        assert_eq!(notice.status, Some(hint));
        let mut liveness = Liveness::default();
        for _ in 0..5 {
            assert_eq!(stream.heartbeat(&mut liveness, 2), Visit::Ping);
        }
        assert_eq!(socket.heartbeat(&mut Liveness::default(), 2), Visit::Skip);
        assert!(socket.hears() && !stream.hears());
        assert_eq!(stream.eof_reason(), CloseReason::Normal(CloseCode::NORMAL));
        assert_eq!(socket.eof_reason(), CloseReason::Abnormal);
        let asked = Protocol::EventStream {
            origin: None,
            last_event_id: None,
        };
        assert_eq!(Wire::resume(&asked, Resume::Off), Resume::Positions);
        assert_eq!(Wire::of(&asked).upstream_name(), Some("sse"));
        assert_eq!(socket.upstream_name(), None);
    }

    #[test]
    fn only_data_messages_of_the_minimum_size_go_compressed_and_only_with_full_deflate() {
        let config = Config {
            deflate_min_bytes: 10,
            ..Config::default()
        };
        for (deflate, opcode, len, compressed) in [
            (DeflateUse::Full, OpCode::Text, 10, true),
            (DeflateUse::Full, OpCode::Binary, 9, false),
            (DeflateUse::Full, OpCode::Pong, 125, false),
            (DeflateUse::Inflate, OpCode::Text, 1000, false),
            (DeflateUse::Off, OpCode::Binary, 1000, false),
        ] {
            let wire = Wire::WebSocket(deflate);
            assert_eq!(
                wire.compresses(opcode, len, &config),
                compressed,
                "{deflate:?} {opcode:?} {len}"
            );
        }
    }
}

//! What a connection speaks on the wire: WebSocket frames (with what
//! permessage-deflate gives it) or an event stream's events, and the
//! messages of its own it sends through them.

use crate::config::Config;
use crate::ops::metrics::Metrics;
use crate::protocol::deflate::{Agreed, MAX_WINDOW_BITS};
use crate::protocol::sse;
use crate::protocol::ws::header::MAX_HEADER_LEN;
use crate::protocol::ws::{FrameHeader, OpCode};
use crate::server::frames::SharedFrames;

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

/// How a connection's messages are put on the wire: the one part of the
/// send path that depends on the protocol the connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Transport {
    /// WebSocket frames (RFC 6455), with what permessage-deflate gives it.
    WebSocket(DeflateUse),
    /// The events of an event stream (SSE: `protocol::sse`), after a
    /// `200`; the client sends nothing.
    EventStream,
}

/// The longest head of a message of a connection's own: a frame header,
/// or an event's fields before its data.
pub(super) const MAX_OWN_HEAD: usize = 32;

impl Transport {
    /// What permessage-deflate gives the connection.
    pub(super) fn deflate(self) -> DeflateUse {
        match self {
            Transport::WebSocket(deflate) => deflate,
            Transport::EventStream => DeflateUse::Off,
        }
    }

    /// Whether it is an event stream.
    pub(super) fn is_event_stream(self) -> bool {
        self == Transport::EventStream
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
            Transport::WebSocket(_) => frames.for_connection(self.compressed(), positions),
            Transport::EventStream => frames.events(&metrics.event_stream_batches),
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
            Transport::WebSocket(_) => {
                let mut header = [0u8; MAX_HEADER_LEN];
                let header_len =
                    FrameHeader::server_message(message.opcode, len, message.compressed)
                        .encode(&mut header);
                head[..header_len].copy_from_slice(&header[..header_len]);
                (header_len, message.payload, b"")
            }
            Transport::EventStream => match message.opcode {
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
            let transport = Transport::WebSocket(deflate);
            assert_eq!(
                transport.compresses(opcode, len, &config),
                compressed,
                "{deflate:?} {opcode:?} {len}"
            );
        }
    }
}

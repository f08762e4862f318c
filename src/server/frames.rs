//! Frames encoded once into one shared buffer: a broadcast (or a batch of
//! them, back to back) is encoded here once and the same bytes are queued
//! by reference on every connection that gets them. A batch with
//! compressed messages carries a second buffer beside it, for the
//! connections that negotiated permessage-deflate: the same frames, those
//! compressed with RSV1 set and their compressed payload. A batch of
//! messages with positions carries the frames for connections that asked
//! for them too: each message's position, a space, then its payload.
//!
//! Every batch keeps its messages in no wire's form too: what each is
//! (text, binary, a status, a ping), where it stands, and where its frame
//! and its payload are in the bytes. Another wire's encoding (the events
//! of an event stream) is made from those fields, once per batch, never
//! by reading the frames back.
//!
//! A positioned message that is compressed is not compressed again: its
//! payload is a stored DEFLATE block holding the position and the space,
//! then the message's compressed payload as it is. Each compressed
//! message stands on its own (no context takeover), so its blocks refer
//! to nothing before them, and the stored block only adds to the window.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::protocol::position::{self, Position};
use crate::protocol::presence::Transport;
use crate::protocol::sse;
use crate::protocol::ws::header::{HeaderStatus, MAX_HEADER_LEN, RSV1};
use crate::protocol::ws::{FrameHeader, OpCode};

/// Whole frames encoded once, shared by every queue they are in (a thin
/// pointer, so a queued reference costs 8 bytes).
#[derive(Debug, Clone)]
pub struct SharedFrames(Arc<Frames>);

/// Frames are encoded once and shared: two are the same when they are
/// one buffer.
impl PartialEq for SharedFrames {
    fn eq(&self, other: &SharedFrames) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedFrames {}

#[derive(Debug)]
struct Frames {
    /// How many frames `bytes` holds (1 for bytes of a connection's own).
    count: u32,
    bytes: Box<[u8]>,
    /// The same frames for connections that negotiated permessage-deflate,
    /// when some are compressed.
    deflated: Option<SharedFrames>,
    /// The same messages with their positions, for connections that asked
    /// for them, when they have positions.
    positioned: Option<SharedFrames>,
    /// The same messages as the events of an event stream, made the first
    /// time a connection of that transport needs them.
    events: OnceLock<SharedFrames>,
    /// The messages in neutral fields, each with where its frame is in
    /// `bytes` (none for bytes of a connection's own, or events).
    messages: Box<[Message]>,
    /// When the first of its messages was input (queued by a handle), for
    /// the delivery latency; none for frames of the server's own.
    input_at: Option<Instant>,
    /// Its recipients not handed it yet, when it is addressed to some.
    awaited: Awaited,
}

/// The recipients a targeted batch waits to be handed to (written or
/// queued), and their transports: when the last one has it, its delivery
/// latency is observed once, for each of those transports.
#[derive(Debug, Default)]
struct Awaited {
    recipients: AtomicU32,
    /// One bit per [`Transport`], as [`transport_bit`] gives it.
    transports: AtomicU8,
}

/// A transport's bit among a batch's recipients' transports.
pub fn transport_bit(transport: Transport) -> u8 {
    1 << transport as u8
}

/// What a message is, whatever the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A text message.
    Text,
    /// A binary message.
    Binary,
    /// A status about the stream for connections with positions (a gap):
    /// one line of JSON.
    Status,
    /// A ping: a heartbeat.
    Ping,
    /// Something of one wire alone (a pong): nothing on the others.
    Other,
}

impl Kind {
    /// The kind of a data or control message of `opcode`.
    fn of(opcode: OpCode) -> Kind {
        match opcode {
            OpCode::Text => Kind::Text,
            OpCode::Binary => Kind::Binary,
            OpCode::Ping => Kind::Ping,
            _ => Kind::Other,
        }
    }
}

/// A message of a batch in neutral fields: what it is, where it stands,
/// and where its frame begins, its payload (after its position, in
/// positioned frames) begins, and both end, in the batch's bytes.
#[derive(Debug, Clone, Copy)]
struct Message {
    kind: Kind,
    position: Option<Position>,
    frame_at: u32,
    payload_at: u32,
    end: u32,
}

impl Message {
    /// The same message in bytes cut `by` bytes from the front.
    fn cut(self, by: u32) -> Message {
        Message {
            frame_at: self.frame_at - by,
            payload_at: self.payload_at - by,
            end: self.end - by,
            ..self
        }
    }
}

/// A message to frame.
#[derive(Debug, Clone, Copy)]
pub struct ToFrame<'a> {
    /// Text or binary.
    pub opcode: OpCode,
    /// The payload.
    pub payload: &'a [u8],
    /// The payload compressed for permessage-deflate, if it is.
    pub deflated: Option<&'a [u8]>,
    /// Its position, if it has one.
    pub position: Option<Position>,
}

/// The largest payload prefix of a positioned message: a stored block's
/// five bytes, the position and a space.
const MAX_PREFIX: usize = 5 + position::MAX_LEN + 1;

/// The payload prefix of a message with `position`: the position and a
/// space, inside a stored DEFLATE block (not final) if `compressed`.
fn prefix(position: &Position, compressed: bool, out: &mut [u8; MAX_PREFIX]) -> usize {
    let mut printed = [0u8; position::MAX_LEN];
    let len = position.write(&mut printed);
    let start = if compressed { 5 } else { 0 };
    if compressed {
        let stored = (len as u16 + 1).to_le_bytes();
        let inverse = (!(len as u16 + 1)).to_le_bytes();
        out[..5].copy_from_slice(&[0, stored[0], stored[1], inverse[0], inverse[1]]);
    }
    out[start..start + len].copy_from_slice(&printed[..len]);
    out[start + len] = b' ';
    start + len + 1
}

impl SharedFrames {
    /// Encodes one unmasked, final frame: header and payload in one buffer.
    pub fn encode(opcode: OpCode, payload: &[u8]) -> SharedFrames {
        SharedFrames::encode_all([(opcode, payload)])
    }

    /// Encodes unmasked, final frames back to back into one buffer, sized
    /// first and allocated once.
    pub fn encode_all<'a, I>(frames: I) -> SharedFrames
    where
        I: IntoIterator<Item = (OpCode, &'a [u8])>,
        I::IntoIter: Clone,
    {
        SharedFrames::encode_batch(frames.into_iter().map(|(opcode, payload)| ToFrame {
            opcode,
            payload,
            deflated: None,
            position: None,
        }))
    }

    /// Encodes a batch of messages: the frames of the plain messages; if
    /// any is compressed, beside them the frames for connections that
    /// negotiated permessage-deflate; and if they have positions, the
    /// positioned frames (with their compressed ones).
    pub fn encode_batch<'a, I>(messages: I) -> SharedFrames
    where
        I: IntoIterator<Item = ToFrame<'a>>,
        I::IntoIter: Clone,
    {
        let messages = messages.into_iter();
        let positions = messages.clone().all(|m| m.position.is_some());
        let positioned = (positions && messages.clone().next().is_some())
            .then(|| SharedFrames::encode_variants(messages.clone(), true, None));
        SharedFrames::encode_variants(messages, false, positioned)
    }

    /// The frames of `messages`, positioned or not, with the compressed
    /// frames beside them if any message is compressed.
    fn encode_variants<'a, I>(
        messages: I,
        positioned: bool,
        with: Option<SharedFrames>,
    ) -> SharedFrames
    where
        I: Iterator<Item = ToFrame<'a>> + Clone,
    {
        let deflated = messages
            .clone()
            .any(|m| m.deflated.is_some())
            .then(|| SharedFrames::encode_frames(messages.clone(), positioned, true, None));
        let mut frames = SharedFrames::encode_frames(messages, positioned, false, with);
        Arc::get_mut(&mut frames.0)
            .expect("not shared yet")
            .deflated = deflated;
        frames
    }

    /// Encodes the messages' frames back to back: with their positions or
    /// not, with their compressed payloads (RSV1 set) or not.
    fn encode_frames<'a, I>(
        messages: I,
        positioned: bool,
        compressed: bool,
        with: Option<SharedFrames>,
    ) -> SharedFrames
    where
        I: Iterator<Item = ToFrame<'a>> + Clone,
    {
        let pieces = messages.map(|m| {
            let (payload, compressed) = match m.deflated {
                Some(deflated) if compressed => (deflated, true),
                _ => (m.payload, false),
            };
            let mut bytes = [0u8; MAX_PREFIX];
            let len = match m.position {
                Some(position) if positioned => prefix(&position, compressed, &mut bytes),
                _ => 0,
            };
            (m, compressed, bytes, len, payload)
        });
        let size = pieces
            .clone()
            .map(|(_, _, _, prefix, payload)| encoded_len(prefix + payload.len()))
            .sum();
        let mut bytes = Vec::with_capacity(size);
        let mut header = [0u8; MAX_HEADER_LEN];
        let mut messages = Vec::with_capacity(pieces.clone().count());
        for (m, compressed, prefix, prefix_len, payload) in pieces {
            let len = (prefix_len + payload.len()) as u64;
            let frame = FrameHeader::server_message(m.opcode, len, compressed);
            let header_len = frame.encode(&mut header);
            let frame_at = bytes.len() as u32;
            bytes.extend_from_slice(&header[..header_len]);
            bytes.extend_from_slice(&prefix[..prefix_len]);
            let payload_at = bytes.len() as u32;
            bytes.extend_from_slice(payload);
            messages.push(Message {
                kind: Kind::of(m.opcode),
                position: m.position,
                frame_at,
                payload_at,
                end: bytes.len() as u32,
            });
        }
        debug_assert_eq!(bytes.len(), size);
        SharedFrames(Arc::new(Frames {
            count: messages.len() as u32,
            bytes: bytes.into_boxed_slice(),
            deflated: None,
            positioned: with,
            events: OnceLock::new(),
            messages: messages.into_boxed_slice(),
            input_at: None,
            awaited: Awaited::default(),
        }))
    }

    /// A message for connections with positions only (a status about
    /// them). The others get an empty unsolicited pong in its place
    /// (RFC 6455 5.5.3: a heartbeat no reply is due for), counted as no
    /// message, so that the delivery path needs no test for frames that
    /// are not for a connection. It stands at `position` (a gap status:
    /// the last position it names).
    pub fn positioned_only(status: &[u8], position: Position) -> SharedFrames {
        let mut pong = SharedFrames::encode(OpCode::Pong, b"");
        let frames = Arc::get_mut(&mut pong.0).expect("not shared yet");
        frames.count = 0;
        frames.messages[0].position = Some(position);
        frames.positioned = Some(SharedFrames::status(status, Some(position)));
        pong
    }

    /// A status about the stream (`status`, one line of JSON), standing at
    /// `position` if it has one: a text frame, and the `status` event.
    pub fn status(status: &[u8], position: Option<Position>) -> SharedFrames {
        let mut frames = SharedFrames::encode(OpCode::Text, status);
        let message = &mut Arc::get_mut(&mut frames.0)
            .expect("not shared yet")
            .messages[0];
        message.kind = Kind::Status;
        message.position = position;
        frames
    }

    /// The frames a connection gets: with positions if it asked for them
    /// and they have some, compressed if it negotiated permessage-deflate
    /// and some are.
    pub fn for_connection(&self, deflate: bool, positions: bool) -> &SharedFrames {
        let frames = match &self.0.positioned {
            Some(positioned) if positions => positioned,
            _ => self,
        };
        match &frames.0.deflated {
            Some(deflated) if deflate => deflated,
            _ => frames,
        }
    }

    /// The messages as events of an event stream (see [`sse`]), made from
    /// their neutral fields: a text or binary message as its event, with
    /// its position as its `id:` when it has one; a status as the
    /// `status` event; a ping as a heartbeat; the rest left out. Made the
    /// first time a connection of that wire needs them, and shared from
    /// then on; counted as the data messages they hold. Each time events
    /// are made, `made` counts one.
    pub fn events(&self, made: &AtomicU64) -> &SharedFrames {
        self.0.events.get_or_init(|| {
            made.fetch_add(1, Ordering::Relaxed);
            // The positioned frames hold the statuses for positioned
            // connections; the payloads are the same in either.
            let source = self.positioned().unwrap_or(self);
            let mut bytes = Vec::with_capacity(source.bytes().len() + 16 * source.count());
            let mut count = 0;
            for m in source.0.messages.iter() {
                let payload = &source.bytes()[m.payload_at as usize..m.end as usize];
                let kind = match m.kind {
                    Kind::Text => sse::EventKind::Text,
                    Kind::Binary => sse::EventKind::Binary,
                    Kind::Status => {
                        sse::write_status(&mut bytes, &String::from_utf8_lossy(payload));
                        continue;
                    }
                    Kind::Ping => {
                        bytes.extend_from_slice(sse::HEARTBEAT);
                        continue;
                    }
                    Kind::Other => continue,
                };
                let mut id = [0u8; position::MAX_LEN];
                let id_len = m.position.map(|p| p.write(&mut id));
                sse::write_message(&mut bytes, id_len.map(|len| &id[..len]), kind, payload);
                count += 1;
            }
            SharedFrames(Arc::new(Frames {
                count,
                bytes: bytes.into_boxed_slice(),
                deflated: None,
                positioned: None,
                events: OnceLock::new(),
                messages: Box::default(),
                input_at: None,
                awaited: Awaited::default(),
            }))
        })
    }

    /// The positioned frames (with their compressed ones), if the
    /// messages have positions.
    pub fn positioned(&self) -> Option<&SharedFrames> {
        self.0.positioned.as_ref()
    }

    /// The frames in order, read back: each whole, and its payload with
    /// whether it is compressed.
    #[cfg(test)]
    pub fn frames(&self) -> impl Iterator<Item = (&[u8], (&[u8], bool))> {
        let mut rest = self.bytes();
        std::iter::from_fn(move || {
            let (start, end, compressed) = frame_bounds(rest)?;
            let (frame, after) = rest.split_at(end);
            rest = after;
            Some((frame, (&frame[start..], compressed)))
        })
    }

    /// The frames' payloads in order, each with whether it is compressed.
    #[cfg(test)]
    pub fn payloads(&self) -> impl Iterator<Item = (&[u8], bool)> {
        self.frames().map(|(_, payload)| payload)
    }

    /// The same frames but the first `n` (and the same of the compressed
    /// ones), copied.
    pub fn skip(&self, n: usize) -> SharedFrames {
        let messages = self.0.messages.get(n..).unwrap_or_default();
        let at = messages
            .first()
            .map_or(self.bytes().len(), |m| m.frame_at as usize);
        SharedFrames(Arc::new(Frames {
            count: self.0.count.saturating_sub(n as u32),
            bytes: self.bytes()[at..].into(),
            deflated: self.0.deflated.as_ref().map(|d| d.skip(n)),
            positioned: self.0.positioned.as_ref().map(|p| p.skip(n)),
            events: OnceLock::new(),
            messages: messages.iter().map(|m| m.cut(at as u32)).collect(),
            input_at: None,
            awaited: Awaited::default(),
        }))
    }

    /// The positions (sequence numbers) of the messages, in order, where
    /// they have them (see [`SharedFrames::encode_batch`] and
    /// [`SharedFrames::positioned_only`]); none otherwise.
    pub fn seqs(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.messages.iter().filter_map(|m| Some(m.position?.seq))
    }

    /// Each message's frame, with its position (if it has one) and whether
    /// it is a status rather than a message of the stream.
    pub fn messages(&self) -> impl Iterator<Item = (&[u8], Option<Position>, bool)> {
        self.0.messages.iter().map(|m| {
            let frame = &self.bytes()[m.frame_at as usize..m.end as usize];
            (frame, m.position, m.kind == Kind::Status)
        })
    }

    /// The messages after position `through` (a replay gave those up to
    /// there): all of them (the same frames), the rest (copied, with
    /// their variants), or `None` when none is after it. Messages without
    /// positions are all after it.
    pub fn after(&self, through: u64) -> Option<SharedFrames> {
        let given = self.seqs().take_while(|&seq| seq <= through).count();
        match given {
            0 => Some(self.clone()),
            all if all == self.0.messages.len() => None,
            given => Some(self.skip(given)),
        }
    }

    /// Frames the loop encoded with positions (the records of the
    /// history), back to back in `bytes`, with each one's position and
    /// whether it is a status, in `stored`: what each is comes from its
    /// opcode and the status mark, its payload after its position (none
    /// in a status), as [`SharedFrames::encode_batch`] framed it.
    pub fn from_encoded(bytes: Vec<u8>, stored: &[(Position, bool)]) -> SharedFrames {
        let mut at = 0;
        let mut messages = Vec::with_capacity(stored.len());
        for &(position, status) in stored {
            let Some((start, end, compressed)) = frame_bounds(&bytes[at..]) else {
                debug_assert!(false, "bug: fewer frames than positions");
                break;
            };
            let kind = match OpCode::from_bits(bytes[at] & 0x0F) {
                _ if status => Kind::Status,
                Some(opcode) => Kind::of(opcode),
                None => Kind::Other,
            };
            let prefix = match (kind, compressed) {
                (Kind::Status, _) => 0,
                (_, false) => position.write(&mut [0u8; position::MAX_LEN]) + 1,
                (_, true) => prefix(&position, true, &mut [0u8; MAX_PREFIX]),
            };
            messages.push(Message {
                kind,
                position: Some(position),
                frame_at: at as u32,
                payload_at: (at + start + prefix).min(at + end) as u32,
                end: (at + end) as u32,
            });
            at += end;
        }
        SharedFrames(Arc::new(Frames {
            count: messages.len() as u32,
            bytes: bytes.into_boxed_slice(),
            deflated: None,
            positioned: None,
            events: OnceLock::new(),
            messages: messages.into_boxed_slice(),
            input_at: None,
            awaited: Awaited::default(),
        }))
    }

    /// Bytes already encoded (one frame, or the unwritten rest of one).
    pub fn from_parts(parts: &[&[u8]]) -> SharedFrames {
        SharedFrames(Arc::new(Frames {
            count: 1,
            bytes: parts.concat().into_boxed_slice(),
            deflated: None,
            positioned: None,
            events: OnceLock::new(),
            messages: Box::default(),
            input_at: None,
            awaited: Awaited::default(),
        }))
    }

    /// The encoded bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0.bytes
    }

    /// The same frames, noted as input at `at` (just encoded: not
    /// shared yet).
    pub fn input_at(mut self, at: Instant) -> SharedFrames {
        Arc::get_mut(&mut self.0).expect("not shared yet").input_at = Some(at);
        self
    }

    /// When the first of its messages was input, if it was.
    pub fn input_time(&self) -> Option<Instant> {
        self.0.input_at
    }

    /// Addressed to `recipients` more connections, of the transports
    /// whose bits `transports` holds (see [`transport_bit`]).
    pub fn await_recipients(&self, recipients: u32, transports: u8) {
        let awaited = &self.0.awaited;
        awaited.recipients.fetch_add(recipients, Ordering::Relaxed);
        awaited.transports.fetch_or(transports, Ordering::Relaxed);
    }

    /// One recipient has it (or is gone): the transports of its
    /// recipients once it was the last, to observe its latency for.
    pub fn handed(&self) -> Option<u8> {
        let awaited = &self.0.awaited;
        let left = awaited.recipients.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(left > 0, "bug: handed to more recipients than awaited");
        (left == 1).then(|| awaited.transports.load(Ordering::Relaxed))
    }

    /// How many frames the bytes hold.
    pub fn count(&self) -> usize {
        self.0.count as usize
    }

    /// How many references to the bytes there are (the queues that hold
    /// them, and the caller's).
    #[cfg(test)]
    pub fn references(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Whether both are the same bytes, not copies.
    #[cfg(test)]
    pub fn is(&self, other: &SharedFrames) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Where the payload of the first frame of `bytes` (frames the loop
/// encoded) begins and ends, and whether it is compressed; `None` at the
/// end.
fn frame_bounds(bytes: &[u8]) -> Option<(usize, usize, bool)> {
    match FrameHeader::parse(bytes) {
        Ok(HeaderStatus::Complete(header, len)) => {
            let end = len + header.payload_len as usize;
            (end <= bytes.len()).then_some((len, end, header.rsv & RSV1 != 0))
        }
        _ => None,
    }
}

/// The encoded size of a server frame with a `payload_len`-byte payload.
pub fn encoded_len(payload_len: usize) -> usize {
    let header = match payload_len {
        0..=125 => 2,
        126..=0xFFFF => 4,
        _ => 10,
    };
    header + payload_len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_stream_connections_get_the_same_messages_as_events_made_once() {
        let epoch = position::Epoch(0xab);
        let at = |seq| Some(Position { epoch, seq });
        let batch = SharedFrames::encode_batch([
            ToFrame {
                opcode: OpCode::Text,
                payload: b"two\nlines",
                deflated: None,
                position: at(7),
            },
            ToFrame {
                opcode: OpCode::Binary,
                payload: &[0xff],
                deflated: None,
                position: at(8),
            },
        ]);
        let made = AtomicU64::new(0);
        let events = batch.events(&made);
        let id = |seq| Position { epoch, seq }.to_string();
        let want = format!(
            "id: {}\ndata: two\ndata: lines\n\nid: {}\nevent: binary\ndata: /w==\n\n",
            id(7),
            id(8)
        );
        assert_eq!(String::from_utf8_lossy(events.bytes()), want);
        assert_eq!(events.count(), 2);
        assert!(events.is(batch.events(&made)), "made once, then shared");
        assert_eq!(made.load(Ordering::Relaxed), 1);
        // A status for connections with positions is the status event.
        let gap = SharedFrames::positioned_only(br#"{"status":"gap"}"#, Position { epoch, seq: 3 });
        assert_eq!(
            String::from_utf8_lossy(gap.events(&made).bytes()),
            "event: status\ndata: {\"status\":\"gap\"}\n\n"
        );
        assert_eq!(gap.events(&made).count(), 0);
        // Messages without positions have no id; a ping is a heartbeat.
        let plain = SharedFrames::encode_all([(OpCode::Text, &b"hi"[..]), (OpCode::Ping, b"")]);
        assert_eq!(
            String::from_utf8_lossy(plain.events(&made).bytes()),
            "data: hi\n\n:\n\n"
        );
    }

    #[test]
    fn events_come_from_what_a_message_is_not_from_how_its_payload_looks() {
        let epoch = position::Epoch(0xab);
        let at = |seq| Position { epoch, seq };
        // A message that looks like a status, with a space in it, is a message.
        let json = br#"{"status":"gap", "not": "one"}"#;
        let batch = SharedFrames::encode_batch([ToFrame {
            opcode: OpCode::Text,
            payload: json,
            deflated: None,
            position: Some(at(5)),
        }]);
        let made = AtomicU64::new(0);
        let want = format!("id: {}\ndata: {}\n\n", at(5), String::from_utf8_lossy(json));
        assert_eq!(String::from_utf8_lossy(batch.events(&made).bytes()), want);
        assert_eq!(batch.events(&made).count(), 1);
        // Records read back from the history: a message, then a status
        // (marked so), each with its position; the message's payload
        // after its position, as it was framed.
        let status = SharedFrames::status(br#"{"status":"gap"}"#, Some(at(6)));
        let mut bytes = batch.positioned().unwrap().bytes().to_vec();
        bytes.extend_from_slice(status.bytes());
        let records = SharedFrames::from_encoded(bytes, &[(at(5), false), (at(6), true)]);
        assert_eq!(records.count(), 2);
        assert_eq!(records.seqs().collect::<Vec<_>>(), [5, 6]);
        let events = String::from_utf8_lossy(records.events(&made).bytes()).into_owned();
        assert_eq!(
            events,
            format!("{want}event: status\ndata: {{\"status\":\"gap\"}}\n\n")
        );
        // Skipped, the rest keeps its fields.
        let rest = records.skip(1);
        assert_eq!(
            String::from_utf8_lossy(rest.events(&made).bytes()),
            "event: status\ndata: {\"status\":\"gap\"}\n\n"
        );
    }

    #[test]
    fn encodes_header_and_payload_once() {
        let frame = SharedFrames::encode(OpCode::Text, b"hello");
        assert_eq!(frame.bytes(), b"\x81\x05hello");
        assert_eq!(frame.count(), 1);
        let big = SharedFrames::encode(OpCode::Binary, &[0; 300]);
        assert_eq!(&big.bytes()[..4], &[0x82, 126, 1, 44]);
    }

    #[test]
    fn a_batch_is_its_frames_back_to_back() {
        let long = [7u8; 70_000];
        let batch = SharedFrames::encode_all([
            (OpCode::Text, &b"a"[..]),
            (OpCode::Binary, &[0; 300]),
            (OpCode::Text, b""),
            (OpCode::Binary, &long),
        ]);
        assert_eq!(batch.count(), 4);
        let mut expected = b"\x81\x01a\x82\x7e\x01\x2c".to_vec();
        expected.extend_from_slice(&[0; 300]);
        expected.extend_from_slice(b"\x81\x00\x82\x7f");
        expected.extend_from_slice(&70_000u64.to_be_bytes());
        expected.extend_from_slice(&long);
        assert_eq!(batch.bytes(), &expected[..]);
        for len in [0, 125, 126, 65_535, 65_536] {
            let one = SharedFrames::encode(OpCode::Text, &vec![b'x'; len]);
            assert_eq!(encoded_len(len), one.bytes().len(), "{len}");
        }
    }

    #[test]
    fn a_positioned_message_is_its_position_a_space_and_its_payload_compressed_or_not() {
        use crate::protocol::position::Epoch;
        use crate::protocol::ws::{compress, inflate::Inflater};
        let message = "bid 1.0842 ask 1.0843 ".repeat(40);
        let deflated = compress::deflate_message(message.as_bytes());
        let position = Position {
            epoch: Epoch(0xfeed),
            seq: 77,
        };
        let batch = SharedFrames::encode_batch([
            ToFrame {
                opcode: OpCode::Text,
                payload: message.as_bytes(),
                deflated: Some(&deflated),
                position: Some(position),
            },
            ToFrame {
                opcode: OpCode::Binary,
                payload: b"\x00\xff",
                deflated: None,
                position: Some(Position {
                    seq: 78,
                    ..position
                }),
            },
        ]);
        assert!(
            batch.for_connection(false, false).is(&batch),
            "unasked: as before"
        );
        let plain: Vec<_> = batch.for_connection(false, true).payloads().collect();
        let expected = format!("000000000000feed.77 {message}");
        assert_eq!(plain[0], (expected.as_bytes(), false));
        assert_eq!(plain[1], (&b"000000000000feed.78 \x00\xff"[..], false));
        let compressed: Vec<_> = batch.for_connection(true, true).payloads().collect();
        let (payload, rsv1) = compressed[0];
        assert!(
            rsv1 && payload.len() < message.len() / 4,
            "still compressed"
        );
        let mut inflated = Vec::new();
        Inflater::default()
            .inflate(payload, 1 << 20, &mut inflated)
            .unwrap();
        assert_eq!(
            inflated,
            expected.as_bytes(),
            "the stored block, then the message"
        );
        assert_eq!(compressed[1], plain[1], "a plain one stays plain");
        let rest = batch.positioned().unwrap().skip(1);
        assert_eq!(rest.count(), 1);
        assert_eq!(rest.payloads().next(), Some(plain[1]));
        assert_eq!(
            rest.for_connection(true, false).payloads().next(),
            Some(plain[1])
        );
    }

    #[test]
    fn the_messages_after_a_position_are_told_by_the_positions_framed_not_read_back() {
        let epoch = position::Epoch(0xab);
        // Positions need not follow each other (a stream's may jump).
        let batch =
            SharedFrames::encode_batch([(b"a", 7), (b"b", 8), (b"c", 12)].map(|(payload, seq)| {
                ToFrame {
                    opcode: OpCode::Text,
                    payload: &payload[..],
                    deflated: None,
                    position: Some(Position { epoch, seq }),
                }
            }));
        assert_eq!(batch.seqs().collect::<Vec<_>>(), [7, 8, 12]);
        assert!(
            batch.after(6).is_some_and(|all| all.is(&batch)),
            "all, shared"
        );
        for (through, left) in [(7, &["b", "c"][..]), (8, &["c"]), (11, &["c"])] {
            let rest = batch.after(through).unwrap();
            assert_eq!(rest.seqs().count(), left.len(), "after {through}");
            let plain: Vec<_> = rest.payloads().map(|(p, _)| p).collect();
            let left: Vec<_> = left.iter().map(|t| t.as_bytes()).collect();
            assert_eq!(plain, left, "after {through}");
            let positioned = rest.for_connection(false, true).payloads().count();
            assert_eq!(positioned, left.len(), "and its positioned frames");
        }
        assert_eq!(batch.after(12), None);
        // Without positions, nothing was given by a replay.
        let plain = SharedFrames::encode(OpCode::Text, b"x");
        assert_eq!(plain.seqs().count(), 0);
        assert!(plain.after(u64::MAX).is_some_and(|all| all.is(&plain)));
    }
}

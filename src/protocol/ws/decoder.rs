//! The read side of an open connection: client frames in, message events out.
//!
//! Pure and incremental. [`Decoder::decode`] takes whatever bytes have
//! arrived, consumes what it can and reports one [`Event`] at a time. Data
//! payloads are unmasked in place and handed out in pieces as they arrive, so
//! nothing is buffered here; text is validated piece by piece, and every RFC
//! 6455 rule is checked on the frame header before any payload is accepted.
//! Control frames (at most 125 bytes) are only consumed whole.
//!
//! With permessage-deflate negotiated (`deflate` given to [`Decoder::decode`]), a data
//! message whose first frame has RSV1 set is compressed: its pieces are
//! reported as they are, marked `compressed`, and its text is validated
//! once it is inflated (see [`super::inflate`]). RSV1 anywhere else (a
//! control frame, a continuation) is still a protocol error.

use super::codes::{CloseCode, MessageKind, OpCode};
use super::header::{FrameHeader, HeaderError, HeaderStatus, RSV1};
use super::mask::apply_mask;
use super::utf8::Utf8Validator;

/// The largest control frame payload (RFC 6455 §5.5).
pub const MAX_CONTROL_PAYLOAD: usize = 125;

/// A rule the client broke; the connection must be failed with
/// [`ProtocolError::close_code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolError {
    /// RSV1–3 set without a negotiated extension (§5.2).
    ReservedBits,
    /// A reserved opcode (§5.2).
    ReservedOpcode(u8),
    /// A client frame without a masking key (§5.1).
    UnmaskedFrame,
    /// A 64-bit length with the most significant bit set (§5.2).
    LengthOverflow,
    /// A control frame with FIN clear (§5.5).
    FragmentedControlFrame,
    /// A control frame payload over 125 bytes (§5.5).
    ControlFrameTooLong,
    /// A continuation frame with no message in progress (§5.4).
    UnexpectedContinuation,
    /// A new text/binary frame while a fragmented message is in progress (§5.4).
    ExpectedContinuation,
    /// A close frame whose payload is a single byte (§5.5.1).
    TruncatedCloseCode,
    /// A close code a peer must not send (§7.4).
    InvalidCloseCode(u16),
    /// Text (message or close reason) that is not UTF-8 (§8.1).
    InvalidUtf8,
    /// A message larger than the configured limit (compressed, or once
    /// inflated).
    MessageTooBig,
    /// A compressed message that is not valid DEFLATE data (RFC 7692 §7.2.2).
    BadCompressedData,
}

impl ProtocolError {
    /// The close code that reports this error to the client.
    pub fn close_code(self) -> CloseCode {
        match self {
            ProtocolError::InvalidUtf8 | ProtocolError::BadCompressedData => {
                CloseCode::INVALID_PAYLOAD
            }
            ProtocolError::MessageTooBig => CloseCode::MESSAGE_TOO_BIG,
            _ => CloseCode::PROTOCOL_ERROR,
        }
    }

    /// A short human description, used as the close reason and in logs.
    pub fn reason(self) -> &'static str {
        match self {
            ProtocolError::ReservedBits => "reserved bits set",
            ProtocolError::ReservedOpcode(_) => "reserved opcode",
            ProtocolError::UnmaskedFrame => "client frame not masked",
            ProtocolError::LengthOverflow => "payload length overflow",
            ProtocolError::FragmentedControlFrame => "fragmented control frame",
            ProtocolError::ControlFrameTooLong => "control frame too long",
            ProtocolError::UnexpectedContinuation => "continuation without a message",
            ProtocolError::ExpectedContinuation => "expected a continuation frame",
            ProtocolError::TruncatedCloseCode => "close payload of one byte",
            ProtocolError::InvalidCloseCode(_) => "invalid close code",
            ProtocolError::InvalidUtf8 => "invalid UTF-8",
            ProtocolError::MessageTooBig => "message too big",
            ProtocolError::BadCompressedData => "invalid compressed data",
        }
    }
}

impl From<HeaderError> for ProtocolError {
    fn from(e: HeaderError) -> Self {
        match e {
            HeaderError::ReservedOpcode(bits) => ProtocolError::ReservedOpcode(bits),
            HeaderError::LengthOverflow => ProtocolError::LengthOverflow,
        }
    }
}

/// The status and reason of a received close frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseFrame<'a> {
    /// The status code, already checked with [`CloseCode::is_valid_on_wire`].
    pub code: CloseCode,
    /// The reason, already checked to be UTF-8.
    pub reason: &'a str,
}

/// Something the client said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// The next piece of a data message, unmasked; text is valid UTF-8 so
    /// far. `last` marks the end of the message. Pieces may be empty.
    Data {
        /// Text or binary, as set by the message's first frame.
        kind: MessageKind,
        /// The unmasked bytes.
        payload: &'a [u8],
        /// This piece ends the message.
        last: bool,
        /// The message is compressed (RSV1 on its first frame): the pieces
        /// are DEFLATE data, not validated as text yet.
        compressed: bool,
    },
    /// A ping with its (unmasked) application data.
    Ping(&'a [u8]),
    /// An unsolicited or answering pong.
    Pong(&'a [u8]),
    /// A close frame; `None` when it carried no status code.
    Close(Option<CloseFrame<'a>>),
}

/// Per-connection decoding state: 16 bytes, no heap. Between frames only
/// the message in progress (if fragmented) is kept; inside a data frame
/// also what is left of it and its masking key.
#[derive(Debug, Default, Clone, Copy)]
pub struct Decoder {
    /// Payload bytes of the current data frame still to come (a frame is
    /// never longer than the message limit, which fits 32 bits).
    remaining: u32,
    /// The current frame's masking key, rotated so that `mask[0]` applies
    /// to the next byte.
    mask: [u8; 4],
    /// Payload bytes announced so far across the message's fragments.
    len: u32,
    /// The message's text so far, when it is uncompressed text.
    utf8: Utf8Validator,
    /// Which of the above are in use, and the message's kind.
    state: State,
}

/// What a [`Decoder`] holds, in a byte.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct State(u8);

impl State {
    /// A data message is in progress (possibly fragmented).
    const MESSAGE: u8 = 1;
    /// Its first frame was binary (else text).
    const BINARY: u8 = 1 << 1;
    /// RSV1 was set on its first frame.
    const COMPRESSED: u8 = 1 << 2;
    /// A data frame's payload is being read.
    const FRAME: u8 = 1 << 3;
    /// That frame ends its message.
    const FIN: u8 = 1 << 4;

    fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }

    fn set(&mut self, bit: u8, on: bool) {
        if on {
            self.0 |= bit;
        } else {
            self.0 &= !bit;
        }
    }
}

/// The bytes of a [`Decoder`]'s state (see [`Decoder::to_bytes`]).
pub const DECODER_BYTES: usize = 16;

impl Decoder {
    /// Its whole state as bytes, for another process to go on from
    /// (`remaining`, `mask`, `len`, the UTF-8 state, the state byte).
    pub fn to_bytes(self) -> [u8; DECODER_BYTES] {
        let mut out = [0u8; DECODER_BYTES];
        out[..4].copy_from_slice(&self.remaining.to_le_bytes());
        out[4..8].copy_from_slice(&self.mask);
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
        out[12..15].copy_from_slice(&self.utf8.to_bytes());
        out[15] = self.state.0;
        out
    }

    /// The decoder [`Decoder::to_bytes`] gave, or `None` for bytes no
    /// decoder could hold.
    pub fn from_bytes(bytes: &[u8; DECODER_BYTES]) -> Option<Decoder> {
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let utf8 = Utf8Validator::from_bytes(bytes[12..15].try_into().unwrap())?;
        let state = bytes[15];
        let known = State::MESSAGE | State::BINARY | State::COMPRESSED | State::FRAME | State::FIN;
        (state & !known == 0).then_some(Decoder {
            remaining: word(0),
            mask: bytes[4..8].try_into().unwrap(),
            len: word(8),
            utf8,
            state: State(state),
        })
    }

    /// Decodes from the start of `input`, unmasking payload bytes in place.
    ///
    /// Returns how many bytes were consumed and the event they completed;
    /// `None` means everything usable was consumed and more input is needed
    /// (the unconsumed bytes, if any, must be presented again with more data
    /// appended). `max_message_bytes` bounds a whole message, checked against
    /// each frame header before its payload is accepted; limits above
    /// `u32::MAX` act as `u32::MAX`. With `deflate` (permessage-deflate
    /// negotiated), RSV1 may mark a message compressed.
    pub fn decode<'a>(
        &mut self,
        input: &'a mut [u8],
        max_message_bytes: u64,
        deflate: bool,
    ) -> Result<(usize, Option<Event<'a>>), ProtocolError> {
        if self.state.has(State::FRAME) {
            return self.data_piece(input, 0);
        }
        let (header, header_len) = match FrameHeader::parse(input)? {
            HeaderStatus::Partial => return Ok((0, None)),
            HeaderStatus::Complete(header, len) => (header, len),
        };
        let mask = check_header(&header, deflate)?;
        if header.opcode.is_control() {
            let end = header_len + header.payload_len as usize;
            if input.len() < end {
                return Ok((0, None));
            }
            let payload = &mut input[header_len..end];
            apply_mask(payload, mask, 0);
            return Ok((end, Some(control_event(header.opcode, payload)?)));
        }
        self.start_data_frame(&header, mask, max_message_bytes)?;
        self.data_piece(input, header_len)
    }

    /// Applies the fragmentation and size rules to a data frame header and
    /// makes it the current frame.
    fn start_data_frame(
        &mut self,
        header: &FrameHeader,
        mask: [u8; 4],
        max_message_bytes: u64,
    ) -> Result<(), ProtocolError> {
        match (header.opcode, self.state.has(State::MESSAGE)) {
            (OpCode::Continuation, true) => {}
            (OpCode::Continuation, false) => return Err(ProtocolError::UnexpectedContinuation),
            (_, true) => return Err(ProtocolError::ExpectedContinuation),
            (opcode, false) => {
                let mut state = State(State::MESSAGE);
                state.set(State::BINARY, opcode != OpCode::Text);
                state.set(State::COMPRESSED, header.rsv == RSV1);
                self.state = state;
                self.len = 0;
                self.utf8 = Utf8Validator::default();
            }
        }
        let len = u64::from(self.len) + header.payload_len;
        self.len = u32::try_from(len)
            .ok()
            .filter(|&len| u64::from(len) <= max_message_bytes)
            .ok_or(ProtocolError::MessageTooBig)?;
        self.remaining = header.payload_len as u32;
        self.mask = mask;
        self.state.set(State::FRAME, true);
        self.state.set(State::FIN, header.fin);
        Ok(())
    }

    /// Takes the available payload of the current data frame, starting at
    /// `input[start..]`, and reports it as one piece.
    fn data_piece<'a>(
        &mut self,
        input: &'a mut [u8],
        start: usize,
    ) -> Result<(usize, Option<Event<'a>>), ProtocolError> {
        debug_assert!(
            self.state.has(State::MESSAGE),
            "bug: a data frame is always part of a message"
        );
        let take = (self.remaining as usize).min(input.len() - start);
        let payload = &mut input[start..start + take];
        apply_mask(payload, self.mask, 0);
        self.mask.rotate_left(take % 4);
        self.remaining -= take as u32;
        let kind = if self.state.has(State::BINARY) {
            MessageKind::Binary
        } else {
            MessageKind::Text
        };
        let compressed = self.state.has(State::COMPRESSED);
        if kind == MessageKind::Text && !compressed {
            self.utf8
                .feed(payload)
                .map_err(|_| ProtocolError::InvalidUtf8)?;
        }
        let frame_done = self.remaining == 0;
        let last = frame_done && self.state.has(State::FIN);
        if frame_done {
            self.state.set(State::FRAME, false);
        }
        if last {
            self.state = State::default();
            self.utf8.finish().map_err(|_| ProtocolError::InvalidUtf8)?;
        }
        if take == 0 && !frame_done {
            return Ok((start, None));
        }
        Ok((
            start + take,
            Some(Event::Data {
                kind,
                payload,
                last,
                compressed,
            }),
        ))
    }
}

/// The rules every client frame header must satisfy (with `deflate`
/// negotiated, RSV1 may mark a message's first frame); returns its
/// masking key.
fn check_header(header: &FrameHeader, deflate: bool) -> Result<[u8; 4], ProtocolError> {
    let first_data = !header.opcode.is_control() && header.opcode != OpCode::Continuation;
    let allowed = if deflate && first_data { RSV1 } else { 0 };
    if header.rsv & !allowed != 0 {
        return Err(ProtocolError::ReservedBits);
    }
    let mask = header.mask.ok_or(ProtocolError::UnmaskedFrame)?;
    if header.opcode.is_control() {
        if !header.fin {
            return Err(ProtocolError::FragmentedControlFrame);
        }
        if header.payload_len > MAX_CONTROL_PAYLOAD as u64 {
            return Err(ProtocolError::ControlFrameTooLong);
        }
    }
    Ok(mask)
}

/// Interprets a whole, unmasked control frame payload.
fn control_event(opcode: OpCode, payload: &[u8]) -> Result<Event<'_>, ProtocolError> {
    match opcode {
        OpCode::Ping => Ok(Event::Ping(payload)),
        OpCode::Pong => Ok(Event::Pong(payload)),
        _ => parse_close(payload).map(Event::Close),
    }
}

/// Validates a close frame payload (§5.5.1, §7.4).
pub fn parse_close(payload: &[u8]) -> Result<Option<CloseFrame<'_>>, ProtocolError> {
    match payload {
        [] => Ok(None),
        [_] => Err(ProtocolError::TruncatedCloseCode),
        [hi, lo, reason @ ..] => {
            let code = CloseCode(u16::from_be_bytes([*hi, *lo]));
            if !code.is_valid_on_wire() {
                return Err(ProtocolError::InvalidCloseCode(code.0));
            }
            let reason = std::str::from_utf8(reason).map_err(|_| ProtocolError::InvalidUtf8)?;
            Ok(Some(CloseFrame { code, reason }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::header::MAX_HEADER_LEN;
    use super::*;

    const LIMIT: u64 = 1 << 20;
    const KEY: [u8; 4] = [0xA1, 0x0B, 0x5C, 0x77];

    /// A masked client frame, as a browser would send it.
    fn frame(fin: bool, rsv: u8, opcode: OpCode, payload: &[u8]) -> Vec<u8> {
        let header = FrameHeader {
            fin,
            rsv,
            opcode,
            mask: Some(KEY),
            payload_len: payload.len() as u64,
        };
        let mut buf = [0u8; MAX_HEADER_LEN];
        let len = header.encode(&mut buf);
        let mut out = buf[..len].to_vec();
        let start = out.len();
        out.extend_from_slice(payload);
        apply_mask(&mut out[start..], KEY, 0);
        out
    }

    /// What a caller of the decoder sees, owned.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Seen {
        Message(MessageKind, Vec<u8>),
        /// A compressed message, as it came (not inflated).
        Compressed(MessageKind, Vec<u8>),
        Ping(Vec<u8>),
        Pong(Vec<u8>),
        Close(Option<(u16, String)>),
        Error(ProtocolError),
    }

    /// Feeds `wire` in pieces cut at `cuts`, holding back unconsumed bytes
    /// the way the connection does, and reassembles messages.
    fn run(wire: &[u8], cuts: &[usize], limit: u64) -> Vec<Seen> {
        run_with(wire, cuts, limit, false)
    }

    /// [`run`], with permessage-deflate negotiated or not.
    fn run_with(wire: &[u8], cuts: &[usize], limit: u64, deflate: bool) -> Vec<Seen> {
        let mut decoder = Decoder::default();
        let mut seen = Vec::new();
        let mut message = Vec::new();
        let mut held: Vec<u8> = Vec::new();
        let mut bounds: Vec<usize> = cuts.iter().copied().filter(|&c| c < wire.len()).collect();
        bounds.push(wire.len());
        let mut from = 0;
        for to in bounds {
            held.extend_from_slice(&wire[from..to]);
            from = to;
            let mut pos = 0;
            loop {
                match decoder.decode(&mut held[pos..], limit, deflate) {
                    Err(e) => {
                        seen.push(Seen::Error(e));
                        return seen;
                    }
                    Ok((used, event)) => {
                        pos += used;
                        let Some(event) = event else { break };
                        match event {
                            Event::Data {
                                kind,
                                payload,
                                last,
                                compressed,
                            } => {
                                message.extend_from_slice(payload);
                                if last {
                                    let bytes = std::mem::take(&mut message);
                                    seen.push(match compressed {
                                        true => Seen::Compressed(kind, bytes),
                                        false => Seen::Message(kind, bytes),
                                    });
                                }
                            }
                            Event::Ping(p) => seen.push(Seen::Ping(p.to_vec())),
                            Event::Pong(p) => seen.push(Seen::Pong(p.to_vec())),
                            Event::Close(c) => {
                                seen.push(Seen::Close(c.map(|c| (c.code.0, c.reason.to_string()))))
                            }
                        }
                    }
                }
            }
            held.drain(..pos);
            // At every cut the decoder goes on from its bytes, as one
            // handed over to another process does.
            decoder = Decoder::from_bytes(&decoder.to_bytes()).expect("a decoder's own bytes");
        }
        seen
    }

    #[test]
    fn bytes_no_decoder_holds_are_refused() {
        let mut bytes = Decoder::default().to_bytes();
        assert!(Decoder::from_bytes(&bytes).is_some());
        bytes[15] = 1 << 7;
        assert!(
            Decoder::from_bytes(&bytes).is_none(),
            "an unknown state bit"
        );
        let mut bytes = Decoder::default().to_bytes();
        bytes[12..15].copy_from_slice(&[0x41, 0, 0]);
        assert!(Decoder::from_bytes(&bytes).is_none(), "ASCII pending");
        bytes[12..15].copy_from_slice(&[0, 0x80, 0]);
        assert!(
            Decoder::from_bytes(&bytes).is_none(),
            "a byte after the end"
        );
        bytes[12..15].copy_from_slice(&[0xE2, 0x82, 0]);
        assert!(
            Decoder::from_bytes(&bytes).is_some(),
            "two of three bytes of €"
        );
    }

    /// Same result whole, byte by byte, and cut in two at every point.
    fn check(wire: &[u8], expected: &[Seen]) {
        assert_eq!(run(wire, &[], LIMIT), expected, "whole");
        let every: Vec<usize> = (1..wire.len()).collect();
        assert_eq!(run(wire, &every, LIMIT), expected, "byte by byte");
        for cut in 1..wire.len() {
            assert_eq!(run(wire, &[cut], LIMIT), expected, "cut at {cut}");
        }
    }

    fn concat(frames: &[Vec<u8>]) -> Vec<u8> {
        frames.concat()
    }

    #[test]
    fn text_and_binary_messages_of_every_length_encoding() {
        for len in [0usize, 1, 125, 126, 65535, 65536] {
            let text = "x".repeat(len);
            let wire = frame(true, 0, OpCode::Text, text.as_bytes());
            assert_eq!(
                run(&wire, &[], LIMIT),
                [Seen::Message(MessageKind::Text, text.into_bytes())]
            );
            let bin: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let wire = frame(true, 0, OpCode::Binary, &bin);
            assert_eq!(
                run(&wire, &[len / 2, len / 2 + 3], LIMIT),
                [Seen::Message(MessageKind::Binary, bin)]
            );
        }
    }

    #[test]
    fn fragmented_text_with_interleaved_control_frames() {
        let wire = concat(&[
            frame(false, 0, OpCode::Text, "κό".as_bytes()),
            frame(true, 0, OpCode::Ping, b"p1"),
            frame(false, 0, OpCode::Continuation, &[]),
            frame(true, 0, OpCode::Pong, b""),
            frame(true, 0, OpCode::Continuation, "σμε".as_bytes()),
            frame(true, 0, OpCode::Close, &[0x03, 0xE8, b'b', b'y', b'e']),
        ]);
        check(
            &wire,
            &[
                Seen::Ping(b"p1".to_vec()),
                Seen::Pong(vec![]),
                Seen::Message(MessageKind::Text, "κόσμε".as_bytes().to_vec()),
                Seen::Close(Some((1000, "bye".into()))),
            ],
        );
    }

    #[test]
    fn utf8_split_across_fragments_is_valid() {
        let euro = "€".as_bytes();
        let wire = concat(&[
            frame(false, 0, OpCode::Text, &euro[..1]),
            frame(false, 0, OpCode::Continuation, &euro[1..2]),
            frame(true, 0, OpCode::Continuation, &euro[2..]),
        ]);
        check(&wire, &[Seen::Message(MessageKind::Text, euro.to_vec())]);
    }

    /// Each protocol rule, with the close code it maps to.
    #[test]
    fn every_rule_fails_with_its_close_code() {
        let mut unmasked = frame(true, 0, OpCode::Text, b"hi");
        unmasked[1] &= 0x7F;
        let mut overflow = vec![0x82, 0xFF];
        overflow.extend_from_slice(&(1u64 << 63).to_be_bytes());
        overflow.extend_from_slice(&KEY);
        let cases: Vec<(&str, Vec<u8>, ProtocolError, u16)> = vec![
            (
                "rsv1",
                frame(true, 0b100, OpCode::Text, b"a"),
                ProtocolError::ReservedBits,
                1002,
            ),
            (
                "rsv3 on ping",
                frame(true, 0b001, OpCode::Ping, b""),
                ProtocolError::ReservedBits,
                1002,
            ),
            (
                "opcode 3",
                {
                    let mut f = frame(true, 0, OpCode::Text, b"");
                    f[0] = 0x83;
                    f
                },
                ProtocolError::ReservedOpcode(3),
                1002,
            ),
            (
                "opcode 0xB",
                {
                    let mut f = frame(true, 0, OpCode::Ping, b"");
                    f[0] = 0x8B;
                    f
                },
                ProtocolError::ReservedOpcode(0xB),
                1002,
            ),
            ("unmasked", unmasked, ProtocolError::UnmaskedFrame, 1002),
            (
                "64-bit top bit",
                overflow,
                ProtocolError::LengthOverflow,
                1002,
            ),
            (
                "fragmented ping",
                frame(false, 0, OpCode::Ping, b"x"),
                ProtocolError::FragmentedControlFrame,
                1002,
            ),
            (
                "ping 126",
                frame(true, 0, OpCode::Ping, &[0; 126]),
                ProtocolError::ControlFrameTooLong,
                1002,
            ),
            (
                "lone continuation",
                frame(true, 0, OpCode::Continuation, b"x"),
                ProtocolError::UnexpectedContinuation,
                1002,
            ),
            (
                "text inside fragmented message",
                concat(&[
                    frame(false, 0, OpCode::Text, b"a"),
                    frame(true, 0, OpCode::Text, b"b"),
                ]),
                ProtocolError::ExpectedContinuation,
                1002,
            ),
            (
                "close of one byte",
                frame(true, 0, OpCode::Close, &[0x03]),
                ProtocolError::TruncatedCloseCode,
                1002,
            ),
            (
                "close 1005",
                frame(true, 0, OpCode::Close, &[0x03, 0xED]),
                ProtocolError::InvalidCloseCode(1005),
                1002,
            ),
            (
                "close 999",
                frame(true, 0, OpCode::Close, &[0x03, 0xE7]),
                ProtocolError::InvalidCloseCode(999),
                1002,
            ),
            (
                "close reason not UTF-8",
                frame(true, 0, OpCode::Close, &[0x03, 0xE8, 0xFF]),
                ProtocolError::InvalidUtf8,
                1007,
            ),
            (
                "invalid text",
                frame(true, 0, OpCode::Text, b"\xce\xba\xff"),
                ProtocolError::InvalidUtf8,
                1007,
            ),
            (
                "text ends mid code point",
                frame(true, 0, OpCode::Text, b"\xe2\x82"),
                ProtocolError::InvalidUtf8,
                1007,
            ),
        ];
        for (name, wire, error, code) in cases {
            let seen = run(&wire, &[], LIMIT);
            assert_eq!(seen.last(), Some(&Seen::Error(error)), "{name}");
            assert_eq!(error.close_code(), CloseCode(code), "{name}");
            let bytewise: Vec<usize> = (1..wire.len()).collect();
            assert_eq!(
                run(&wire, &bytewise, LIMIT).last(),
                Some(&Seen::Error(error)),
                "{name} byte by byte"
            );
        }
    }

    /// The size limit is checked from headers alone, before any payload
    /// arrives, and counts every fragment of the message.
    #[test]
    fn message_limit_is_checked_before_the_payload() {
        let header_only = &frame(true, 0, OpCode::Binary, &[0; 101])[..6];
        assert_eq!(
            run(header_only, &[], 100),
            [Seen::Error(ProtocolError::MessageTooBig)]
        );
        let wire = concat(&[
            frame(false, 0, OpCode::Text, &[b'a'; 60]),
            frame(true, 0, OpCode::Continuation, &[b'b'; 41]),
        ]);
        assert_eq!(
            run(&wire, &[], 100),
            [Seen::Error(ProtocolError::MessageTooBig)]
        );
        assert_eq!(run(&wire, &[], 101).len(), 1);
    }

    /// Invalid UTF-8 in the middle of a long frame fails before the rest of
    /// the frame has arrived (Autobahn 6.4.3/6.4.4).
    #[test]
    fn invalid_utf8_fails_fast_inside_one_frame() {
        let mut payload = "κόσμε".as_bytes().to_vec();
        let bad_at = payload.len();
        payload.extend_from_slice(b"\xf4\x90\x80\x80");
        payload.extend_from_slice(&[b'z'; 1000]);
        let wire = frame(true, 0, OpCode::Text, &payload);
        let header_len = wire.len() - payload.len();
        let prefix = &wire[..header_len + bad_at + 2];
        let seen = run(prefix, &[header_len + bad_at + 1], LIMIT);
        assert_eq!(seen, [Seen::Error(ProtocolError::InvalidUtf8)]);
    }

    #[test]
    fn payload_pieces_consume_input_as_it_arrives() {
        let mut wire = frame(true, 0, OpCode::Binary, &[7; 300]);
        let mut decoder = Decoder::default();
        let (used, event) = decoder.decode(&mut wire[..108], LIMIT, false).unwrap();
        assert_eq!(used, 108, "header (2 + 2 + 4) + 100 payload bytes");
        assert!(
            matches!(event, Some(Event::Data { payload, last: false, .. }) if payload == [7; 100])
        );
        let (used, event) = decoder.decode(&mut wire[108..], LIMIT, false).unwrap();
        assert_eq!(used, 200);
        assert!(matches!(event, Some(Event::Data { last: true, .. })));
        assert_eq!(std::mem::size_of::<Decoder>(), 16);
    }

    /// Arbitrary bytes (random, and random mutations of valid frames) end
    /// in events or an error, never a panic or a loop that consumes nothing
    /// while reporting events.
    #[test]
    fn arbitrary_input_never_panics() {
        let mut rng = crate::testing::XorShift(0x9E37_79B9_7F4A_7C15u64);
        let mut next = move || rng.next();
        let valid = concat(&[
            frame(false, 0, OpCode::Text, "κόσμε".as_bytes()),
            frame(true, 0, OpCode::Ping, b"ping"),
            frame(true, 0, OpCode::Continuation, b"!"),
            frame(true, 0, OpCode::Close, &[0x03, 0xE8]),
        ]);
        for round in 0..20_000 {
            let mut wire = if round % 2 == 0 {
                (0..next() % 64).map(|_| next() as u8).collect::<Vec<u8>>()
            } else {
                let mut wire = valid.clone();
                for _ in 0..1 + next() % 4 {
                    let at = (next() as usize) % wire.len();
                    wire[at] = next() as u8;
                }
                wire
            };
            let mut decoder = Decoder::default();
            let mut pos = 0;
            while let Ok((used, Some(_))) = decoder.decode(&mut wire[pos..], 1 << 16, false) {
                pos += used;
            }
        }
    }

    #[test]
    fn with_deflate_rsv1_marks_a_message_compressed_and_nothing_else() {
        use OpCode::{Binary, Continuation, Ping, Text};
        // Not UTF-8, and not checked as such: it is DEFLATE data.
        let deflated = [0xf2, 0x48, 0xcd, 0xc9];
        let wire = frame(true, 0b100, Text, &deflated);
        assert_eq!(
            run_with(&wire, &[1, 3, 7], LIMIT, true),
            [Seen::Compressed(MessageKind::Text, deflated.to_vec())]
        );
        // Fragmented: RSV1 on the first frame only.
        let mut wire = frame(false, 0b100, Binary, b"ab");
        wire.extend(frame(true, 0, Continuation, b"cd"));
        wire.extend(frame(true, 0, Text, b"plain"));
        assert_eq!(
            run_with(&wire, &[5], LIMIT, true),
            [
                Seen::Compressed(MessageKind::Binary, b"abcd".to_vec()),
                Seen::Message(MessageKind::Text, b"plain".to_vec())
            ]
        );
        let refused = |wire: Vec<u8>, deflate| {
            assert_eq!(
                run_with(&wire, &[], LIMIT, deflate),
                [Seen::Error(ProtocolError::ReservedBits)]
            )
        };
        refused(frame(true, 0b100, Text, b"x"), false);
        refused(frame(true, 0b100, Ping, b"x"), true);
        refused(frame(true, 0b010, Text, b"x"), true);
        refused(frame(true, 0b001, Text, b"x"), true);
        let mut wire = frame(false, 0b100, Text, b"a");
        wire.extend(frame(true, 0b100, Continuation, b"b"));
        refused(wire, true);
    }
}

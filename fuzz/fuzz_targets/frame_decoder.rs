//! The frame decoder, driven the way a connection drives it: bytes it does
//! not consume are held and presented again with the next read appended.
//!
//! Input: `[mode, ..]`. Bit 1 of `mode` set: permessage-deflate is
//! negotiated. An even `mode` is followed by raw bytes,
//! `[limit, n, size_1 .. size_n, wire ..]`: `limit` is the message limit
//! in units of 8 bytes (0: none), and the wire is read `size_i + 1` bytes
//! at a time, cycling (all at once when `n % 8` is 0). An odd `mode` is
//! followed by structured data for a list of client frames: fragmented
//! messages cut anywhere, even inside a UTF-8 sequence, control frames
//! between fragments, close frames with codes and reasons, messages
//! compressed (RSV1 on the first frame, the payload DEFLATE data), and now
//! and then a reserved bit, a reserved opcode, a missing mask or a longer
//! length encoding than needed.
//!
//! Either way, decoding it whole, in chunks and a byte at a time gives the
//! same events and the same end; for built frames, those are the ones a
//! model of RFC 6455 and RFC 7692 predicts from the plain payloads. Every
//! compressed message is then inflated within the limit: one built from a
//! compressed payload gives back the plain bytes (or is too big), and no
//! input inflates past the limit.

#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use wspush::protocol::ws::compress::deflate_message;
use wspush::protocol::ws::decoder::{parse_close, MAX_CONTROL_PAYLOAD};
use wspush::protocol::ws::inflate::{InflateError, Inflater};
use wspush::protocol::ws::{CloseFrame, Decoder, Event, MessageKind, ProtocolError};

/// The structured input.
#[derive(Arbitrary, Debug)]
struct Input {
    limit: Limit,
    /// Read sizes, each `size + 1`, cycling; none: one read.
    chunks: Vec<u8>,
    items: Vec<Item>,
}

/// `max_message_bytes`.
#[derive(Arbitrary, Debug)]
enum Limit {
    Small(u8),
    Medium(u16),
    Unlimited,
}

#[derive(Arbitrary, Debug)]
enum Item {
    Frame(Frame),
    /// One message cut into fragments at `cuts`, with a control frame after
    /// the first fragment if given; `compressed`: its payload is the body
    /// compressed, RSV1 on its first frame.
    Fragmented {
        text: bool,
        compressed: bool,
        body: Payload,
        cuts: Vec<u8>,
        between: Option<Frame>,
        mask: [u8; 4],
    },
}

#[derive(Arbitrary, Debug)]
struct Frame {
    fin: bool,
    op: Op,
    mask: [u8; 4],
    length: LengthForm,
    /// 249..=255 are flaws, one frame in 37; see [`Frame::flaws`].
    flaw: u8,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Continuation(Payload),
    Text(Payload),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(CloseBody),
    /// One of the ten reserved opcodes.
    Reserved(u8, Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Payload {
    Text(String),
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum CloseBody {
    Empty,
    /// `code` picks one of [`CLOSE_CODES`] when `pick` is set.
    Code {
        code: u16,
        pick: bool,
        reason: Payload,
    },
    Raw(Vec<u8>),
}

/// Close codes on both sides of every boundary of the valid ranges.
const CLOSE_CODES: [u16; 17] = [
    0, 999, 1000, 1003, 1004, 1005, 1006, 1007, 1011, 1012, 1014, 1015, 2999, 3000, 4999, 5000,
    65535,
];

const RESERVED_OPCODES: [u8; 10] = [3, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF];

/// How the payload length is written: the shortest form, or a longer one
/// (which RFC 6455 asks for but a receiver may accept).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum LengthForm {
    Shortest,
    Sixteen,
    SixtyFour,
}

impl Payload {
    fn bytes(&self) -> &[u8] {
        match self {
            Payload::Text(text) => text.as_bytes(),
            Payload::Bytes(bytes) => bytes,
        }
    }
}

/// A frame as it goes on the wire, its payload still plain.
struct WireFrame {
    fin: bool,
    rsv: u8,
    opcode: u8,
    mask: Option<[u8; 4]>,
    length: LengthForm,
    payload: Vec<u8>,
}

impl WireFrame {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(u8::from(self.fin) << 7 | self.rsv << 4 | self.opcode);
        let mask_bit = if self.mask.is_some() { 0x80 } else { 0 };
        let len = self.payload.len();
        match self.length {
            LengthForm::Shortest if len <= 125 => out.push(mask_bit | len as u8),
            LengthForm::Shortest | LengthForm::Sixteen if len <= 0xFFFF => {
                out.push(mask_bit | 126);
                out.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                out.push(mask_bit | 127);
                out.extend_from_slice(&(len as u64).to_be_bytes());
            }
        }
        let key = self.mask.unwrap_or_default();
        if self.mask.is_some() {
            out.extend_from_slice(&key);
        }
        out.extend(
            self.payload
                .iter()
                .zip(key.iter().cycle())
                .map(|(byte, k)| byte ^ k),
        );
    }
}

impl Frame {
    fn to_wire(&self) -> WireFrame {
        let (opcode, payload) = match &self.op {
            Op::Continuation(payload) => (0x0, payload.bytes().to_vec()),
            Op::Text(payload) => (0x1, payload.bytes().to_vec()),
            Op::Binary(bytes) => (0x2, bytes.clone()),
            Op::Close(CloseBody::Empty) => (0x8, Vec::new()),
            Op::Close(CloseBody::Code { code, pick, reason }) => {
                let code = if *pick {
                    CLOSE_CODES[usize::from(*code) % CLOSE_CODES.len()]
                } else {
                    *code
                };
                let mut payload = code.to_be_bytes().to_vec();
                payload.extend_from_slice(reason.bytes());
                (0x8, payload)
            }
            Op::Close(CloseBody::Raw(bytes)) => (0x8, bytes.clone()),
            Op::Ping(bytes) => (0x9, bytes.clone()),
            Op::Pong(bytes) => (0xA, bytes.clone()),
            Op::Reserved(bits, bytes) => (
                RESERVED_OPCODES[usize::from(*bits) % RESERVED_OPCODES.len()],
                bytes.clone(),
            ),
        };
        let (rsv, masked) = self.flaws();
        WireFrame {
            // A control frame with FIN clear is a flaw too.
            fin: if opcode >= 0x8 {
                self.flaw != 249
            } else {
                self.fin
            },
            rsv,
            opcode,
            mask: masked.then_some(self.mask),
            length: self.length,
            payload,
        }
    }

    /// Reserved bits and whether the frame is masked (249, which clears a
    /// control frame's FIN, is applied in [`Frame::to_wire`]).
    fn flaws(&self) -> (u8, bool) {
        match self.flaw {
            250 => (0, false),
            251..=255 => ((self.flaw - 250) & 7, true),
            _ => (0, true),
        }
    }
}

impl Item {
    fn frames(&self) -> Vec<WireFrame> {
        match self {
            Item::Frame(frame) => vec![frame.to_wire()],
            Item::Fragmented {
                text,
                compressed,
                body,
                cuts,
                between,
                mask,
            } => {
                let deflated = compressed.then(|| deflate_message(body.bytes()));
                let body = deflated.as_deref().unwrap_or(body.bytes());
                let mut bounds: Vec<usize> = cuts
                    .iter()
                    .map(|&cut| usize::from(cut) % (body.len() + 1))
                    .collect();
                bounds.push(body.len());
                bounds.sort_unstable();
                let mut frames = Vec::new();
                let mut from = 0;
                for (i, &to) in bounds.iter().enumerate() {
                    frames.push(WireFrame {
                        fin: i + 1 == bounds.len(),
                        rsv: if i == 0 && *compressed { RSV1 } else { 0 },
                        opcode: match (i, text) {
                            (0, true) => 0x1,
                            (0, false) => 0x2,
                            _ => 0x0,
                        },
                        mask: Some(*mask),
                        length: LengthForm::Shortest,
                        payload: body[from..to].to_vec(),
                    });
                    from = to;
                    if i == 0 {
                        frames.extend(between.as_ref().map(Frame::to_wire));
                    }
                }
                frames
            }
        }
    }

    /// A compressed message's payload with its plain bytes.
    fn originals(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        match self {
            Item::Fragmented {
                compressed: true,
                body,
                ..
            } => Some((deflate_message(body.bytes()).into(), body.bytes().to_vec())),
            _ => None,
        }
    }
}

/// RSV1: the message is compressed.
const RSV1: u8 = 0b100;

/// What the decoder reported, with data pieces joined into messages.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// A whole message: its kind, whether it is compressed, its payload.
    Message(MessageKind, bool, Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<(u16, String)>),
}

/// How decoding ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    Failed(ProtocolError),
    /// All input decoded: the message still open, if any, and how many
    /// bytes (the start of a frame) are held for more input.
    Open {
        unfinished: Option<(MessageKind, Vec<u8>)>,
        held: usize,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    seen: Vec<Seen>,
    end: End,
}

fn close_seen(frame: Option<CloseFrame<'_>>) -> Seen {
    Seen::Close(frame.map(|f| (f.code.0, f.reason.to_string())))
}

/// Decodes `wire` read in chunks of `sizes` (cycling; empty: one read),
/// holding unconsumed bytes as a connection does.
fn decode(wire: &[u8], sizes: &[u8], limit: u64, deflate: bool) -> Outcome {
    let mut decoder = Decoder::default();
    let mut seen = Vec::new();
    let mut message: Option<(MessageKind, bool, Vec<u8>)> = None;
    let mut held: Vec<u8> = Vec::new();
    let mut chunks = sizes.iter().map(|&size| usize::from(size) + 1).cycle();
    let mut from = 0;
    while from < wire.len() {
        let to = chunks
            .next()
            .map_or(wire.len(), |size| (from + size).min(wire.len()));
        held.extend_from_slice(&wire[from..to]);
        from = to;
        let mut pos = 0;
        loop {
            let available = held.len() - pos;
            let (used, event) = match decoder.decode(&mut held[pos..], limit, deflate) {
                Ok(decoded) => decoded,
                Err(error) => {
                    return Outcome {
                        seen,
                        end: End::Failed(error),
                    }
                }
            };
            assert!(used <= available, "used {used} of {available}");
            pos += used;
            let Some(event) = event else { break };
            assert!(used > 0, "an event consumes input: {event:?}");
            match event {
                Event::Data {
                    kind,
                    payload,
                    last,
                    compressed,
                } => {
                    // Without deflate negotiated, nothing is ever compressed.
                    assert!(deflate || !compressed, "RSV1 accepted without deflate");
                    let (started, was, bytes) =
                        message.get_or_insert((kind, compressed, Vec::new()));
                    assert_eq!(
                        (*started, *was),
                        (kind, compressed),
                        "a message keeps its kind"
                    );
                    bytes.extend_from_slice(payload);
                    // Compressed text is checked once inflated, not here.
                    let text = kind == MessageKind::Text && !compressed;
                    if text {
                        check_text_prefix(bytes);
                    }
                    if last {
                        let (kind, _, bytes) = message.take().expect("just set");
                        if text {
                            assert!(std::str::from_utf8(&bytes).is_ok());
                        }
                        seen.push(Seen::Message(kind, compressed, bytes));
                    }
                }
                Event::Ping(payload) => {
                    assert!(payload.len() <= MAX_CONTROL_PAYLOAD);
                    seen.push(Seen::Ping(payload.to_vec()));
                }
                Event::Pong(payload) => {
                    assert!(payload.len() <= MAX_CONTROL_PAYLOAD);
                    seen.push(Seen::Pong(payload.to_vec()));
                }
                Event::Close(frame) => {
                    assert!(frame.is_none_or(|f| f.code.is_valid_on_wire()));
                    seen.push(close_seen(frame));
                }
            }
        }
        held.drain(..pos);
        // What was left is the start of a frame: presented again as it is,
        // it is left again.
        assert_eq!(decoder.decode(&mut held, limit, deflate), Ok((0, None)));
    }
    Outcome {
        seen,
        end: End::Open {
            unfinished: message.map(|(kind, _, bytes)| (kind, bytes)),
            held: held.len(),
        },
    }
}

/// Text handed out so far is UTF-8 or ends inside a sequence that may
/// still become valid.
fn check_text_prefix(bytes: &[u8]) {
    if let Err(e) = std::str::from_utf8(bytes) {
        assert!(e.error_len().is_none(), "invalid text passed: {bytes:?}");
        assert!(bytes.len() - e.valid_up_to() < 4);
    }
}

/// `parse_close` against RFC 6455 §5.5.1 and §7.4.
fn check_parse_close(payload: &[u8]) {
    let parsed = parse_close(payload);
    match payload {
        [] => assert_eq!(parsed, Ok(None)),
        [_] => assert_eq!(parsed, Err(ProtocolError::TruncatedCloseCode)),
        [hi, lo, reason @ ..] => {
            let code = u16::from_be_bytes([*hi, *lo]);
            // RFC 6455 §7.4, and 1012-1014 registered with IANA since.
            let valid = matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999);
            match (valid, std::str::from_utf8(reason)) {
                (false, _) => assert_eq!(parsed, Err(ProtocolError::InvalidCloseCode(code))),
                (true, Err(_)) => assert_eq!(parsed, Err(ProtocolError::InvalidUtf8)),
                (true, Ok(text)) => {
                    let frame = parsed.expect("a valid close").expect("with a code");
                    assert_eq!((frame.code.0, frame.reason), (code, text));
                }
            }
        }
    }
}

/// What RFC 6455 says a server decoding `frames` sees, checked in the
/// decoder's order: opcode, reserved bits, mask, control frame rules, then
/// fragmentation, size and UTF-8 for data. With `deflate`, RSV1 may mark
/// a message's first frame: the message is compressed, its text checked
/// only once inflated.
fn model(frames: &[WireFrame], limit: u64, deflate: bool) -> Outcome {
    let limit = limit.min(u64::from(u32::MAX)) as usize;
    let mut seen = Vec::new();
    let mut message: Option<(MessageKind, bool, Vec<u8>)> = None;
    let fail = |seen, error| Outcome {
        seen,
        end: End::Failed(error),
    };
    for frame in frames {
        let payload = &frame.payload;
        if RESERVED_OPCODES.contains(&frame.opcode) {
            return fail(seen, ProtocolError::ReservedOpcode(frame.opcode));
        }
        let first_data = frame.opcode == 0x1 || frame.opcode == 0x2;
        let allowed = if deflate && first_data { RSV1 } else { 0 };
        if frame.rsv & !allowed != 0 {
            return fail(seen, ProtocolError::ReservedBits);
        }
        if frame.mask.is_none() {
            return fail(seen, ProtocolError::UnmaskedFrame);
        }
        if frame.opcode >= 0x8 {
            if !frame.fin {
                return fail(seen, ProtocolError::FragmentedControlFrame);
            }
            if payload.len() > MAX_CONTROL_PAYLOAD {
                return fail(seen, ProtocolError::ControlFrameTooLong);
            }
            seen.push(match frame.opcode {
                0x9 => Seen::Ping(payload.clone()),
                0xA => Seen::Pong(payload.clone()),
                _ => match parse_close(payload) {
                    Ok(close) => close_seen(close),
                    Err(error) => return fail(seen, error),
                },
            });
            continue;
        }
        let (kind, compressed, bytes) = match (frame.opcode, message.as_mut()) {
            (0x0, Some(open)) => open,
            (0x0, None) => return fail(seen, ProtocolError::UnexpectedContinuation),
            (_, Some(_)) => return fail(seen, ProtocolError::ExpectedContinuation),
            (opcode, None) => {
                let kind = if opcode == 0x1 {
                    MessageKind::Text
                } else {
                    MessageKind::Binary
                };
                message.insert((kind, frame.rsv == RSV1, Vec::new()))
            }
        };
        if bytes.len() + payload.len() > limit {
            return fail(seen, ProtocolError::MessageTooBig);
        }
        bytes.extend_from_slice(payload);
        if *kind == MessageKind::Text && !*compressed {
            if let Err(e) = std::str::from_utf8(bytes) {
                if e.error_len().is_some() || frame.fin {
                    return fail(seen, ProtocolError::InvalidUtf8);
                }
            }
        }
        if frame.fin {
            let (kind, compressed, bytes) = message.take().expect("open");
            seen.push(Seen::Message(kind, compressed, bytes));
        }
    }
    Outcome {
        seen,
        end: End::Open {
            unfinished: message.map(|(kind, _, bytes)| (kind, bytes)),
            held: 0,
        },
    }
}

/// Decodes `wire` whole, in chunks of `sizes` and a byte at a time: the
/// same outcome each time, the `predicted` one if given. Returns it.
fn check(
    wire: &[u8],
    sizes: &[u8],
    limit: u64,
    deflate: bool,
    predicted: Option<Outcome>,
) -> Outcome {
    let whole = decode(wire, &[], limit, deflate);
    if let Some(predicted) = predicted {
        assert_eq!(whole, predicted, "decoded whole vs the model");
    }
    assert_eq!(
        decode(wire, sizes, limit, deflate),
        whole,
        "in chunks vs whole"
    );
    if !sizes.is_empty() {
        assert_eq!(
            decode(wire, &[0], limit, deflate),
            whole,
            "byte by byte vs whole"
        );
    }
    whole
}

/// Inflates every compressed message seen, within `limit` (at most 1 MiB
/// here): never past it; one of `originals` (payload, plain bytes) gives
/// back its plain bytes, or is refused as too big if they are.
fn check_inflate(seen: &[Seen], originals: &[(Vec<u8>, Vec<u8>)], limit: u64) {
    let limit = limit.min(1 << 20) as usize;
    let (mut inflater, mut out) = (Inflater::default(), Vec::new());
    for seen in seen {
        let Seen::Message(_, true, payload) = seen else {
            continue;
        };
        let result = inflater.inflate(payload, limit, &mut out);
        if result.is_ok() {
            assert!(out.len() <= limit, "inflated {} past {limit}", out.len());
        }
        let Some((_, plain)) = originals.iter().find(|(p, _)| p == payload) else {
            continue;
        };
        match result {
            Ok(()) => assert_eq!(&out, plain, "inflated vs the plain bytes"),
            Err(InflateError::TooBig) => assert!(plain.len() > limit),
            Err(InflateError::Corrupt) => panic!("a compressed message refused as corrupt"),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let deflate = mode & 2 != 0;
    if mode % 2 == 0 {
        let Some((&[limit, count], rest)) = data.split_first_chunk::<2>() else {
            return;
        };
        let count = usize::from(count % 8);
        if rest.len() < count {
            return;
        }
        let (sizes, wire) = rest.split_at(count);
        let limit = match limit {
            0 => u64::MAX,
            units => u64::from(units) * 8,
        };
        let outcome = check(wire, sizes, limit, deflate, None);
        return check_inflate(&outcome.seen, &[], limit);
    }
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let limit = match input.limit {
        Limit::Small(limit) => u64::from(limit),
        Limit::Medium(limit) => u64::from(limit),
        Limit::Unlimited => u64::MAX,
    };
    let frames: Vec<WireFrame> = input.items.iter().flat_map(Item::frames).collect();
    let mut wire = Vec::new();
    for frame in &frames {
        if frame.opcode == 0x8 {
            check_parse_close(&frame.payload);
        }
        frame.encode(&mut wire);
    }
    let predicted = model(&frames, limit, deflate);
    let outcome = check(&wire, &input.chunks, limit, deflate, Some(predicted));
    let originals: Vec<_> = input.items.iter().filter_map(Item::originals).collect();
    check_inflate(&outcome.seen, &originals, limit);
});

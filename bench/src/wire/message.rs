//! The payloads the bench sends, each naming its place in the run and the
//! moment it was sent, so that receivers check order and measure latency
//! on their own.
//!
//! - A broadcast (one stdin line): `<seq> <sent_ns> ` followed by padding
//!   up to the payload size: `.`s, e.g. `7 81234567890123 ........` for
//!   32 bytes, or JSON text (an order book, [`Padding::Json`]) for
//!   permessage-deflate to compress as it would a real feed.
//! - An echo request: `<conn> <seq> <sent_ns> ` followed by a filler whose
//!   every byte depends on the sequence number and its position, so that
//!   the echo can be checked byte for byte without keeping a copy.
//!
//! `sent_ns` is [`crate::observe::sys::now_ns`] (CLOCK_MONOTONIC), shared by all
//! processes.

use serde::{Deserialize, Serialize};

/// What a receiver learns from a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Sequence number, from 1.
    pub seq: u32,
    /// Monotonic time at which the line was written to the server.
    pub sent_ns: u64,
}

/// Checks that `payload_bytes` can hold a stamp with sequence numbers up
/// to `max_seq` (and any 20-digit time).
pub fn check_room(payload_bytes: usize, max_seq: u32) -> Result<(), String> {
    let widest = Stamp {
        seq: max_seq,
        sent_ns: u64::MAX,
    };
    match encode(widest, payload_bytes) {
        Some(_) => Ok(()),
        None => Err(format!(
            "--payload-bytes {payload_bytes} is too small for a sequence number and a timestamp"
        )),
    }
}

/// What fills a broadcast after its stamp.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum Padding {
    /// `.` bytes.
    #[default]
    Dots,
    /// An order book in JSON (25 price levels a side, ~960 bytes, repeated
    /// as needed): text that compresses as a real JSON feed does.
    Json,
}

impl Padding {
    /// Whether `padding` is this padding's first `padding.len()` bytes.
    fn matches(self, padding: &[u8]) -> bool {
        match self {
            // Without an early exit, so that it compiles to a few vector
            // compares: the client checks millions of these a second.
            Padding::Dots => padding.iter().fold(0u8, |acc, &b| acc | (b ^ b'.')) == 0,
            Padding::Json => {
                let json = json_padding();
                padding.chunks(json.len()).all(|c| c == &json[..c.len()])
            }
        }
    }

    /// Appends this padding to `line` until it is `size` bytes long.
    fn fill(self, line: &mut Vec<u8>, size: usize) {
        match self {
            Padding::Dots => line.resize(size, b'.'),
            Padding::Json => {
                let json = json_padding();
                while line.len() < size {
                    let take = json.len().min(size - line.len());
                    line.extend_from_slice(&json[..take]);
                }
            }
        }
    }
}

/// The order book of [`Padding::Json`].
fn json_padding() -> &'static [u8] {
    static JSON: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    JSON.get_or_init(|| crate::wire::feed::feed(1, 25).remove(0))
}

/// The message for `stamp`, padded with `.` to `size` bytes; `None` if the
/// stamp alone (with its trailing space) does not fit in `size` bytes.
pub fn encode(stamp: Stamp, size: usize) -> Option<Vec<u8>> {
    encode_padded(stamp, size, Padding::Dots)
}

/// [`encode`] with `padding`.
pub fn encode_padded(stamp: Stamp, size: usize, padding: Padding) -> Option<Vec<u8>> {
    let mut line = format!("{} {} ", stamp.seq, stamp.sent_ns).into_bytes();
    if line.len() > size {
        return None;
    }
    padding.fill(&mut line, size);
    Some(line)
}

/// Reads the stamp from a received payload of the expected `size`, padded
/// with `.`; `None` if the payload is corrupt.
pub fn decode(payload: &[u8], size: usize) -> Option<Stamp> {
    decode_padded(payload, size, Padding::Dots)
}

/// [`decode`] of a payload padded with `padding`.
pub fn decode_padded(payload: &[u8], size: usize, padding: Padding) -> Option<Stamp> {
    if payload.len() != size {
        return None;
    }
    let (seq, rest) = split_field(payload)?;
    let (sent_ns, pad) = split_field(rest)?;
    if !padding.matches(pad) {
        return None;
    }
    Some(Stamp {
        seq: u32::try_from(seq).ok()?,
        sent_ns,
    })
}

/// What an echo request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EchoStamp {
    /// Id of the connection it was sent on.
    pub conn: u64,
    /// Its number on that connection, from 0.
    pub seq: u64,
    /// Monotonic time at which it was written to the socket.
    pub sent_ns: u64,
}

/// Length of the filler's cycle: the letters `a`..`z`.
const FILLER_CYCLE: usize = 26;

/// Two cycles of the filler, so that any run of up to one cycle starting
/// anywhere in the first is one slice: the filler is copied and compared
/// a cycle at a time instead of computed byte by byte (the echo client
/// handles tens of thousands of 1 KB payloads a second).
const FILLER: &[u8; 2 * FILLER_CYCLE] = b"abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz";

/// The filler of echo request `seq` from payload position `start` on, in
/// pieces of at most one cycle, covering `len` bytes: byte `i` of the
/// payload is `a` + (`seq` + `i`) mod 26.
fn filler(seq: u64, start: usize, len: usize) -> impl Iterator<Item = &'static [u8]> {
    let phase = ((seq % FILLER_CYCLE as u64) as usize + start % FILLER_CYCLE) % FILLER_CYCLE;
    let cycle = &FILLER[phase..phase + FILLER_CYCLE];
    (0..len)
        .step_by(FILLER_CYCLE)
        .map(move |at| &cycle[..FILLER_CYCLE.min(len - at)])
}

/// Appends the payload of echo request `stamp`, `size` bytes, to `out`;
/// false (nothing appended) if the stamp does not fit in `size` bytes.
/// With `json`, the filler is [`Padding::Json`]'s order book (for
/// permessage-deflate to compress as it would a JSON feed) instead of the
/// alphabet.
pub fn encode_echo(stamp: EchoStamp, size: usize, json: bool, out: &mut Vec<u8>) -> bool {
    use std::io::Write;
    let start = out.len();
    write!(out, "{} {} {} ", stamp.conn, stamp.seq, stamp.sent_ns).expect("a Vec takes it");
    let head = out.len() - start;
    if head > size {
        out.truncate(start);
        return false;
    }
    if json {
        Padding::Json.fill(out, start + size);
    } else {
        for piece in filler(stamp.seq, head, size - head) {
            out.extend_from_slice(piece);
        }
    }
    debug_assert_eq!(out.len() - start, size);
    true
}

/// Reads and checks an echoed payload of the expected `size`: the stamp,
/// and every filler byte (the order book's with `json`); `None` if
/// anything differs.
pub fn decode_echo(payload: &[u8], size: usize, json: bool) -> Option<EchoStamp> {
    if payload.len() != size {
        return None;
    }
    let mut fields = payload.splitn(4, |&b| b == b' ');
    let conn = parse_decimal(fields.next()?)?;
    let seq = parse_decimal(fields.next()?)?;
    let sent_ns = parse_decimal(fields.next()?)?;
    let rest = fields.next()?;
    let offset = size - rest.len();
    let intact = if json {
        Padding::Json.matches(rest)
    } else {
        filler(seq, offset, rest.len())
            .zip(rest.chunks(FILLER_CYCLE))
            .all(|(expected, got)| expected == got)
    };
    intact.then_some(EchoStamp { conn, seq, sent_ns })
}

/// A decimal number ended by a space at the start of `bytes`, and what
/// follows the space.
fn split_field(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let end = bytes.iter().position(|&b| b == b' ')?;
    Some((parse_decimal(&bytes[..end])?, &bytes[end + 1..]))
}

/// A decimal number of 1 to 19 digits; eight at a time where it can (the
/// client decodes millions of stamps a second, and their 14-digit times
/// took most of that byte by byte).
fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let (head, chunks) = digits.split_at(digits.len() % 8);
    let mut n = head.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0'))
    })?;
    for chunk in chunks.chunks_exact(8) {
        n = n * 100_000_000 + u64::from(eight_digits(chunk.try_into().expect("8 bytes"))?);
    }
    Some(n)
}

/// Eight ASCII digits as a number (SWAR, as in simdjson), or `None` if one
/// of them is not a digit.
fn eight_digits(chunk: [u8; 8]) -> Option<u32> {
    let x = u64::from_le_bytes(chunk);
    // Every byte is 0x30..=0x39: adding 0x46 sets no top bit, and
    // subtracting 0x30 borrows nothing.
    let all_digits = (x.wrapping_add(0x4646_4646_4646_4646)
        | x.wrapping_sub(0x3030_3030_3030_3030))
        & 0x8080_8080_8080_8080
        == 0;
    if !all_digits {
        return None;
    }
    let mut v = x - 0x3030_3030_3030_3030;
    // Pairs of digits, then fours, then all eight.
    v = v.wrapping_mul(10) + (v >> 8);
    let mask = 0x0000_00FF_0000_00FF;
    let mul1 = 100 + (1_000_000 << 32);
    let mul2 = 1 + (10_000 << 32);
    v = ((v & mask).wrapping_mul(mul1) + ((v >> 16) & mask).wrapping_mul(mul2)) >> 32;
    Some(v as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_parse_as_the_digit_by_digit_way_does() {
        let slow = |digits: &[u8]| -> Option<u64> {
            if digits.is_empty() || digits.len() > 19 {
                return None;
            }
            digits.iter().try_fold(0u64, |n, &d| {
                d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0'))
            })
        };
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for len in 1..=20 {
            for _ in 0..2000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let mut digits: Vec<u8> = (0..len)
                    .map(|i| b'0' + ((x >> (i % 60)) % 10) as u8)
                    .collect();
                assert_eq!(parse_decimal(&digits), slow(&digits), "{digits:?}");
                // One byte off: anything that is not a digit, at any place.
                let at = (x % len as u64) as usize;
                digits[at] = [b'/', b':', b' ', b'.', 0x80, 0xb0, b'a', 0][(x >> 5) as usize % 8];
                assert_eq!(parse_decimal(&digits), None, "{digits:?}");
            }
        }
        assert_eq!(
            parse_decimal(b"1234567890123456789"),
            Some(1_234_567_890_123_456_789)
        );
        assert_eq!(parse_decimal(b"00000000"), Some(0));
        assert_eq!(parse_decimal(b"99999999"), Some(99_999_999));
    }

    #[test]
    fn round_trip_at_32_bytes() {
        let stamp = Stamp {
            seq: 20,
            sent_ns: 1_234_567_890_123_456,
        };
        let line = encode(stamp, 32).unwrap();
        assert_eq!(line, b"20 1234567890123456 ............");
        assert_eq!(decode(&line, 32), Some(stamp));
    }

    #[test]
    fn json_padding_round_trips_past_one_order_book_and_catches_a_change() {
        let stamp = Stamp {
            seq: 3,
            sent_ns: 42,
        };
        let json = json_padding();
        assert!(json.starts_with(b"{\"type\":\"book\"") && !json.contains(&b'\n'));
        for size in [64, 1024, json.len() * 2 + 100] {
            let mut line = encode_padded(stamp, size, Padding::Json).unwrap();
            assert_eq!(line.len(), size);
            assert_eq!(decode_padded(&line, size, Padding::Json), Some(stamp));
            assert_eq!(decode_padded(&line, size, Padding::Dots), None);
            line[size - 1] ^= 1;
            assert_eq!(decode_padded(&line, size, Padding::Json), None);
        }
    }

    #[test]
    fn json_echo_payloads_round_trip_and_catch_a_changed_byte() {
        let stamp = EchoStamp {
            conn: 12,
            seq: 7,
            sent_ns: 99,
        };
        let mut payload = Vec::new();
        assert!(encode_echo(stamp, 1024, true, &mut payload));
        assert_eq!(payload.len(), 1024);
        assert_eq!(decode_echo(&payload, 1024, true), Some(stamp));
        assert_eq!(decode_echo(&payload, 1024, false), None);
        payload[500] ^= 1;
        assert_eq!(decode_echo(&payload, 1024, true), None);
    }

    #[test]
    fn exact_fit_and_too_small() {
        let stamp = Stamp {
            seq: 1,
            sent_ns: 99,
        };
        assert_eq!(encode(stamp, 5).unwrap(), b"1 99 ");
        assert_eq!(decode(b"1 99 ", 5), Some(stamp));
        assert_eq!(encode(stamp, 4), None);
    }

    #[test]
    fn echo_payloads_round_trip_and_catch_any_changed_byte() {
        let stamp = EchoStamp {
            conn: 999_999,
            seq: 12_345,
            sent_ns: 81_234_567_890_123,
        };
        let mut payload = Vec::new();
        assert!(encode_echo(stamp, 1024, false, &mut payload));
        assert_eq!(payload.len(), 1024);
        assert!(payload.starts_with(b"999999 12345 81234567890123 "));
        assert_eq!(decode_echo(&payload, 1024, false), Some(stamp));
        // A changed digit names another connection, sequence number or
        // time (the receiver compares them); any other change is refused.
        for i in [0, 7, 13, 27, 28, 500, 1023] {
            let mut bad = payload.clone();
            bad[i] ^= 1;
            assert_ne!(decode_echo(&bad, 1024, false), Some(stamp), "byte {i}");
        }
        for i in [6, 27, 28, 500, 1023] {
            let mut bad = payload.clone();
            bad[i] ^= 1;
            assert_eq!(decode_echo(&bad, 1024, false), None, "byte {i}");
        }
        assert_eq!(decode_echo(&payload[..1023], 1024, false), None);
        let next = EchoStamp {
            seq: 12_346,
            ..stamp
        };
        let mut other = Vec::new();
        encode_echo(next, 1024, false, &mut other);
        assert_ne!(
            other[100], payload[100],
            "the filler depends on the sequence number"
        );
        assert!(!encode_echo(stamp, 20, false, &mut other));
    }

    #[test]
    fn the_filler_is_the_alphabet_shifted_by_the_sequence_number() {
        for (seq, start, len) in [
            (0, 0, 0),
            (0, 5, 1),
            (3, 27, 26),
            (25, 1, 100),
            (u64::MAX, 30, 61),
        ] {
            let pieces: Vec<u8> = filler(seq, start, len).flatten().copied().collect();
            let bytewise: Vec<u8> = (start..start + len)
                .map(|i| b'a' + ((u128::from(seq) + i as u128) % 26) as u8)
                .collect();
            assert_eq!(pieces, bytewise, "seq {seq}, from {start}, {len} bytes");
        }
    }

    #[test]
    fn corrupt_payloads() {
        assert_eq!(decode(b"1 99 ...", 9), None, "wrong length");
        assert_eq!(decode(b"1 9x ...", 8), None, "bad digit");
        assert_eq!(decode(b"1 99 .x.", 8), None, "bad padding");
        assert_eq!(decode(b" 99 ....", 8), None, "empty field");
        assert_eq!(decode(b"1 99....", 8), None, "missing separator");
        assert_eq!(decode(b"99999999999 1 ..", 16), None, "seq overflow");
    }
}

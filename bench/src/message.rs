//! The broadcast message: one stdin line that names its place in the run
//! and the moment it was sent, so every receiver can check order and
//! measure latency on its own.
//!
//! Format: `<seq> <sent_ns> ` followed by `.` padding up to the payload
//! size, e.g. `7 81234567890123 ........` for 32 bytes. `sent_ns` is
//! [`crate::sys::now_ns`] (CLOCK_MONOTONIC), shared by all processes.

/// What a receiver learns from a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Sequence number, from 1.
    pub seq: u32,
    /// Monotonic time at which the line was written to the server.
    pub sent_ns: u64,
}

/// The message for `stamp`, padded to `size` bytes; `None` if the stamp
/// alone (with its trailing space) does not fit in `size` bytes.
pub fn encode(stamp: Stamp, size: usize) -> Option<Vec<u8>> {
    let mut line = format!("{} {} ", stamp.seq, stamp.sent_ns).into_bytes();
    if line.len() > size {
        return None;
    }
    line.resize(size, b'.');
    Some(line)
}

/// Reads the stamp from a received payload of the expected `size`;
/// `None` if the payload is corrupt.
pub fn decode(payload: &[u8], size: usize) -> Option<Stamp> {
    if payload.len() != size {
        return None;
    }
    let mut fields = payload.splitn(3, |&b| b == b' ');
    let seq = parse_decimal(fields.next()?)?;
    let sent_ns = parse_decimal(fields.next()?)?;
    let padding = fields.next()?;
    if !padding.iter().all(|&b| b == b'.') {
        return None;
    }
    Some(Stamp {
        seq: u32::try_from(seq).ok()?,
        sent_ns,
    })
}

fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn corrupt_payloads() {
        assert_eq!(decode(b"1 99 ...", 9), None, "wrong length");
        assert_eq!(decode(b"1 9x ...", 8), None, "bad digit");
        assert_eq!(decode(b"1 99 .x.", 8), None, "bad padding");
        assert_eq!(decode(b" 99 ....", 8), None, "empty field");
        assert_eq!(decode(b"1 99....", 8), None, "missing separator");
        assert_eq!(decode(b"99999999999 1 ..", 16), None, "seq overflow");
    }
}

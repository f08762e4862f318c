//! Positions: where a message stands among the messages of its source,
//! and the status messages a client that asks for positions is told.
//!
//! A position is printed `EPOCH.SEQ`: the epoch as 16 lowercase hex
//! digits, a dot, and the sequence number in decimal (at most 37 bytes).
//! Within one epoch, a later message has a larger sequence number; the
//! numbers need not be consecutive. A new epoch begins whenever what came
//! before it cannot be known (a start with no history kept), so a
//! position of another epoch says nothing about what its holder missed.
//!
//! A position begins with a hex digit; a status message is a JSON object,
//! so it begins with `{`, which no position does.

use std::fmt;

/// The longest position printed: 16 + 1 + 20 bytes.
pub const MAX_LEN: usize = 37;

/// Which history a position belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Epoch(pub u64);

impl Epoch {
    /// Parses 16 lowercase hex digits.
    pub fn parse(text: &[u8]) -> Option<Epoch> {
        if text.len() != 16 || !text.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        u64::from_str_radix(std::str::from_utf8(text).ok()?, 16)
            .ok()
            .map(Epoch)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A message's position: its epoch and its sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Position {
    /// The history it belongs to.
    pub epoch: Epoch,
    /// Its place in that history.
    pub seq: u64,
}

impl Position {
    /// Parses the printed form, exactly: 16 lowercase hex digits, a dot,
    /// and a decimal number without leading zeros that fits 64 bits.
    /// Anything else (another spelling of the same position too) is `None`.
    pub fn parse(text: &[u8]) -> Option<Position> {
        if text.len() > MAX_LEN || text.len() < 18 || text[16] != b'.' {
            return None;
        }
        let epoch = Epoch::parse(&text[..16])?;
        let digits = &text[17..];
        if !digits.iter().all(u8::is_ascii_digit) || (digits.len() > 1 && digits[0] == b'0') {
            return None;
        }
        let seq = std::str::from_utf8(digits).ok()?.parse().ok()?;
        Some(Position { epoch, seq })
    }

    /// Writes the printed form into `out`; returns its length.
    pub fn write(&self, out: &mut [u8; MAX_LEN]) -> usize {
        use std::io::Write;
        let mut cursor = std::io::Cursor::new(&mut out[..]);
        write!(cursor, "{self}").expect("a position fits in MAX_LEN");
        cursor.position() as usize
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.epoch, self.seq)
    }
}

/// What a client that asked for positions is told first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// It asked for positions without `since`: the position of the last
    /// message before its first, to resume from if nothing comes first.
    Position {
        /// The last position given out.
        current: Position,
    },
    /// Everything after its `since` follows.
    Recovered {
        /// The last position given out before its live messages.
        current: Position,
    },
    /// Messages are missing: every message positioned from `from` to
    /// `to`, both included, that was for this connection is lost to it
    /// (the history no longer held it, or never did), and every message
    /// that follows is positioned after `to`. Told first when the history
    /// does not reach back to `since`; told later, where the hole is, when
    /// a replay meets one.
    Gap {
        /// The first position missing: the one after the last the client
        /// had (which need not have been given out).
        from: Position,
        /// The last position missing.
        to: Position,
        /// The last position given out when it was told.
        current: Position,
    },
    /// Its `since` is of another epoch, not a position, or one never
    /// given out (past the newest, where this server alone gives out its
    /// epoch's positions): nothing is replayed, and live messages follow.
    Unknown {
        /// The last position given out.
        current: Position,
    },
}

impl Status {
    /// The name under `/metrics`' `result` label (and in the message).
    pub fn name(&self) -> &'static str {
        match self {
            Status::Position { .. } => "position",
            Status::Recovered { .. } => "recovered",
            Status::Gap { .. } => "gap",
            Status::Unknown { .. } => "unknown",
        }
    }

    /// The status message: one JSON object, e.g.
    /// `{"status":"gap","from":"…","to":"…","position":"…"}`.
    pub fn message(&self) -> String {
        match self {
            Status::Position { current }
            | Status::Recovered { current }
            | Status::Unknown { current } => {
                format!(r#"{{"status":"{}","position":"{current}"}}"#, self.name())
            }
            Status::Gap { from, to, current } => {
                format!(r#"{{"status":"gap","from":"{from}","to":"{to}","position":"{current}"}}"#)
            }
        }
    }
}

/// The hint a client with positions is told just before a drain closes
/// its connection (1012): `{"status":"reconnect","delay_ms":N}`, reconnect
/// (resuming) after N milliseconds. A status message like the others, so
/// it begins with `{`.
pub fn reconnect_hint(delay: std::time::Duration) -> String {
    format!(
        r#"{{"status":"reconnect","delay_ms":{}}}"#,
        delay.as_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPOCH: Epoch = Epoch(0x00c0_ffee_1234_abcd);

    #[test]
    fn positions_print_and_parse_back_exactly() {
        for seq in [0, 1, 42, u64::MAX] {
            let position = Position { epoch: EPOCH, seq };
            let mut out = [0u8; MAX_LEN];
            let len = position.write(&mut out);
            assert_eq!(&out[..len], position.to_string().as_bytes());
            assert_eq!(Position::parse(&out[..len]), Some(position));
        }
        let longest = Position {
            epoch: Epoch(u64::MAX),
            seq: u64::MAX,
        };
        assert_eq!(longest.to_string().len(), MAX_LEN);
        assert_eq!(
            Position {
                epoch: EPOCH,
                seq: 7
            }
            .to_string(),
            "00c0ffee1234abcd.7"
        );
    }

    #[test]
    fn anything_but_the_exact_printed_form_is_not_a_position() {
        for bad in [
            &b""[..],
            b"00c0ffee1234abcd",
            b"00c0ffee1234abcd.",
            b"00c0ffee1234abcd.07",
            b"00c0ffee1234abcd.-1",
            b"00c0ffee1234abcd.+1",
            b"00c0ffee1234abcd.1 ",
            b"00C0FFEE1234ABCD.1",
            b"0c0ffee1234abcd.1",
            b"00c0ffee1234abcde.1",
            b"00c0ffee1234abcd:1",
            b"00c0ffee1234abcd.18446744073709551616",
            b"00c0ffee1234abcd.184467440737095516150",
            b"\xff\xfe\x00",
            b"{\"status\":\"gap\"}",
        ] {
            assert_eq!(
                Position::parse(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn status_messages_begin_with_a_byte_no_position_begins_with() {
        let current = Position {
            epoch: EPOCH,
            seq: 9,
        };
        let from = Position {
            epoch: EPOCH,
            seq: 4,
        };
        let to = Position {
            epoch: EPOCH,
            seq: 6,
        };
        for status in [
            Status::Position { current },
            Status::Recovered { current },
            Status::Gap { from, to, current },
            Status::Unknown { current },
        ] {
            let message = status.message();
            assert!(message.starts_with('{') && message.ends_with('}'));
            assert!(message.contains(&format!(r#""status":"{}""#, status.name())));
            assert!(message.contains(r#""position":"00c0ffee1234abcd.9""#));
        }
        assert_eq!(
            Status::Gap { from, to, current }.message(),
            r#"{"status":"gap","from":"00c0ffee1234abcd.4","to":"00c0ffee1234abcd.6","position":"00c0ffee1234abcd.9"}"#
        );
    }

    #[test]
    fn the_reconnect_hint_is_a_status_with_its_delay_in_milliseconds() {
        let hint = reconnect_hint(std::time::Duration::from_micros(731_999));
        assert_eq!(hint, r#"{"status":"reconnect","delay_ms":731}"#);
        assert_eq!(Position::parse(hint.as_bytes()), None);
    }

    #[test]
    fn an_epoch_prints_as_it_parses() {
        let epoch = Epoch(0x00c0_ffee_1234_abcd);
        assert_eq!(epoch.to_string(), "00c0ffee1234abcd");
        assert_eq!(Epoch::parse(epoch.to_string().as_bytes()), Some(epoch));
        assert_eq!(Epoch::parse(b"00C0FFEE1234ABCD"), None);
    }
}

//! Opcodes and close codes (RFC 6455 §5.2, §7.4): small value types, no I/O.

/// A frame opcode (RFC 6455 §5.2, `%x0`–`%xF`); the reserved values are not representable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpCode {
    /// `%x0`: continues a fragmented data message.
    Continuation,
    /// `%x1`: first frame of a text message.
    Text,
    /// `%x2`: first frame of a binary message.
    Binary,
    /// `%x8`: connection close.
    Close,
    /// `%x9`: ping.
    Ping,
    /// `%xA`: pong.
    Pong,
}

impl OpCode {
    /// Decodes the 4-bit opcode field; `None` for the reserved values
    /// `%x3`–`%x7` and `%xB`–`%xF`.
    pub fn from_bits(bits: u8) -> Option<OpCode> {
        match bits {
            0x0 => Some(OpCode::Continuation),
            0x1 => Some(OpCode::Text),
            0x2 => Some(OpCode::Binary),
            0x8 => Some(OpCode::Close),
            0x9 => Some(OpCode::Ping),
            0xA => Some(OpCode::Pong),
            _ => None,
        }
    }

    /// The 4-bit wire value.
    pub fn bits(self) -> u8 {
        match self {
            OpCode::Continuation => 0x0,
            OpCode::Text => 0x1,
            OpCode::Binary => 0x2,
            OpCode::Close => 0x8,
            OpCode::Ping => 0x9,
            OpCode::Pong => 0xA,
        }
    }

    /// Control frames (close, ping, pong) have the high opcode bit set.
    pub fn is_control(self) -> bool {
        self.bits() & 0x8 != 0
    }
}

/// The kind of a data message, fixed by its first frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    /// UTF-8 text.
    Text,
    /// Arbitrary bytes.
    Binary,
}

impl MessageKind {
    /// The opcode that starts a message of this kind.
    pub(crate) fn opcode(self) -> OpCode {
        match self {
            MessageKind::Text => OpCode::Text,
            MessageKind::Binary => OpCode::Binary,
        }
    }
}

/// A close status code (RFC 6455 §7.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CloseCode(pub u16);

impl CloseCode {
    /// 1000: normal closure.
    pub const NORMAL: CloseCode = CloseCode(1000);
    /// 1001: the endpoint is going away (server shutdown).
    pub const GOING_AWAY: CloseCode = CloseCode(1001);
    /// 1002: protocol error.
    pub const PROTOCOL_ERROR: CloseCode = CloseCode(1002);
    /// 1003: a data type the endpoint cannot accept.
    pub const UNSUPPORTED_DATA: CloseCode = CloseCode(1003);
    /// 1007: payload inconsistent with its type (invalid UTF-8 in a text message).
    pub const INVALID_PAYLOAD: CloseCode = CloseCode(1007);
    /// 1008: policy violation (used for slow consumers).
    pub const POLICY_VIOLATION: CloseCode = CloseCode(1008);
    /// 1009: message too big to process.
    pub const MESSAGE_TOO_BIG: CloseCode = CloseCode(1009);
    /// 1011: unexpected condition on the server.
    pub const INTERNAL_ERROR: CloseCode = CloseCode(1011);
    /// 1012: the service is restarting; reconnect (IANA's registry, after
    /// RFC 6455).
    pub const SERVICE_RESTART: CloseCode = CloseCode(1012);
    /// 1013: try again later (IANA's registry, after RFC 6455): the
    /// client came with a position this server has not reached in time.
    pub const TRY_AGAIN_LATER: CloseCode = CloseCode(1013);
    /// 4001 (private use, wspush's): the connection's signed token
    /// expired; reconnect with a new one.
    pub const TOKEN_EXPIRED: CloseCode = CloseCode(4001);

    /// Whether a peer may send this code in a close frame: 1000–1003,
    /// 1007–1011 (RFC 6455 §7.4.1), 1012–1014 (registered with IANA since:
    /// a client answering this server's 1012 or 1013 echoes it, as
    /// tungstenite and browsers do) and the application/private range
    /// 3000–4999. Everything else (below 1000, 1004–1006, 1015–2999, 5000
    /// and above) is a protocol error when received (§7.4.2).
    pub fn is_valid_on_wire(self) -> bool {
        matches!(self.0, 1000..=1003 | 1007..=1014 | 3000..=4999)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_round_trips_and_rejects_reserved_values() {
        for bits in 0u8..16 {
            match OpCode::from_bits(bits) {
                Some(op) => assert_eq!(op.bits(), bits),
                None => assert!(matches!(bits, 0x3..=0x7 | 0xB..=0xF), "{bits:#x}"),
            }
        }
        assert!(OpCode::Ping.is_control() && OpCode::Close.is_control());
        assert!(!OpCode::Text.is_control() && !OpCode::Continuation.is_control());
    }

    #[test]
    fn close_code_validity_follows_rfc_ranges() {
        let valid = [
            1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999,
            4000, 4999,
        ];
        let invalid = [
            0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535,
        ];
        for code in valid {
            assert!(CloseCode(code).is_valid_on_wire(), "{code}");
        }
        for code in invalid {
            assert!(!CloseCode(code).is_valid_on_wire(), "{code}");
        }
    }
}

//! The frame header (RFC 6455 §5.2): parse from borrowed bytes, encode into a
//! caller's buffer. No I/O and no allocation.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-------+-+-------------+-------------------------------+
//! |F|R|R|R| opcode|M| Payload len |    Extended payload length    |
//! |I|S|S|S|  (4)  |A|     (7)     |             (16/64)           |
//! |N|V|V|V|       |S|             |   (if payload len==126/127)   |
//! | |1|2|3|       |K|             |                               |
//! +-+-+-+-+-------+-+-------------+ - - - - - - - - - - - - - - - +
//! |     Extended payload length continued, if payload len == 127  |
//! + - - - - - - - - - - - - - - - +-------------------------------+
//! |                               |Masking-key, if MASK set to 1  |
//! +-------------------------------+-------------------------------+
//! ```

use super::codes::OpCode;

/// The longest possible header: 2 + 8 (64-bit length) + 4 (masking key).
pub const MAX_HEADER_LEN: usize = 14;

/// RSV1 in [`FrameHeader::rsv`]: permessage-deflate's "compressed" bit
/// (RFC 7692 §6).
pub const RSV1: u8 = 0b100;

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// FIN: this is the final fragment of a message.
    pub fin: bool,
    /// RSV1–RSV3 as the low three bits; non-zero only with a negotiated extension.
    pub rsv: u8,
    /// The opcode; reserved opcodes are rejected while parsing.
    pub opcode: OpCode,
    /// The masking key, present on every client-to-server frame.
    pub mask: Option<[u8; 4]>,
    /// Payload length in bytes.
    pub payload_len: u64,
}

/// What [`FrameHeader::parse`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderStatus {
    /// Not enough bytes yet; nothing was consumed.
    Partial,
    /// A whole header of this many bytes.
    Complete(FrameHeader, usize),
}

/// A header no extension could make valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// The opcode field holds a reserved value.
    ReservedOpcode(u8),
    /// A 64-bit payload length with its most significant bit set (§5.2).
    LengthOverflow,
}

impl FrameHeader {
    /// Parses a header from the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<HeaderStatus, HeaderError> {
        let [b0, b1, ..] = *buf else {
            return Ok(HeaderStatus::Partial);
        };
        let opcode = OpCode::from_bits(b0 & 0x0F).ok_or(HeaderError::ReservedOpcode(b0 & 0x0F))?;
        let masked = b1 & 0x80 != 0;
        let (extended_len, mut pos) = match b1 & 0x7F {
            126 => (2, 2),
            127 => (8, 2),
            _ => (0, 2),
        };
        let needed = pos + extended_len + if masked { 4 } else { 0 };
        if buf.len() < needed {
            return Ok(HeaderStatus::Partial);
        }
        let payload_len = match extended_len {
            0 => u64::from(b1 & 0x7F),
            2 => u64::from(u16::from_be_bytes([buf[2], buf[3]])),
            _ => {
                let mut be = [0u8; 8];
                be.copy_from_slice(&buf[2..10]);
                let len = u64::from_be_bytes(be);
                if len >> 63 != 0 {
                    return Err(HeaderError::LengthOverflow);
                }
                len
            }
        };
        pos += extended_len;
        let mask = masked.then(|| [buf[pos], buf[pos + 1], buf[pos + 2], buf[pos + 3]]);
        let header = FrameHeader {
            fin: b0 & 0x80 != 0,
            rsv: (b0 >> 4) & 0x07,
            opcode,
            mask,
            payload_len,
        };
        Ok(HeaderStatus::Complete(header, needed))
    }

    /// Writes the header into `out` using the shortest length encoding and
    /// returns the number of bytes written (at most [`MAX_HEADER_LEN`]).
    pub fn encode(&self, out: &mut [u8; MAX_HEADER_LEN]) -> usize {
        out[0] = (u8::from(self.fin) << 7) | ((self.rsv & 0x07) << 4) | self.opcode.bits();
        let mask_bit = if self.mask.is_some() { 0x80 } else { 0 };
        let mut pos = 2;
        match self.payload_len {
            len @ 0..=125 => out[1] = mask_bit | len as u8,
            len @ 126..=0xFFFF => {
                out[1] = mask_bit | 126;
                out[2..4].copy_from_slice(&(len as u16).to_be_bytes());
                pos = 4;
            }
            len => {
                out[1] = mask_bit | 127;
                out[2..10].copy_from_slice(&len.to_be_bytes());
                pos = 10;
            }
        }
        if let Some(key) = self.mask {
            out[pos..pos + 4].copy_from_slice(&key);
            pos += 4;
        }
        pos
    }

    /// The header of an unmasked, final server frame.
    pub fn server(opcode: OpCode, payload_len: u64) -> FrameHeader {
        FrameHeader {
            fin: true,
            rsv: 0,
            opcode,
            mask: None,
            payload_len,
        }
    }

    /// [`FrameHeader::server`] of a message whose payload is compressed
    /// (permessage-deflate: RSV1 set) if `compressed`.
    pub fn server_message(opcode: OpCode, payload_len: u64, compressed: bool) -> FrameHeader {
        FrameHeader {
            rsv: if compressed { RSV1 } else { 0 },
            ..FrameHeader::server(opcode, payload_len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(opcode: OpCode, len: u64, mask: Option<[u8; 4]>) -> FrameHeader {
        FrameHeader {
            fin: true,
            rsv: 0,
            opcode,
            mask,
            payload_len: len,
        }
    }

    /// Every header is Partial at every strict prefix and Complete with the
    /// right length when whole, with or without trailing payload bytes.
    #[test]
    fn round_trip_at_every_split_point() {
        let key = Some([1, 2, 3, 4]);
        let cases = [
            header(OpCode::Text, 0, None),
            header(OpCode::Binary, 125, key),
            header(OpCode::Text, 126, key),
            header(OpCode::Binary, 0xFFFF, None),
            header(OpCode::Binary, 0x1_0000, key),
            header(OpCode::Ping, 5, key),
            FrameHeader {
                fin: false,
                rsv: 0b101,
                opcode: OpCode::Continuation,
                mask: key,
                payload_len: (1 << 63) - 1,
            },
        ];
        for expected in cases {
            let mut buf = [0u8; MAX_HEADER_LEN];
            let len = expected.encode(&mut buf);
            for cut in 0..len {
                assert_eq!(
                    FrameHeader::parse(&buf[..cut]),
                    Ok(HeaderStatus::Partial),
                    "{expected:?} cut {cut}"
                );
            }
            let mut with_payload = buf[..len].to_vec();
            with_payload.extend_from_slice(b"payload");
            for input in [&buf[..len], &with_payload[..]] {
                assert_eq!(
                    FrameHeader::parse(input),
                    Ok(HeaderStatus::Complete(expected, len))
                );
            }
        }
    }

    #[test]
    fn uses_the_shortest_length_encoding() {
        let mut buf = [0u8; MAX_HEADER_LEN];
        for (len, header_len) in [(0, 2), (125, 2), (126, 4), (65535, 4), (65536, 10)] {
            assert_eq!(
                FrameHeader::server(OpCode::Binary, len).encode(&mut buf),
                header_len,
                "{len}"
            );
        }
        assert_eq!(&buf[..2], &[0x82, 127]);
    }

    #[test]
    fn rejects_reserved_opcodes_and_oversized_lengths() {
        for bits in [0x3, 0x7, 0xB, 0xF] {
            assert_eq!(
                FrameHeader::parse(&[0x80 | bits, 0x80]),
                Err(HeaderError::ReservedOpcode(bits))
            );
        }
        let mut huge = vec![0x82, 0xFF];
        huge.extend_from_slice(&(1u64 << 63).to_be_bytes());
        huge.extend_from_slice(&[0; 4]);
        assert_eq!(FrameHeader::parse(&huge), Err(HeaderError::LengthOverflow));
    }
}

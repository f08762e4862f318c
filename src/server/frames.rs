//! Frames encoded once into one shared buffer: a broadcast (or a batch of
//! them, back to back) is encoded here once and the same bytes are queued
//! by reference on every connection that gets them. A batch with
//! compressed messages carries a second buffer beside it, for the
//! connections that negotiated permessage-deflate: the same frames, those
//! compressed with RSV1 set and their compressed payload.

use std::sync::Arc;

use crate::protocol::ws::header::MAX_HEADER_LEN;
use crate::protocol::ws::{FrameHeader, OpCode};

/// Whole frames encoded once, shared by every queue they are in (a thin
/// pointer, so a queued reference costs 8 bytes).
#[derive(Debug, Clone)]
pub struct SharedFrames(Arc<Frames>);

#[derive(Debug)]
struct Frames {
    /// How many frames `bytes` holds (1 for bytes of a connection's own).
    count: u32,
    bytes: Box<[u8]>,
    /// The same frames for connections that negotiated permessage-deflate,
    /// when some are compressed.
    deflated: Option<SharedFrames>,
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
        SharedFrames::encode_frames(frames.into_iter().map(|(op, p)| (op, p, false)), None)
    }

    /// Encodes a batch of messages, each with its compressed payload if it
    /// has one: the frames of the plain messages, and, if any is
    /// compressed, beside them the frames for connections that negotiated
    /// permessage-deflate.
    pub fn encode_batch<'a, I>(messages: I) -> SharedFrames
    where
        I: IntoIterator<Item = (OpCode, &'a [u8], Option<&'a [u8]>)>,
        I::IntoIter: Clone,
    {
        let messages = messages.into_iter();
        let deflated = messages.clone().any(|(_, _, d)| d.is_some()).then(|| {
            let frames = messages
                .clone()
                .map(|(opcode, plain, deflated)| match deflated {
                    Some(d) => (opcode, d, true),
                    None => (opcode, plain, false),
                });
            SharedFrames::encode_frames(frames, None)
        });
        SharedFrames::encode_frames(messages.map(|(op, p, _)| (op, p, false)), deflated)
    }

    /// Encodes `(opcode, payload, compressed)` frames back to back (RSV1
    /// set on the compressed ones).
    fn encode_frames<'a, I>(frames: I, deflated: Option<SharedFrames>) -> SharedFrames
    where
        I: Iterator<Item = (OpCode, &'a [u8], bool)> + Clone,
    {
        let size = frames.clone().map(|(_, p, _)| encoded_len(p.len())).sum();
        let mut bytes = Vec::with_capacity(size);
        let mut header = [0u8; MAX_HEADER_LEN];
        let mut count = 0u32;
        for (opcode, payload, compressed) in frames {
            let frame = FrameHeader::server_message(opcode, payload.len() as u64, compressed);
            let len = frame.encode(&mut header);
            bytes.extend_from_slice(&header[..len]);
            bytes.extend_from_slice(payload);
            count += 1;
        }
        debug_assert_eq!(bytes.len(), size);
        SharedFrames(Arc::new(Frames {
            count,
            bytes: bytes.into_boxed_slice(),
            deflated,
        }))
    }

    /// The frames a connection gets: the compressed ones if it negotiated
    /// permessage-deflate and there are any.
    pub fn for_connection(&self, deflate: bool) -> &SharedFrames {
        match &self.0.deflated {
            Some(deflated) if deflate => deflated,
            _ => self,
        }
    }

    /// Bytes already encoded (one frame, or the unwritten rest of one).
    pub fn from_parts(parts: &[&[u8]]) -> SharedFrames {
        SharedFrames(Arc::new(Frames {
            count: 1,
            bytes: parts.concat().into_boxed_slice(),
            deflated: None,
        }))
    }

    /// The encoded bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0.bytes
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
}

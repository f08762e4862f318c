//! permessage-deflate on the client side (RFC 7692, no context takeover
//! either way): compressing what a client sends, inflating what it
//! receives, and, for push clients, remembering each broadcast inflated.
//!
//! A server that compresses each broadcast once sends every connection
//! the same compressed bytes, so a push worker inflates each distinct
//! payload once ([`Inflating`]): a connection's check is then a lookup and
//! a comparison, not an inflation, and the client does not cost more than
//! the server it measures. A server that compressed per connection would
//! cost the client an inflation per delivery.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The tail a sync flush ends with, which permessage-deflate drops.
const SYNC_TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// Payloads remembered before the memory is cleared (a stream of 1 KB
/// messages: ~12 MB per worker at most).
const REMEMBERED: usize = 8192;

/// The level clients compress at: zlib's fastest, so that the client
/// costs little beside the server it measures.
const CLIENT_LEVEL: u32 = 1;

/// A client's compressor: each message compressed on its own.
pub struct Deflater(Compress);

impl Default for Deflater {
    fn default() -> Self {
        Deflater(Compress::new(Compression::new(CLIENT_LEVEL), false))
    }
}

impl Deflater {
    /// Appends `message` compressed as a permessage-deflate payload to `out`.
    pub fn deflate(&mut self, message: &[u8], out: &mut Vec<u8>) {
        self.0.reset();
        let start = out.len();
        out.reserve(message.len() + 64);
        self.0
            .compress_vec(message, out, FlushCompress::Sync)
            .expect("room reserved");
        assert!(
            out[start..].ends_with(&SYNC_TAIL),
            "one call compresses it all"
        );
        out.truncate(out.len() - SYNC_TAIL.len());
    }
}

/// A client's inflater: each message inflated on its own.
pub struct Inflater {
    inner: Decompress,
    /// The payload with its tail put back.
    data: Vec<u8>,
}

impl Default for Inflater {
    fn default() -> Self {
        Inflater {
            inner: Decompress::new(false),
            data: Vec::new(),
        }
    }
}

impl Inflater {
    /// Inflates a compressed message payload into `out` (cleared first);
    /// false if it is not valid DEFLATE data or inflates past `limit`.
    pub fn inflate(&mut self, compressed: &[u8], limit: usize, out: &mut Vec<u8>) -> bool {
        self.inner.reset(false);
        self.data.clear();
        self.data.extend_from_slice(compressed);
        self.data.extend_from_slice(&SYNC_TAIL);
        out.clear();
        // One byte of room past the limit shows a message that is too big.
        out.reserve(limit + 1);
        let status = self
            .inner
            .decompress_vec(&self.data, out, FlushDecompress::Sync);
        matches!(
            status,
            Ok(Status::Ok | Status::StreamEnd | Status::BufError)
        ) && out.len() <= limit
            && self.inner.total_in() as usize == self.data.len()
    }
}

/// A push worker's inflater and the payloads it has inflated.
#[derive(Default)]
pub struct Inflating {
    inflater: Inflater,
    /// Compressed payload → its plain bytes.
    known: HashMap<Box<[u8]>, Box<[u8]>, BuildHasherDefault<EdgeHasher>>,
    /// Payloads actually inflated (the rest were found in `known`).
    pub inflations: u64,
}

impl Inflating {
    /// The plain bytes of a compressed message payload; `None` if it is not
    /// valid DEFLATE data or inflates past `limit`.
    pub fn plain(&mut self, compressed: &[u8], limit: usize) -> Option<&[u8]> {
        if !self.known.contains_key(compressed) {
            self.inflations += 1;
            let mut plain = Vec::new();
            if !self.inflater.inflate(compressed, limit, &mut plain) {
                return None;
            }
            if self.known.len() >= REMEMBERED {
                self.known.clear();
            }
            self.known.insert(compressed.into(), plain.into());
        }
        self.known.get(compressed).map(|p| &p[..])
    }
}

/// Hashes a payload by its length and its first and last 16 bytes: the
/// payloads of different messages differ there (the stamp leads each
/// message), and hashing 500 bytes per delivery would cost more than the
/// comparison that confirms a match.
#[derive(Default)]
pub struct EdgeHasher(u64);

impl EdgeHasher {
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for EdgeHasher {
    fn write(&mut self, bytes: &[u8]) {
        let edge = |part: &[u8]| {
            let mut word = [0u8; 16];
            word[..part.len()].copy_from_slice(part);
            u128::from_le_bytes(word)
        };
        let head = edge(&bytes[..bytes.len().min(16)]);
        let tail = edge(&bytes[bytes.len().saturating_sub(16)..]);
        for word in [head, head >> 64, tail, tail >> 64] {
            self.mix(word as u64);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compressed(message: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        Deflater::default().deflate(message, &mut out);
        out
    }

    #[test]
    fn each_distinct_payload_is_inflated_once() {
        let mut inflating = Inflating::default();
        let one = compressed(&b"1 2 ".repeat(100));
        let two = compressed(&b"3 4 ".repeat(100));
        for _ in 0..3 {
            assert_eq!(inflating.plain(&one, 1000).unwrap(), b"1 2 ".repeat(100));
            assert_eq!(inflating.plain(&two, 1000).unwrap(), b"3 4 ".repeat(100));
        }
        assert_eq!(inflating.inflations, 2);
    }

    #[test]
    fn corrupt_or_too_big_payloads_are_refused() {
        let mut inflating = Inflating::default();
        assert_eq!(inflating.plain(&[0xff, 0xff, 0xff], 1000), None);
        let big = compressed(&[7; 2000]);
        assert_eq!(inflating.plain(&big, 1999), None);
        assert_eq!(inflating.plain(&big, 2000).unwrap(), &[7; 2000][..]);
    }
}

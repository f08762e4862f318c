//! Compressing a message for permessage-deflate (RFC 7692 §7.2.1): raw
//! DEFLATE with a fresh window (the server answers every offer with
//! `server_no_context_takeover`, so a compressed message depends on no
//! other and one copy serves every connection), a sync flush, and the
//! flush's 4-byte tail dropped.
//!
//! Each thread keeps one compressor (zlib-rs, level 6), reset per message:
//! broadcasts are compressed where they are queued, by the publisher's
//! thread, not by the loop.

use std::cell::RefCell;

use flate2::{Compress, Compression, FlushCompress};

use super::inflate::SYNC_TAIL;

/// The compression level: zlib's default, the best ratio per CPU second
/// on JSON feeds (bench/RESULTS.md).
pub const LEVEL: u32 = 6;

thread_local! {
    static COMPRESSOR: RefCell<Compress> = RefCell::new(Compress::new(Compression::new(LEVEL), false));
}

/// `message` compressed as a permessage-deflate payload.
pub fn deflate_message(message: &[u8]) -> Box<[u8]> {
    let mut out = Vec::with_capacity(message.len() / 2 + 64);
    deflate_into(message, &mut out);
    out.into_boxed_slice()
}

/// `message` compressed as a permessage-deflate payload into `out`
/// (cleared first; its capacity is kept and grown as needed).
pub fn deflate_into(message: &[u8], out: &mut Vec<u8>) {
    out.clear();
    COMPRESSOR.with_borrow_mut(|c| {
        c.reset();
        loop {
            let from = c.total_in() as usize;
            c.compress_vec(&message[from..], out, FlushCompress::Sync)
                .expect("compressing into a growing buffer cannot fail");
            // Done once every byte is in and the flush's tail is out, with
            // room to spare (a full buffer may hold only part of the flush).
            let room = out.len() < out.capacity();
            if c.total_in() as usize == message.len() && room && out.ends_with(&SYNC_TAIL) {
                break;
            }
            out.reserve(out.capacity().max(64));
        }
        out.truncate(out.len() - SYNC_TAIL.len());
    });
}

#[cfg(test)]
mod tests {
    use super::super::inflate::Inflater;
    use super::*;

    #[test]
    fn messages_inflate_back_each_on_its_own() {
        let (mut inflater, mut out) = (Inflater::default(), Vec::new());
        let big: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        for message in [&b"{\"price\":1.0842}"[..], b"", &big, &[0u8; 70_000]] {
            let payload = deflate_message(message);
            inflater.inflate(&payload, 1 << 22, &mut out).unwrap();
            assert_eq!(out, message);
        }
        let json = "{\"symbol\":\"EURUSD\",\"bid\":1.0842,\"ask\":1.0843}".repeat(20);
        assert!(deflate_message(json.as_bytes()).len() < json.len() / 5);
    }
}

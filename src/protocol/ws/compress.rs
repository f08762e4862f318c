//! Compressing a message for permessage-deflate (RFC 7692 §7.2.1): raw
//! DEFLATE with a fresh window (the server answers every offer with
//! `server_no_context_takeover`, so a compressed message depends on no
//! other and one copy serves every connection), a sync flush, and the
//! flush's 4-byte tail dropped.
//!
//! Each thread keeps a compressor (zlib-rs) per [`Level`], reset per
//! message: broadcasts are compressed where they are queued, by the
//! publisher's thread, not by the loop; echoes by the loop.

use std::cell::RefCell;

use flate2::{Compress, Compression, FlushCompress};

use super::inflate::SYNC_TAIL;

/// How hard a message is compressed: by who gets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// A broadcast, compressed once for every connection that gets it:
    /// zlib's default level 6, the best ratio per CPU second on JSON feeds
    /// (bench/RESULTS.md), its cost shared by all of them.
    Shared,
    /// A message for one connection (an echo), compressed per connection:
    /// level 1, the fastest (gorilla/websocket's default too).
    Single,
}

impl Level {
    /// The zlib level.
    pub fn zlib(self) -> u32 {
        match self {
            Level::Shared => 6,
            Level::Single => 1,
        }
    }
}

thread_local! {
    static SHARED: RefCell<Compress> = RefCell::new(compressor(Level::Shared));
    static SINGLE: RefCell<Compress> = RefCell::new(compressor(Level::Single));
}

fn compressor(level: Level) -> Compress {
    Compress::new(Compression::new(level.zlib()), false)
}

/// A broadcast compressed as a permessage-deflate payload ([`Level::Shared`]).
pub fn deflate_message(message: &[u8]) -> Box<[u8]> {
    let mut out = Vec::with_capacity(message.len() / 2 + 64);
    deflate_into(message, Level::Shared, &mut out);
    out.into_boxed_slice()
}

/// `message` compressed at `level` as a permessage-deflate payload into
/// `out` (cleared first; its capacity is kept and grown as needed).
pub fn deflate_into(message: &[u8], level: Level, out: &mut Vec<u8>) {
    out.clear();
    let compressor = match level {
        Level::Shared => &SHARED,
        Level::Single => &SINGLE,
    };
    compressor.with_borrow_mut(|c| {
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
        let mut single = Vec::new();
        for message in [&b"{\"price\":1.0842}"[..], b"", &big, &[0u8; 70_000]] {
            let payload = deflate_message(message);
            inflater.inflate(&payload, 1 << 22, &mut out).unwrap();
            assert_eq!(out, message);
            deflate_into(message, Level::Single, &mut single);
            inflater.inflate(&single, 1 << 22, &mut out).unwrap();
            assert_eq!(out, message);
        }
        let json = "{\"symbol\":\"EURUSD\",\"bid\":1.0842,\"ask\":1.0843}".repeat(20);
        assert!(deflate_message(json.as_bytes()).len() < json.len() / 5);
    }
}

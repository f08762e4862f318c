//! permessage-deflate as a browser does it, written from RFC 7692 with
//! zlib (flate2) apart from the server's own code: the offer, and
//! messages compressed and inflated.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

use super::{raw, read_response};

/// RSV1: the message is compressed.
pub const RSV1: u8 = 0x40;

/// What a browser offers.
pub const BROWSER_OFFER: &str = "permessage-deflate; client_max_window_bits";

/// An upgraded raw client that offered `offer` (if any); the response's
/// `Sec-WebSocket-Extensions`, if it had one.
pub fn upgrade(addr: SocketAddr, offer: Option<&str>) -> (TcpStream, Option<String>) {
    let mut stream = raw(addr);
    let extensions = offer.map_or(String::new(), |o| {
        format!("Sec-WebSocket-Extensions: {o}\r\n")
    });
    let request = format!(
        "GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extensions}\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let response = read_response(&mut stream);
    assert_eq!(response.status, 101);
    let answer = response
        .header("Sec-WebSocket-Extensions")
        .map(String::from);
    (stream, answer)
}

/// `message` as a browser compresses it: raw DEFLATE, a sync flush, the
/// 4-byte tail dropped.
pub fn deflated(message: &[u8]) -> Vec<u8> {
    let mut c = Compress::new(Compression::default(), false);
    let mut out = Vec::with_capacity(message.len() / 2 + 64);
    while (c.total_in() as usize) < message.len() || out.is_empty() {
        out.reserve(64 * 1024);
        let from = c.total_in() as usize;
        c.compress_vec(&message[from..], &mut out, FlushCompress::Sync)
            .unwrap();
    }
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
    out.truncate(out.len() - 4);
    out
}

/// A compressed payload inflated as a browser does: the tail put back.
pub fn inflated(payload: &[u8]) -> Vec<u8> {
    let mut d = Decompress::new(false);
    let mut data = payload.to_vec();
    data.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut out = Vec::with_capacity(1 << 20);
    d.decompress_vec(&data, &mut out, FlushDecompress::Sync)
        .unwrap();
    assert_eq!(d.total_in() as usize, data.len(), "all of it inflated");
    out
}

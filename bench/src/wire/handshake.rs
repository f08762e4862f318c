//! The HTTP/1.1 upgrade that opens a WebSocket (RFC 6455 §4), both sides:
//! the client request and its check of the server's answer, and the
//! minimal server answer the floor gives.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use sha1::{Digest, Sha1};

/// The GUID that RFC 6455 §1.3 appends to the key before hashing.
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Most headers parsed from a request or response; real ones have under 16.
const MAX_HEADERS: usize = 32;

/// Why an upgrade failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeError {
    /// The head is not valid HTTP/1.x.
    Malformed,
    /// The head grew past the size limit without ending.
    TooLarge,
    /// The server answered with this status instead of 101.
    Status(u16),
    /// `Upgrade: websocket` or `Connection: Upgrade` is missing.
    NotUpgrade,
    /// The request had no `Sec-WebSocket-Key`.
    MissingKey,
    /// `Sec-WebSocket-Accept` is missing or does not match the key.
    BadAccept,
    /// permessage-deflate was offered and not agreed to (with
    /// `server_no_context_takeover`), or agreed to without an offer.
    Deflate,
    /// A `200` that should start an event stream is of another media type.
    NotEventStream,
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeError::Malformed => f.write_str("malformed HTTP head"),
            HandshakeError::TooLarge => f.write_str("HTTP head too large"),
            HandshakeError::Status(code) => write!(f, "HTTP status {code}"),
            HandshakeError::NotUpgrade => f.write_str("not an upgrade"),
            HandshakeError::MissingKey => f.write_str("no Sec-WebSocket-Key"),
            HandshakeError::BadAccept => f.write_str("wrong Sec-WebSocket-Accept"),
            HandshakeError::Deflate => f.write_str("permessage-deflate not agreed as offered"),
            HandshakeError::NotEventStream => f.write_str("not text/event-stream"),
        }
    }
}

impl std::error::Error for HandshakeError {}

/// Largest HTTP head either side accepts.
pub const MAX_HEAD: usize = 8192;

/// `Sec-WebSocket-Accept` for a `Sec-WebSocket-Key`.
pub fn accept_key(key: &[u8]) -> String {
    let mut sha = Sha1::new();
    sha.update(key);
    sha.update(GUID);
    BASE64.encode(sha.finalize())
}

/// A `Sec-WebSocket-Key` for connection `id`: 16 bytes, base64-encoded.
///
/// RFC 6455 asks for random bytes so that proxies can't be confused; there is
/// no proxy on loopback, and deriving the key from the id lets the client
/// check the server's answer without storing the key per connection.
pub fn client_key(id: u64) -> String {
    let mixed = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5753_5055_5348_4245;
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&id.to_be_bytes());
    bytes[8..].copy_from_slice(&mixed.to_be_bytes());
    BASE64.encode(bytes)
}

/// The permessage-deflate offer (RFC 7692) of a client that inflates every
/// message on its own: it asks the server to keep no context between
/// messages, and keeps none itself.
pub const DEFLATE_OFFER: &str =
    "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// The upgrade request a browser-like client sends for `GET path`, with
/// [`DEFLATE_OFFER`] if `deflate`.
pub fn client_request(host: &str, path: &str, key: &str, deflate: bool) -> Vec<u8> {
    let extensions = if deflate {
        format!("Sec-WebSocket-Extensions: {DEFLATE_OFFER}\r\n")
    } else {
        String::new()
    };
    format!(
        "GET {path} HTTP/1.1\r\n\
         Host: {host}\r\n\
         Upgrade: websocket\r\n\
         Connection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\n\
         Sec-WebSocket-Version: 13\r\n\
         {extensions}\
         \r\n"
    )
    .into_bytes()
}

/// Length of the HTTP head at the start of `buf` (through the blank line),
/// or `None` if the blank line has not arrived yet.
pub fn head_len(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Checks a server's complete response head for a valid 101 answer to
/// `key`, agreeing to [`DEFLATE_OFFER`] if `deflate` (and to no extension
/// otherwise).
pub fn check_response(head: &[u8], key: &str, deflate: bool) -> Result<(), HandshakeError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let headers = parse_answer(head, &mut headers, 101)?;
    if !has_token(headers, "upgrade", "websocket") || !has_token(headers, "connection", "upgrade") {
        return Err(HandshakeError::NotUpgrade);
    }
    match header(headers, "sec-websocket-accept") {
        Some(accept) if accept == accept_key(key.as_bytes()).as_bytes() => {}
        _ => return Err(HandshakeError::BadAccept),
    }
    match (deflate, header(headers, "sec-websocket-extensions")) {
        (false, None) => Ok(()),
        (true, Some(agreed)) if agrees_to_deflate(agreed) => Ok(()),
        _ => Err(HandshakeError::Deflate),
    }
}

/// Whether an answer's extensions are permessage-deflate alone, with
/// `server_no_context_takeover`.
fn agrees_to_deflate(agreed: &[u8]) -> bool {
    let mut parts = agreed.split(|&b| b == b';').map(<[u8]>::trim_ascii);
    parts.next() == Some(b"permessage-deflate".as_slice())
        && !agreed.contains(&b',')
        && parts.any(|p| p == b"server_no_context_takeover")
}

/// The headers of a complete response head whose status is `status`, or
/// why it is not one.
pub(crate) fn parse_answer<'h, 'b>(
    head: &'b [u8],
    headers: &'h mut [httparse::Header<'b>],
    status: u16,
) -> Result<&'h [httparse::Header<'b>], HandshakeError> {
    let mut response = httparse::Response::new(headers);
    match response.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(HandshakeError::Malformed),
    }
    match response.code {
        Some(code) if code == status => Ok(response.headers),
        Some(code) => Err(HandshakeError::Status(code)),
        None => Err(HandshakeError::Malformed),
    }
}

/// The 101 response for a complete request head, or why there is none.
///
/// Checks only what the answer needs (a parseable GET with a key); this is
/// the floor's deliberately minimal upgrade.
pub fn server_response(head: &[u8]) -> Result<Vec<u8>, HandshakeError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(HandshakeError::Malformed),
    }
    let key = header(request.headers, "sec-websocket-key").ok_or(HandshakeError::MissingKey)?;
    Ok(format!(
        "HTTP/1.1 101 Switching Protocols\r\n\
         Upgrade: websocket\r\n\
         Connection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n\
         \r\n",
        accept_key(key)
    )
    .into_bytes())
}

/// Value of the first header called `name` (ASCII case-insensitive).
pub(crate) fn header<'a>(headers: &[httparse::Header<'a>], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value.trim_ascii())
}

/// Whether header `name` lists `token` in its comma-separated value.
fn has_token(headers: &[httparse::Header<'_>], name: &str, token: &str) -> bool {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case(name))
        .flat_map(|h| h.value.split(|&b| b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_6455_accept_example() {
        assert_eq!(
            accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn client_keys_are_16_bytes_and_distinct() {
        let a = client_key(1);
        assert_eq!(BASE64.decode(&a).unwrap().len(), 16);
        assert_ne!(a, client_key(2));
    }

    #[test]
    fn floor_answers_what_the_client_accepts() {
        let key = client_key(42);
        let request = client_request("127.0.0.1:9000", "/ws?id=42", &key, false);
        let n = head_len(&request).unwrap();
        assert_eq!(n, request.len());
        let response = server_response(&request[..n]).unwrap();
        assert_eq!(head_len(&response), Some(response.len()));
        assert_eq!(check_response(&response, &key, false), Ok(()));
        assert_eq!(
            check_response(&response, &client_key(43), false),
            Err(HandshakeError::BadAccept)
        );
    }

    #[test]
    fn response_checks() {
        let key = client_key(7);
        let accept = accept_key(key.as_bytes());
        let ok = format!(
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: WebSocket\r\n\
             connection: keep-alive, Upgrade\r\nsec-websocket-accept:  {accept} \r\n\r\n"
        );
        assert_eq!(check_response(ok.as_bytes(), &key, false), Ok(()));
        let refused = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(
            check_response(refused, &key, false),
            Err(HandshakeError::Status(400))
        );
        let plain = format!("HTTP/1.1 101 OK\r\nSec-WebSocket-Accept: {accept}\r\n\r\n");
        assert_eq!(
            check_response(plain.as_bytes(), &key, false),
            Err(HandshakeError::NotUpgrade)
        );
        assert_eq!(
            check_response(b"garbage\r\n\r\n", &key, false),
            Err(HandshakeError::Malformed)
        );
    }

    #[test]
    fn a_deflate_offer_must_be_agreed_to_without_server_context_takeover() {
        let key = client_key(9);
        let request = String::from_utf8(client_request("h", "/", &key, true)).unwrap();
        assert!(request.contains(&format!(
            "\r\nSec-WebSocket-Extensions: {DEFLATE_OFFER}\r\n"
        )));
        let accept = accept_key(key.as_bytes());
        let answer = |extensions: &str| {
            format!(
                "HTTP/1.1 101 OK\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                 Sec-WebSocket-Accept: {accept}\r\n{extensions}\r\n"
            )
        };
        let agreed = answer(
            "Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; \
             client_no_context_takeover\r\n",
        );
        assert_eq!(check_response(agreed.as_bytes(), &key, true), Ok(()));
        assert_eq!(
            check_response(agreed.as_bytes(), &key, false),
            Err(HandshakeError::Deflate)
        );
        for refused in [
            answer(""),
            answer("Sec-WebSocket-Extensions: permessage-deflate\r\n"),
            answer("Sec-WebSocket-Extensions: x-other; server_no_context_takeover\r\n"),
        ] {
            assert_eq!(
                check_response(refused.as_bytes(), &key, true),
                Err(HandshakeError::Deflate),
                "{refused}"
            );
        }
    }

    #[test]
    fn request_without_key_is_refused() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(server_response(head), Err(HandshakeError::MissingKey));
    }

    #[test]
    fn head_length() {
        assert_eq!(head_len(b"HTTP/1.1 101\r\n\r\n\x81\x00"), Some(16));
        assert_eq!(head_len(b"HTTP/1.1 101\r\n\r"), None);
    }
}

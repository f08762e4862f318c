//! Server-Sent Events (the HTML standard's `text/event-stream`), without
//! I/O: which request asks for a stream, the response head, and the
//! bytes of each event, written once for every connection that gets it.
//!
//! - A text message is one event: its lines (split at CR, LF and CRLF, as
//!   the format splits them) each become a `data:` line, so the
//!   browser's `event.data` is the payload with its line ends as LF. The
//!   format cannot carry a CR: a payload's CR or CRLF arrives as LF.
//! - A binary message is an event named `binary` whose data is the
//!   payload in base64 (`onmessage` does not see it).
//! - A message with a position has it as the event's `id:`, so that an
//!   `EventSource` that reconnects sends it back as `Last-Event-ID`.
//! - A status (where a connection stands, a gap, a drain's hint) is an
//!   event named `status` with the JSON object as its data.
//! - A stream the server ends for a reason the client should act on (its
//!   token expired, a publisher closed it, the server is going) ends with
//!   a `closed` status naming the code a WebSocket would have had in its
//!   close frame: an `EventSource` cannot see why a stream ended.
//! - A heartbeat is a comment line (`:`), which no application sees.
//! - The first thing a stream sends is a `retry:` field, the delay an
//!   `EventSource` waits before it reconnects, with jitter given by the
//!   caller, so that a server's clients do not all come back at once.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

/// The media type of an event stream.
pub const MEDIA_TYPE: &str = "text/event-stream";

/// What a status event begins with: its data, one line of JSON, and a
/// blank line follow.
pub const STATUS_HEAD: &[u8] = b"event: status\ndata: ";

/// A heartbeat: a comment line and the blank line after it.
pub const HEARTBEAT: &[u8] = b":\n\n";

/// Whether an `Accept` header value lists the event stream's media type
/// (what `EventSource` sends: `text/event-stream`).
pub fn accepts_event_stream(accept: &[u8]) -> bool {
    accept.split(|&b| b == b',').any(|item| {
        let media = item.split(|&b| b == b';').next().unwrap_or_default();
        media
            .trim_ascii()
            .eq_ignore_ascii_case(MEDIA_TYPE.as_bytes())
    })
}

/// Appends the `200` response head that begins a stream, and its first
/// field, `retry: retry_ms`. `allow_origin`: the request's `Origin`, when
/// it is one the server allows (a page of another origin may then read
/// the stream); `None` leaves CORS out.
pub fn write_head(out: &mut Vec<u8>, allow_origin: Option<&[u8]>, retry_ms: u32) {
    out.extend_from_slice(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n\
          Connection: keep-alive\r\nX-Accel-Buffering: no\r\n",
    );
    if let Some(origin) = allow_origin {
        out.extend_from_slice(b"Access-Control-Allow-Origin: ");
        out.extend_from_slice(origin);
        out.extend_from_slice(b"\r\nAccess-Control-Allow-Credentials: true\r\nVary: Origin\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(retry_field(retry_ms).as_bytes());
}

/// A `retry:` field: how long an `EventSource` waits before it
/// reconnects, from now on.
pub fn retry_field(retry_ms: u32) -> String {
    format!("retry: {retry_ms}\n\n")
}

/// What a message is, as an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A text message: `data:` lines, the default event.
    Text,
    /// A binary message: the `binary` event, base64.
    Binary,
}

/// Appends one message as an event: its `id:` (the position, as
/// printed, if it has one), its name if it is binary, and its data.
pub fn write_message(out: &mut Vec<u8>, id: Option<&[u8]>, kind: EventKind, payload: &[u8]) {
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id);
        out.push(b'\n');
    }
    match kind {
        EventKind::Text => write_data(out, payload),
        EventKind::Binary => {
            out.extend_from_slice(b"event: binary\ndata: ");
            let start = out.len();
            out.resize(start + payload.len().div_ceil(3) * 4, 0);
            let written = BASE64
                .encode_slice(payload, &mut out[start..])
                .expect("room for the base64 made above");
            out.truncate(start + written);
            out.push(b'\n');
        }
    }
    out.push(b'\n');
}

/// Appends a status (a JSON object on one line) as the `status` event.
pub fn write_status(out: &mut Vec<u8>, status: &str) {
    debug_assert!(!status.contains(['\r', '\n']), "a status is one line");
    out.extend_from_slice(STATUS_HEAD);
    out.extend_from_slice(status.as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// Appends `payload` as `data:` lines: one for each line of it, split at
/// CR, LF and CRLF, each written after `data: ` (the reader drops that
/// one space, so a line's own leading spaces stay). An empty payload is
/// one empty `data:` line, so the event still comes, with empty data.
fn write_data(out: &mut Vec<u8>, payload: &[u8]) {
    let mut rest = payload;
    loop {
        let end = rest.iter().position(|&b| b == b'\r' || b == b'\n');
        out.extend_from_slice(b"data: ");
        let Some(end) = end else {
            out.extend_from_slice(rest);
            out.push(b'\n');
            return;
        };
        out.extend_from_slice(&rest[..end]);
        out.push(b'\n');
        let skip = match &rest[end..] {
            [b'\r', b'\n', ..] => 2,
            _ => 1,
        };
        rest = &rest[end + skip..];
    }
}

/// The status that ends a stream closed with `code` for `reason` (what a
/// WebSocket's close frame would have carried):
/// `{"status":"closed","code":4001,"reason":"token expired"}`.
pub fn closed_status(code: u16, reason: &str) -> String {
    let reason = serde_json::to_string(reason).expect("a string serialises");
    format!(r#"{{"status":"closed","code":{code},"reason":{reason}}}"#)
}

/// The position a reconnecting `EventSource` names (its `Last-Event-ID`
/// header, as written), if any: what it resumes after, as `?since=` would.
pub fn last_event_id(value: Option<&[u8]>) -> Option<&str> {
    let value = std::str::from_utf8(value?).ok()?.trim();
    (!value.is_empty()).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::position::{Epoch, Position};

    /// Events as an `EventSource` reads them, written from the HTML
    /// standard's "event stream interpretation", independently of the
    /// writer above: `(last event id, type, data)` for each dispatched
    /// event, and the retry field's value.
    fn interpret(stream: &[u8]) -> (Vec<(String, String, String)>, Option<u32>) {
        let text = std::str::from_utf8(stream).expect("streams are UTF-8");
        let (mut events, mut retry) = (Vec::new(), None);
        let (mut data, mut kind, mut id, mut last_id) =
            (String::new(), String::new(), None::<String>, String::new());
        // Lines end at CRLF, LF or CR.
        let normalized = text.replace("\r\n", "\n").replace('\r', "\n");
        for line in normalized.split('\n') {
            if line.is_empty() {
                if let Some(new) = id.take() {
                    last_id = new;
                }
                if !data.is_empty() {
                    data.pop(); // The last LF.
                    let name = if kind.is_empty() { "message" } else { &kind };
                    events.push((last_id.clone(), name.to_string(), data.clone()));
                }
                data.clear();
                kind.clear();
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" => {
                    data.push_str(value);
                    data.push('\n');
                }
                "event" => kind = value.to_string(),
                "id" => id = Some(value.to_string()),
                "retry" => retry = value.parse().ok(),
                _ => {}
            }
        }
        (events, retry)
    }

    #[test]
    fn text_arrives_as_written_its_line_ends_as_lf() {
        let cases: [(&[u8], &str); 9] = [
            (b"plain", "plain"),
            (b"", ""),
            (b"   ", "   "),
            (b" lead and trail ", " lead and trail "),
            ("non-ASCII: żółw 🐢".as_bytes(), "non-ASCII: żółw 🐢"),
            (b"a\nb", "a\nb"),
            (b"a\r\nb", "a\nb"),
            (b"a\rb\n\nc\n", "a\nb\n\nc\n"),
            (b"data: looks like a field", "data: looks like a field"),
        ];
        for (payload, data) in cases {
            let mut out = Vec::new();
            write_message(&mut out, None, EventKind::Text, payload);
            let (events, _) = interpret(&out);
            assert_eq!(
                events,
                [(String::new(), "message".into(), data.to_string())],
                "{:?}",
                String::from_utf8_lossy(payload)
            );
        }
    }

    #[test]
    fn binary_is_a_named_event_in_base64_and_positions_are_ids() {
        let position = Position {
            epoch: Epoch(0xabc),
            seq: 42,
        };
        let mut out = Vec::new();
        let id = position.to_string();
        write_message(
            &mut out,
            Some(id.as_bytes()),
            EventKind::Binary,
            &[0, 255, 10, 13],
        );
        write_message(&mut out, None, EventKind::Text, b"after");
        write_status(&mut out, r#"{"status":"recovered","position":"x"}"#);
        out.extend_from_slice(HEARTBEAT);
        let (events, _) = interpret(&out);
        assert_eq!(
            events,
            [
                (id.clone(), "binary".into(), "AP8KDQ==".into()),
                // The last id stays until another is given.
                (id.clone(), "message".into(), "after".into()),
                (
                    id,
                    "status".into(),
                    r#"{"status":"recovered","position":"x"}"#.into()
                ),
            ]
        );
    }

    #[test]
    fn the_head_says_what_the_stream_is_and_whom_it_is_for() {
        let mut out = Vec::new();
        write_head(&mut out, Some(b"https://app.example"), 2750);
        let text = String::from_utf8(out).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"));
        for header in [
            "Content-Type: text/event-stream",
            "Cache-Control: no-store",
            "Access-Control-Allow-Origin: https://app.example",
            "Vary: Origin",
        ] {
            assert!(head.contains(header), "{header}");
        }
        assert_eq!(interpret(body.as_bytes()), (vec![], Some(2750)));
        let mut out = Vec::new();
        write_head(&mut out, None, 1000);
        assert!(!String::from_utf8(out).unwrap().contains("Access-Control"));
    }

    #[test]
    fn the_request_and_the_resume_are_read_as_browsers_send_them() {
        assert!(accepts_event_stream(b"text/event-stream"));
        assert!(accepts_event_stream(b"text/html, Text/Event-Stream;q=0.9"));
        assert!(!accepts_event_stream(b"text/event-streamx"));
        assert!(!accepts_event_stream(b"*/*"));
        assert_eq!(last_event_id(Some(b" 1a2b.7 ")), Some("1a2b.7"));
        assert_eq!(last_event_id(Some(b"")), None);
        assert_eq!(last_event_id(None), None);
    }
}

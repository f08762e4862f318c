//! Server-Sent Events, the client side: the `GET` that asks for a stream,
//! the check of the `200` that starts one, and an incremental reader that
//! turns the stream into events as the HTML standard's "event stream
//! interpretation" does (fields `data`, `id`, `event`; comments and
//! `retry` read past; an event dispatched at its blank line).
//!
//! Lines end at LF, CRLF or CR. An event's data lines are joined with LF.
//! Unlike a browser, it takes an id with a NUL in it (servers measured
//! here send none): one search fewer per event.

use crate::wire::handshake::{self, HandshakeError};

/// The `GET` an `EventSource` sends for `path`.
pub fn request(host: &str, path: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\n\
         Host: {host}\r\n\
         Accept: text/event-stream\r\n\
         Cache-Control: no-cache\r\n\
         \r\n"
    )
    .into_bytes()
}

/// Checks a complete response head for the `200` that starts a stream:
/// `Content-Type: text/event-stream`.
pub fn check_response(head: &[u8]) -> Result<(), HandshakeError> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let headers = handshake::parse_answer(head, &mut headers, 200)?;
    let media = handshake::header(headers, "content-type").map(|v| {
        v.split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii()
    });
    match media {
        Some(m) if m.eq_ignore_ascii_case(b"text/event-stream") => Ok(()),
        _ => Err(HandshakeError::NotEventStream),
    }
}

/// One dispatched event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    /// Its type (`event:`); `None` for the default, `message`.
    pub name: Option<&'a [u8]>,
    /// Its `id:`, if it had one (the last one, as the standard says).
    pub id: Option<&'a [u8]>,
    /// Its data lines, joined with LF.
    pub data: &'a [u8],
}

/// Reads a stream into events, however its bytes are split across reads.
///
/// Holds only the bytes of an event not yet complete (nothing between
/// events): an idle stream costs its connection an empty `Vec`.
#[derive(Debug, Default)]
pub struct EventReader {
    /// The bytes of the event begun and not ended in an earlier read.
    pending: Vec<u8>,
}

impl EventReader {
    /// Consumes `input`, calling `on_event` for every event it completes;
    /// `joined` is where data of several lines is put together. Stops at
    /// the first error `on_event` returns.
    pub fn feed<E>(
        &mut self,
        mut input: &[u8],
        joined: &mut Vec<u8>,
        mut on_event: impl FnMut(Event<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        if !self.pending.is_empty() {
            // Complete the event begun earlier, then go on from the input.
            let Some(end) = block_end(&self.pending, input) else {
                self.pending.extend_from_slice(input);
                return Ok(());
            };
            self.pending.extend_from_slice(&input[..end]);
            input = &input[end..];
            let block = std::mem::take(&mut self.pending);
            let result = read_events(&block, joined, &mut on_event);
            self.pending = block;
            self.pending.clear();
            result?;
        }
        let used = read_events(input, joined, &mut on_event)?;
        self.pending.extend_from_slice(&input[used..]);
        if self.pending.is_empty() && self.pending.capacity() > 0 {
            self.pending = Vec::new();
        }
        Ok(())
    }
}

/// Where the first block (lines up to and including a blank one) ends in
/// `before` (the start of a block) followed by `input`, as an offset into
/// `input`; `None` if no block ends in `input`.
fn block_end(before: &[u8], input: &[u8]) -> Option<usize> {
    // Whether a line begins here, and whether an LF here would be the
    // second half of a CRLF.
    let mut line_start = matches!(before.last(), None | Some(b'\n' | b'\r'));
    let mut after_cr = before.last() == Some(&b'\r');
    for (at, &b) in input.iter().enumerate() {
        match b {
            b'\n' if after_cr => after_cr = false,
            b'\n' | b'\r' if line_start => {
                let end = at + 1;
                let crlf = b == b'\r' && input.get(end) == Some(&b'\n');
                return Some(end + usize::from(crlf));
            }
            b'\n' | b'\r' => {
                line_start = true;
                after_cr = b == b'\r';
            }
            _ => {
                line_start = false;
                after_cr = false;
            }
        }
    }
    None
}

/// The fields of the event being read.
#[derive(Default)]
struct Fields<'a> {
    name: Option<&'a [u8]>,
    id: Option<&'a [u8]>,
    /// Its first data line.
    data: Option<&'a [u8]>,
    /// Data lines so far: from the second, the data is in `joined`.
    data_lines: u32,
}

impl<'a> Fields<'a> {
    /// Takes one line (not blank, without its end).
    fn take(&mut self, line: &'a [u8], joined: &mut Vec<u8>) {
        if line[0] == b':' {
            return;
        }
        // The two lines of every message, as servers write them, without
        // a search for the colon.
        let (field, value) = if let Some(value) = line.strip_prefix(b"data: ") {
            (&b"data"[..], value)
        } else if let Some(value) = line.strip_prefix(b"id: ") {
            (&b"id"[..], value)
        } else {
            field_and_value(line)
        };
        match field {
            b"data" => {
                self.data_lines += 1;
                match self.data_lines {
                    1 => self.data = Some(value),
                    n => {
                        if n == 2 {
                            joined.clear();
                            joined.extend_from_slice(self.data.unwrap_or_default());
                        }
                        joined.push(b'\n');
                        joined.extend_from_slice(value);
                    }
                }
            }
            b"event" => self.name = Some(value),
            b"id" => self.id = Some(value),
            _ => {}
        }
    }

    /// The event, at its blank line: `None` without data.
    fn event<'j>(&self, joined: &'j [u8]) -> Option<Event<'j>>
    where
        'a: 'j,
    {
        let first = self.data?;
        Some(Event {
            name: self.name,
            id: self.id,
            data: if self.data_lines > 1 { joined } else { first },
        })
    }
}

/// A line's field name and value (after the colon and one space; the
/// whole line is a name with an empty value if it has no colon).
fn field_and_value(line: &[u8]) -> (&[u8], &[u8]) {
    match memchr::memchr(b':', line) {
        Some(colon) => {
            let value = &line[colon + 1..];
            (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
        }
        None => (line, &b""[..]),
    }
}

/// Interprets the events at the start of `input`, dispatching each at its
/// blank line; returns the bytes they took (the rest begins an event not
/// yet ended). Stops at the first error `on_event` returns.
fn read_events<E>(
    input: &[u8],
    joined: &mut Vec<u8>,
    on_event: &mut impl FnMut(Event<'_>) -> Result<(), E>,
) -> Result<usize, E> {
    // Where each line ends: at LF only, found in one pass, unless the
    // input has a CR anywhere.
    match memchr::memchr(b'\r', input) {
        None => read_lines(input, memchr::memchr_iter(b'\n', input), joined, on_event),
        Some(_) => read_lines(
            input,
            memchr::memchr2_iter(b'\n', b'\r', input),
            joined,
            on_event,
        ),
    }
}

/// [`read_events`], the lines of `input` ending at `ends` (each a CR or
/// an LF, in order).
fn read_lines<E>(
    input: &[u8],
    ends: impl Iterator<Item = usize>,
    joined: &mut Vec<u8>,
    on_event: &mut impl FnMut(Event<'_>) -> Result<(), E>,
) -> Result<usize, E> {
    let mut fields = Fields::default();
    let (mut at, mut used) = (0, 0);
    for end in ends {
        if end < at {
            // The LF of a CRLF.
            continue;
        }
        let line = &input[at..end];
        let crlf = input[end] == b'\r' && input.get(end + 1) == Some(&b'\n');
        at = end + 1 + usize::from(crlf);
        if !line.is_empty() {
            fields.take(line, joined);
            continue;
        }
        if let Some(event) = fields.event(joined) {
            on_event(event)?;
        }
        fields = Fields::default();
        used = at;
    }
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Owned = (Option<String>, Option<String>, String);

    fn owned(e: Event<'_>) -> Owned {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (e.name.map(text), e.id.map(text), text(e.data))
    }

    /// The events of `stream` fed whole, and fed in pieces split at every
    /// point: each must give the same.
    fn events(stream: &[u8]) -> Vec<Owned> {
        let read = |pieces: &[&[u8]]| {
            let mut reader = EventReader::default();
            let mut joined = Vec::new();
            let mut got = Vec::new();
            for piece in pieces {
                reader
                    .feed::<()>(piece, &mut joined, |e| {
                        got.push(owned(e));
                        Ok(())
                    })
                    .unwrap();
            }
            got
        };
        let whole = read(&[stream]);
        for split in 0..=stream.len() {
            let (a, b) = stream.split_at(split);
            assert_eq!(read(&[a, b]), whole, "split at {split}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(read(&bytes), whole, "a byte at a time");
        whole
    }

    fn event(name: Option<&str>, id: Option<&str>, data: &str) -> Owned {
        (name.map(Into::into), id.map(Into::into), data.into())
    }

    #[test]
    fn events_are_dispatched_at_their_blank_line() {
        let stream = b"retry: 1000\n\nid: 7.1\ndata: one\n\n:\n\nid: 7.2\ndata: two\ndata: lines\n\nevent: status\ndata: {}\n\ndata: not yet";
        assert_eq!(
            events(stream),
            vec![
                event(None, Some("7.1"), "one"),
                event(None, Some("7.2"), "two\nlines"),
                event(Some("status"), None, "{}"),
            ]
        );
    }

    #[test]
    fn every_line_end_is_one() {
        let stream = b"data: a\r\ndata:b\rdata:  c\n\r\ndata\r\rdata:\n\n";
        assert_eq!(
            events(stream),
            vec![
                event(None, None, "a\nb\n c"),
                event(None, None, ""),
                event(None, None, "")
            ]
        );
    }

    #[test]
    fn a_comment_or_retry_alone_dispatches_nothing() {
        assert_eq!(events(b":\n\nretry: 5\n\n: hi\n\n"), Vec::<Owned>::new());
    }

    #[test]
    fn an_idle_reader_holds_no_buffer() {
        let mut reader = EventReader::default();
        let mut joined = Vec::new();
        reader
            .feed::<()>(b"data: x", &mut joined, |_| Ok(()))
            .unwrap();
        assert!(reader.pending.capacity() > 0);
        reader.feed::<()>(b"\n\n", &mut joined, |_| Ok(())).unwrap();
        assert_eq!(reader.pending.capacity(), 0);
    }

    #[test]
    fn the_stream_is_checked_by_its_answer() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n\r\n";
        assert_eq!(check_response(ok), Ok(()));
        let html = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n";
        assert_eq!(check_response(html), Err(HandshakeError::NotEventStream));
        let refused = b"HTTP/1.1 401 Unauthorized\r\n\r\n";
        assert_eq!(check_response(refused), Err(HandshakeError::Status(401)));
        assert!(String::from_utf8(request("h:1", "/?id=3"))
            .unwrap()
            .contains("Accept: text/event-stream\r\n"));
    }
}

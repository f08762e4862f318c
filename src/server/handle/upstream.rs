//! What clients send, on its way out of the loop as lines (`--upstream`):
//! one line per data message, and optionally one per connection opened
//! and closed, for a program that reads them (the binary writes them to
//! standard output).
//!
//! ```text
//! msg KEY ID text PAYLOAD     a text message, `\` `\n` `\r` escaped as \\ \n \r
//! msg KEY ID binary BASE64    a binary message
//! open KEY ID CHANNELS        an upgrade (CHANNELS: a,b or -)
//! close KEY ID CODE           its close (1006: the connection just ended)
//! open KEY ID CHANNELS sse    an event stream (SSE)
//! close KEY ID CODE sse       its end
//! ```
//!
//! KEY is the connection key `conn` commands take, ID the client id or
//! `-`. The loop gathers an iteration's lines in its own buffer and hands
//! them over once per iteration; the reader takes all that is there at
//! once. Both buffers together hold at most the bound (plus what one
//! read brings): past it, the loop stops reading clients until the reader
//! catches up, or (`drop`) drops messages and counts them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use crate::config::{Overflow, UpstreamConfig};
use crate::protocol::commands::ConnRef;
use crate::protocol::ws::{CloseCode, MessageKind};

/// The lines handed over and not read yet, shared by the loop and the
/// reader.
#[derive(Debug)]
pub struct Shelf {
    state: Mutex<State>,
    ready: Condvar,
    /// Bytes in `state.lines`, for the loop to read without the lock.
    held: AtomicUsize,
}

#[derive(Debug, Default)]
struct State {
    lines: Vec<u8>,
    /// The loop stopped: the reader gets what is left, then the end.
    closed: bool,
    /// The loop paused reading clients and waits to hear that the reader
    /// took lines.
    loop_waiting: bool,
}

impl Shelf {
    /// An empty shelf.
    pub fn new() -> Shelf {
        Shelf {
            state: Mutex::new(State::default()),
            ready: Condvar::new(),
            held: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes waiting for the reader.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// The loop hands over `lines` (emptying it); `waiting` says it has
    /// paused reading clients and must be woken once the reader took them.
    pub fn put(&self, lines: &mut Vec<u8>, waiting: bool) {
        let mut state = self.lock();
        if state.lines.is_empty() {
            std::mem::swap(&mut state.lines, lines);
        } else {
            state.lines.append(lines);
        }
        state.loop_waiting |= waiting;
        self.held.store(state.lines.len(), Ordering::Release);
        self.ready.notify_one();
    }

    /// The loop has stopped: the reader gets what is left, then `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// Waits for lines and swaps them into `into` (emptied first): whole
    /// lines, as many as there are. `Ok(false)` once the loop has stopped
    /// and every line was taken; `wake` is called when the loop was
    /// waiting for the reader.
    pub fn take(&self, into: &mut Vec<u8>, wake: impl FnOnce()) -> bool {
        into.clear();
        let mut state = self.lock();
        while state.lines.is_empty() && !state.closed {
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        if state.lines.is_empty() {
            return false;
        }
        std::mem::swap(&mut state.lines, into);
        self.held.store(0, Ordering::Release);
        let waiting = std::mem::take(&mut state.loop_waiting);
        drop(state);
        if waiting {
            wake();
        }
        true
    }
}

impl Default for Shelf {
    fn default() -> Shelf {
        Shelf::new()
    }
}

/// The loop's side: the lines of this iteration, and whether reading is
/// paused.
#[derive(Debug)]
pub struct Outbox {
    config: UpstreamConfig,
    shelf: Arc<Shelf>,
    lines: Vec<u8>,
    paused: bool,
}

/// What became of a client message offered upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    /// Written into the lines.
    Taken,
    /// Written, and now the reader is a bound behind: stop reading.
    TakenPausing,
    /// Dropped: the reader is a bound behind (`Overflow::Drop`).
    Dropped,
}

impl Outbox {
    /// An empty outbox that hands its lines over on `shelf`.
    pub fn new(config: UpstreamConfig, shelf: Arc<Shelf>) -> Outbox {
        Outbox {
            config,
            shelf,
            lines: Vec::new(),
            paused: false,
        }
    }

    /// Whether reading clients is paused until the reader catches up.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    fn behind(&self) -> usize {
        self.lines.len() + self.shelf.held()
    }

    /// Writes the line of a client's message, unless the reader is a bound
    /// behind and messages are dropped then.
    pub fn message(
        &mut self,
        key: ConnRef,
        id: Option<&str>,
        kind: MessageKind,
        payload: &[u8],
    ) -> Offered {
        let over = self.behind() >= self.config.max_bytes;
        if over && self.config.overflow == Overflow::Drop {
            return Offered::Dropped;
        }
        self.head("msg", key, id);
        match kind {
            MessageKind::Text => {
                self.lines.extend_from_slice(b" text ");
                escape_into(payload, &mut self.lines);
            }
            MessageKind::Binary => {
                self.lines.extend_from_slice(b" binary ");
                let start = self.lines.len();
                self.lines.resize(start + payload.len().div_ceil(3) * 4, 0);
                let written = BASE64
                    .encode_slice(payload, &mut self.lines[start..])
                    .expect("bug: sized for the encoding");
                self.lines.truncate(start + written);
            }
        }
        self.lines.push(b'\n');
        if self.config.overflow == Overflow::Pause && self.behind() >= self.config.max_bytes {
            self.paused = true;
            return Offered::TakenPausing;
        }
        Offered::Taken
    }

    /// Writes an `open` line, if events are on (marked with its
    /// `wire`'s name, `sse` for an event stream).
    pub fn opened<'c>(
        &mut self,
        key: ConnRef,
        id: Option<&str>,
        channels: impl Iterator<Item = &'c str>,
        wire: Option<&str>,
    ) {
        if !self.config.events {
            return;
        }
        self.head("open", key, id);
        let mut any = false;
        for (i, channel) in channels.enumerate() {
            self.lines.push(if i == 0 { b' ' } else { b',' });
            self.lines.extend_from_slice(channel.as_bytes());
            any = true;
        }
        if !any {
            self.lines.extend_from_slice(b" -");
        }
        self.end_event(wire);
    }

    /// Writes a `close` line, if events are on (marked with its
    /// `wire`'s name, `sse` for an event stream).
    pub fn closed(&mut self, key: ConnRef, id: Option<&str>, code: CloseCode, wire: Option<&str>) {
        if !self.config.events {
            return;
        }
        self.head("close", key, id);
        self.lines
            .extend_from_slice(format!(" {}", code.0).as_bytes());
        self.end_event(wire);
    }

    fn end_event(&mut self, wire: Option<&str>) {
        if let Some(wire) = wire {
            self.lines.push(b' ');
            self.lines.extend_from_slice(wire.as_bytes());
        }
        self.lines.push(b'\n');
    }

    fn head(&mut self, what: &str, key: ConnRef, id: Option<&str>) {
        use std::io::Write;
        let _ = write!(self.lines, "{what} {key} {}", id.unwrap_or("-"));
    }

    /// Hands this iteration's lines to the reader; `true` when reading may
    /// resume (it was paused and the reader has caught up to half the
    /// bound).
    pub fn hand_over(&mut self) -> bool {
        if !self.lines.is_empty() || self.paused {
            // Paused, the reader is told to wake the loop when it takes lines.
            self.shelf.put(&mut self.lines, self.paused);
        }
        if self.paused && self.shelf.held() <= self.config.max_bytes / 2 {
            self.paused = false;
            return true;
        }
        false
    }
}

/// Escapes a text payload so that it stays on one line: `\` as `\\`, a
/// line feed as `\n`, a carriage return as `\r`; the rest as it is.
pub fn escape_into(text: &[u8], out: &mut Vec<u8>) {
    let mut rest = text;
    while let Some(at) = rest
        .iter()
        .position(|&b| matches!(b, b'\\' | b'\n' | b'\r'))
    {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(match rest[at] {
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            _ => b"\\r",
        });
        rest = &rest[at + 1..];
    }
    out.extend_from_slice(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: ConnRef = ConnRef {
        instance: 0,
        slot: 4,
        serial: 9,
    };

    fn outbox(max_bytes: usize, overflow: Overflow) -> (Outbox, Arc<Shelf>) {
        let shelf = Arc::new(Shelf::new());
        let config = UpstreamConfig {
            max_bytes,
            overflow,
            events: true,
        };
        (Outbox::new(config, Arc::clone(&shelf)), shelf)
    }

    fn taken(shelf: &Shelf) -> String {
        let mut lines = Vec::new();
        assert!(shelf.take(&mut lines, || {}));
        String::from_utf8(lines).unwrap()
    }

    #[test]
    fn each_message_and_event_is_one_line() {
        let (mut out, shelf) = outbox(1 << 20, Overflow::Pause);
        out.opened(KEY, Some("alice"), ["news", "chat"].into_iter(), None);
        out.opened(KEY, None, std::iter::empty(), Some("sse"));
        let text = "two\nlines \\ and\r a return";
        assert_eq!(
            out.message(KEY, Some("alice"), MessageKind::Text, text.as_bytes()),
            Offered::Taken
        );
        out.message(KEY, None, MessageKind::Binary, &[0, 1, 2, 255]);
        out.message(KEY, None, MessageKind::Text, b"");
        out.closed(KEY, Some("alice"), CloseCode(1006), None);
        out.closed(KEY, None, CloseCode(1000), Some("sse"));
        assert!(!out.hand_over());
        assert_eq!(
            taken(&shelf),
            "open 0.4.9 alice news,chat\n\
             open 0.4.9 - - sse\n\
             msg 0.4.9 alice text two\\nlines \\\\ and\\r a return\n\
             msg 0.4.9 - binary AAEC/w==\n\
             msg 0.4.9 - text \n\
             close 0.4.9 alice 1006\n\
             close 0.4.9 - 1000 sse\n"
        );
    }

    #[test]
    fn a_reader_a_bound_behind_pauses_reading_or_drops() {
        let (mut out, shelf) = outbox(100, Overflow::Pause);
        let payload = [b'x'; 40];
        assert_eq!(
            out.message(KEY, None, MessageKind::Text, &payload),
            Offered::Taken
        );
        assert_eq!(
            out.message(KEY, None, MessageKind::Text, &payload),
            Offered::TakenPausing
        );
        assert!(out.is_paused());
        assert!(!out.hand_over(), "still a bound behind");
        let mut woken = false;
        let mut lines = Vec::new();
        assert!(shelf.take(&mut lines, || woken = true));
        assert!(woken, "the paused loop is woken once the reader took lines");
        assert_eq!(lines.iter().filter(|&&b| b == b'\n').count(), 2);
        assert!(out.hand_over(), "caught up: reading resumes");
        assert!(!out.is_paused());

        let (mut out, _) = outbox(100, Overflow::Drop);
        assert_eq!(
            out.message(KEY, None, MessageKind::Text, &payload),
            Offered::Taken
        );
        assert_eq!(
            out.message(KEY, None, MessageKind::Text, &payload),
            Offered::Taken
        );
        assert_eq!(
            out.message(KEY, None, MessageKind::Text, &payload),
            Offered::Dropped
        );
        assert!(!out.is_paused());
    }

    #[test]
    fn the_reader_gets_what_is_left_then_the_end() {
        let (mut out, shelf) = outbox(100, Overflow::Pause);
        out.message(KEY, None, MessageKind::Text, b"last");
        out.hand_over();
        shelf.close();
        assert_eq!(taken(&shelf), "msg 0.4.9 - text last\n");
        assert!(!shelf.take(&mut Vec::new(), || {}));
    }
}

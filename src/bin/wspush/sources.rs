//! Where input comes from: standard input and the Redis feed, and how
//! their lines reach the instances of a supervisor.
//!
//! A Redis message is read as its bytes followed by a line end (unless it
//! ends with one): one line, or several if it holds line ends.
//!
//! One reader thread per source hands over chunks of whole lines
//! ([`WholeLines`]) through one channel ([`spawn`]), so the lines of both
//! come interleaved whole, in the order the chunks came, and are numbered
//! in that order: by a lone server's input pump ([`Merged`]), or by a
//! supervisor, which hands the chunks on to its instances. The feed's
//! being lost or restored is said in the same stream with **control
//! lines**: a line that begins with [`CONTROL`] (0xFF, which no UTF-8 text
//! holds, so no line an instance would act on). A data line that begins
//! with that byte has it replaced with 0xFE on the way (it is still not
//! UTF-8, and is skipped and counted as before), so only the Redis reader
//! writes control lines.

use std::io::{self, BufRead, Read};
use std::ops::ControlFlow;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use mio::Waker;

use crate::redis_feed::{FeedEvent, RedisFeed};
use wspush::protocol::lines::Splitter;

/// The first byte of a control line.
pub const CONTROL: u8 = 0xFF;
/// The longest control line, without its end: a reader knows one however
/// short its line limit.
pub const CONTROL_MAX_LEN: usize = 64;
/// What a data line's leading [`CONTROL`] byte becomes.
const ESCAPED: u8 = 0xFE;

/// Input read per chunk.
const INPUT_CHUNK: usize = 64 * 1024;

/// What a control line tells an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// The feed is lost.
    FeedLost,
    /// The feed is back after this outage.
    FeedRestored(Duration),
}

impl Control {
    /// The line, with its end.
    pub fn line(self) -> Vec<u8> {
        let text = match self {
            Control::FeedLost => "feed lost".to_string(),
            Control::FeedRestored(outage) => format!("feed restored {}", outage.as_millis()),
        };
        let mut line = vec![CONTROL];
        line.extend_from_slice(text.as_bytes());
        line.push(b'\n');
        line
    }

    /// The control a line (without its end) holds, if it is one.
    pub fn parse(line: &[u8]) -> Option<Control> {
        let text = std::str::from_utf8(line.strip_prefix(&[CONTROL])?).ok()?;
        if text == "feed lost" {
            return Some(Control::FeedLost);
        }
        let ms = text.strip_prefix("feed restored ")?;
        if ms.is_empty() || !ms.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Control::FeedRestored(Duration::from_millis(
            ms.parse().ok()?,
        )))
    }
}

/// Cuts a byte stream into whole lines, each ended with `\n`, holding at
/// most one line's beginning: up to two bytes past the limit, where a
/// longer line is cut and the rest of it dropped (the instance still
/// skips it as too long, even if it ends with a `\r` it strips).
#[derive(Debug)]
pub struct WholeLines(Splitter);

impl WholeLines {
    /// Lines of at most `max_line` bytes pass whole.
    pub fn new(max_line: usize) -> WholeLines {
        WholeLines(Splitter::new(max_line))
    }

    /// Takes `bytes` and appends the lines they end to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        let _ = self.0.split(bytes, |piece| put_line(piece.bytes, out));
    }

    /// Ends the line begun, if any (at the end of the input).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let _ = self.0.finish(|piece| put_line(piece.bytes, out));
    }

    /// Appends one message's lines to `out`: its bytes, then a line end
    /// unless it ends with one.
    pub fn push_message(&mut self, message: &[u8], out: &mut Vec<u8>) {
        self.push(message, out);
        if !message.ends_with(b"\n") {
            self.push(b"\n", out);
        }
    }
}

/// Appends `line` and its end to `out`, a leading [`CONTROL`] escaped.
fn put_line(line: &[u8], out: &mut Vec<u8>) -> ControlFlow<()> {
    let start = out.len();
    out.extend_from_slice(line);
    out.push(b'\n');
    if line.first() == Some(&CONTROL) {
        out[start] = ESCAPED;
    }
    ControlFlow::Continue(())
}

/// Reads standard input (`input`) and the Redis feed, if any, each on a
/// thread of its own, and hands over chunks of whole lines of at most
/// `max_line` bytes (and control lines), one at a time, waking `waker`
/// (a supervisor's poll) for each: a source waits while its reader does
/// not take them, which slows its producer down. The channel ends when
/// every source has.
pub fn spawn(
    input: impl Read + Send + 'static,
    feed: Option<RedisFeed>,
    max_line: usize,
    waker: Option<Arc<Waker>>,
) -> io::Result<Receiver<Vec<u8>>> {
    let (tx, rx) = mpsc::sync_channel(1);
    if let Some(feed) = feed {
        let (tx, waker) = (tx.clone(), waker.clone());
        std::thread::Builder::new()
            .name("redis".into())
            .spawn(move || {
                let mut lines = WholeLines::new(max_line);
                feed.run(|event| {
                    let chunk = match event {
                        FeedEvent::Message(message) => {
                            let mut chunk = Vec::with_capacity(message.len() + 1);
                            lines.push_message(message, &mut chunk);
                            chunk
                        }
                        FeedEvent::Lost => Control::FeedLost.line(),
                        FeedEvent::Restored(outage) => Control::FeedRestored(outage).line(),
                    };
                    hand_over(&tx, waker.as_deref(), chunk)
                })
            })?;
    }
    std::thread::Builder::new()
        .name("input".into())
        .spawn(move || read_input(input, max_line, &tx, waker.as_deref()))?;
    Ok(rx)
}

/// Sends `chunk` and wakes its reader; false once it is gone.
fn hand_over(tx: &SyncSender<Vec<u8>>, waker: Option<&Waker>, chunk: Vec<u8>) -> bool {
    if tx.send(chunk).is_err() {
        return false;
    }
    wake(waker);
    true
}

fn wake(waker: Option<&Waker>) {
    if let Some(waker) = waker {
        let _ = waker.wake();
    }
}

/// The chunks [`spawn`] hands over, read as one stream of lines.
#[derive(Debug)]
pub struct Merged {
    chunks: Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    /// Bytes of `chunk` read.
    at: usize,
}

impl Merged {
    /// Reads what `chunks` brings.
    pub fn new(chunks: Receiver<Vec<u8>>) -> Merged {
        Merged {
            chunks,
            chunk: Vec::new(),
            at: 0,
        }
    }
}

impl Read for Merged {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for Merged {
    /// Waits for the next chunk once this one is read; empty once every
    /// source has ended.
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.at == self.chunk.len() {
            match self.chunks.recv() {
                Ok(chunk) => (self.chunk, self.at) = (chunk, 0),
                Err(_) => return Ok(&[]),
            }
        }
        Ok(&self.chunk[self.at..])
    }

    fn consume(&mut self, n: usize) {
        self.at = (self.at + n).min(self.chunk.len());
    }
}

/// Hands over `input`'s whole lines until it ends (the last line ended),
/// or the supervisor is gone.
fn read_input(
    mut input: impl Read,
    max_line: usize,
    tx: &SyncSender<Vec<u8>>,
    waker: Option<&Waker>,
) {
    let mut lines = WholeLines::new(max_line);
    let mut buf = vec![0u8; INPUT_CHUNK];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::warn!("reading standard input failed: {e}");
                break;
            }
        };
        let mut chunk = Vec::with_capacity(n + 1);
        lines.push(&buf[..n], &mut chunk);
        if !chunk.is_empty() && !hand_over(tx, waker, chunk) {
            return;
        }
    }
    let mut last = Vec::new();
    lines.finish(&mut last);
    if !last.is_empty() {
        hand_over(tx, waker, last);
    }
    log::info!("standard input closed");
    wake(waker);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(max_line: usize, pieces: &[&[u8]]) -> Vec<u8> {
        let mut lines = WholeLines::new(max_line);
        let mut out = Vec::new();
        for piece in pieces {
            lines.push(piece, &mut out);
        }
        lines.finish(&mut out);
        out
    }

    #[test]
    fn only_whole_lines_pass_and_the_last_is_ended() {
        let mut lines = WholeLines::new(100);
        let mut out = Vec::new();
        lines.push(b"one\ntw", &mut out);
        assert_eq!(out, b"one\n");
        lines.push(b"o\nthr", &mut out);
        assert_eq!(out, b"one\ntwo\n");
        lines.push(b"ee", &mut out);
        assert_eq!(out, b"one\ntwo\n");
        lines.finish(&mut out);
        assert_eq!(out, b"one\ntwo\nthree\n");
        assert_eq!(cut(100, &[b"\n\n", b"x\r\n"]), b"\n\nx\r\n");
        assert_eq!(cut(100, &[b""]), b"");
    }

    #[test]
    fn a_line_over_the_limit_is_cut_two_bytes_past_it() {
        assert_eq!(cut(4, &[b"abcd\nabcdefgh\nok\n"]), b"abcd\nabcdef\nok\n");
        assert_eq!(cut(4, &[b"abc", b"defg", b"hij\nok"]), b"abcdef\nok\n");
        // Still too long once the reader strips a `\r`; whole lines pass.
        assert_eq!(cut(4, &[b"abcd\rxyz\nabcd\r\n"]), b"abcd\rx\nabcd\r\n");
        // However long, at most six bytes of it are held.
        let mut lines = WholeLines::new(4);
        let mut out = Vec::new();
        for _ in 0..1000 {
            lines.push(&[b'x'; 1000], &mut out);
        }
        assert!(out.is_empty() && lines.0.unfinished() == 6);
    }

    #[test]
    fn data_lines_never_begin_with_the_control_byte() {
        let out = cut(100, &[b"\xFFfeed lost\nok\n\xFF", b"x\n"]);
        assert_eq!(out, b"\xFEfeed lost\nok\n\xFEx\n");
        assert_eq!(cut(100, &[b"\xFF", b"feed lost\n"]), b"\xFEfeed lost\n");
        let mut lines = WholeLines::new(100);
        let mut out = Vec::new();
        lines.push_message(b"\xFFfeed lost", &mut out);
        assert_eq!(Control::parse(out.strip_suffix(b"\n").unwrap()), None);
    }

    #[test]
    fn the_chunks_read_as_one_stream_until_every_source_has_ended() {
        let (tx, rx) = mpsc::sync_channel(4);
        for chunk in [&b"one\ntw"[..], b"", b"o\n", b"three\n"] {
            tx.send(chunk.to_vec()).unwrap();
        }
        drop(tx);
        let mut merged = Merged::new(rx);
        let mut first = [0u8; 5];
        merged.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"one\nt");
        let lines: Vec<String> = merged.lines().map(Result::unwrap).collect();
        assert_eq!(lines, ["wo", "three"]);
    }

    #[test]
    fn a_message_is_its_lines() {
        let mut lines = WholeLines::new(100);
        let mut out = Vec::new();
        for message in [&b"one"[..], b"two\n", b"", b"a\nb"] {
            lines.push_message(message, &mut out);
        }
        assert_eq!(out, b"one\ntwo\n\na\nb\n");
    }

    #[test]
    fn control_lines_round_trip_and_nothing_else_is_one() {
        for control in [
            Control::FeedLost,
            Control::FeedRestored(Duration::from_millis(1234)),
            Control::FeedRestored(Duration::from_millis(u64::MAX)),
        ] {
            let line = control.line();
            assert!(line.len() - 1 <= CONTROL_MAX_LEN, "{line:?}");
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(Control::parse(&line[..line.len() - 1]), Some(control));
        }
        for line in [
            &b"feed lost"[..],
            b"\xFFfeed",
            b"\xFFfeed lost ",
            b"\xFFfeed restored",
            b"\xFFfeed restored x",
            b"\xFFfeed restored +5",
            b"\xFEfeed lost",
        ] {
            assert_eq!(Control::parse(line), None, "{line:?}");
        }
    }
}

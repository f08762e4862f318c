//! Input lines, without I/O: a byte stream, handed over in chunks of any
//! size, split into lines ([`Splitter`]), and each line judged by the rules
//! for a text message ([`Lines`]). The binary's standard input, the
//! supervisor's sources and its merge of the instances' outputs all split
//! with a [`Splitter`]; the reading is theirs.
//!
//! Rules, in order:
//! - a line ends at `\n`; a `\r` before it is dropped too, and a last line
//!   without `\n` at end of input still counts;
//! - an empty line is broadcast as an empty text message (one line, one
//!   message, always);
//! - a line longer than the message limit is skipped whole, with a warning;
//! - a line that is not valid UTF-8 is skipped (a text message must be
//!   UTF-8), with a warning naming its line number.

use std::ops::ControlFlow;

/// One line as split: its bytes without the `\n`, whole, or the first
/// `max_line_bytes + 2` of them when it was longer (`cut`). Two bytes over
/// the limit are kept so that a cut line passed on is still too long for
/// its reader, even after the reader strips a `\r` from its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece<'a> {
    /// The line's bytes, or its first ones.
    pub bytes: &'a [u8],
    /// Whether the line was longer than `bytes`.
    pub cut: bool,
}

/// Splits a byte stream into lines. Holds at most `max_line_bytes + 2`
/// bytes of a line begun in one chunk and ended in a later one, however
/// long it is; lines within one chunk are handed over without a copy.
#[derive(Debug)]
pub struct Splitter {
    /// The most bytes of a line kept: the limit plus two.
    keep: usize,
    /// The kept start of the line begun and not ended yet.
    partial: Vec<u8>,
    /// Whether that line was longer than what is kept.
    partial_cut: bool,
    /// Whether a line is begun and not ended (it may be empty so far).
    begun: bool,
}

impl Splitter {
    /// Lines of up to `max_line_bytes + 2` bytes are handed over whole
    /// (`usize::MAX`: every line).
    pub fn new(max_line_bytes: usize) -> Splitter {
        Splitter {
            keep: max_line_bytes.saturating_add(2),
            partial: Vec::new(),
            partial_cut: false,
            begun: false,
        }
    }

    /// Calls `each` with every line `bytes` ends, in order, until it breaks;
    /// the rest of the last line is kept for the next chunk.
    pub fn split<B>(
        &mut self,
        mut bytes: &[u8],
        mut each: impl FnMut(Piece<'_>) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            let line = &bytes[..end];
            bytes = &bytes[end + 1..];
            if !self.begun && line.len() <= self.keep {
                each(Piece {
                    bytes: line,
                    cut: false,
                })?;
            } else {
                self.take(line);
                self.end_line(&mut each)?;
            }
        }
        if !bytes.is_empty() {
            self.take(bytes);
        }
        ControlFlow::Continue(())
    }

    /// The input ended: hands over the line begun, if any.
    pub fn finish<B>(
        &mut self,
        mut each: impl FnMut(Piece<'_>) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        if self.begun {
            self.end_line(&mut each)?;
        }
        ControlFlow::Continue(())
    }

    /// Bytes kept of the line begun and not ended.
    pub fn unfinished(&self) -> usize {
        self.partial.len()
    }

    /// Takes the bytes kept of the line begun and not ended (for whoever
    /// reads on where this splitter stops); nothing is begun after.
    pub fn take_unfinished(&mut self) -> Vec<u8> {
        self.begun = false;
        self.partial_cut = false;
        std::mem::take(&mut self.partial)
    }

    fn take(&mut self, part: &[u8]) {
        let room = self.keep - self.partial.len();
        self.partial
            .extend_from_slice(&part[..part.len().min(room)]);
        self.partial_cut |= part.len() > room;
        self.begun = true;
    }

    fn end_line<B>(
        &mut self,
        each: &mut impl FnMut(Piece<'_>) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        let flow = each(Piece {
            bytes: &self.partial,
            cut: self.partial_cut,
        });
        self.partial.clear();
        self.partial_cut = false;
        self.begun = false;
        flow
    }
}

/// One line of the input, judged by the rules above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line<'a> {
    /// A line to broadcast, without its ending.
    Text(&'a str),
    /// A line longer than the limit, skipped.
    TooLong,
    /// A line that is not valid UTF-8, skipped: its bytes, without its end.
    NotUtf8(&'a [u8]),
}

/// Splits a byte stream into numbered [`Line`]s.
#[derive(Debug)]
pub struct Lines {
    splitter: Splitter,
    max_line_bytes: usize,
    number: u64,
}

impl Lines {
    /// Lines longer than `max_line_bytes` (after a `\r` at their end is
    /// dropped) are [`Line::TooLong`].
    pub fn new(max_line_bytes: usize) -> Lines {
        Lines {
            splitter: Splitter::new(max_line_bytes),
            max_line_bytes,
            number: 0,
        }
    }

    /// Calls `each` with the number (from 1) and the judgement of every
    /// line `bytes` ends, until it breaks.
    pub fn push<B>(
        &mut self,
        bytes: &[u8],
        mut each: impl FnMut(u64, Line<'_>) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        let (max, number) = (self.max_line_bytes, &mut self.number);
        self.splitter.split(bytes, |piece| {
            *number += 1;
            each(*number, judge(piece, max))
        })
    }

    /// The input ended: judges the line begun, if any.
    pub fn finish<B>(
        &mut self,
        mut each: impl FnMut(u64, Line<'_>) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        let (max, number) = (self.max_line_bytes, &mut self.number);
        self.splitter.finish(|piece| {
            *number += 1;
            each(*number, judge(piece, max))
        })
    }
}

/// A line as the rules judge it, for lines of at most `max` bytes.
fn judge(piece: Piece<'_>, max: usize) -> Line<'_> {
    if piece.cut {
        return Line::TooLong;
    }
    let line = piece.bytes.strip_suffix(b"\r").unwrap_or(piece.bytes);
    if line.len() > max {
        return Line::TooLong;
    }
    match std::str::from_utf8(line) {
        Ok(text) => Line::Text(text),
        Err(_) => Line::NotUtf8(line),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `Lines` makes of `input` handed over `chunk` bytes at a time.
    fn judged(input: &[u8], max: usize, chunk: usize) -> Vec<String> {
        let mut lines = Lines::new(max);
        let mut out = Vec::new();
        let mut record = |number: u64, line: Line<'_>| {
            assert_eq!(number, out.len() as u64 + 1, "numbered from 1, in order");
            out.push(match line {
                Line::Text(text) => format!("text {text}"),
                Line::TooLong => "too long".to_string(),
                Line::NotUtf8(bytes) => format!("not utf-8 {bytes:?}"),
            });
            ControlFlow::<()>::Continue(())
        };
        for part in input.chunks(chunk) {
            let _ = lines.push(part, &mut record);
        }
        let _ = lines.finish(&mut record);
        out
    }

    /// The same for every chunk size from 1 to the whole input.
    fn lines(input: &[u8], max: usize) -> Vec<String> {
        let whole = judged(input, max, input.len().max(1));
        for chunk in 1..input.len() {
            assert_eq!(judged(input, max, chunk), whole, "in chunks of {chunk}");
        }
        whole
    }

    #[test]
    fn splits_lines_and_strips_their_endings() {
        assert_eq!(
            lines(b"one\r\n\ntwo\nlast", 10),
            ["text one", "text ", "text two", "text last"]
        );
        assert!(lines(b"", 10).is_empty());
        assert_eq!(lines(b"\n", 10), ["text "], "one empty line");
    }

    #[test]
    fn long_lines_are_refused_whole_and_reading_goes_on() {
        assert_eq!(
            lines(b"12345\n123456\n1234\r\nok\n12345678901\r\n", 5),
            ["text 12345", "too long", "text 1234", "text ok", "too long"]
        );
        assert_eq!(
            lines(b"12345\r\n", 5),
            ["text 12345"],
            "the \\r does not count"
        );
        assert_eq!(lines(b"123456\r\n", 5), ["too long"]);
    }

    #[test]
    fn lines_that_are_not_utf8_are_refused_with_their_bytes() {
        assert_eq!(
            lines(b"caf\xc3\xa9\n\xff\xfe\r\nok", 10),
            ["text caf\u{e9}", "not utf-8 [255, 254]", "text ok"]
        );
    }

    /// Every line a splitter of limit `max` hands over, as (bytes, cut).
    fn pieces(input: &[u8], max: usize, chunk: usize) -> Vec<(Vec<u8>, bool)> {
        let mut splitter = Splitter::new(max);
        let mut out = Vec::new();
        let mut record = |piece: Piece<'_>| {
            out.push((piece.bytes.to_vec(), piece.cut));
            ControlFlow::<()>::Continue(())
        };
        for part in input.chunks(chunk) {
            let _ = splitter.split(part, &mut record);
            assert!(
                splitter.unfinished() <= max.saturating_add(2),
                "holds at most the limit and two"
            );
        }
        let _ = splitter.finish(&mut record);
        out
    }

    #[test]
    fn a_long_line_is_cut_two_bytes_past_the_limit_in_any_chunks() {
        let input = b"abc\n0123456789\r\nxy";
        for chunk in 1..=input.len() {
            assert_eq!(
                pieces(input, 4, chunk),
                [
                    (b"abc".to_vec(), false),
                    (b"012345".to_vec(), true),
                    (b"xy".to_vec(), false)
                ],
                "in chunks of {chunk}"
            );
        }
        let unlimited = pieces(input, usize::MAX, 3);
        assert_eq!(unlimited[1], (b"0123456789\r".to_vec(), false));
    }

    #[test]
    fn a_break_stops_the_split() {
        let mut splitter = Splitter::new(10);
        let mut seen = Vec::new();
        let flow = splitter.split(b"a\nb\nc\n", |piece| {
            seen.push(piece.bytes.to_vec());
            if piece.bytes == b"b" {
                ControlFlow::Break("stop")
            } else {
                ControlFlow::Continue(())
            }
        });
        assert_eq!(flow, ControlFlow::Break("stop"));
        assert_eq!(seen, [b"a".to_vec(), b"b".to_vec()]);
    }
}

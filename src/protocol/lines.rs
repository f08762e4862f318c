//! The input line rules: each line of a byte stream (the binary's standard
//! input) becomes one text message.
//!
//! Rules, in order:
//! - a line ends at `\n`; a `\r` before it is dropped too, and a last line
//!   without `\n` at end of input still counts;
//! - an empty line is broadcast as an empty text message (one line, one
//!   message, always);
//! - a line longer than the message limit is skipped whole, with a warning;
//! - a line that is not valid UTF-8 is skipped (a text message must be
//!   UTF-8), with a warning naming its line number.
//!
//! Pure: [`Lines`] reads any `BufRead` and judges each line; the binary
//! broadcasts and counts them.

use std::io::{self, BufRead};

/// One line of the input, judged by the rules above.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// A line to broadcast, without its ending.
    Text(String),
    /// A line longer than the limit, skipped (never held whole).
    TooLong,
    /// A line that is not valid UTF-8, skipped.
    NotUtf8,
}

/// Splits a byte stream into [`Line`]s.
/// Holds at most one byte more than the limit of a line, however long
/// the line is.
#[derive(Debug)]
pub struct Lines<R> {
    input: R,
    max_line_bytes: usize,
    /// The line being read; kept for the next one when it was skipped.
    line: Vec<u8>,
    number: u64,
}

impl<R: BufRead> Lines<R> {
    /// The lines of `input`; a line longer than `max_line_bytes` is
    /// [`Line::TooLong`].
    pub fn new(input: R, max_line_bytes: usize) -> Lines<R> {
        Lines {
            input,
            max_line_bytes,
            line: Vec::new(),
            number: 0,
        }
    }

    /// The next line; `Ok(None)` at end of input. A read interrupted by a
    /// signal is retried; any other read error is returned.
    pub fn next_line(&mut self) -> io::Result<Option<Line>> {
        self.line.clear();
        let Some(complete) = read_line(&mut self.input, &mut self.line, self.max_line_bytes)?
        else {
            return Ok(None);
        };
        self.number += 1;
        if !complete {
            return Ok(Some(Line::TooLong));
        }
        Ok(Some(
            match String::from_utf8(std::mem::take(&mut self.line)) {
                Ok(text) => Line::Text(text),
                Err(e) => {
                    self.line = e.into_bytes();
                    Line::NotUtf8
                }
            },
        ))
    }

    /// The bytes of the line [`Lines::next_line`] returned last, if it was
    /// [`Line::NotUtf8`] (without its end); empty otherwise.
    pub fn rejected(&self) -> &[u8] {
        &self.line
    }

    /// The number of the line [`Lines::next_line`] returned last, from 1.
    pub fn number(&self) -> u64 {
        self.number
    }
}

/// Reads one line into `line` without its ending. `Ok(None)` at end of
/// input; `Ok(Some(false))` when the line was longer than `max` (the rest
/// of it is consumed and discarded, `line` holds the first `max` bytes).
fn read_line(input: &mut impl BufRead, line: &mut Vec<u8>, max: usize) -> io::Result<Option<bool>> {
    let mut seen_any = false;
    let mut too_long = false;
    loop {
        let available = match input.fill_buf() {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            break;
        }
        seen_any = true;
        let (chunk, used, ended) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], i + 1, true),
            None => (available, available.len(), false),
        };
        // Keep up to one byte over the limit: it may be a '\r' to strip.
        let room = (max + 1).saturating_sub(line.len());
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        too_long |= chunk.len() > room;
        input.consume(used);
        if ended {
            break;
        }
    }
    if !seen_any {
        return Ok(None);
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    too_long |= line.len() > max;
    line.truncate(max);
    Ok(Some(!too_long))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<Line> {
        let mut lines = Lines::new(io::BufReader::with_capacity(3, input), max);
        let mut out = Vec::new();
        while let Some(line) = lines.next_line().unwrap() {
            out.push(line);
            assert_eq!(lines.number(), out.len() as u64);
        }
        out
    }

    fn text(line: &str) -> Line {
        Line::Text(line.to_string())
    }

    #[test]
    fn splits_lines_and_strips_their_endings() {
        let got = lines(b"one\r\n\ntwo\nlast", 10);
        assert_eq!(got, [text("one"), text(""), text("two"), text("last")]);
        assert!(lines(b"", 10).is_empty());
    }

    #[test]
    fn long_lines_are_refused_whole_and_reading_goes_on() {
        let got = lines(b"12345\n123456\n1234\r\nok\n", 5);
        assert_eq!(
            got,
            [text("12345"), Line::TooLong, text("1234"), text("ok")]
        );
        assert_eq!(
            lines(b"12345\r\n", 5),
            [text("12345")],
            "the \\r does not count"
        );
    }

    #[test]
    fn lines_that_are_not_utf8_are_refused_and_counted() {
        let got = lines(b"caf\xc3\xa9\n\xff\xfe\r\nok", 10);
        assert_eq!(got, [text("caf\u{e9}"), Line::NotUtf8, text("ok")]);
    }
}

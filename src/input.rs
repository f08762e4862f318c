//! Broadcast input: each line of a byte stream (the binary's standard
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
//! Skipped lines are counted in `input_lines_rejected`. End of input ends
//! the pump, not the server.

use std::io::{self, BufRead};

use crate::ops::metrics::Metrics;
use crate::server::{Handle, ServerGone};

/// How reading the input ended.
#[derive(Debug)]
pub enum PumpEnd {
    /// End of input.
    Eof,
    /// The server loop stopped.
    ServerGone,
    /// Reading failed.
    Failed(io::Error),
}

/// Reads `input` to its end, broadcasting each line through `handle` in
/// order; lines longer than `max_line_bytes` are skipped.
pub fn pump_lines(mut input: impl BufRead, handle: &Handle, max_line_bytes: usize) -> PumpEnd {
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        number += 1;
        let complete = match read_line(&mut input, &mut line, max_line_bytes) {
            Ok(None) => return PumpEnd::Eof,
            Ok(Some(complete)) => complete,
            Err(e) => return PumpEnd::Failed(e),
        };
        let text = match (complete, String::from_utf8(std::mem::take(&mut line))) {
            (true, Ok(text)) => text,
            (false, _) => {
                reject(
                    handle,
                    number,
                    &format!("longer than the {max_line_bytes}-byte message limit"),
                );
                continue;
            }
            (true, Err(e)) => {
                line = e.into_bytes();
                reject(handle, number, "not valid UTF-8");
                continue;
            }
        };
        if let Err(ServerGone) = handle.broadcast_text(text) {
            return PumpEnd::ServerGone;
        }
    }
}

fn reject(handle: &Handle, number: u64, why: &str) {
    Metrics::incr(&handle.metrics_ref().input_lines_rejected);
    log::warn!("input line {number} skipped: {why}");
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

    fn lines(input: &[u8], max: usize) -> Vec<Option<Vec<u8>>> {
        let mut reader = io::BufReader::with_capacity(3, input);
        let mut out = Vec::new();
        let mut line = Vec::new();
        while let Some(complete) = read_line(&mut reader, &mut line, max).unwrap() {
            out.push(complete.then(|| line.clone()));
            line.clear();
        }
        out
    }

    #[test]
    fn splits_lines_and_strips_their_endings() {
        let got = lines(b"one\r\n\ntwo\nlast", 10);
        let want: Vec<Option<Vec<u8>>> = vec![
            Some(b"one".to_vec()),
            Some(vec![]),
            Some(b"two".to_vec()),
            Some(b"last".to_vec()),
        ];
        assert_eq!(got, want);
        assert!(lines(b"", 10).is_empty());
    }

    #[test]
    fn long_lines_are_refused_whole_and_reading_goes_on() {
        let got = lines(b"12345\n123456\n1234\r\nok\n", 5);
        assert_eq!(
            got,
            vec![
                Some(b"12345".to_vec()),
                None,
                Some(b"1234".to_vec()),
                Some(b"ok".to_vec())
            ]
        );
        assert_eq!(
            lines(b"12345\r\n", 5),
            vec![Some(b"12345".to_vec())],
            "the \\r does not count"
        );
    }
}

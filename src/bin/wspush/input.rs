//! Standard input to broadcasts: each line, judged by the rules of
//! [`wspush::protocol::lines`], is broadcast through a [`Handle`]; skipped
//! lines are logged and counted in `input_lines_rejected`. End of input
//! ends the pump, not the server.

use std::io::{self, BufRead};

use wspush::protocol::lines::{Line, Lines};
use wspush::{BroadcastError, Handle, ServerGone};

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
pub fn pump_lines(input: impl BufRead, handle: &Handle, max_line_bytes: usize) -> PumpEnd {
    let mut lines = Lines::new(input, max_line_bytes);
    loop {
        let text = match lines.next_line() {
            Ok(None) => return PumpEnd::Eof,
            Ok(Some(Line::Text(text))) => text,
            Ok(Some(Line::TooLong)) => {
                reject(
                    handle,
                    lines.number(),
                    &format!("longer than the {max_line_bytes}-byte message limit"),
                );
                continue;
            }
            Ok(Some(Line::NotUtf8)) => {
                reject(handle, lines.number(), "not valid UTF-8");
                continue;
            }
            Err(e) => return PumpEnd::Failed(e),
        };
        match handle.broadcast_text(text) {
            Ok(()) => {}
            Err(BroadcastError::Gone(ServerGone)) => return PumpEnd::ServerGone,
            // Longer lines were skipped above; counted and logged by the
            // handle if the limits ever differ.
            Err(BroadcastError::TooBig(_)) => {}
        }
    }
}

fn reject(handle: &Handle, number: u64, why: &str) {
    handle.count_rejected_input();
    log::warn!("input line {number} skipped: {why}");
}

//! Standard input (`tail -f feed | wspush`), read as whole lines until it
//! ends.

use std::io::{self, Read};

use super::source::{Outlet, Source};
use crate::chunks::WholeLines;

/// Input read per chunk.
const INPUT_CHUNK: usize = 64 * 1024;

/// Standard input (or any reader, in tests) as a source.
pub struct Stdin<R> {
    input: R,
}

impl<R: Read + Send> Stdin<R> {
    /// Reads `input`.
    pub fn new(input: R) -> Stdin<R> {
        Stdin { input }
    }
}

impl<R: Read + Send> Source for Stdin<R> {
    fn name(&self) -> &'static str {
        "input"
    }

    /// Hands over the input's whole lines until it ends (the last line
    /// ended), or the reader is gone.
    fn run(mut self: Box<Self>, out: Outlet) {
        let mut lines = WholeLines::new(out.max_line());
        let mut buf = vec![0u8; INPUT_CHUNK];
        loop {
            let n = match self.input.read(&mut buf) {
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
            if !chunk.is_empty() && !out.send(chunk) {
                return;
            }
        }
        let mut last = Vec::new();
        lines.finish(&mut last);
        if !last.is_empty() {
            out.send(last);
        }
        log::info!("standard input closed");
        out.wake();
    }
}

//! Where input comes from: standard input, a Redis subscription (pub/sub),
//! a Redis stream and the publish listener, each a [`Source`] in a file
//! of its own, and how their lines reach the loop or the instances of a
//! supervisor.
//!
//! One reader thread per source hands over chunks of whole lines
//! ([`WholeLines`](crate::chunks::WholeLines)) through one channel
//! ([`spawn`]), so the lines of all come interleaved whole, in the order
//! the chunks came, and are numbered in that order: by a lone server's
//! input pump ([`Merged`]), or by a supervisor, which hands the chunks on
//! to its instances. What a source knows beside lines (lost, restored, an
//! entry's position, a gap) is said in the same stream with control lines
//! ([`crate::chunks`]). A source that reads from a broker over a
//! connection reconnects through `reconnect::keep_reading`.
//!
//! Where a recorder keeps the history (a supervisor's, or a lone server's
//! that reads a stream), each chunk is recorded before the loop gets it.
//!
//! A new source is one file here, its `Source::run`, and its settings
//! read from the command line in `cli::sources_from`.

use std::io::{self, BufRead, Read};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;

use mio::Waker;

use crate::input::{Recorder, EVICT_EVERY};
pub use questions::ANSWER_TIMEOUT;
pub use source::{FeedEvent, Outlet, Source};

pub mod presence_writer;
pub mod publish;
pub mod pubsub;
mod questions;
pub mod reconnect;
mod source;
pub mod stdin;
pub mod stop;
pub mod stream;

/// Runs each of `sources` on a thread of its own, handing over chunks of
/// whole lines of at most `max_line` bytes (and control lines), one at a
/// time, waking `waker` (a supervisor's poll) for each: a source waits
/// while its reader does not take them, which slows its producer down.
/// The channel ends when every source has.
pub fn spawn(
    sources: Vec<Box<dyn Source>>,
    max_line: usize,
    waker: Option<Arc<Waker>>,
) -> io::Result<Receiver<Vec<u8>>> {
    let (tx, rx) = mpsc::sync_channel(1);
    let out = Outlet::new(tx, waker, max_line);
    for source in sources {
        let out = out.clone();
        std::thread::Builder::new()
            .name(source.name().into())
            .spawn(move || source.run(out))?;
    }
    Ok(rx)
}

/// The chunks [`spawn`] hands over, read as one stream of lines.
#[derive(Debug)]
pub struct Merged {
    chunks: Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    /// Bytes of `chunk` read.
    at: usize,
    /// Keeps each chunk's messages in the history first, if this process
    /// writes one apart from its loop.
    recorder: Option<Recorder>,
}

impl Merged {
    /// Reads what `chunks` brings (recorded by `recorder` first, if any).
    pub fn new(chunks: Receiver<Vec<u8>>, recorder: Option<Recorder>) -> Merged {
        Merged {
            chunks,
            chunk: Vec::new(),
            at: 0,
            recorder,
        }
    }
}

impl Merged {
    /// The recorder, once the chunks are read (for a re-exec to carry its
    /// history on).
    pub fn into_recorder(self) -> Option<Recorder> {
        self.recorder
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
            let Some(recorder) = &mut self.recorder else {
                match self.chunks.recv() {
                    Ok(chunk) => (self.chunk, self.at) = (chunk, 0),
                    Err(_) => return Ok(&[]),
                }
                continue;
            };
            match self.chunks.recv_timeout(EVICT_EVERY) {
                Ok(chunk) => {
                    recorder.record(&chunk);
                    (self.chunk, self.at) = (chunk, 0);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(&[]),
            }
            recorder.evict();
        }
        Ok(&self.chunk[self.at..])
    }

    fn consume(&mut self, n: usize) {
        self.at = (self.at + n).min(self.chunk.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chunks_read_as_one_stream_until_every_source_has_ended() {
        let (tx, rx) = mpsc::sync_channel(4);
        for chunk in [&b"one\ntw"[..], b"", b"o\n", b"three\n"] {
            tx.send(chunk.to_vec()).unwrap();
        }
        drop(tx);
        let mut merged = Merged::new(rx, None);
        let mut first = [0u8; 5];
        merged.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"one\nt");
        let lines: Vec<String> = merged.lines().map(Result::unwrap).collect();
        assert_eq!(lines, ["wo", "three"]);
    }
}

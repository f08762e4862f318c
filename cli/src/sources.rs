//! Where input comes from: standard input, the Redis feed (pub/sub) and
//! the Redis stream, and how their lines reach the loop or the instances
//! of a supervisor.
//!
//! One reader thread per source hands over chunks of whole lines
//! ([`WholeLines`]) through one channel ([`spawn`]), so the lines of all
//! come interleaved whole, in the order the chunks came, and are numbered
//! in that order: by a lone server's input pump ([`Merged`]), or by a
//! supervisor, which hands the chunks on to its instances. What a Redis
//! reader knows beside lines (lost, restored, an entry's position, a gap)
//! is said in the same stream with control lines ([`crate::chunks`]).
//!
//! Where a recorder keeps the history (a supervisor's, or a lone server's
//! that reads a stream), each chunk is recorded before the loop gets it.

use std::io::{self, BufRead, Read};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;

use mio::Waker;

use crate::chunks::{Control, WholeLines};
use crate::input::{Recorder, EVICT_EVERY};
use crate::publish;
use crate::redis_feed::{FeedEvent, RedisFeed};
use crate::redis_stream::StreamFeed;

/// Input read per chunk.
const INPUT_CHUNK: usize = 64 * 1024;

/// Reads standard input (`input`), the Redis feed and the Redis stream,
/// if any, and serves the publish listener, if any, each on a thread of
/// its own, and hands over chunks of whole
/// lines of at most `max_line` bytes (and control lines), one at a time,
/// waking `waker` (a supervisor's poll) for each: a source waits while its
/// reader does not take them, which slows its producer down. The channel
/// ends when every source has.
pub fn spawn(
    input: impl Read + Send + 'static,
    (feed, stream): (Option<RedisFeed>, Option<StreamFeed>),
    publish: Option<publish::Listener>,
    max_line: usize,
    waker: Option<Arc<Waker>>,
) -> io::Result<Receiver<Vec<u8>>> {
    let (tx, rx) = mpsc::sync_channel(1);
    if let Some(listener) = publish {
        publish::spawn(listener, tx.clone(), waker.clone())?;
    }
    // What a Redis reader hands over.
    let forward = |tx: SyncSender<Vec<u8>>, waker: Option<Arc<Waker>>| {
        move |event| {
            let chunk = match event {
                FeedEvent::Chunk(chunk) => chunk,
                FeedEvent::Lost => Control::FeedLost.line(),
                FeedEvent::Restored(outage) => Control::FeedRestored(outage).line(),
            };
            hand_over(&tx, waker.as_deref(), chunk)
        }
    };
    if let Some(feed) = feed {
        let on = forward(tx.clone(), waker.clone());
        std::thread::Builder::new()
            .name("redis".into())
            .spawn(move || feed.run(max_line, on))?;
    }
    if let Some(stream) = stream {
        let on = forward(tx.clone(), waker.clone());
        std::thread::Builder::new()
            .name("redis-stream".into())
            .spawn(move || stream.run(max_line, on))?;
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

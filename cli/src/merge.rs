//! Under `--processes` with `--upstream`: the instances' standard outputs
//! merged into the supervisor's (or, with `--upstream redis-stream`,
//! written into the stream by the supervisor, for the host), a whole
//! line at a time, so a line is never cut by another instance's.
//!
//! The supervisor's loop reads each instance's pipe as it becomes readable
//! and passes the complete lines to a writer thread (standard output may
//! block, Redis may be away). The thread holds at most [`CHUNKS`] chunks
//! (and the one it writes): when it is that far behind, the pipes are
//! left unread until it catches up, so the instances fill their pipes and
//! then their own bounds, and pause their clients (or drop their
//! messages, counted, with `--upstream-overflow drop`).

use std::io::{self, Read, Write};
use std::ops::ControlFlow;
use std::sync::mpsc::{self, Receiver as Chunks, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use mio::unix::pipe::Receiver;
use mio::{Interest, Registry, Token, Waker};
use wspush::protocol::lines::Splitter;
use wspush::UpstreamTally;

use crate::upstream::stream::{self, GiveUp};
use crate::upstream::Sink;

/// Chunks of lines the writer thread may hold.
const CHUNKS: usize = 16;
/// Bytes read from a pipe at once.
const READ_CHUNK: usize = 64 * 1024;

/// The token of the output pipe of process `slot` (1-based; see
/// [`Merge::attach`]).
pub fn token(slot: usize) -> Token {
    Token(OUTPUT_TOKENS + slot)
}

/// The process slot of an output token, if it is one.
pub fn slot_of(token: Token) -> Option<usize> {
    token.0.checked_sub(OUTPUT_TOKENS).filter(|&n| n > 0)
}

/// Output pipes' tokens start here.
pub const OUTPUT_TOKENS: usize = 1 << 20;

/// One instance's output: its pipe and its lines (an instance's own lines
/// are not limited: they pass whole, however long).
#[derive(Debug)]
struct Output {
    pipe: Receiver,
    lines: Splitter,
    /// The instance the process serves, for the logs.
    instance: usize,
}

/// The merged output.
#[derive(Debug)]
pub struct Merge {
    /// By process slot − 1.
    outputs: Vec<Option<Output>>,
    writer: Option<SyncSender<Vec<u8>>>,
    thread: Option<JoinHandle<()>>,
    /// When a stream's writer gives up on what Redis did not take: a
    /// grace after the merge is done.
    give_up: GiveUp,
    grace: Duration,
    /// Lines the writer had no room for; while some wait, no pipe is read.
    pending: Option<Vec<u8>>,
}

impl Merge {
    /// Starts the writer thread on `sink` (a stream's writer counts in
    /// `tally`, gives up on what it could not write `grace` after the
    /// merge is done); it wakes `room` each time it takes a chunk.
    pub fn new(
        room: Arc<Waker>,
        sink: Sink,
        tally: Option<UpstreamTally>,
        grace: Duration,
    ) -> io::Result<Merge> {
        let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(CHUNKS);
        let give_up = GiveUp::default();
        let giving_up = give_up.clone();
        let thread = std::thread::Builder::new()
            .name("upstream".into())
            .spawn(move || match (sink, tally) {
                (Sink::Stream(target), Some(tally)) => {
                    let next = |lines: &mut Vec<u8>| match rx.recv() {
                        Ok(chunk) => {
                            *lines = chunk;
                            let _ = room.wake();
                            true
                        }
                        Err(_) => false,
                    };
                    stream::write(*target, tally, next, &giving_up);
                }
                _ => write_stdout(&rx, &room),
            })?;
        Ok(Merge {
            outputs: Vec::new(),
            writer: Some(tx),
            thread: Some(thread),
            pending: None,
            give_up,
            grace,
        })
    }

    /// Takes the output pipe of the process in `slot` (1-based, one per
    /// process alive: an instance's, and during a roll its replacement's),
    /// which serves `instance`.
    pub fn attach(
        &mut self,
        slot: usize,
        instance: usize,
        mut pipe: Receiver,
        registry: &Registry,
    ) -> io::Result<()> {
        pipe.set_nonblocking(true)?;
        registry.register(&mut pipe, token(slot), Interest::READABLE)?;
        if self.outputs.len() < slot {
            self.outputs.resize_with(slot, || None);
        }
        self.outputs[slot - 1] = Some(Output {
            pipe,
            lines: Splitter::new(usize::MAX),
            instance,
        });
        Ok(())
    }

    /// Takes the output pipe of the process in `slot` as an earlier image
    /// of the supervisor left it: with what was read of a line it did not
    /// finish.
    pub fn attach_resumed(
        &mut self,
        slot: usize,
        instance: usize,
        pipe: Receiver,
        unfinished: &[u8],
        registry: &Registry,
    ) -> io::Result<()> {
        self.attach(slot, instance, pipe, registry)?;
        let output = self.outputs[slot - 1].as_mut().expect("attached");
        let _ = output
            .lines
            .split(unfinished, |_| ControlFlow::<()>::Continue(()));
        Ok(())
    }

    /// Stops for the supervisor's next image: passes on what waits, ends
    /// the writer once it wrote it all, and returns each output pipe (by
    /// slot, left registered nowhere) with what was read of a line not
    /// finished; what the pipes hold stays there for the next image.
    pub fn suspend(mut self, registry: &Registry) -> Vec<(usize, Receiver, Vec<u8>)> {
        if let (Some(lines), Some(writer)) = (self.pending.take(), &self.writer) {
            let _ = writer.send(lines);
        }
        self.end_writer();
        (self.outputs.into_iter().enumerate())
            .filter_map(|(i, output)| {
                let mut output = output?;
                let _ = registry.deregister(&mut output.pipe);
                Some((i + 1, output.pipe, output.lines.take_unfinished()))
            })
            .collect()
    }

    /// The process in `slot` is gone: reads what its pipe still holds,
    /// and drops a last line it did not finish.
    pub fn detach(&mut self, slot: usize, registry: &Registry) {
        if let Some(lines) = self.pending.take() {
            self.pass_on(lines, true);
        }
        self.read_all(slot, true);
        if let Some(mut output) = self.outputs.get_mut(slot - 1).and_then(Option::take) {
            let _ = registry.deregister(&mut output.pipe);
            if output.lines.unfinished() > 0 {
                log::warn!(
                    "instance {} ended in the middle of an upstream line: dropped its {} bytes",
                    output.instance,
                    output.lines.unfinished()
                );
            }
        }
    }

    /// The pipe of the process in `slot` is readable: reads it until it
    /// would block (or the writer is full), passing on the complete lines.
    pub fn read(&mut self, slot: usize) {
        self.read_all(slot, false);
    }

    /// Reads the pipe of the process in `slot` until it would block or
    /// ends; unless `block`, stops when the writer is full.
    fn read_all(&mut self, slot: usize, block: bool) {
        let mut buf = [0u8; READ_CHUNK];
        while self.pending.is_none() {
            let Some(output) = self.outputs.get_mut(slot - 1).and_then(Option::as_mut) else {
                return;
            };
            let n = match output.pipe.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    log::warn!("reading instance {}'s output failed: {e}", output.instance);
                    return;
                }
            };
            let mut lines = Vec::new();
            let _ = output.lines.split(&buf[..n], |piece| {
                lines.extend_from_slice(piece.bytes);
                lines.push(b'\n');
                ControlFlow::<()>::Continue(())
            });
            if !lines.is_empty() {
                self.pass_on(lines, block);
            }
        }
    }

    /// The writer has room again: passes on what waited, then reads every
    /// pipe that may hold more.
    pub fn on_room(&mut self) {
        if let Some(lines) = self.pending.take() {
            self.pass_on(lines, false);
        }
        for slot in 1..=self.outputs.len() {
            self.read(slot);
        }
    }

    /// Hands lines to the writer; when it is full, they wait (or, with
    /// `block`, the caller waits for room).
    fn pass_on(&mut self, lines: Vec<u8>, block: bool) {
        let Some(writer) = &self.writer else {
            return;
        };
        if block {
            let _ = writer.send(lines);
            return;
        }
        match writer.try_send(lines) {
            Ok(()) => {}
            Err(TrySendError::Full(lines)) => self.pending = Some(lines),
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Ends the writer once it wrote what it has (or gave up on it after
    /// the grace, Redis away).
    fn end_writer(&mut self) {
        self.writer = None;
        self.give_up.after(self.grace);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    /// Every instance is gone: writes what is left and ends the writer.
    pub fn finish(mut self) {
        if let (Some(lines), Some(writer)) = (self.pending.take(), &self.writer) {
            let _ = writer.send(lines);
        }
        self.end_writer();
    }
}

/// Writes the merged lines to standard output; after a failed write, the
/// lines are dropped, and counted in the log.
fn write_stdout(chunks: &Chunks<Vec<u8>>, room: &Waker) {
    let mut out = io::stdout().lock();
    let mut dropped = 0usize;
    for chunk in chunks {
        if dropped == 0 && out.write_all(&chunk).and_then(|()| out.flush()).is_ok() {
            let _ = room.wake();
            continue;
        }
        if dropped == 0 {
            log::error!(
                "writing to standard output failed: upstream lines are dropped from now on"
            );
        }
        dropped += chunk.iter().filter(|&&b| b == b'\n').count();
        let _ = room.wake();
    }
    if dropped > 0 {
        log::error!("{dropped} upstream lines were dropped: standard output had failed");
    }
}

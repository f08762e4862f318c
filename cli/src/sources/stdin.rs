//! Standard input (`tail -f feed | wspush`), read as whole lines until it
//! ends, or, for a lone server's re-exec, until it is stopped at a line's
//! end ([`Stop`]): the line begun is handed on, and the next image reads
//! on from there.

use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use rustix::event::{poll, PollFd, PollFlags};

use super::source::{Outlet, Source};
use super::stop::{Carried, Stopper};
use crate::chunks::WholeLines;

/// Input read per chunk.
const INPUT_CHUNK: usize = 64 * 1024;

/// Standard input (or any reader, in tests) as a source.
pub struct Stdin<R> {
    input: R,
    /// What an earlier image had read of a line it did not finish.
    begun: Vec<u8>,
    /// How it is stopped.
    stop: Stopping,
}

/// The reader's side of a [`Stop`].
struct Stopping {
    /// The input's descriptor, watched beside `asked`.
    input: OwnedFd,
    /// Readable once a stop is asked; `None` once no [`Stop`] is left
    /// to ask (its end closed).
    asked: Option<UnixStream>,
    /// Where the line begun goes when it stops.
    unfinished: Arc<Mutex<Option<Vec<u8>>>>,
}

/// Stops a [`Stdin`] at a line's end: every line read before is handed
/// over, and what was read of the next is kept (see [`Stop::stop`]).
#[derive(Debug)]
pub struct Stop {
    ask: UnixStream,
    unfinished: Arc<Mutex<Option<Vec<u8>>>>,
}

impl Stop {
    /// Asks the reader to stop. Once its source has ended (its outlet
    /// dropped), [`Stop::unfinished`] holds the line begun.
    pub fn stop(&self) -> io::Result<()> {
        io::Write::write_all(&mut &self.ask, b"s")
    }

    /// What the reader had read of a line it did not finish, once it
    /// stopped (empty if the input had ended before).
    pub fn unfinished(&self) -> Vec<u8> {
        let mut kept = self.unfinished.lock().unwrap_or_else(|e| e.into_inner());
        kept.take().unwrap_or_default()
    }
}

impl Stopper for Stop {
    fn stop(&self) -> io::Result<()> {
        Stop::stop(self)
    }

    fn carry(&self, carried: &mut Carried) {
        carried.unfinished = self.unfinished();
    }
}

impl<R: Read + Send> Stdin<R> {
    /// Reads `input` (whose descriptor is `fd`), beginning with `begun`
    /// (what an earlier image read of a line), until it ends or the
    /// [`Stop`] returned asks.
    pub fn stoppable(input: R, fd: OwnedFd, begun: Vec<u8>) -> io::Result<(Stdin<R>, Stop)> {
        let (ask, asked) = UnixStream::pair()?;
        let unfinished = Arc::new(Mutex::new(None));
        let stopping = Stopping {
            input: fd,
            asked: Some(asked),
            unfinished: Arc::clone(&unfinished),
        };
        let stdin = Stdin {
            input,
            begun,
            stop: stopping,
        };
        let stop = Stop { ask, unfinished };
        Ok((stdin, stop))
    }
}

impl Stopping {
    /// Waits until the input is readable (true) or a stop is asked (false).
    fn wait(&mut self) -> bool {
        let Some(asked) = &self.asked else {
            return true;
        };
        loop {
            let mut fds = [
                PollFd::new(&self.input, PollFlags::IN),
                PollFd::new(asked, PollFlags::IN),
            ];
            match poll(&mut fds, None) {
                Ok(_) if !fds[1].revents().is_empty() => break,
                Ok(_) => return true,
                Err(rustix::io::Errno::INTR) => continue,
                // Reading will tell.
                Err(_) => return true,
            }
        }
        let mut byte = [0u8; 1];
        match (&*asked).read(&mut byte) {
            Ok(1) => false,
            // No stop can be asked any more: the input is read to its end.
            _ => {
                self.asked = None;
                true
            }
        }
    }
}

impl<R: Read + Send> Source for Stdin<R> {
    fn name(&self) -> &'static str {
        "input"
    }

    /// Hands over the input's whole lines until it ends (the last line
    /// ended), the reader is gone, or it is stopped (the line begun is
    /// kept for the [`Stop`]).
    fn run(mut self: Box<Self>, out: Outlet) {
        let mut lines = WholeLines::new(out.max_line());
        let mut buf = vec![0u8; INPUT_CHUNK];
        let mut begun = Vec::new();
        lines.push(&std::mem::take(&mut self.begun), &mut begun);
        if !begun.is_empty() && !out.send(begun) {
            return;
        }
        loop {
            if !self.stop.wait() {
                let unfinished = lines.take_unfinished();
                log::info!(
                    "standard input stopped at a line's end ({} bytes of the next kept)",
                    unfinished.len()
                );
                let kept = &self.stop.unfinished;
                *kept.lock().unwrap_or_else(|e| e.into_inner()) = Some(unfinished);
                return;
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::sync::mpsc;

    #[test]
    fn a_stopped_reader_hands_over_whole_lines_and_keeps_the_one_begun() {
        let (mut feed, input) = UnixStream::pair().unwrap();
        let fd = input.as_fd().try_clone_to_owned().unwrap();
        let (stdin, stop) = Stdin::stoppable(input, fd, b"from bef".to_vec()).unwrap();
        let (tx, rx) = mpsc::sync_channel(16);
        let reader = std::thread::spawn(move || {
            Box::new(stdin).run(Outlet::new(tx, None, 1024));
        });
        io::Write::write_all(&mut feed, b"ore\nsecond\nthi").unwrap();
        let mut got = Vec::new();
        while got != b"from before\nsecond\n" {
            got.extend(rx.recv().unwrap());
        }
        stop.stop().unwrap();
        reader.join().unwrap();
        assert!(rx.recv().is_err(), "nothing more, and the outlet is gone");
        assert_eq!(stop.unfinished(), b"thi");
    }
}

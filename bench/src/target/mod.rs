//! The server under test: something that takes broadcast lines and whose
//! processes can be watched ([`Target`]). A server the bench spawned
//! ([`server::Server`]) is one; a server started by someone else is an
//! [`External`] one, fed through a FIFO; tests embed one. Also here: the
//! supervisor of several processes, and the bench's own bare-epoll
//! reference server, the floor. Built on [`crate::observe`]; the floor
//! speaks [`crate::wire`].

pub mod floor;
pub mod publish;
pub mod server;
pub mod supervisor;

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use crate::observe::procfs::{self, Usage};
use crate::observe::sys;
use crate::Error;

/// A server being measured.
pub trait Target {
    /// Sends one broadcast line (`line` has no newline).
    fn send_line(&mut self, line: &[u8]) -> io::Result<()>;
    /// Sends several lines back to back, each ending in `\n`: one
    /// `write()` where the lines go through a pipe.
    fn send_lines(&mut self, lines: &[u8]) -> io::Result<()> {
        lines
            .split_inclusive(|&b| b == b'\n')
            .try_for_each(|line| self.send_line(line.strip_suffix(b"\n").unwrap_or(line)))
    }
    /// Memory and CPU time of the server's processes.
    fn usage(&self) -> io::Result<Usage>;
    /// An error if the server has gone away.
    fn check_alive(&mut self) -> io::Result<()>;
    /// Kills (SIGKILL) one instance of a server that runs several under a
    /// supervisor (`--processes`); returns its process id.
    fn kill_an_instance(&mut self) -> io::Result<u32> {
        Err(io::Error::other("this server has no instances to kill"))
    }
    /// Asks a supervisor (`--processes`) for a rolling restart (`signal`
    /// `HUP`) or an upgrade (`USR2`); returns its process id.
    fn roll(&mut self, _signal: &str) -> io::Result<u32> {
        Err(io::Error::other("this server has no supervisor to roll"))
    }
    /// Stops the broker the servers read from (a broker outage); lines
    /// sent meanwhile wait in the publisher.
    fn stop_broker(&mut self) -> io::Result<()> {
        Err(io::Error::other("this server reads from no broker"))
    }
    /// Starts the broker again after [`Target::stop_broker`].
    fn start_broker(&mut self) -> io::Result<()> {
        Err(io::Error::other("this server reads from no broker"))
    }
}

/// A server started by someone else: process `pid` (and its descendants)
/// broadcasts every line written into a FIFO (e.g. `wspush ... < FIFO`).
#[derive(Debug)]
pub struct External {
    pid: u32,
    fifo: Option<File>,
}

impl External {
    /// Watches process `pid` and opens `fifo`, if given, for writing (this
    /// blocks until the server has it open for reading). Without a FIFO
    /// the server cannot be sent broadcasts (enough for `echo`).
    pub fn new(pid: u32, fifo: Option<&Path>) -> io::Result<External> {
        if !procfs::is_alive(pid) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no process {pid}"),
            ));
        }
        let fifo = match fifo {
            Some(path) => Some(OpenOptions::new().write(true).open(path)?),
            None => None,
        };
        Ok(External { pid, fifo })
    }
}

impl Target for External {
    fn send_line(&mut self, line: &[u8]) -> io::Result<()> {
        let fifo = self
            .fifo
            .as_mut()
            .ok_or_else(|| io::Error::other("no FIFO to send broadcasts through (--fifo)"))?;
        write_line(fifo, line)
    }

    fn send_lines(&mut self, lines: &[u8]) -> io::Result<()> {
        let fifo = self
            .fifo
            .as_mut()
            .ok_or_else(|| io::Error::other("no FIFO to send broadcasts through (--fifo)"))?;
        fifo.write_all(lines)
    }

    fn usage(&self) -> io::Result<Usage> {
        procfs::tree_usage(self.pid)
    }

    fn check_alive(&mut self) -> io::Result<()> {
        if procfs::is_alive(self.pid) {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "server process {} is gone",
                self.pid
            )))
        }
    }
}

/// Writes `line` and a newline with one `write()` (so that lines from one
/// writer never interleave with another's in a pipe).
pub fn write_line(out: &mut impl Write, line: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line);
    buf.push(b'\n');
    out.write_all(&buf)
}

/// Fails if the run was interrupted or the server died.
pub fn check(server: &mut dyn Target) -> Result<(), Error> {
    if sys::interrupted() {
        return Err(io::Error::from(io::ErrorKind::Interrupted).into());
    }
    Ok(server.check_alive()?)
}

//! The command every instance runs, and what it is started with: its
//! arguments, and the environment that names what it inherits (its
//! number, the descriptors of the host's history, shared words, metrics
//! board and its listener, its status pipe and handover sockets).

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use mio::unix::pipe::Sender;

use crate::host_metrics::{METRICS_FD_ENV, METRICS_SLOT_ENV};

/// The environment variable that tells an instance its number (1-based).
pub const INSTANCE_ENV: &str = "WSPUSH_INSTANCE";
/// The environment variable that names the descriptor of the host's
/// history, which the supervisor writes and its instances read.
pub const HISTORY_FD_ENV: &str = "WSPUSH_HISTORY_FD";
/// The environment variable that names the descriptor of the host's
/// shared words (see `wspush::Config::host_fd`), which the supervisor
/// makes and every instance updates.
pub const HOST_FD_ENV: &str = "WSPUSH_HOST_FD";
/// The environment variable that tells an instance the number of the
/// first input line it reads (the lines before it went to the others):
/// a line's number is its messages' position on every instance.
pub const FIRST_LINE_ENV: &str = "WSPUSH_FIRST_LINE";
/// The environment variable that tells an instance how many processes it
/// had before this one (restarts after a death, replacements in a roll).
pub const RESTARTS_ENV: &str = "WSPUSH_RESTARTS";
/// The environment variable that names the descriptor of the listening
/// socket the supervisor holds for the instance's number: every process
/// of that number serves the same socket, so none of its queued
/// connections is lost when one process replaces another.
pub const LISTEN_FD_ENV: &str = "WSPUSH_LISTEN_FD";
/// The environment variable that names the write end of a pipe on which
/// the instance tells the supervisor it listens (`LISTENING`).
pub const STATUS_FD_ENV: &str = "WSPUSH_STATUS_FD";
/// The environment variable that names the instance's end of its
/// handover control socket: a successor's socket arrives on it (see
/// `wspush::Server::hand_over_on`), and the connections move to it.
pub const CONTROL_FD_ENV: &str = "WSPUSH_CONTROL_FD";
/// The environment variable that names, in a process a roll starts, the
/// socket it takes the connections of the process it replaces over on
/// (see `wspush::Server::take_over`), before it says it listens.
pub const TAKE_OVER_FD_ENV: &str = "WSPUSH_TAKE_OVER_FD";
/// The epoch of positions other hosts give too, if they do (see
/// `Policy::shared_epoch`), in hex.
pub const EPOCH_ENV: &str = "WSPUSH_EPOCH";

/// The command every instance runs.
#[derive(Debug)]
pub(super) struct Program {
    pub(super) path: PathBuf,
    pub(super) args: Vec<OsString>,
    /// The descriptor of the history the instances read.
    pub(super) history_fd: i32,
    /// The descriptor of the host's shared words.
    pub(super) host_fd: i32,
    /// The descriptor of the host's metrics board.
    pub(super) metrics_fd: i32,
    /// The positions' epoch, if other hosts give them too.
    pub(super) shared_epoch: Option<wspush::Epoch>,
    /// The new binary's file, held open while its instances run, so that
    /// `path` (this process's descriptor of it) keeps naming it whatever
    /// is later put on disk.
    pub(super) _binary: Option<std::fs::File>,
}

/// What a process is started with, besides the program.
pub(super) struct Start<'a> {
    pub(super) number: usize,
    /// Processes this instance had before this one.
    pub(super) earlier: u64,
    /// The number of the first line it reads, if the input is open.
    pub(super) first_line: Option<u64>,
    pub(super) capture_output: bool,
    pub(super) listener: &'a OwnedFd,
    /// The write end of its status pipe.
    pub(super) status: &'a OwnedFd,
    /// Its end of its handover control socket.
    pub(super) control: &'a OwnedFd,
    /// The socket it takes its predecessor's connections over on, if a
    /// roll starts it.
    pub(super) take_over: Option<&'a OwnedFd>,
    /// Its slot on the metrics board, if one was free.
    pub(super) metrics_slot: Option<usize>,
}

impl Program {
    /// Starts a process of instance `start.number`: its number in
    /// [`INSTANCE_ENV`], the history's descriptor, its listener's
    /// ([`LISTEN_FD_ENV`]) and status pipe's ([`STATUS_FD_ENV`]), the
    /// number of the first line it reads (if the input is open), its own
    /// process group (a terminal's Ctrl-C reaches only the supervisor,
    /// which forwards it once), SIGINT as its parent-death signal (no
    /// orphans if the supervisor is killed, and no drain holding the
    /// port meanwhile), and a pipe for its input (or
    /// nothing, once the input has ended).
    pub(super) fn spawn(&self, start: &Start<'_>) -> io::Result<(Child, Option<Sender>)> {
        let mut command = Command::new(&self.path);
        command
            .args(&self.args)
            .env(INSTANCE_ENV, start.number.to_string())
            .env(HISTORY_FD_ENV, self.history_fd.to_string())
            .env(HOST_FD_ENV, self.host_fd.to_string())
            .env(LISTEN_FD_ENV, start.listener.as_raw_fd().to_string())
            .env(FIRST_LINE_ENV, start.first_line.unwrap_or(1).to_string())
            .env(RESTARTS_ENV, start.earlier.to_string())
            .stdin(if start.first_line.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(if start.capture_output {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .process_group(0);
        command.env(STATUS_FD_ENV, start.status.as_raw_fd().to_string());
        command.env(CONTROL_FD_ENV, start.control.as_raw_fd().to_string());
        if let Some(take_over) = start.take_over {
            command.env(TAKE_OVER_FD_ENV, take_over.as_raw_fd().to_string());
        }
        if let Some(epoch) = self.shared_epoch {
            command.env(EPOCH_ENV, epoch.to_string());
        }
        if let Some(slot) = start.metrics_slot {
            command.env(METRICS_FD_ENV, self.metrics_fd.to_string());
            command.env(METRICS_SLOT_ENV, slot.to_string());
        }
        wspush::sys::die_with_parent(&mut command, wspush::sys::ParentDeath::Interrupt);
        // Only this child inherits its listener, status pipe and handover
        // sockets: the flags are set back as soon as it is started
        // (nothing else here starts processes meanwhile).
        let passed: Vec<&OwnedFd> = [start.listener, start.status, start.control]
            .into_iter()
            .chain(start.take_over)
            .collect();
        for &fd in &passed {
            wspush::sys::set_inheritable(fd.as_fd(), true)?;
        }
        let spawned = command.spawn();
        for fd in passed {
            wspush::sys::set_inheritable(fd.as_fd(), false)?;
        }
        let mut child = spawned?;
        let input = child.stdin.take().map(Sender::from);
        if let Some(input) = &input {
            input.set_nonblocking(true)?;
        }
        Ok((child, input))
    }
}

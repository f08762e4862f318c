//! A child process by its pid, which an exec of the supervisor keeps (a
//! `std::process::Child` cannot be made again from one).

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use rustix::process::{kill_process, Pid, Signal, WaitOptions};

/// A child process, by its pid: an exec of the supervisor keeps its
/// children, and its next image goes on with them by their pids.
#[derive(Debug)]
pub struct Process(pub u32);

impl Process {
    /// Its pid.
    pub fn id(&self) -> u32 {
        self.0
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.0 as i32).expect("a child's pid is positive")
    }

    /// Kills it (SIGKILL); it is reaped later.
    pub fn kill(&self) -> io::Result<()> {
        Ok(kill_process(self.pid(), Signal::KILL)?)
    }

    /// How it ended, if it did (reaping it).
    pub fn try_wait(&self) -> io::Result<Option<ExitStatus>> {
        let waited = rustix::process::waitpid(Some(self.pid()), WaitOptions::NOHANG)?;
        Ok(waited.map(|(_, status)| ExitStatus::from_raw(status.as_raw())))
    }
}

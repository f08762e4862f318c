//! The machine's CPU around a measurement: marks of every process's CPU
//! time, to tell how much others used in between, and the wait for a
//! quiet machine before a run.

use std::io;
use std::thread;
use std::time::{Duration, Instant};

use crate::observe::{procfs, sys};
use crate::Error;

/// CPU share (of one CPU) that other processes may use during a phase
/// before the report warns that the machine was not quiet.
pub const QUIET_SHARE: f64 = 0.1;

/// Seconds in a row the machine must be quiet for [`wait_quiet`]. The
/// kernel goes on working for tens of seconds after a big run ends (closing
/// its sockets, freeing and handing back their memory), in bursts with
/// quiet seconds between them.
const QUIET_STREAK: u32 = 5;

/// Waits until the machine has been quiet for `QUIET_STREAK` seconds in
/// a row, for at most `limit`.
pub fn wait_quiet(limit: Duration) -> Result<(), Error> {
    let deadline = Instant::now() + limit;
    let mut streak = 0;
    loop {
        let before = CpuMark::take(0, procfs::own_cpu_ns()?)?;
        thread::sleep(Duration::from_secs(1));
        let share = CpuMark::take(0, procfs::own_cpu_ns()?)?.others_since(&before);
        streak = if share <= QUIET_SHARE { streak + 1 } else { 0 };
        if streak >= QUIET_STREAK {
            return Ok(());
        }
        if sys::interrupted() {
            return Err(io::Error::from(io::ErrorKind::Interrupted).into());
        }
        if Instant::now() >= deadline {
            eprintln!(
                "machine still busy ({:.0}% of a CPU) after {limit:?}; going ahead",
                share * 100.0
            );
            return Ok(());
        }
    }
}

/// CPU counters at one moment, to tell how much CPU time processes other
/// than the server and the client used in between two marks.
pub struct CpuMark {
    /// When the mark was taken.
    pub at: Instant,
    /// Busy time of all CPUs.
    pub machine_ns: u64,
    /// Of that, interrupts (mostly softirq: on loopback, the TCP work of
    /// both ends; see [`procfs::MachineCpu`]).
    pub interrupts_ns: u64,
    /// Of that, the `ksoftirqd` threads (softirq work the kernel deferred).
    pub softirq_threads_ns: u64,
    /// CPU time of the client.
    pub client_ns: u64,
    /// CPU time of the server's processes.
    pub server_ns: u64,
}

impl CpuMark {
    /// Marks now, given the server's and the client's CPU time so far.
    pub fn take(server_ns: u64, client_ns: u64) -> io::Result<CpuMark> {
        let machine = procfs::machine_cpu()?;
        Ok(CpuMark {
            at: Instant::now(),
            machine_ns: machine.busy_ns,
            interrupts_ns: machine.interrupts_ns,
            softirq_threads_ns: machine.softirq_threads_ns,
            client_ns,
            server_ns,
        })
    }

    /// Share of one CPU that other processes used since `earlier`
    /// (`ksoftirqd` is not counted: it does the network work of whoever
    /// sends, mostly our own traffic).
    pub fn others_since(&self, earlier: &CpuMark) -> f64 {
        let machine = (self.machine_ns.saturating_sub(self.softirq_threads_ns)).saturating_sub(
            earlier
                .machine_ns
                .saturating_sub(earlier.softirq_threads_ns),
        );
        let ours =
            (self.client_ns + self.server_ns).saturating_sub(earlier.client_ns + earlier.server_ns);
        let wall = self.at.duration_since(earlier.at).as_nanos().max(1);
        machine.saturating_sub(ours) as f64 / wall as f64
    }
}

//! One `push` measurement in progress ([`Run`]): the server, the worker
//! fleet and the warnings, with what every phase uses: the server's and
//! the client's usage, settling, and handling reports while waiting.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::options::PushOptions;
use crate::fleet::coordinator::Fleet;
use crate::observe::cpu::{CpuMark, QUIET_SHARE};
use crate::observe::procfs::{self, Usage};
use crate::target::Target;
use crate::Error;

/// How often the server's liveness is checked while waiting.
pub(super) const CHECK_EVERY: Duration = Duration::from_millis(100);

/// One measurement in progress.
pub(super) struct Run<'a> {
    pub(super) addr: SocketAddr,
    pub(super) target: &'a mut dyn Target,
    pub(super) fleet: Fleet,
    pub(super) options: &'a PushOptions,
    pub(super) label: &'a str,
    pub(super) warnings: Vec<String>,
}

impl Run<'_> {
    /// Memory and CPU of the worker processes (none when they are threads).
    pub(super) fn client_usage(&self) -> io::Result<Option<Usage>> {
        let pids = self.fleet.pids();
        if pids.is_empty() {
            return Ok(None);
        }
        procfs::processes_usage(&pids).map(Some)
    }

    /// CPU time of the client: this process and its worker processes.
    pub(super) fn client_cpu_ns(&self) -> io::Result<u64> {
        let workers = self.client_usage()?.map_or(0, |u| u.cpu_ns);
        Ok(procfs::own_cpu_ns()? + workers)
    }

    /// Waits `duration` (handling reports), then samples the server; warns
    /// if other processes were busy meanwhile (`phase` names the moment).
    pub(super) fn settle(&mut self, duration: Duration, phase: &str) -> Result<Usage, Error> {
        let before = CpuMark::take(self.target.usage()?.cpu_ns, self.client_cpu_ns()?)?;
        self.pump(duration)?;
        let usage = self.target.usage()?;
        let others = CpuMark::take(usage.cpu_ns, self.client_cpu_ns()?)?.others_since(&before);
        self.warn_if_busy(others, phase);
        Ok(usage)
    }

    /// Records a warning if others used more than [`QUIET_SHARE`] of a CPU.
    pub(super) fn warn_if_busy(&mut self, share: f64, phase: &str) {
        if share > QUIET_SHARE {
            self.warnings.push(format!(
                "other processes used {:.0}% of a CPU {phase}: numbers may be disturbed",
                share * 100.0
            ));
        }
    }

    /// Handles reports for `duration`, checking the server now and then.
    pub(super) fn pump(&mut self, duration: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + duration;
        loop {
            self.check()?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            self.fleet.next_report(left.min(CHECK_EVERY))?;
        }
    }

    /// Fails if the run was interrupted or the server died.
    pub(super) fn check(&mut self) -> Result<(), Error> {
        crate::target::check(self.target)
    }
}

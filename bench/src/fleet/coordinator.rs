//! The coordinator's side of the workers: launching them (as processes of
//! this program, or as threads in tests), granting connection attempts
//! (push) or waiting until they are ready (`channels`), collecting their
//! reports, and stopping them.
//!
//! One process may hold at most `RLIMIT_NOFILE` descriptors (20,000 here,
//! and the hard limit cannot be raised), so a million connections need
//! dozens of workers; each gets a share no larger than `--per-worker`.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command as Process, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};
use wspush::sys::ParentDeath;

use crate::client::clients::Counts;
use crate::client::pacing;
use crate::client::receipts::Event;
use crate::fleet::protocol::{self, Command, Plan, Report};
use crate::fleet::worker;
use crate::observe::stats::{Observed, StreamReceipts};
use crate::observe::sys;
use crate::Error;

/// How long workers get to answer `Arm` and `Finish`.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the coordinator checks the server while it waits for
/// receipts workers.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// How often the coordinator logs the receipts workers' setup.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// How workers run.
#[derive(Debug, Clone)]
pub enum Launch {
    /// As `EXE worker` child processes (the normal case: each process has
    /// its own open-file limit).
    Processes {
        /// This program.
        exe: PathBuf,
    },
    /// As threads of this process (tests: every socket counts against one
    /// process's open-file limit).
    Threads,
}

/// A started worker's pipes: its commands in, its reports out, and what
/// to end it by.
pub struct WorkerPipes {
    /// Where its commands go.
    pub input: Box<dyn Write + Send>,
    /// Where its reports come from.
    pub output: Box<dyn Read + Send>,
    /// Its process, when it is one.
    pub process: Option<Child>,
    /// Our end of its socket, when it is a thread (shut down to end it).
    pub socket: Option<UnixStream>,
}

impl Launch {
    /// Starts one worker: `wspush-bench SUBCOMMAND` as a child process
    /// (killed if this process dies), or `entry` on a thread named `name`
    /// over a socket pair.
    pub fn start<R, E>(&self, subcommand: &str, name: &str, entry: E) -> io::Result<WorkerPipes>
    where
        E: FnOnce(UnixStream, UnixStream) -> R + Send + 'static,
        R: Send + 'static,
    {
        match self {
            Launch::Processes { exe } => {
                let mut cmd = Process::new(exe);
                cmd.arg(subcommand)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit());
                wspush::sys::die_with_parent(&mut cmd, ParentDeath::Kill);
                let mut child = cmd.spawn()?;
                let stdin = child.stdin.take().expect("piped");
                let stdout = child.stdout.take().expect("piped");
                Ok(WorkerPipes {
                    input: Box::new(stdin),
                    output: Box::new(stdout),
                    process: Some(child),
                    socket: None,
                })
            }
            Launch::Threads => {
                let (ours, theirs) = UnixStream::pair()?;
                let input = theirs.try_clone()?;
                thread::Builder::new()
                    .name(name.to_string())
                    .spawn(move || entry(input, theirs))?;
                Ok(WorkerPipes {
                    input: Box::new(ours.try_clone()?),
                    socket: Some(ours.try_clone()?),
                    output: Box::new(ours),
                    process: None,
                })
            }
        }
    }
}

/// One worker as the coordinator sees it.
struct Worker {
    commands: Box<dyn Write + Send>,
    process: Option<Child>,
    /// Connections this worker may hold.
    capacity: usize,
    /// Connection attempts granted so far.
    granted: usize,
    /// Its latest counters.
    counts: Counts,
    /// It sent its final report; the end of its output is expected now.
    finished: bool,
    /// A thread worker's end of the command socket, shut down on drop so
    /// that the worker sees the end of its input.
    socket: Option<UnixStream>,
}

/// The running workers of one run; stopped (their connections closed) on
/// drop.
pub struct Fleet {
    workers: Vec<Worker>,
    /// Reports of all workers, tagged with the worker's index; `None` when
    /// a worker's output ended.
    reports: mpsc::Receiver<(usize, Option<io::Result<Report>>)>,
    /// Receipts workers' events that arrived before the last was ready.
    early: VecDeque<Event>,
    started: Instant,
}

/// The setup of a receipts run's connections.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Setup {
    /// Connections open.
    pub open: u64,
    /// Indices of the connections that failed, in order.
    pub failed: Vec<u64>,
    /// Failures by kind.
    pub failures: BTreeMap<String, u64>,
    /// Seconds from the launch until every connection was open or failed.
    pub secs: f64,
}

impl Fleet {
    /// Starts one worker per share of `shares`; worker `i` gets `plan` with
    /// `first_id` moved past the shares before it.
    pub fn launch(launch: &Launch, plan: &Plan, shares: &[usize]) -> Result<Fleet, Error> {
        let (tx, reports) = mpsc::channel();
        let mut workers = Vec::with_capacity(shares.len());
        let mut first_id = plan.first_id;
        for (index, &capacity) in shares.iter().enumerate() {
            let WorkerPipes {
                input: commands,
                output,
                process,
                socket,
            } = launch.start("worker", &format!("worker-{index}"), worker::run)?;
            spawn_report_reader(index, output, tx.clone())?;
            let mut worker = Worker {
                commands,
                process,
                capacity,
                granted: 0,
                counts: Counts::default(),
                finished: false,
                socket,
            };
            let plan = plan.share(first_id, capacity, shares.iter().sum());
            protocol::send(&mut worker.commands, &Command::Plan(plan))?;
            first_id += capacity as u64;
            workers.push(worker);
        }
        Ok(Fleet {
            workers,
            reports,
            early: VecDeque::new(),
            started: Instant::now(),
        })
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether there are no workers.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Process ids of the worker processes (none for threads).
    pub fn pids(&self) -> Vec<u32> {
        self.workers
            .iter()
            .filter_map(|w| w.process.as_ref().map(Child::id))
            .collect()
    }

    /// Connection attempts granted so far.
    pub fn granted(&self) -> usize {
        self.workers.iter().map(|w| w.granted).sum()
    }

    /// The workers' latest counters, added up.
    pub fn counts(&self) -> Counts {
        let mut total = Counts::default();
        for w in &self.workers {
            total.add(&w.counts);
        }
        total
    }

    /// Attempts granted but not yet settled: not yet started by their
    /// worker, or connecting or upgrading.
    pub fn in_flight(&self) -> usize {
        self.workers
            .iter()
            .map(|w| w.granted.saturating_sub(w.counts.started) + w.counts.pending)
            .sum()
    }

    /// Grants `count` more connection attempts, `active` workers at a time
    /// (see [`pacing::grant`]); returns how many were granted (fewer if
    /// the workers are full).
    pub fn open(&mut self, count: usize, active: usize) -> Result<usize, Error> {
        let granted: Vec<usize> = self.workers.iter().map(|w| w.granted).collect();
        let capacity: Vec<usize> = self.workers.iter().map(|w| w.capacity).collect();
        let grants = pacing::grant(&granted, &capacity, count, active);
        let mut total = 0;
        for (w, count) in self.workers.iter_mut().zip(grants) {
            if count > 0 {
                protocol::send(&mut w.commands, &Command::Open { count })?;
                w.granted += count;
                total += count;
            }
        }
        Ok(total)
    }

    /// Tells every worker to give up its pending connections.
    pub fn abandon(&mut self) -> Result<(), Error> {
        self.broadcast(&Command::Abandon)
    }

    /// Waits up to `timeout` for one report; a `Progress` report also
    /// updates the worker's counters. `Ok(None)` if none came. A worker
    /// that failed or ended is an error.
    pub fn next_report(&mut self, timeout: Duration) -> Result<Option<(usize, Report)>, Error> {
        let (index, report) = match self.reports.recv_timeout(timeout) {
            Ok(received) => received,
            Err(RecvTimeoutError::Timeout) => return Ok(None),
            Err(RecvTimeoutError::Disconnected) => return Err("every worker has ended".into()),
        };
        match report {
            // A worker that sent its final report exits; other workers'
            // final reports may still be on their way.
            None if self.workers[index].finished => Ok(None),
            None => Err(format!("worker {index} ended unexpectedly").into()),
            Some(Err(e)) => Err(format!("worker {index}: unreadable report: {e}").into()),
            Some(Ok(Report::Failed(e))) => Err(format!("worker {index} failed: {e}").into()),
            Some(Ok(report)) => {
                match &report {
                    Report::Progress(counts) => self.workers[index].counts = *counts,
                    Report::Final(_) => self.workers[index].finished = true,
                    _ => {}
                }
                Ok(Some((index, report)))
            }
        }
    }

    /// Announces message `seq` to every worker and waits for their
    /// answers; returns, per worker, the connections expected to receive it.
    ///
    /// A worker expecting none reports the message complete at once, maybe
    /// before the others have answered: that report is consumed here, so
    /// the caller must count such workers as done from the start.
    pub fn arm(&mut self, seq: u32, nap_us: u64) -> Result<Vec<u32>, Error> {
        self.broadcast(&Command::Arm { seq, nap_us })?;
        let mut expected: Vec<Option<u32>> = vec![None; self.len()];
        self.collect(|index, report| match report {
            Report::Armed { seq: s, open } if s == seq && expected[index].is_none() => {
                expected[index] = Some(open);
                expected.iter().all(Option::is_some)
            }
            _ => false,
        })?;
        Ok(expected.into_iter().map(|e| e.unwrap_or(0)).collect())
    }

    /// Announces a stream of `count` messages from `first` to every worker
    /// (see [`Fleet::arm`]); returns, per worker, the connections expected
    /// to receive each of them.
    /// `windows`: ranges of its messages whose latency is also kept apart.
    pub fn arm_stream(
        &mut self,
        (first, count): (u32, u32),
        nap_us: u64,
        windows: Vec<(u32, u32)>,
    ) -> Result<Vec<u32>, Error> {
        self.broadcast(&Command::ArmStream {
            first,
            count,
            nap_us,
            windows,
        })?;
        let mut expected: Vec<Option<u32>> = vec![None; self.len()];
        self.collect(|index, report| match report {
            Report::Armed { seq, open } if seq == first && expected[index].is_none() => {
                expected[index] = Some(open);
                expected.iter().all(Option::is_some)
            }
            _ => false,
        })?;
        Ok(expected.into_iter().map(|e| e.unwrap_or(0)).collect())
    }

    /// Ends the armed stream in every worker and merges what they saw of it.
    pub fn end_stream(&mut self, first: u32) -> Result<StreamReceipts, Error> {
        self.broadcast(&Command::EndStream)?;
        let mut done = vec![false; self.len()];
        let mut merged = StreamReceipts::default();
        self.collect(|index, report| match report {
            Report::StreamEnded { first: f, receipts } if f == first && !done[index] => {
                merged.merge(&receipts);
                done[index] = true;
                done.iter().all(|&d| d)
            }
            _ => false,
        })?;
        Ok(merged)
    }

    /// Has every worker drop its open connections and dial them again,
    /// spread over `within_ms` (see [`Command::Storm`]).
    pub fn storm(&mut self, within_ms: u64) -> Result<(), Error> {
        self.broadcast(&Command::Storm { within_ms })
    }

    /// Stops the workers and merges what they observed.
    pub fn finish(&mut self) -> Result<Observed, Error> {
        self.broadcast(&Command::Finish)?;
        let mut done = vec![false; self.len()];
        let mut merged = Observed::default();
        self.collect(|index, report| match report {
            Report::Final(observed) if !done[index] => {
                merged.merge(&observed);
                done[index] = true;
                done.iter().all(|&d| d)
            }
            _ => false,
        })?;
        for w in &mut self.workers {
            if let Some(mut child) = w.process.take() {
                let _ = child.wait();
            }
        }
        Ok(merged)
    }

    /// Waits until every receipts worker is ready, for at most `timeout`,
    /// calling `check` (that the server is alive) now and then; logs
    /// progress to standard error as `label`.
    pub fn wait_ready(
        &mut self,
        timeout: Duration,
        mut check: impl FnMut() -> Result<(), Error>,
        label: &str,
    ) -> Result<Setup, Error> {
        let deadline = Instant::now() + timeout;
        let mut ready = vec![false; self.len()];
        let mut setup = Setup::default();
        let mut logged = Instant::now();
        while ready.iter().any(|&r| !r) {
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "[{label}] the connections were not all open or failed within {timeout:?}"
                )
                .into());
            }
            if now >= logged + LOG_EVERY {
                let counts = self.counts();
                eprintln!("[{label}] {} open, {} failed", counts.open, counts.failed);
                logged = now;
            }
            check()?;
            match self.next_report(CHECK_EVERY)? {
                Some((index, Report::Ready { failed, failures })) if !ready[index] => {
                    ready[index] = true;
                    setup.failed.extend(failed);
                    for (kind, n) in failures {
                        *setup.failures.entry(kind).or_default() += n;
                    }
                }
                Some((_, Report::Event(event))) => self.early.push_back(event),
                _ => {}
            }
        }
        setup.open = self.counts().open as u64;
        setup.secs = self.started.elapsed().as_secs_f64();
        setup.failed.sort_unstable();
        Ok(setup)
    }

    /// The next event of a receipts worker, waiting up to `timeout`.
    pub fn next_event(&mut self, timeout: Duration) -> Result<Option<Event>, Error> {
        if let Some(event) = self.early.pop_front() {
            return Ok(Some(event));
        }
        match self.next_report(timeout)? {
            Some((_, Report::Event(event))) => Ok(Some(event)),
            _ => Ok(None),
        }
    }

    /// Sends `command` to every worker.
    fn broadcast(&mut self, command: &Command) -> Result<(), Error> {
        for w in &mut self.workers {
            protocol::send(&mut w.commands, command)?;
        }
        Ok(())
    }

    /// Feeds reports to `until` until it returns true, for at most
    /// [`ANSWER_TIMEOUT`].
    fn collect(&mut self, mut until: impl FnMut(usize, Report) -> bool) -> Result<(), Error> {
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            if sys::interrupted() {
                return Err("interrupted".into());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("workers did not answer in time".into());
            }
            if let Some((index, report)) = self.next_report(left.min(Duration::from_millis(100)))? {
                if until(index, report) {
                    return Ok(());
                }
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for w in &mut self.workers {
            if let Some(mut child) = w.process.take() {
                // A worker that is still running after its run ended (an
                // error, an interrupt) is of no further use.
                let _ = child.kill();
                let _ = child.wait();
            }
            if let Some(socket) = &w.socket {
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Reads a worker's reports (one JSON line each) on a thread of their
/// own and forwards them tagged with `index`; `None` at their end.
fn spawn_report_reader(
    index: usize,
    output: Box<dyn Read + Send>,
    tx: mpsc::Sender<(usize, Option<io::Result<Report>>)>,
) -> io::Result<()> {
    thread::Builder::new()
        .name(format!("reports-{index}"))
        .spawn(move || {
            for line in BufReader::new(output).lines() {
                let report = line.and_then(|l| protocol::parse(&l));
                let stop = report.is_err();
                if tx.send((index, Some(report))).is_err() || stop {
                    return;
                }
            }
            let _ = tx.send((index, None));
        })?;
    Ok(())
}

//! `--processes N`: a small supervisor process that starts N ordinary
//! single-threaded instances of a server on one address (`SO_REUSEPORT`, so
//! the kernel spreads connections among them), hands each instance every
//! line of its standard input in the same order (whole lines; a line over
//! the limit cut two bytes past it, and a data line's leading 0xFF made
//! 0xFE: [`crate::sources`]), forwards SIGINT/SIGTERM, and keeps the
//! instances running, as nginx's master process does:
//!
//! - **An instance that dies is started again**, after a backoff that
//!   doubles while it keeps dying young ([`MIN_BACKOFF`] to
//!   [`MAX_BACKOFF`]). Its clients reconnect (to the others, or to it);
//!   the others keep their connections. An instance that dies
//!   [`CRASH_LOOP`] times in a row within [`YOUNG`] of its start is a
//!   crash loop: the supervisor stops everything and exits with an error.
//!   With [`OnExit::Stop`], the first death stops everything instead.
//! - **An instance that stops taking its input** (stopped, or far behind)
//!   does not hold back the others: its input waits here, up to
//!   [`Policy::max_backlog`] bytes. Past that bound, or when it has taken
//!   nothing for [`Policy::stall_timeout`] while input waited, it is killed
//!   and started again. The input it had not taken is dropped and logged;
//!   the new instance starts at the next whole line.
//!
//! Input is read as fast as the most advanced instance takes it, so a
//! producer faster than every instance is slowed down (backpressure), not
//! buffered without bound. Every restart is logged with its running count.
//!
//! One thread waits (mio) on the instances' input pipes and on signals;
//! the input comes in chunks of whole lines from reader threads
//! ([`crate::sources`]: standard input, which may be a file, a pipe or a
//! terminal, and the Redis feed), so an instance started again starts at
//! a line. While the feed is lost, an instance started again is told so
//! first. No connection is held here, and nothing polls: the supervisor's
//! CPU and memory stay negligible.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use mio::net::UnixStream;
use mio::unix::pipe::{Receiver, Sender};
use mio::{Events, Interest, Poll, Token, Waker};
use rustix::process::{kill_process, Pid, Signal};
use signal_hook::consts::{SIGCHLD, SIGINT, SIGTERM};

use crate::input::Recorder;
use crate::merge::{self, Merge};
use crate::sources::{Control, CONTROL};

/// The environment variable that tells an instance its number (1-based).
pub const INSTANCE_ENV: &str = "WSPUSH_INSTANCE";
/// The environment variable that names the descriptor of the host's
/// history, which the supervisor writes and its instances read.
pub const HISTORY_FD_ENV: &str = "WSPUSH_HISTORY_FD";
/// The environment variable that tells an instance the number of the
/// first input line it reads (the lines before it went to the others):
/// a line's number is its messages' position on every instance.
pub const FIRST_LINE_ENV: &str = "WSPUSH_FIRST_LINE";

/// The first restart's delay; it doubles with each young death in a row.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// The longest delay before a restart.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// An instance that dies within this time of its start died young.
pub const YOUNG: Duration = Duration::from_secs(5);
/// Young deaths in a row of one instance that make a crash loop.
pub const CRASH_LOOP: u32 = 5;

/// How often the history's messages older than its age bound are dropped.
const EVICT_EVERY: Duration = Duration::from_secs(1);

const SIGNALS: Token = Token(usize::MAX);
/// The poll's one waker: an input reader has a chunk, or the merged
/// output's writer has room again.
const WAKE: Token = Token(usize::MAX - 1);

/// What the supervisor does when an instance exits unasked
/// (`--on-instance-exit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnExit {
    /// Start it again (with backoff; a crash loop stops everything).
    Restart,
    /// Stop every instance and exit with an error.
    Stop,
}

/// How the supervisor keeps its instances.
#[derive(Debug, Clone)]
pub struct Policy {
    /// What to do when an instance dies.
    pub on_exit: OnExit,
    /// Input bytes an instance may have waiting here (beyond what its pipe
    /// holds) before it counts as stuck and is replaced.
    pub max_backlog: usize,
    /// How long an instance may take no input, while some waits for it,
    /// before it counts as stuck and is replaced.
    pub stall_timeout: Duration,
    /// How long instances get to exit after SIGTERM before they are killed.
    pub stop_grace: Duration,
}

/// Why the supervisor stopped with an error.
#[derive(Debug)]
pub enum SupervisorError {
    /// An instance exited unasked, with [`OnExit::Stop`].
    InstanceDied {
        /// Its number.
        instance: usize,
        /// Its process id.
        pid: u32,
        /// How it ended.
        status: ExitStatus,
    },
    /// An instance died [`CRASH_LOOP`] times in a row, each within
    /// [`YOUNG`] of its start.
    CrashLoop {
        /// Its number.
        instance: usize,
        /// How it ended the last time.
        status: ExitStatus,
    },
    /// Starting or watching the instances failed.
    Io(io::Error),
}

/// How a process ended, in words.
struct Ended(ExitStatus);

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0.code(), self.0.signal()) {
            (Some(code), _) => write!(f, "exited with status {code}"),
            (_, Some(signal)) => write!(f, "was killed by signal {signal}"),
            _ => write!(f, "ended ({})", self.0),
        }
    }
}

impl fmt::Display for SupervisorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SupervisorError::InstanceDied {
                instance,
                pid,
                status,
            } => write!(
                f,
                "instance {instance} (pid {pid}) {}; stopped the others",
                Ended(*status)
            ),
            SupervisorError::CrashLoop { instance, status } => write!(
                f,
                "instance {instance} died {CRASH_LOOP} times in a row within {YOUNG:?} of starting \
                 (the last time it {}): stopped the others",
                Ended(*status)
            ),
            SupervisorError::Io(e) => write!(f, "supervising instances failed: {e}"),
        }
    }
}

impl std::error::Error for SupervisorError {}

impl From<io::Error> for SupervisorError {
    fn from(e: io::Error) -> Self {
        SupervisorError::Io(e)
    }
}

/// Input an instance has not taken yet: chunks shared by every instance,
/// the first one partly written.
#[derive(Debug, Default)]
struct Backlog {
    chunks: VecDeque<Rc<[u8]>>,
    /// Bytes of the first chunk already written.
    offset: usize,
    bytes: usize,
}

impl Backlog {
    fn push(&mut self, chunk: Rc<[u8]>) {
        self.bytes += chunk.len();
        self.chunks.push_back(chunk);
    }

    /// Writes as much as `out` takes; returns the bytes written, stopping
    /// at `WouldBlock`.
    fn write_to(&mut self, out: &mut impl Write) -> io::Result<usize> {
        let mut written = 0;
        while let Some(chunk) = self.chunks.front() {
            match out.write(&chunk[self.offset..]) {
                Ok(0) => break,
                Ok(n) => {
                    written += n;
                    self.bytes -= n;
                    self.offset += n;
                    if self.offset == chunk.len() {
                        self.chunks.pop_front();
                        self.offset = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(written)
    }

    /// Drops everything; returns the bytes and the line ends dropped.
    fn clear(&mut self) -> (usize, usize) {
        let lines = self
            .chunks
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let from = if i == 0 { self.offset } else { 0 };
                c[from..].iter().filter(|&&b| b == b'\n').count()
            })
            .sum();
        let bytes = std::mem::take(&mut self.bytes);
        self.chunks.clear();
        self.offset = 0;
        (bytes, lines)
    }
}

/// Where an instance's process is in its life.
#[derive(Debug)]
enum Life {
    /// Running; its input pipe until the input ends.
    Running {
        child: Child,
        input: Option<Sender>,
        started: Instant,
        /// When its pipe last refused input while some waited.
        stalled_since: Option<Instant>,
        /// It was killed for being stuck (its death is not a crash).
        killed_stuck: bool,
    },
    /// Dead, to be started again at this time.
    Waiting { until: Instant },
    /// Exited for good (the server is stopping).
    Gone,
}

/// One instance slot: the same number across restarts.
#[derive(Debug)]
struct Instance {
    number: usize,
    life: Life,
    backlog: Backlog,
    /// Young deaths in a row.
    young_deaths: u32,
    restarts: u64,
}

/// The command every instance runs.
#[derive(Debug)]
struct Program {
    path: PathBuf,
    args: Vec<OsString>,
    /// The descriptor of the history the instances read.
    history_fd: i32,
}

impl Program {
    /// Starts instance `number`: its number in [`INSTANCE_ENV`], the
    /// history's descriptor and the number of the first line it reads
    /// (`first_line`, if the input is open), its own process group (a terminal's Ctrl-C
    /// reaches only the supervisor, which forwards it once), SIGTERM as
    /// its parent-death signal (no orphans if the supervisor is killed),
    /// and a pipe for its input (or nothing, once the input has ended).
    fn spawn(
        &self,
        number: usize,
        first_line: Option<u64>,
        capture_output: bool,
    ) -> io::Result<(Child, Option<Sender>)> {
        let mut command = Command::new(&self.path);
        command
            .args(&self.args)
            .env(INSTANCE_ENV, number.to_string())
            .env(HISTORY_FD_ENV, self.history_fd.to_string())
            .env(FIRST_LINE_ENV, first_line.unwrap_or(1).to_string())
            .stdin(if first_line.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(if capture_output {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .process_group(0);
        wspush::sys::die_with_parent(&mut command, wspush::sys::ParentDeath::Term);
        let mut child = command.spawn()?;
        let input = child.stdin.take().map(Sender::from);
        if let Some(input) = &input {
            input.set_nonblocking(true)?;
        }
        Ok((child, input))
    }
}

/// Running instances and what drives the supervisor.
#[derive(Debug)]
pub struct Supervisor {
    program: Program,
    instances: Vec<Instance>,
    policy: Policy,
    poll: Poll,
    /// Set by the signal handlers; the byte they write wakes the poll.
    signals: [(i32, Arc<AtomicBool>); 3],
    signal_pipe: UnixStream,
    restarts: u64,
    /// The instances' outputs merged line by line, when they write upstream.
    merge: Option<Merge>,
    waker: Arc<Waker>,
    /// While the feed is lost: the control line that says so, for
    /// instances started meanwhile.
    feed_lost: Option<Rc<[u8]>>,
    /// Keeps the messages of the input in the host's history.
    recorder: Recorder,
}

impl Supervisor {
    /// Starts `count` instances of `program args…` (see [`Program::spawn`]).
    /// With `merge_output`, their standard outputs are merged into this
    /// one's, whole lines at a time (see [`Merge`]). The input's messages
    /// are kept in `recorder`'s history before the instances get them.
    pub fn start(
        program: &Path,
        args: &[OsString],
        count: usize,
        policy: Policy,
        merge_output: bool,
        recorder: Recorder,
    ) -> Result<Supervisor, SupervisorError> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKE)?;
        // Registered before any child exists, so no SIGCHLD is missed.
        let (signal_pipe, wake) = std::os::unix::net::UnixStream::pair()?;
        signal_pipe.set_nonblocking(true)?;
        wake.set_nonblocking(true)?;
        let mut signal_pipe = UnixStream::from_std(signal_pipe);
        let signals = [SIGCHLD, SIGINT, SIGTERM].map(|s| (s, Arc::new(AtomicBool::new(false))));
        for (signal, flag) in &signals {
            signal_hook::flag::register(*signal, Arc::clone(flag))?;
            signal_hook::low_level::pipe::register(*signal, wake.try_clone()?)?;
        }
        poll.registry()
            .register(&mut signal_pipe, SIGNALS, Interest::READABLE)?;
        let mut supervisor = Supervisor {
            program: Program {
                path: program.to_path_buf(),
                args: args.to_vec(),
                history_fd: recorder.inheritable_fd()?,
            },
            recorder,
            instances: Vec::with_capacity(count),
            policy,
            poll,
            signals,
            signal_pipe,
            restarts: 0,
            merge: None,
            waker: Arc::new(waker),
            feed_lost: None,
        };
        if merge_output {
            supervisor.merge = Some(Merge::new(count, Arc::clone(&supervisor.waker))?);
        }
        for number in 1..=count {
            let mut instance = Instance {
                number,
                life: Life::Gone,
                backlog: Backlog::default(),
                young_deaths: 0,
                restarts: 0,
            };
            let merge = supervisor.merge.as_mut();
            if let Err(e) = launch(
                &supervisor.program,
                &supervisor.poll,
                &mut instance,
                Some(1),
                merge,
            ) {
                supervisor.kill_all();
                return Err(e.into());
            }
            supervisor.instances.push(instance);
        }
        Ok(supervisor)
    }

    /// The waker of the supervisor's poll, for the input readers.
    pub fn waker(&self) -> Arc<Waker> {
        Arc::clone(&self.waker)
    }

    /// Copies the input, `chunks` of whole lines, to every instance until
    /// it ends (then closes their inputs; instances keep serving), keeps
    /// the instances running as the policy says, and returns once all have
    /// exited after SIGINT/SIGTERM (forwarded to each; success), or with
    /// the error that stopped them.
    pub fn run(mut self, chunks: mpsc::Receiver<Vec<u8>>) -> Result<(), SupervisorError> {
        let mut events = Events::with_capacity(64);
        let mut input_open = true;
        let mut failure = None;
        let mut stop_deadline: Option<Instant> = None;
        let mut next_eviction = Instant::now() + EVICT_EVERY;
        loop {
            let now = Instant::now();
            if now >= next_eviction {
                self.recorder.evict();
                next_eviction = now + EVICT_EVERY;
            }
            if self.take_signal(SIGCHLD) {
                if let Some(error) = self.reap(now, stop_deadline.is_some())? {
                    failure.get_or_insert(error);
                    stop_deadline.get_or_insert_with(|| self.stop_all(now, Signal::INT));
                }
            }
            if stop_deadline.is_none() {
                self.restart_due(now, input_open);
                self.replace_stuck(now);
            }
            if self.instances.iter().all(|i| matches!(i.life, Life::Gone)) {
                break;
            }
            if stop_deadline.is_some_and(|at| now >= at) {
                log::warn!(
                    "instances still running {:?} after SIGTERM: killing them",
                    self.policy.stop_grace
                );
                self.kill_all();
                stop_deadline = Some(now + self.policy.stop_grace);
            }
            // Read more only as fast as the most advanced instance takes
            // it; instances that drain still serve their clients.
            if input_open && self.lead_is_idle() {
                match chunks.try_recv() {
                    Ok(chunk) => {
                        self.deliver(chunk, now);
                        continue;
                    }
                    Err(mpsc::TryRecvError::Empty) => {}
                    Err(mpsc::TryRecvError::Disconnected) => {
                        input_open = false;
                        log::info!("the input ended; instances keep serving");
                    }
                }
            }
            if !input_open {
                self.close_drained_inputs();
            }
            let timeout = self
                .next_deadline(stop_deadline)
                .map_or(next_eviction, |at| at.min(next_eviction))
                .saturating_duration_since(now);
            let timeout = Some(timeout);
            match self.poll.poll(&mut events, timeout) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                result => result?,
            }
            for event in events.iter() {
                match event.token() {
                    SIGNALS => {
                        let mut sink = [0u8; 64];
                        while matches!(self.signal_pipe.read(&mut sink), Ok(n) if n > 0) {}
                        // SIGTERM drains the instances, SIGINT closes
                        // their connections at once; they are forwarded
                        // as they come, so a second one ends them at once.
                        let (term, int) = (self.take_signal(SIGTERM), self.take_signal(SIGINT));
                        let stop = [(term, Signal::TERM), (int, Signal::INT)];
                        for (_, signal) in stop.into_iter().filter(|(taken, _)| *taken) {
                            if stop_deadline.is_some() {
                                log::warn!("second stop signal: the instances exit now");
                            } else {
                                log::info!(
                                    "received a stop signal: stopping {} instances",
                                    self.instances.len()
                                );
                            }
                            let now = Instant::now();
                            let deadline = self.stop_all(now, signal);
                            stop_deadline.get_or_insert(deadline);
                        }
                    }
                    WAKE => self.merge.iter_mut().for_each(Merge::on_room),
                    token => match merge::instance_of(token) {
                        Some(number) => self.merge.iter_mut().for_each(|m| m.read(number)),
                        None => self.flush(token.0, Instant::now()),
                    },
                }
            }
        }
        if let Some(merge) = self.merge.take() {
            merge.finish();
        }
        failure.map_or(Ok(()), Err)
    }

    fn take_signal(&self, signal: i32) -> bool {
        self.signals
            .iter()
            .any(|(s, flag)| *s == signal && flag.swap(false, Ordering::Relaxed))
    }

    /// Whether some running instance has nothing waiting here: the input
    /// may advance. (While none runs, it waits for one to start again.)
    fn lead_is_idle(&self) -> bool {
        self.instances
            .iter()
            .any(|i| matches!(i.life, Life::Running { input: Some(_), .. }) && i.backlog.bytes == 0)
    }

    /// Queues `chunk` for every instance that takes input, and writes it;
    /// notes what a control line says of the feed.
    fn deliver(&mut self, chunk: Vec<u8>, now: Instant) {
        let chunk: Rc<[u8]> = chunk.into();
        if chunk.first() == Some(&CONTROL) {
            let line = chunk.strip_suffix(b"\n").unwrap_or(&chunk);
            self.feed_lost = match Control::parse(line) {
                Some(Control::FeedLost) => Some(Rc::clone(&chunk)),
                _ => None,
            };
        } else {
            self.recorder.record(&chunk);
        }
        for index in 0..self.instances.len() {
            let instance = &mut self.instances[index];
            if !matches!(instance.life, Life::Running { input: Some(_), .. }) {
                continue;
            }
            instance.backlog.push(Rc::clone(&chunk));
            let number = instance.number;
            self.flush(number, now);
        }
    }

    /// Writes instance `number`'s backlog into its pipe, as far as it goes.
    fn flush(&mut self, number: usize, now: Instant) {
        let Some(instance) = self.instances.get_mut(number - 1) else {
            return;
        };
        let Life::Running {
            input: Some(pipe),
            stalled_since,
            child,
            ..
        } = &mut instance.life
        else {
            return;
        };
        match instance.backlog.write_to(pipe) {
            Ok(written) => {
                if written > 0 || instance.backlog.bytes == 0 {
                    *stalled_since = None;
                }
                if instance.backlog.bytes > 0 {
                    stalled_since.get_or_insert(now);
                }
            }
            Err(e) => {
                // It closed its input or died (its SIGCHLD follows).
                let (bytes, lines) = instance.backlog.clear();
                log::warn!(
                    "instance {number} (pid {}) stopped taking input ({e}); dropped {bytes} bytes ({lines} lines) queued for it",
                    child.id()
                );
                if let Life::Running { input, .. } = &mut instance.life {
                    *input = None;
                }
            }
        }
    }

    /// Once the input has ended, closes each pipe whose backlog is written.
    fn close_drained_inputs(&mut self) {
        for instance in &mut self.instances {
            if let Life::Running { input, .. } = &mut instance.life {
                if instance.backlog.bytes == 0 {
                    *input = None;
                }
            }
        }
    }

    /// Kills (to be started again) every instance that is stuck: too much
    /// input waiting, or none taken for the stall timeout.
    fn replace_stuck(&mut self, now: Instant) {
        let policy = &self.policy;
        for instance in &mut self.instances {
            let Life::Running {
                child,
                stalled_since: Some(since),
                killed_stuck: killed @ false,
                ..
            } = &mut instance.life
            else {
                continue;
            };
            let stalled = now.saturating_duration_since(*since);
            let why = if instance.backlog.bytes > policy.max_backlog {
                format!(
                    "has {} bytes of input waiting (the bound is {})",
                    instance.backlog.bytes, policy.max_backlog
                )
            } else if stalled >= policy.stall_timeout {
                format!("has taken no input for {stalled:.1?}")
            } else {
                continue;
            };
            log::warn!(
                "instance {} (pid {}) is stuck: it {why}; killing it to start it again",
                instance.number,
                child.id()
            );
            let _ = child.kill();
            *killed = true;
        }
    }

    /// Records every instance that exited. A requested stop lets them go;
    /// otherwise each is scheduled to start again, or the policy says stop.
    fn reap(&mut self, now: Instant, stopping: bool) -> io::Result<Option<SupervisorError>> {
        let mut error = None;
        for instance in &mut self.instances {
            let Life::Running {
                child,
                started,
                killed_stuck,
                ..
            } = &mut instance.life
            else {
                continue;
            };
            let Some(status) = child.try_wait()? else {
                continue;
            };
            let (number, pid, lived, stuck) =
                (instance.number, child.id(), now - *started, *killed_stuck);
            if let Some(merge) = &mut self.merge {
                merge.detach(number, self.poll.registry());
            }
            let (bytes, lines) = instance.backlog.clear();
            if stopping {
                instance.life = Life::Gone;
                continue;
            }
            let dropped = if bytes > 0 {
                format!("; dropped {bytes} bytes ({lines} lines) of input queued for it")
            } else {
                String::new()
            };
            if self.policy.on_exit == OnExit::Stop {
                log::error!("instance {number} (pid {pid}) {}{dropped}", Ended(status));
                instance.life = Life::Gone;
                error.get_or_insert(SupervisorError::InstanceDied {
                    instance: number,
                    pid,
                    status,
                });
                continue;
            }
            if lived < YOUNG && !stuck {
                instance.young_deaths += 1;
            } else {
                instance.young_deaths = 0;
            }
            if instance.young_deaths >= CRASH_LOOP {
                log::error!(
                    "instance {number} (pid {pid}) {} {lived:.1?} after starting{dropped}",
                    Ended(status)
                );
                instance.life = Life::Gone;
                error.get_or_insert(SupervisorError::CrashLoop {
                    instance: number,
                    status,
                });
                continue;
            }
            let backoff = MIN_BACKOFF
                .saturating_mul(1 << instance.young_deaths.saturating_sub(1).min(10))
                .min(MAX_BACKOFF);
            let cause = if stuck {
                "was replaced for being stuck".to_string()
            } else {
                Ended(status).to_string()
            };
            log::warn!(
                "instance {number} (pid {pid}) {cause} after {lived:.1?}{dropped}; starting it again in {backoff:?}"
            );
            instance.life = Life::Waiting {
                until: now + backoff,
            };
        }
        Ok(error)
    }

    /// Starts again every instance whose backoff is over.
    fn restart_due(&mut self, now: Instant, input_open: bool) {
        for instance in &mut self.instances {
            match instance.life {
                Life::Waiting { until } if now >= until => {}
                _ => continue,
            }
            let merge = self.merge.as_mut();
            let first_line = input_open.then_some(self.recorder.next_line());
            let launched = launch(&self.program, &self.poll, instance, first_line, merge);
            if let (Ok(()), true, Some(line)) = (&launched, input_open, &self.feed_lost) {
                instance.backlog.push(Rc::clone(line));
            }
            instance.restarts += 1;
            self.restarts += 1;
            match &launched {
                Ok(()) => {
                    let Life::Running { child, .. } = &instance.life else {
                        unreachable!("launched")
                    };
                    log::warn!(
                        "instance {} started again (pid {}): restart {} of it, {} in all",
                        instance.number,
                        child.id(),
                        instance.restarts,
                        self.restarts
                    );
                }
                Err(e) => {
                    log::error!(
                        "instance {} could not be started again: {e}; trying again in {MAX_BACKOFF:?}",
                        instance.number
                    );
                    instance.life = Life::Waiting {
                        until: now + MAX_BACKOFF,
                    };
                }
            }
        }
    }

    /// The earliest time the loop must wake without an event.
    fn next_deadline(&self, stop_deadline: Option<Instant>) -> Option<Instant> {
        let policy = &self.policy;
        self.instances
            .iter()
            .filter_map(|i| match &i.life {
                Life::Waiting { until } => Some(*until),
                Life::Running {
                    stalled_since: Some(since),
                    killed_stuck: false,
                    ..
                } => Some(*since + policy.stall_timeout),
                // A killed or exiting process: SIGCHLD wakes the poll.
                _ => None,
            })
            .chain(stop_deadline)
            .min()
    }

    /// Sends `signal` (SIGTERM: drain; SIGINT: close at once) to every
    /// running instance, cancels pending restarts, and returns when to
    /// kill what is left.
    fn stop_all(&mut self, now: Instant, signal: Signal) -> Instant {
        for instance in &mut self.instances {
            match &instance.life {
                Life::Running { child, .. } => {
                    let _ = kill_process(Pid::from_child(child), signal);
                }
                Life::Waiting { .. } => instance.life = Life::Gone,
                Life::Gone => {}
            }
        }
        now + self.policy.stop_grace
    }

    /// Kills every running instance (start-up failed, or the stop grace
    /// is over); they are reaped on their SIGCHLD.
    fn kill_all(&mut self) {
        for instance in &mut self.instances {
            if let Life::Running { child, .. } = &mut instance.life {
                let _ = child.kill();
            }
        }
    }
}

/// Starts `instance`'s process and registers its input pipe.
fn launch(
    program: &Program,
    poll: &Poll,
    instance: &mut Instance,
    first_line: Option<u64>,
    merge: Option<&mut Merge>,
) -> io::Result<()> {
    let (mut child, mut input) = program.spawn(instance.number, first_line, merge.is_some())?;
    if let Some(input) = &mut input {
        poll.registry()
            .register(input, Token(instance.number), Interest::WRITABLE)?;
    }
    if let (Some(merge), Some(output)) = (merge, child.stdout.take()) {
        merge.attach(instance.number, Receiver::from(output), poll.registry())?;
    }
    instance.life = Life::Running {
        child,
        input,
        started: Instant::now(),
        stalled_since: None,
        killed_stuck: false,
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<OsString> {
        vec!["-c".into(), script.into()]
    }

    fn recorder() -> Recorder {
        let history = wspush::SharedHistory::create(&wspush::Config::default()).unwrap();
        Recorder::new(history, crate::input::InputMode::Lines, 1024, 1024)
    }

    fn policy(on_exit: OnExit) -> Policy {
        Policy {
            on_exit,
            max_backlog: 1 << 20,
            stall_timeout: Duration::from_secs(30),
            stop_grace: Duration::from_secs(10),
        }
    }

    #[test]
    fn with_stop_a_dying_instance_stops_the_others_and_is_reported() {
        let script = "if [ \"$WSPUSH_INSTANCE\" = 2 ]; then exit 3; fi; exec sleep 30";
        let supervisor = Supervisor::start(
            Path::new("/bin/sh"),
            &sh(script),
            3,
            policy(OnExit::Stop),
            false,
            recorder(),
        )
        .unwrap();
        let started = Instant::now();
        match supervisor.run(mpsc::channel().1).unwrap_err() {
            SupervisorError::InstanceDied {
                instance, status, ..
            } => {
                assert_eq!((instance, status.code()), (2, Some(3)));
            }
            other => panic!("{other}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the others stopped on SIGTERM"
        );
    }

    /// An instance that keeps dying at once is started again with a
    /// doubling backoff, then the crash loop stops everything.
    #[test]
    fn a_crash_loop_stops_the_server_after_backing_off() {
        let script = "if [ \"$WSPUSH_INSTANCE\" = 2 ]; then exit 3; fi; exec sleep 30";
        let supervisor = Supervisor::start(
            Path::new("/bin/sh"),
            &sh(script),
            2,
            policy(OnExit::Restart),
            false,
            recorder(),
        )
        .unwrap();
        let started = Instant::now();
        let error = supervisor.run(mpsc::channel().1).unwrap_err();
        let took = started.elapsed();
        match error {
            SupervisorError::CrashLoop { instance, status } => {
                assert_eq!((instance, status.code()), (2, Some(3)));
            }
            other => panic!("{other}"),
        }
        // Four restarts after 0.1, 0.2, 0.4 and 0.8 s.
        assert!(took >= Duration::from_millis(1500), "{took:?}");
        assert!(took < Duration::from_secs(10), "{took:?}");
    }

    #[test]
    fn a_backlog_writes_in_order_and_counts_what_it_drops() {
        let mut backlog = Backlog::default();
        backlog.push(Rc::from(&b"ab"[..]));
        backlog.push(Rc::from(&b"c\nd\n"[..]));
        assert_eq!(backlog.bytes, 6);
        let mut out = [0u8; 3];
        let mut slice = &mut out[..];
        assert_eq!(backlog.write_to(&mut slice).unwrap(), 3);
        assert_eq!(&out, b"abc");
        assert_eq!(backlog.bytes, 3);
        assert_eq!(backlog.clear(), (3, 2));
        assert_eq!(backlog.bytes, 0);
    }
}

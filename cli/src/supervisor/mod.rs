//! `--processes N`: a small supervisor process that starts N ordinary
//! single-threaded instances of a server on one address, each on a
//! listening socket of an `SO_REUSEPORT` group that the supervisor holds
//! (so the kernel spreads connections among them, and a process that
//! replaces another takes over the very socket, its queue included),
//! hands each instance every line of its standard input in the same order
//! (whole lines; a line over the limit cut two bytes past it, and a data
//! line's leading 0xFF made 0xFE: [`crate::sources`]), forwards
//! SIGINT/SIGTERM, and keeps the instances running, as nginx's master
//! process does:
//!
//! - **SIGHUP rolls the instances**, one at a time: a new process starts
//!   beside the instance's and, before it says it listens (its status
//!   pipe, [`LISTENING`]), takes the old one's connections over: the
//!   supervisor introduces it to the old process over that one's control
//!   socket ([`CONTROL_FD_ENV`], [`TAKE_OVER_FD_ENV`]), and each open
//!   connection moves with its state and its socket (see
//!   `wspush::Server::take_over`), so no client sees a close. Once it
//!   listens it becomes the instance's process; the old one is sent
//!   SIGUSR1 and hands over what could not move (all of it, if the
//!   handover was refused: a drain without its grace, whose clients
//!   resume on the others, or on it, from the host's history, which is
//!   kept here). The next instance goes on once the new process took
//!   the connections over ([`TOOK_OVER`]), or, when the old one drains,
//!   once it exited.
//!   **SIGUSR2 upgrades**: the binary on disk is opened and run with
//!   `--version` first, then the instances roll to it. A binary that does
//!   not answer, or whose first process exits or does not listen within
//!   [`LISTEN_TIMEOUT`] ([`TAKE_OVER_TIMEOUT`] once it takes connections
//!   over), is refused with a log line, and the instances not replaced
//!   yet keep running.
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
//! One thread waits (mio) on the instances' pipes and on signals;
//! the input comes in chunks of whole lines from reader threads
//! ([`crate::sources`]: standard input, which may be a file, a pipe or a
//! terminal, and the Redis feed), so an instance started again starts at
//! a line. While the feed is lost, an instance started again is told so
//! first. No connection is held here, and nothing polls: the supervisor's
//! CPU and memory stay negligible.

mod asking;
mod feeding;
pub mod image;
mod life;
mod process;
mod program;
mod reexec;
mod roll;
pub use image::RunEnd;

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use mio::net::UnixStream;
use mio::unix::pipe::{Receiver, Sender};
use mio::{Events, Interest, Poll, Token, Waker};
use rustix::process::{kill_process, Signal};
use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM, SIGUSR2};
use slab::Slab;

use crate::binary::{check_binary, Checked, Ended};
use crate::board::{Board, Heard, Word};
use crate::chunks::{Control, CONTROL};
use crate::host_metrics::metrics_slots;
use crate::input::{Recorder, EVICT_EVERY};
use crate::merge::{self, Merge};
use crate::upstream::Sink;
use process::Process;
use program::{Program, Start};
pub use program::{
    CONTROL_FD_ENV, EPOCH_ENV, FIRST_LINE_ENV, HISTORY_FD_ENV, HOST_FD_ENV, INSTANCE_ENV,
    LISTEN_FD_ENV, RESTARTS_ENV, STATUS_FD_ENV, TAKE_OVER_FD_ENV,
};
use wspush::board::Board as MetricsBoard;
use wspush::sys::SharedMemory;
use wspush::UpstreamTally;

/// What an instance writes on its status pipe once it serves its listener.
pub const LISTENING: u8 = b'L';
/// What a process a roll started writes on its status pipe when it
/// begins to take its predecessor's connections over: it then has
/// [`TAKE_OVER_TIMEOUT`] to listen.
pub const TAKING_OVER: u8 = b'T';
/// What a process a roll started writes on its status pipe once it took
/// its predecessor's connections over: that one has nothing left to hand
/// over, and the roll goes on without waiting for it to exit.
pub const TOOK_OVER: u8 = b'O';
/// What an instance writes on its status pipe when it becomes full: new
/// connections are steered to the others.
pub const FULL: u8 = b'F';
/// What an instance writes on its status pipe when it has room again.
pub const ROOM: u8 = b'R';

/// The first restart's delay; it doubles with each young death in a row.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// The longest delay before a restart.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// An instance that dies within this time of its start died young.
pub const YOUNG: Duration = Duration::from_secs(5);
/// Young deaths in a row of one instance that make a crash loop.
pub const CRASH_LOOP: u32 = 5;
/// How long a process a roll starts has to listen before the roll is
/// given up.
pub const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a process a roll starts has to listen once it says it takes
/// connections over ([`TAKING_OVER`]): on a busy host, its predecessor
/// first frames up to its first line and finishes its fan-out.
pub const TAKE_OVER_TIMEOUT: Duration = Duration::from_secs(60);

const SIGNALS: Token = Token(usize::MAX);
/// The poll's one waker: an input reader has a chunk, the merged output's
/// writer has room again, or a new binary's check is done.
const WAKE: Token = Token(usize::MAX - 1);
/// Status pipes' tokens start here (input pipes use the process's key,
/// output pipes [`merge::OUTPUT_TOKENS`] on).
const STATUS_TOKENS: usize = 1 << 21;

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
    /// Where the instances' standard outputs (their upstream lines) go,
    /// merged, if they write upstream: this one's, or a Redis stream.
    pub merge_output: Option<Sink>,
    /// How long the merge's writer still tries to write into a Redis
    /// stream that is away once the instances are gone.
    pub upstream_grace: Duration,
    /// The epoch of the positions, when other hosts give them too (a
    /// stream's): the instances are told ([`EPOCH_ENV`]), so that a
    /// client that comes with a position one of them has not reached yet
    /// waits for it rather than being told `unknown`.
    pub shared_epoch: Option<wspush::Epoch>,
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

    /// What is left to write, in one piece.
    fn bytes_left(&self) -> Vec<u8> {
        let mut left = Vec::with_capacity(self.bytes);
        for (i, chunk) in self.chunks.iter().enumerate() {
            let from = if i == 0 { self.offset } else { 0 };
            left.extend_from_slice(&chunk[from..]);
        }
        left
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

/// What a process of an instance is doing.
#[derive(Debug)]
enum Role {
    /// It is the instance's process.
    Serving,
    /// A roll started it beside the instance's process: it becomes that
    /// once its status pipe says it listens, before `deadline`.
    Starting { deadline: Instant },
    /// Replaced: its connections were taken over (`emptied`: all that
    /// could move), and it hands over what could not (SIGUSR1, a drain
    /// without its grace); killed if still running at `deadline`.
    Retiring { deadline: Instant, emptied: bool },
    /// Killed for being late (to listen, or to hand over): its exit is
    /// only reaped.
    Killed,
}

/// One process of an instance.
#[derive(Debug)]
struct Proc {
    /// The instance it is a process of.
    number: usize,
    child: Process,
    /// Its input pipe, until the input ends.
    input: Option<Sender>,
    /// Input it has not taken yet.
    backlog: Backlog,
    started: Instant,
    /// When its pipe last refused input while some waited.
    stalled_since: Option<Instant>,
    /// It was killed for being stuck (its death is not a crash).
    killed_stuck: bool,
    role: Role,
    /// Where it says it listens ([`LISTENING`]), is full ([`FULL`]) or
    /// has room again ([`ROOM`]), until it ends.
    status: Option<Receiver>,
    /// It said it listens.
    listening: bool,
    /// It said it took its predecessor's connections over.
    took_over: bool,
    /// It reads the history in the layout it had before it was carried
    /// into this build's (it was started by an earlier image).
    reads_former: bool,
    /// Its slot on the metrics board, freed when it is gone.
    metrics_slot: Option<usize>,
    /// It said it is full, and not yet that it has room again.
    full: bool,
    /// Its status pipe's bytes, read into words and stats records.
    heard: Heard,
    /// The supervisor's end of its handover control socket: a
    /// successor's socket is sent on it (see [`CONTROL_FD_ENV`]).
    control: OwnedFd,
    /// Its loop's priority, raised while it hands its connections to a
    /// successor (it notices the successor at once, however busy the
    /// host); set back once the successor listens or the roll is given
    /// up.
    urgent: Option<wspush::sys::Urgent>,
}

/// Where an instance is in its life.
#[derive(Debug)]
enum Life {
    /// Its process (a key of [`Supervisor::procs`]).
    Running(usize),
    /// Dead, to be started again at this time.
    Waiting { until: Instant },
    /// Exited for good (the server is stopping).
    Gone,
}

/// One instance (its number is its place in [`Supervisor::instances`],
/// from 1), and the listener every process of that number serves, across
/// restarts and rolls.
#[derive(Debug)]
struct Instance {
    life: Life,
    /// The listening socket its processes serve, held here.
    listener: OwnedFd,
    /// Young deaths in a row.
    young_deaths: u32,
    restarts: u64,
    /// Processes started for it so far (its first, restarts, and
    /// replacements in rolls).
    processes: u64,
}

/// A rolling restart under way: the instances are replaced one at a time,
/// each by a process that starts and listens beside it before it hands
/// its clients over and exits.
#[derive(Debug)]
struct Roll {
    /// What the new processes run: this binary, or a new one.
    program: Rc<Program>,
    /// The instances not replaced yet, in order.
    left: VecDeque<usize>,
    /// "restart" or "upgrade", for the logs.
    what: &'static str,
}

/// The signals a supervisor handles (held across its re-exec).
pub const SIGNALS_HANDLED: [i32; 5] = [SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR2];

/// The supervisor's signals, registered before anything listens or any
/// child exists (so that no signal is fatal and no SIGCHLD is missed):
/// a flag each, set by its handler, and a pipe whose byte wakes the poll.
#[derive(Debug)]
pub struct Signaled {
    flags: [(i32, Arc<AtomicBool>); 5],
    pipe: UnixStream,
}

impl Signaled {
    /// Registers the handlers of [`SIGNALS_HANDLED`].
    pub fn register() -> io::Result<Signaled> {
        let (pipe, wake) = std::os::unix::net::UnixStream::pair()?;
        pipe.set_nonblocking(true)?;
        wake.set_nonblocking(true)?;
        let flags = SIGNALS_HANDLED.map(|s| (s, Arc::new(AtomicBool::new(false))));
        for (signal, flag) in &flags {
            signal_hook::flag::register(*signal, Arc::clone(flag))?;
            signal_hook::low_level::pipe::register(*signal, wake.try_clone()?)?;
        }
        Ok(Signaled {
            flags,
            pipe: UnixStream::from_std(pipe),
        })
    }
}

/// Running instances and what drives the supervisor.
#[derive(Debug)]
pub struct Supervisor {
    program: Rc<Program>,
    /// The binary on disk, which SIGUSR2 upgrades the instances to.
    on_disk: PathBuf,
    instances: Vec<Instance>,
    /// Every process alive; a key is its input pipe's token.
    procs: Slab<Proc>,
    roll: Option<Roll>,
    /// A new binary's check under way, on its thread.
    checking: Option<mpsc::Receiver<Checked>>,
    /// The instances (0-based) new connections are steered to now, if a
    /// program was attached (see [`Supervisor::steer`]).
    steered: Option<Vec<u32>>,
    policy: Policy,
    poll: Poll,
    /// Set by the signal handlers; the byte they write wakes the poll.
    signals: [(i32, Arc<AtomicBool>); 5],
    signal_pipe: UnixStream,
    restarts: u64,
    /// The instances' outputs merged line by line, when they write upstream.
    merge: Option<Merge>,
    waker: Arc<Waker>,
    /// Feeds (Redis) lost now: an instance started meanwhile is told so.
    feeds_lost: usize,
    /// Keeps the messages of the input in the host's history.
    recorder: Recorder,
    /// The host's shared words, which the instances map.
    _host: SharedMemory,
    /// The host's metrics board, where each process keeps its counters
    /// (see `host_metrics`).
    metrics: MetricsBoard,
    /// What each process holds, as it says, for `GET /stats`.
    board: Board,
    /// Stop the sources for a re-exec of the supervisor.
    stoppers: Vec<Arc<dyn crate::sources::stop::Stopper>>,
    /// A re-exec under way: the input stops, then the supervisor execs.
    pending_reexec: Option<image::Pending>,
    /// Presence questions the processes answer.
    asking: asking::Asking,
}

impl Supervisor {
    /// Starts an instance of `program args…` on each of `listeners` (see
    /// [`Program::spawn`]; the first is instance 1): the supervisor's own
    /// binary is `/proc/self/exe`, which names it whatever is on disk
    /// later. SIGUSR2 upgrades the instances to what is at `on_disk` then.
    /// With [`Policy::merge_output`], their standard outputs are merged into this
    /// one's, whole lines at a time (see [`Merge`]). The input's messages
    /// are kept in `recorder`'s history before the instances get them.
    /// `signaled` holds the signals that came since it was registered.
    pub fn start(
        program: &Path,
        on_disk: PathBuf,
        args: &[OsString],
        listeners: Vec<OwnedFd>,
        policy: Policy,
        recorder: Recorder,
        signaled: Signaled,
    ) -> Result<Supervisor, SupervisorError> {
        let shared = (
            wspush::host_memory()?,
            MetricsBoard::create(metrics_slots(listeners.len()))?,
        );
        let mut supervisor =
            Supervisor::empty(program, on_disk, args, policy, recorder, shared, signaled)?;
        for (index, listener) in listeners.into_iter().enumerate() {
            supervisor.instances.push(Instance {
                life: Life::Gone,
                listener,
                young_deaths: 0,
                restarts: 0,
                processes: 0,
            });
            let program = Rc::clone(&supervisor.program);
            match supervisor.launch(&program, index + 1, Some(1), Role::Serving) {
                Ok(key) => supervisor.instances[index].life = Life::Running(key),
                Err(e) => {
                    supervisor.kill_all();
                    return Err(e.into());
                }
            }
        }
        Ok(supervisor)
    }

    /// A supervisor with no instance yet: its poll, its signals, and the
    /// program its instances run (see [`Supervisor::start`]), with the
    /// host's shared words and metrics board.
    fn empty(
        program: &Path,
        on_disk: PathBuf,
        args: &[OsString],
        policy: Policy,
        recorder: Recorder,
        (host, metrics): (SharedMemory, MetricsBoard),
        signaled: Signaled,
    ) -> Result<Supervisor, SupervisorError> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKE)?;
        let Signaled {
            flags: signals,
            pipe: mut signal_pipe,
        } = signaled;
        poll.registry()
            .register(&mut signal_pipe, SIGNALS, Interest::READABLE)?;
        let mut supervisor = Supervisor {
            program: Rc::new(Program {
                path: program.to_path_buf(),
                args: args.to_vec(),
                history_fd: recorder.inheritable_fd()?,
                host_fd: host.inheritable()?.as_raw_fd(),
                metrics_fd: metrics.inheritable()?.as_raw_fd(),
                shared_epoch: policy.shared_epoch,
                _binary: None,
            }),
            on_disk,
            recorder,
            instances: Vec::new(),
            procs: Slab::new(),
            roll: None,
            checking: None,
            steered: None,
            policy,
            poll,
            signals,
            signal_pipe,
            restarts: 0,
            merge: None,
            waker: Arc::new(waker),
            feeds_lost: 0,
            board: Board::default(),
            _host: host,
            metrics,
            stoppers: Vec::new(),
            pending_reexec: None,
            asking: asking::Asking::default(),
        };
        if let Some(sink) = supervisor.policy.merge_output.clone() {
            // Its writer into Redis counts on the board, as the host.
            let tally = match &sink {
                Sink::Stream(_) => Some(UpstreamTally::on_board(
                    supervisor.metrics.place_own(std::process::id())?,
                )),
                Sink::Stdout => None,
            };
            let (room, grace) = (
                Arc::clone(&supervisor.waker),
                supervisor.policy.upstream_grace,
            );
            supervisor.merge = Some(Merge::new(room, sink, tally, grace)?);
        }
        Ok(supervisor)
    }

    /// The host's metrics board, mapped again (for the thread that
    /// answers the host's `/metrics`).
    pub fn metrics_board(&self) -> io::Result<MetricsBoard> {
        MetricsBoard::open(self.metrics.fd().try_clone_to_owned()?)
    }

    /// What the processes hold, as they say it, for `GET /stats`.
    pub fn stats(&self) -> Board {
        self.board.clone()
    }

    /// The waker of the supervisor's poll, for the input readers.
    pub fn waker(&self) -> Arc<Waker> {
        Arc::clone(&self.waker)
    }

    /// Copies the input, `chunks` of whole lines, to every instance until
    /// it ends (then closes their inputs; instances keep serving), keeps
    /// the instances running as the policy says, rolls them on SIGHUP
    /// (SIGUSR2: to the binary on disk), and returns once all have exited
    /// after SIGINT/SIGTERM (forwarded to each; success), or with the
    /// error that stopped them.
    pub fn run(mut self, chunks: mpsc::Receiver<Vec<u8>>) -> Result<RunEnd, SupervisorError> {
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
                self.advance_roll(now, input_open);
            }
            self.expire(now);
            let all_gone = self.instances.iter().all(|i| matches!(i.life, Life::Gone));
            if all_gone && self.procs.is_empty() {
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
            // Read more only as fast as the most advanced process takes
            // it; processes that drain still serve their clients.
            if input_open && self.lead_is_idle() {
                match chunks.try_recv() {
                    Ok(chunk) => {
                        self.deliver(chunk, now);
                        continue;
                    }
                    Err(mpsc::TryRecvError::Empty) => {}
                    Err(mpsc::TryRecvError::Disconnected) => {
                        input_open = false;
                        if self.pending_reexec.is_none() || stop_deadline.is_some() {
                            log::info!("the input ended; instances keep serving");
                        }
                    }
                }
            }
            if !input_open && stop_deadline.is_none() && self.pending_reexec.is_some() {
                // Every chunk read is queued for the instances.
                return Ok(self.suspend()?);
            }
            if !input_open {
                self.close_drained_inputs();
            }
            let timeout = self
                .next_deadline(stop_deadline)
                .map_or(next_eviction, |at| at.min(next_eviction))
                .saturating_duration_since(now);
            match self.poll.poll(&mut events, Some(timeout)) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                result => result?,
            }
            for event in events.iter() {
                match event.token() {
                    SIGNALS => {
                        let mut sink = [0u8; 64];
                        while matches!(self.signal_pipe.read(&mut sink), Ok(n) if n > 0) {}
                        self.on_signals(&mut stop_deadline);
                    }
                    WAKE => {
                        self.merge.iter_mut().for_each(Merge::on_room);
                        self.on_checked();
                    }
                    Token(t) if t >= STATUS_TOKENS => self.on_status(t - STATUS_TOKENS),
                    token => match merge::slot_of(token) {
                        Some(slot) => self.merge.iter_mut().for_each(|m| m.read(slot)),
                        None => self.flush(token.0, Instant::now()),
                    },
                }
            }
        }
        if let Some(merge) = self.merge.take() {
            merge.finish();
        }
        failure.map_or(Ok(RunEnd::Stopped), Err)
    }

    /// Acts on the signals that arrived: SIGTERM drains the instances,
    /// SIGINT closes their connections at once (each forwarded as it
    /// comes, so a second one ends them at once); SIGHUP rolls them,
    /// SIGUSR2 checks the binary on disk and rolls them to it.
    fn on_signals(&mut self, stop_deadline: &mut Option<Instant>) {
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
            let deadline = self.stop_all(Instant::now(), signal);
            stop_deadline.get_or_insert(deadline);
        }
        let (hup, usr2) = (self.take_signal(SIGHUP), self.take_signal(SIGUSR2));
        if stop_deadline.is_some() {
            return;
        }
        let busy = self.roll.is_some() || self.checking.is_some() || self.pending_reexec.is_some();
        if (hup || usr2) && busy {
            log::warn!("a restart or upgrade is under way: SIGHUP/SIGUSR2 ignored");
            return;
        }
        if usr2 {
            self.check_binary();
        } else if hup {
            log::info!(
                "SIGHUP: restarting the {} instances one at a time",
                self.instances.len()
            );
            self.roll = Some(Roll {
                program: Rc::clone(&self.program),
                left: (1..=self.instances.len()).collect(),
                what: "restart",
            });
        }
    }

    fn take_signal(&self, signal: i32) -> bool {
        self.signals
            .iter()
            .any(|(s, flag)| *s == signal && flag.swap(false, Ordering::Relaxed))
    }

    /// The earliest time the loop must wake without an event.
    fn next_deadline(&self, stop_deadline: Option<Instant>) -> Option<Instant> {
        let policy = &self.policy;
        let waiting = self.instances.iter().filter_map(|i| match &i.life {
            Life::Waiting { until } => Some(*until),
            _ => None,
        });
        let procs = self.procs.iter().filter_map(|(_, p)| match &p.role {
            Role::Serving => p.stalled_since.map(|since| since + policy.stall_timeout),
            Role::Starting { deadline, .. } | Role::Retiring { deadline, .. } => Some(*deadline),
            Role::Killed => None,
        });
        waiting.chain(procs).chain(stop_deadline).min()
    }
}

impl Proc {
    /// Takes in one byte of what it says on its status pipe; returns
    /// whether it became full (`Some(true)`) or has room again.
    fn hear(&mut self, byte: u8) -> Option<bool> {
        match byte {
            LISTENING => self.listening = true,
            TAKING_OVER => {
                if let Role::Starting { deadline } = &mut self.role {
                    *deadline = Instant::now() + TAKE_OVER_TIMEOUT;
                }
                return None;
            }
            TOOK_OVER => {
                self.took_over = true;
                return None;
            }
            FULL if !self.full => self.full = true,
            ROOM if self.full => self.full = false,
            _ => return None,
        }
        (byte != LISTENING).then_some(self.full)
    }
}

/// A pipe for a process to say it listens: the read end (non-blocking,
/// for the poll) and the write end, to pass on.
fn status_pipe() -> io::Result<(Receiver, OwnedFd)> {
    let (reader, writer) = io::pipe()?;
    let reader = Receiver::from(OwnedFd::from(reader));
    reader.set_nonblocking(true)?;
    Ok((reader, OwnedFd::from(writer)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<OsString> {
        vec!["-c".into(), script.into()]
    }

    fn recorder() -> Recorder {
        let history = wspush::SharedHistory::create(&wspush::Config::default()).unwrap();
        Recorder::new(history, crate::input::InputMode::Lines, 1024).unwrap()
    }

    fn listeners(count: usize) -> Vec<OwnedFd> {
        let first = wspush::listen("127.0.0.1:0".parse().unwrap(), true).unwrap();
        let addr = first.local_addr().unwrap();
        let rest = (1..count).map(|_| wspush::listen(addr, true).unwrap());
        std::iter::once(first)
            .chain(rest)
            .map(OwnedFd::from)
            .collect()
    }

    fn policy(on_exit: OnExit) -> Policy {
        Policy {
            on_exit,
            max_backlog: 1 << 20,
            stall_timeout: Duration::from_secs(30),
            stop_grace: Duration::from_secs(10),
            merge_output: None,
            upstream_grace: Duration::from_secs(5),
            shared_epoch: None,
        }
    }

    #[test]
    fn with_stop_a_dying_instance_stops_the_others_and_is_reported() {
        let script = "if [ \"$WSPUSH_INSTANCE\" = 2 ]; then exit 3; fi; exec sleep 30";
        let supervisor = Supervisor::start(
            Path::new("/bin/sh"),
            "/bin/sh".into(),
            &sh(script),
            listeners(3),
            policy(OnExit::Stop),
            recorder(),
            Signaled::register().unwrap(),
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
            "/bin/sh".into(),
            &sh(script),
            listeners(2),
            policy(OnExit::Restart),
            recorder(),
            Signaled::register().unwrap(),
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

//! The clients of the `channels` measurements: connections that each ask
//! for a URL of their own (`/?id=u17&channel=c3`), held by worker
//! processes of this program (`wspush-bench channels-worker`, each within
//! its open-file limit) that report every message a connection receives
//! back over a pipe: which connection, the message's sequence number and
//! send time, and when it arrived. The coordinator ([`Swarm`]) judges what
//! was right; a worker only counts failures.
//!
//! A worker reads its [`SwarmPlan`] as the first line of its standard
//! input, opens its connections at its share of the rate, reports
//! [`Report::Ready`] once every one is open or failed, then reports
//! receipts (in batches: at most a millisecond late, or 1,024 at a time)
//! until its standard input ends, and exits.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr};
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token, Waker};
use serde::{Deserialize, Serialize};

use crate::client::clients::{EVENTS_PER_POLL, SCRATCH_BYTES, WAKER};
use crate::client::conn::{Check, Conn, Context, Transition};
use crate::client::dial::{self, Failure};
use crate::client::pacing::{self, Schedule};
use crate::fleet::coordinator::{spawn_report_reader, Launch, WorkerPipes};
use crate::fleet::protocol;
use crate::observe::sys;
use crate::target::Target;
use crate::wire::frame::Frame;
use crate::wire::message;
use crate::Error;

/// Receipts a worker holds back at most before reporting them.
const BATCH: usize = 1024;

/// How long a receipt waits at most before it is reported.
const BATCH_DELAY: Duration = Duration::from_millis(1);

/// How often a worker reports its setup progress.
const PROGRESS_EVERY: Duration = Duration::from_millis(50);

/// How long a worker blocks when nothing is happening.
const IDLE_POLL: Duration = Duration::from_millis(100);

/// How often the coordinator checks the server while it waits.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// How often the coordinator logs the setup's progress.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// The path each connection asks for, by its index `i` (from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Paths {
    /// `/`.
    Plain,
    /// `/?id=u{i}`.
    Id,
    /// `/?id=u{i}&channel=c{i % channels}`.
    IdChannel {
        /// Channels in all.
        channels: u64,
    },
    /// `/?id=u{i}` and `per` channels `c{(i + k * step) % channels}` for
    /// `k` in `0..per` (distinct when `k * step % channels` is for `k <
    /// per`, as for 10, 7919 and 1000).
    IdChannels {
        /// Channels per connection.
        per: u32,
        /// Channels in all.
        channels: u64,
        /// Step between a connection's channels.
        step: u64,
    },
    /// `/?channel=hot` for `subscribers` of the `total` connections,
    /// spread evenly (see [`spread`]); `/` for the others.
    Hot {
        /// Connections on `hot`.
        subscribers: u64,
        /// All connections.
        total: u64,
    },
    /// `/?channel=ch{i}`: a channel of its own.
    OwnChannel,
}

impl Paths {
    /// The path of connection `i`.
    pub fn path(&self, i: u64) -> String {
        match *self {
            Paths::Plain => "/".into(),
            Paths::Id => format!("/?id=u{i}"),
            Paths::IdChannel { channels } => format!("/?id=u{i}&channel=c{}", i % channels.max(1)),
            Paths::IdChannels {
                per,
                channels,
                step,
            } => {
                let mut path = format!("/?id=u{i}");
                for k in 0..u64::from(per) {
                    let channel = (i + k * step) % channels.max(1);
                    write!(path, "&channel=c{channel}").expect("writing to a String");
                }
                path
            }
            Paths::Hot { subscribers, total } if spread(i, subscribers, total) => {
                "/?channel=hot".into()
            }
            Paths::Hot { .. } => "/".into(),
            Paths::OwnChannel => format!("/?channel=ch{i}"),
        }
    }
}

/// Whether `i` is one of `count` indices spread evenly over `0..total`:
/// exactly `min(count, total)` of them are.
pub fn spread(i: u64, count: u64, total: u64) -> bool {
    let count = count.min(total);
    total > 0 && (i + 1) * count / total > i * count / total
}

/// What one worker connects to, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwarmPlan {
    /// The server.
    pub server: SocketAddr,
    /// Source addresses; connection `i` binds `sources[i % len]`.
    pub sources: Vec<Ipv4Addr>,
    /// The path of each connection.
    pub paths: Paths,
    /// Index of the worker's first connection.
    pub first: u64,
    /// Connections of the worker.
    pub count: u64,
    /// Connections started per second.
    pub rate: f64,
    /// Most connections connecting or upgrading at once.
    pub max_in_flight: usize,
    /// How long a connection may stay connecting or upgrading, in ms.
    pub connect_timeout_ms: u64,
    /// Size of every message payload ([`message::encode`]).
    pub payload_bytes: usize,
}

/// One message received: connection index, sequence number, send time (from
/// the payload) and receipt time, both [`sys::now_ns`].
pub type Receipt = (u64, u32, u64, u64);

/// Worker → coordinator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Report {
    /// Setup progress.
    Progress {
        /// Connections open.
        open: u64,
        /// Connections failed.
        failed: u64,
    },
    /// Every connection is open or failed.
    Ready {
        /// Connections open.
        open: u64,
        /// Indices of the connections that failed.
        failed: Vec<u64>,
        /// Failures by kind ([`Failure::label`]).
        failures: BTreeMap<String, u64>,
    },
    /// Messages received, in the order each connection read them.
    Got(Vec<Receipt>),
    /// An open connection failed.
    Lost {
        /// Its index.
        conn: u64,
        /// Why ([`Failure::label`]).
        why: String,
    },
    /// A connection received a payload that is not a message.
    Corrupt {
        /// Its index.
        conn: u64,
    },
    /// The worker stopped because of an error.
    Failed(String),
}

/// Runs a worker: its plan and then the end of its input from `input`,
/// reports to `output`.
pub fn worker(input: impl Read + Send + 'static, mut output: impl Write) -> Result<(), Error> {
    let mut input = BufReader::new(input);
    let mut first = String::new();
    input.read_line(&mut first)?;
    let plan: SwarmPlan = protocol::parse(&first)?;
    let needed = plan.count as usize + 64;
    let limit = wspush::sys::raise_open_file_limit()? as usize;
    if needed > limit {
        return Err(format!(
            "{} connections need {needed} open files, the limit is {limit}",
            plan.count
        )
        .into());
    }
    let mut set = ConnSet::new(plan)?;
    let ended = Arc::new(AtomicBool::new(false));
    let waker = Waker::new(set.poll.registry(), WAKER)?;
    let flag = Arc::clone(&ended);
    thread::Builder::new().name("input".into()).spawn(move || {
        let _ = io::copy(&mut input, &mut io::sink());
        flag.store(true, Ordering::Relaxed);
        let _ = waker.wake();
    })?;
    match set.serve(&ended, &mut output) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = protocol::send(&mut output, &Report::Failed(e.to_string()));
            Err(e)
        }
    }
}

/// The `channels` check: every message's receipt, for the coordinator
/// to judge.
struct Receipts<'a> {
    paths: Paths,
    payload_bytes: usize,
    got: &'a mut Vec<Receipt>,
    out: &'a mut Vec<Report>,
}

impl Check for Receipts<'_> {
    fn deflate(&self) -> bool {
        false
    }

    fn path(&self, id: u64, _next_seq: u32) -> String {
        self.paths.path(id)
    }

    fn message(&mut self, id: u64, f: &Frame<'_>, _: &mut u32, now: u64) -> Result<(), Failure> {
        match message::decode(f.payload, self.payload_bytes) {
            Some(stamp) => self.got.push((id, stamp.seq, stamp.sent_ns, now)),
            None => self.out.push(Report::Corrupt { conn: id }),
        }
        Ok(())
    }
}

/// A worker's connections.
struct ConnSet {
    poll: Poll,
    events: Events,
    conns: Vec<Conn>,
    scratch: Box<[u8]>,
    plan: SwarmPlan,
    /// Connections that were pending when last looked at, oldest first.
    pending_since: VecDeque<(usize, Instant)>,
    pending: usize,
    open: usize,
    failed: Vec<u64>,
    failures: BTreeMap<String, u64>,
    got: Vec<Receipt>,
    got_since: Option<Instant>,
    out: Vec<Report>,
}

impl ConnSet {
    fn new(plan: SwarmPlan) -> io::Result<ConnSet> {
        if plan.sources.is_empty() {
            return Err(io::Error::other("a plan needs a source address"));
        }
        Ok(ConnSet {
            poll: Poll::new()?,
            events: Events::with_capacity(EVENTS_PER_POLL),
            conns: Vec::with_capacity(plan.count as usize),
            scratch: vec![0; SCRATCH_BYTES].into_boxed_slice(),
            plan,
            pending_since: VecDeque::new(),
            pending: 0,
            open: 0,
            failed: Vec::new(),
            failures: BTreeMap::new(),
            got: Vec::new(),
            got_since: None,
            out: Vec::new(),
        })
    }

    fn fail(&mut self, id: u64, failure: &Failure) {
        self.failed.push(id);
        *self.failures.entry(failure.label()).or_default() += 1;
    }

    /// Starts `count` more connections.
    fn start(&mut self, count: usize) {
        let now = Instant::now();
        for _ in 0..count {
            let index = self.conns.len();
            let id = self.plan.first + index as u64;
            let source = self.plan.sources[id as usize % self.plan.sources.len()];
            let path = self.plan.paths.path(id);
            let dialed = dial::dial_path(
                source,
                self.plan.server,
                id,
                dial::Ask {
                    path: &path,
                    deflate: false,
                },
                self.poll.registry(),
                Token(index),
                Interest::READABLE,
            );
            match dialed {
                Ok(d) => {
                    self.conns.push(Conn::dialed(d));
                    self.pending_since.push_back((index, now));
                    self.pending += 1;
                }
                Err(failure) => {
                    self.conns.push(Conn::dead());
                    self.fail(id, &failure);
                }
            }
        }
    }

    /// Opens the connections, then reports receipts until `ended`.
    fn serve(&mut self, ended: &AtomicBool, output: &mut impl Write) -> Result<(), Error> {
        let count = self.plan.count as usize;
        let schedule = Schedule::new(self.plan.rate.max(1e-3), self.plan.count);
        let start = Instant::now();
        let mut ready = false;
        let mut last_progress = start;
        let mut reported = (0, 0);
        loop {
            if ended.load(Ordering::Relaxed) {
                return self.flush(output);
            }
            let now = Instant::now();
            if self.conns.len() < count {
                let due = schedule.due(now - start) as usize;
                let room = self.plan.max_in_flight.max(1).saturating_sub(self.pending);
                self.start(due.saturating_sub(self.conns.len()).min(room));
            }
            if !ready && self.conns.len() == count && self.pending == 0 {
                ready = true;
                self.flush(output)?;
                protocol::send(
                    output,
                    &Report::Ready {
                        open: self.open as u64,
                        failed: self.failed.clone(),
                        failures: self.failures.clone(),
                    },
                )?;
            } else if !ready && now >= last_progress + PROGRESS_EVERY {
                let progress = (self.open as u64, self.failed.len() as u64);
                if progress != reported {
                    protocol::send(
                        output,
                        &Report::Progress {
                            open: progress.0,
                            failed: progress.1,
                        },
                    )?;
                    reported = progress;
                }
                last_progress = now;
            }
            for report in self.out.drain(..) {
                protocol::send(output, &report)?;
            }
            let flush_at = self.got_since.map(|t| t + BATCH_DELAY);
            if self.got.len() >= BATCH || flush_at.is_some_and(|t| now >= t) {
                self.flush(output)?;
            }
            let timeout = if self.conns.len() < count {
                Duration::from_millis(1)
            } else if let Some(t) = self.got_since.map(|t| t + BATCH_DELAY) {
                t.saturating_duration_since(now)
            } else if !ready {
                Duration::from_millis(10)
            } else {
                IDLE_POLL
            };
            self.step(timeout)?;
        }
    }

    /// Reports the receipts held back.
    fn flush(&mut self, output: &mut impl Write) -> Result<(), Error> {
        for report in self.out.drain(..) {
            protocol::send(output, &report)?;
        }
        if !self.got.is_empty() {
            protocol::send(output, &Report::Got(std::mem::take(&mut self.got)))?;
        }
        self.got_since = None;
        Ok(())
    }

    /// Waits up to `timeout` for readiness and handles it, then fails the
    /// connections pending for too long.
    fn step(&mut self, timeout: Duration) -> io::Result<()> {
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e),
        }
        let had = self.got.len();
        let mut failed = Vec::new();
        {
            let ConnSet {
                poll,
                events,
                conns,
                scratch,
                plan,
                pending,
                open,
                got,
                out,
                ..
            } = self;
            let mut cx = Context {
                registry: poll.registry(),
                servers: std::slice::from_ref(&plan.server),
                scratch,
                check: Receipts {
                    paths: plan.paths,
                    payload_bytes: plan.payload_bytes,
                    got,
                    out,
                },
            };
            for event in events.iter() {
                let token = event.token();
                if token == WAKER {
                    continue;
                }
                let conn = &mut conns[token.0];
                let was_open = conn.is_open();
                let id = plan.first + token.0 as u64;
                match conn.on_event(id, token, event, &mut cx) {
                    Ok(Transition::Same) => {}
                    Ok(Transition::Opened) => {
                        *pending -= 1;
                        *open += 1;
                    }
                    Err(failure) => {
                        if was_open {
                            *open -= 1;
                            cx.check.out.push(Report::Lost {
                                conn: id,
                                why: failure.label(),
                            });
                        } else {
                            *pending -= 1;
                            failed.push((id, failure));
                        }
                        conn.kill();
                    }
                }
            }
        }
        for (id, failure) in failed {
            self.fail(id, &failure);
        }
        if self.got.len() > had && self.got_since.is_none() {
            self.got_since = Some(Instant::now());
        }
        self.expire(Instant::now());
        Ok(())
    }

    /// Fails the connections pending for longer than the connect timeout
    /// (they started in order: only the front of the queue is looked at).
    fn expire(&mut self, now: Instant) {
        let timeout = Duration::from_millis(self.plan.connect_timeout_ms);
        while let Some(&(index, since)) = self.pending_since.front() {
            let conn = &mut self.conns[index];
            if conn.is_pending() {
                if now.duration_since(since) < timeout {
                    return;
                }
                conn.kill();
                self.pending -= 1;
                self.fail(self.plan.first + index as u64, &Failure::Timeout);
            }
            self.pending_since.pop_front();
        }
    }
}

/// What a worker reported after its setup.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Messages received.
    Got(Vec<Receipt>),
    /// An open connection failed.
    Lost {
        /// Its index.
        conn: u64,
        /// Why.
        why: String,
    },
    /// A connection received a payload that is not a message.
    Corrupt {
        /// Its index.
        conn: u64,
    },
}

/// The setup of a [`Swarm`]'s connections.
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

/// One worker as the coordinator sees it.
struct Handle {
    input: Option<Box<dyn Write + Send>>,
    process: Option<Child>,
    /// A thread worker's end of its socket, shut down on drop.
    socket: Option<UnixStream>,
}

/// The client workers of one measurement; stopped (their connections
/// closed) on drop.
pub struct Swarm {
    workers: Vec<Handle>,
    reports: mpsc::Receiver<(usize, Option<io::Result<Report>>)>,
    /// What arrived before the last worker was ready.
    early: VecDeque<Event>,
    started: Instant,
}

impl Swarm {
    /// Starts enough workers, each with at most `per_worker` of `plan`'s
    /// connections (`plan.first` onwards) and its share of the rate.
    pub fn launch(launch: &Launch, plan: &SwarmPlan, per_worker: usize) -> Result<Swarm, Error> {
        let count = plan.count as usize;
        let parts = count.div_ceil(per_worker.max(1)).max(1);
        let (tx, reports) = mpsc::channel();
        let mut workers = Vec::with_capacity(parts);
        let mut first = plan.first;
        for (index, share) in pacing::split_evenly(count, parts).into_iter().enumerate() {
            let fraction = share as f64 / count.max(1) as f64;
            let own = SwarmPlan {
                first,
                count: share as u64,
                rate: plan.rate * fraction,
                max_in_flight: ((plan.max_in_flight as f64 * fraction).ceil() as usize).max(1),
                ..plan.clone()
            };
            first += share as u64;
            let WorkerPipes {
                mut input,
                output,
                process,
                socket,
            } = launch.start("channels-worker", &format!("swarm-{index}"), worker)?;
            spawn_report_reader(index, output, tx.clone())?;
            protocol::send(&mut input, &own)?;
            workers.push(Handle {
                input: Some(input),
                process,
                socket,
            });
        }
        Ok(Swarm {
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

    /// Waits until every worker is ready, for at most `timeout`, checking
    /// the server now and then; logs progress to standard error as `label`.
    pub fn wait_ready(
        &mut self,
        timeout: Duration,
        server: &mut dyn Target,
        label: &str,
    ) -> Result<Setup, Error> {
        let deadline = Instant::now() + timeout;
        let mut ready: Vec<Option<Setup>> = vec![None; self.len()];
        let mut progress = vec![(0u64, 0u64); self.len()];
        let mut logged = Instant::now();
        while ready.iter().any(Option::is_none) {
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "[{label}] the connections were not all open or failed within {timeout:?}"
                )
                .into());
            }
            if now >= logged + LOG_EVERY {
                let (open, failed) = progress
                    .iter()
                    .fold((0, 0), |(o, f), &(a, b)| (o + a, f + b));
                eprintln!("[{label}] {open} open, {failed} failed");
                logged = now;
            }
            check(server)?;
            let Some((index, report)) = self.next_report(CHECK_EVERY)? else {
                continue;
            };
            match report {
                Report::Progress { open, failed } => progress[index] = (open, failed),
                Report::Ready {
                    open,
                    failed,
                    failures,
                } => {
                    progress[index] = (open, failed.len() as u64);
                    ready[index] = Some(Setup {
                        open,
                        failed,
                        failures,
                        secs: 0.0,
                    });
                }
                other => {
                    if let Some(event) = event_of(other) {
                        self.early.push_back(event);
                    }
                }
            }
        }
        let mut setup = Setup {
            secs: self.started.elapsed().as_secs_f64(),
            ..Setup::default()
        };
        for part in ready.into_iter().flatten() {
            setup.open += part.open;
            setup.failed.extend(part.failed);
            for (kind, n) in part.failures {
                *setup.failures.entry(kind).or_default() += n;
            }
        }
        setup.failed.sort_unstable();
        Ok(setup)
    }

    /// The next event, waiting up to `timeout`.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Event>, Error> {
        if let Some(event) = self.early.pop_front() {
            return Ok(Some(event));
        }
        match self.next_report(timeout)? {
            Some((_, report)) => Ok(event_of(report)),
            None => Ok(None),
        }
    }

    fn next_report(&mut self, timeout: Duration) -> Result<Option<(usize, Report)>, Error> {
        match self.reports.recv_timeout(timeout) {
            Ok((index, None)) => Err(format!("client worker {index} ended unexpectedly").into()),
            Ok((index, Some(Err(e)))) => {
                Err(format!("client worker {index}: unreadable report: {e}").into())
            }
            Ok((index, Some(Ok(Report::Failed(e))))) => {
                Err(format!("client worker {index} failed: {e}").into())
            }
            Ok((index, Some(Ok(report)))) => Ok(Some((index, report))),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err("every client worker has ended".into()),
        }
    }
}

impl Drop for Swarm {
    fn drop(&mut self) {
        for w in &mut self.workers {
            // The end of its input stops a worker; a process is killed too,
            // so that its sockets close now.
            w.input = None;
            if let Some(socket) = &w.socket {
                let _ = socket.shutdown(Shutdown::Both);
            }
            if let Some(mut child) = w.process.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Fails if the run was interrupted or the server died.
pub fn check(server: &mut dyn Target) -> Result<(), Error> {
    if sys::interrupted() {
        return Err(io::Error::from(io::ErrorKind::Interrupted).into());
    }
    Ok(server.check_alive()?)
}

fn event_of(report: Report) -> Option<Event> {
    match report {
        Report::Got(receipts) => Some(Event::Got(receipts)),
        Report::Lost { conn, why } => Some(Event::Lost { conn, why }),
        Report::Corrupt { conn } => Some(Event::Corrupt { conn }),
        Report::Progress { .. } | Report::Ready { .. } | Report::Failed(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_their_templates() {
        assert_eq!(Paths::Plain.path(7), "/");
        assert_eq!(Paths::Id.path(7), "/?id=u7");
        assert_eq!(
            Paths::IdChannel { channels: 100 }.path(1234),
            "/?id=u1234&channel=c34"
        );
        let ten = Paths::IdChannels {
            per: 10,
            channels: 1000,
            step: 7919,
        };
        let path = ten.path(5);
        assert!(
            path.starts_with("/?id=u5&channel=c5&channel=c924&"),
            "{path}"
        );
        let channels: std::collections::BTreeSet<&str> = path
            .split('&')
            .filter_map(|p| p.strip_prefix("channel="))
            .collect();
        assert_eq!(channels.len(), 10, "ten distinct channels: {path}");
        for i in 0..2000 {
            let p = ten.path(i);
            let distinct: std::collections::BTreeSet<&str> = p.split('&').skip(1).collect();
            assert_eq!(distinct.len(), 10);
        }
        assert_eq!(Paths::OwnChannel.path(99_999), "/?channel=ch99999");
        let hot = Paths::Hot {
            subscribers: 190,
            total: 19_000,
        };
        let on_hot = (0..19_000)
            .filter(|&i| hot.path(i) == "/?channel=hot")
            .count();
        assert_eq!(on_hot, 190);
        assert_eq!(hot.path(0), "/");
    }

    #[test]
    fn spread_picks_exactly_count_evenly() {
        for (count, total) in [(190, 19_000), (1, 1), (3, 10), (10, 10), (0, 5), (7, 3)] {
            let picked: Vec<u64> = (0..total).filter(|&i| spread(i, count, total)).collect();
            assert_eq!(picked.len() as u64, count.min(total), "{count} of {total}");
        }
        // 1% of 19,000: every hundredth, from 99.
        assert!(spread(99, 190, 19_000) && spread(199, 190, 19_000));
        assert!(!spread(100, 190, 19_000));
        assert!(!spread(0, 1, 0));
    }

    /// The floor on a thread of this process, fed through a socket pair.
    struct Floor {
        feed: UnixStream,
    }

    impl Target for Floor {
        fn send_line(&mut self, line: &[u8]) -> io::Result<()> {
            crate::target::write_line(&mut self.feed, line)
        }

        fn usage(&self) -> io::Result<crate::observe::procfs::Usage> {
            crate::observe::procfs::tree_usage(std::process::id())
        }

        fn check_alive(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// The receipts (connection, sequence number) of 25 connections with
    /// `paths`, by three workers, of two lines sent through a floor with
    /// `options`, sorted; `expected` of them, waited for.
    fn floor_receipts(
        options: crate::target::floor::FloorOptions,
        paths: Paths,
        expected: usize,
    ) -> Vec<(u64, u32)> {
        let listener = crate::target::floor::bind((Ipv4Addr::LOCALHOST, 0).into(), false).unwrap();
        let server = listener.local_addr().unwrap();
        let (feed, input) = UnixStream::pair().unwrap();
        // The floor runs until the test process ends.
        thread::spawn(move || crate::target::floor::serve_with(listener, input, options));
        let mut floor = Floor { feed };
        let plan = SwarmPlan {
            server,
            sources: vec![Ipv4Addr::LOCALHOST],
            paths,
            first: 0,
            count: 25,
            rate: 10_000.0,
            max_in_flight: 8,
            connect_timeout_ms: 10_000,
            payload_bytes: 32,
        };
        // Three workers: 9, 8 and 8 connections.
        let mut swarm = Swarm::launch(&Launch::Threads, &plan, 9).unwrap();
        assert_eq!(swarm.len(), 3);
        let setup = swarm
            .wait_ready(Duration::from_secs(20), &mut floor, "test")
            .unwrap();
        assert_eq!((setup.open, setup.failed.len()), (25, 0), "{setup:?}");
        for seq in [1, 2] {
            let stamp = message::Stamp {
                seq,
                sent_ns: sys::now_ns(),
            };
            floor
                .send_line(&message::encode(stamp, 32).unwrap())
                .unwrap();
        }
        let mut got: Vec<(u64, u32)> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while got.len() < expected && Instant::now() < deadline {
            match swarm.next(Duration::from_millis(100)).unwrap() {
                Some(Event::Got(receipts)) => {
                    for (conn, seq, sent, recv) in receipts {
                        assert!(recv >= sent);
                        got.push((conn, seq));
                    }
                }
                Some(other) => panic!("{other:?}"),
                None => {}
            }
        }
        // Anything more would be there by now, behind the lines awaited.
        let after = swarm.next(Duration::from_millis(200)).unwrap();
        assert!(after.is_none(), "after the lines: {after:?}");
        got.sort_unstable();
        got
    }

    #[test]
    fn workers_report_every_receipt_with_its_connection() {
        let got = floor_receipts(Default::default(), Paths::IdChannel { channels: 3 }, 50);
        let expected: Vec<(u64, u32)> = (0..25).flat_map(|c| [(c, 1), (c, 2)]).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn a_floor_with_a_channel_writes_only_to_the_connections_that_named_it() {
        let options = crate::target::floor::FloorOptions {
            channel: Some("hot".into()),
            ..Default::default()
        };
        let paths = Paths::Hot {
            subscribers: 5,
            total: 25,
        };
        let got = floor_receipts(options, paths, 10);
        let expected: Vec<(u64, u32)> = (0..25)
            .filter(|&c| spread(c, 5, 25))
            .flat_map(|c| [(c, 1), (c, 2)])
            .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn plans_and_reports_round_trip() {
        let plan = SwarmPlan {
            server: "127.0.0.1:9000".parse().unwrap(),
            sources: vec![Ipv4Addr::new(127, 0, 0, 2)],
            paths: Paths::Hot {
                subscribers: 3,
                total: 300,
            },
            first: 19_000,
            count: 19_000,
            rate: 5000.0,
            max_in_flight: 256,
            connect_timeout_ms: 10_000,
            payload_bytes: 32,
        };
        let mut out = Vec::new();
        protocol::send(&mut out, &plan).unwrap();
        let reports = [
            Report::Ready {
                open: 2,
                failed: vec![5],
                failures: BTreeMap::from([("refused".to_string(), 1)]),
            },
            Report::Got(vec![(1, 2, 3, 4), (u64::MAX, u32::MAX, u64::MAX, 0)]),
            Report::Lost {
                conn: 3,
                why: "closed by server".into(),
            },
        ];
        for r in &reports {
            protocol::send(&mut out, r).unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            protocol::parse::<SwarmPlan>(lines.next().unwrap()).unwrap(),
            plan
        );
        for r in &reports {
            assert_eq!(
                &protocol::parse::<Report>(lines.next().unwrap()).unwrap(),
                r
            );
        }
    }
}

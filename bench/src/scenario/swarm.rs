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
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr};
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::client::clients::{ClientPlan, Clients};
use crate::client::pacing::{self, Schedule};
use crate::client::receipts::{Event, Paths, Receipts};
use crate::fleet::coordinator::{spawn_report_reader, Launch, WorkerPipes};
use crate::fleet::protocol;
use crate::observe::sys;
use crate::target::Target;
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
    /// Size of every message payload ([`crate::wire::message::encode`]).
    pub payload_bytes: usize,
}

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
        /// Failures by kind ([`crate::client::dial::Failure::label`]).
        failures: BTreeMap<String, u64>,
    },
    /// Receipts, or a connection lost or sent a corrupt payload.
    Event(Event),
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
    let servers = vec![plan.server];
    let client_plan = ClientPlan {
        servers,
        sources: plan.sources.clone(),
        first_id: plan.first,
        connect_timeout: Duration::from_millis(plan.connect_timeout_ms),
    };
    let mut clients = Clients::new(client_plan, Receipts::new(plan.paths, plan.payload_bytes))?;
    let ended = Arc::new(AtomicBool::new(false));
    let waker = clients.waker()?;
    let flag = Arc::clone(&ended);
    thread::Builder::new().name("input".into()).spawn(move || {
        let _ = io::copy(&mut input, &mut io::sink());
        flag.store(true, Ordering::Relaxed);
        let _ = waker.wake();
    })?;
    match serve(&mut clients, &plan, &ended, &mut output) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = protocol::send(&mut output, &Report::Failed(e.to_string()));
            Err(e)
        }
    }
}

/// Opens the connections, then reports receipts until `ended`.
fn serve(
    clients: &mut Clients<Receipts>,
    plan: &SwarmPlan,
    ended: &AtomicBool,
    output: &mut impl Write,
) -> Result<(), Error> {
    let count = plan.count as usize;
    let schedule = Schedule::new(plan.rate.max(1e-3), plan.count);
    let start = Instant::now();
    let mut ready = false;
    let mut last_progress = start;
    let mut reported = (0, 0);
    let mut got_since = None;
    loop {
        if ended.load(Ordering::Relaxed) {
            return flush(clients, &mut got_since, output);
        }
        let now = Instant::now();
        if clients.started() < count {
            let due = schedule.due(now - start) as usize;
            let room = plan.max_in_flight.max(1).saturating_sub(clients.pending());
            clients.start(due.saturating_sub(clients.started()).min(room));
        }
        if !ready && clients.started() == count && clients.pending() == 0 {
            ready = true;
            flush(clients, &mut got_since, output)?;
            let check = clients.check();
            protocol::send(
                output,
                &Report::Ready {
                    open: clients.open() as u64,
                    failed: check.failed.clone(),
                    failures: check.failures.clone(),
                },
            )?;
        } else if !ready && now >= last_progress + PROGRESS_EVERY {
            let progress = (clients.open() as u64, clients.check().failed.len() as u64);
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
        for event in clients.check_mut().events.drain(..) {
            protocol::send(output, &Report::Event(event))?;
        }
        let flush_at = got_since.map(|t| t + BATCH_DELAY);
        if clients.check().got.len() >= BATCH || flush_at.is_some_and(|t| now >= t) {
            flush(clients, &mut got_since, output)?;
        }
        let timeout = if clients.started() < count {
            Duration::from_millis(1)
        } else if let Some(t) = got_since.map(|t| t + BATCH_DELAY) {
            t.saturating_duration_since(now)
        } else if !ready {
            Duration::from_millis(10)
        } else {
            IDLE_POLL
        };
        let had = clients.check().got.len();
        clients.step(timeout)?;
        if clients.check().got.len() > had && got_since.is_none() {
            got_since = Some(Instant::now());
        }
    }
}

/// Reports the receipts held back.
fn flush(
    clients: &mut Clients<Receipts>,
    got_since: &mut Option<Instant>,
    output: &mut impl Write,
) -> Result<(), Error> {
    let check = clients.check_mut();
    for event in check.events.drain(..) {
        protocol::send(output, &Report::Event(event))?;
    }
    if !check.got.is_empty() {
        let got = std::mem::take(&mut check.got);
        protocol::send(output, &Report::Event(Event::Got(got)))?;
    }
    *got_since = None;
    Ok(())
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
        Report::Event(event) => Some(event),
        Report::Progress { .. } | Report::Ready { .. } | Report::Failed(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::receipts::spread;
    use crate::wire::message;

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
            Report::Event(Event::Got(vec![
                (1, 2, 3, 4),
                (u64::MAX, u32::MAX, u64::MAX, 0),
            ])),
            Report::Event(Event::Lost {
                conn: 3,
                why: "closed by server".into(),
            }),
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

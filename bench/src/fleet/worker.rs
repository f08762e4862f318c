//! A worker: one process (or, in tests, one thread) holding a share of a
//! run's connections, driven by the coordinator through the
//! [`protocol`]: for push it opens connections when granted, counts the
//! receipts of each broadcast, and reports; for `channels` it opens its
//! connections at its own pace and reports every receipt.
//!
//! Commands arrive on a helper thread that wakes the epoll loop through a
//! [`mio::Waker`], so a worker blocked in `epoll_wait` reacts at once.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::mpsc::{self, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use mio::Waker;

use crate::client::clients::Counts;
use crate::client::clients::{ClientPlan, Clients, EVENTS_PER_POLL};
use crate::client::conn::{Expect, InOrder, Query};
use crate::client::pacing::Schedule;
use crate::client::receipts::{Event, Receipts};
use crate::fleet::protocol::{self, Command, ReceiptsPlan, Report};
use crate::observe::stats::{self, Tally};
use crate::wire::compression::Inflating;
use crate::Error;

/// Least time between two `Progress` reports.
const PROGRESS_EVERY: Duration = Duration::from_millis(2);

/// Least time between two unfinished `Received` reports.
const RECEIVED_EVERY: Duration = Duration::from_millis(50);

/// Longest a worker blocks in `epoll_wait` when nothing is happening.
const IDLE_POLL: Duration = Duration::from_millis(100);

/// Least time between two `Progress` reports of a receipts worker.
const RECEIPTS_PROGRESS_EVERY: Duration = Duration::from_millis(50);

/// Receipts a worker holds back at most before reporting them.
const BATCH: usize = 1024;

/// How long a receipt waits at most before it is reported.
const BATCH_DELAY: Duration = Duration::from_millis(1);

/// What a worker is collecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watch {
    /// One broadcast.
    Message,
    /// A stream of `count` messages from the armed `seq`, each expected
    /// by the `expected` connections open when it was armed.
    Stream { count: u32, expected: u32 },
}

/// The broadcast (or stream) a worker is currently collecting.
struct Armed {
    seq: u32,
    watch: Watch,
    nap: Duration,
    /// Whether receipts have started arriving: from then on the worker
    /// polls without blocking and naps in between, until it is done.
    napping: bool,
    last_report: Instant,
    reported: stats::Receipts,
    /// Stream deliveries last reported.
    stream_reported: u64,
}

/// Runs a worker: reads commands from `input`, writes reports to `output`,
/// until `Finish` (or the end of `input`). A worker process uses its
/// standard input and output.
pub fn run(input: impl Read + Send + 'static, mut output: impl Write) -> Result<(), Error> {
    let mut input = BufReader::new(input);
    let mut first = String::new();
    input.read_line(&mut first)?;
    let Command::Plan(plan) = protocol::parse(&first)? else {
        return Err("a worker's first command must be its plan".into());
    };
    let client_plan = ClientPlan {
        servers: plan.servers,
        sources: plan.sources,
        first_id: plan.first_id,
        connect_timeout: Duration::from_millis(plan.connect_timeout_ms),
    };
    if let Some(receipts) = plan.receipts {
        let needed = receipts.count as usize + 64;
        let limit = wspush::sys::raise_open_file_limit()? as usize;
        if needed > limit {
            return Err(format!(
                "{} connections need {needed} open files, the limit is {limit}",
                receipts.count
            )
            .into());
        }
        let check = Receipts::new(receipts.paths, plan.payload_bytes);
        let mut clients = Clients::new(client_plan, check)?;
        let commands = spawn_command_reader(input, clients.waker()?)?;
        let served = serve_receipts(&mut clients, &receipts, &commands, &mut output);
        return reported(served, &mut output);
    }
    let check = InOrder {
        expect: Expect {
            payload_len: plan.payload_bytes,
            padding: plan.padding,
            deflate: plan.deflate,
            mixed: plan.mixed,
        },
        inflating: Inflating::default(),
        tally: Tally::new(),
        query: Query {
            channel: plan.channel,
            positions: plan.positions,
            mixed: plan.mixed,
            token: plan.token,
            epoch: None,
            positions_seen: Vec::new(),
        },
        transports: plan.transports,
        hints: Default::default(),
    };
    let mut clients = Clients::new(client_plan, check)?;
    let commands = spawn_command_reader(input, clients.waker()?)?;
    let served = serve(&mut clients, &commands, &mut output);
    reported(served, &mut output)
}

/// `served`, its error also reported to the coordinator.
fn reported(served: Result<(), Error>, output: &mut impl Write) -> Result<(), Error> {
    if let Err(e) = &served {
        // The coordinator may be gone too; the error is returned anyway.
        let _ = protocol::send(output, &Report::Failed(e.to_string()));
    }
    served
}

/// Reads commands on a thread of their own and hands them over, waking
/// the loop for each; the channel closes at the end of the input.
fn spawn_command_reader(
    input: impl BufRead + Send + 'static,
    waker: Waker,
) -> io::Result<mpsc::Receiver<io::Result<Command>>> {
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name("commands".into())
        .spawn(move || {
            for line in input.lines() {
                let command = line.and_then(|l| protocol::parse(&l));
                let stop = command.is_err();
                if tx.send(command).is_err() || waker.wake().is_err() || stop {
                    return;
                }
            }
            // End of input: dropping `tx` closes the channel; wake the loop to see it.
            drop(tx);
            let _ = waker.wake();
        })?;
    Ok(rx)
}

/// The worker's loop after its plan.
fn serve(
    clients: &mut Clients<InOrder>,
    commands: &mpsc::Receiver<io::Result<Command>>,
    output: &mut impl Write,
) -> Result<(), Error> {
    let mut armed: Option<Armed> = None;
    let mut reported = counts(clients);
    let mut last_progress = Instant::now();
    loop {
        loop {
            let command = match commands.try_recv() {
                Ok(command) => command?,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return Ok(()),
            };
            match command {
                Command::Plan(_) => return Err("a worker gets one plan".into()),
                Command::Open { count } => clients.start(count),
                Command::Abandon => clients.abandon_pending(),
                Command::Storm { within_ms } => clients.storm(Duration::from_millis(within_ms)),
                Command::Arm { seq, nap_us } => {
                    let open = clients.open() as u32;
                    clients.check_mut().tally.arm(seq, open);
                    protocol::send(output, &Report::Armed { seq, open })?;
                    armed = Some(Armed {
                        seq,
                        watch: Watch::Message,
                        nap: Duration::from_micros(nap_us),
                        napping: false,
                        last_report: Instant::now(),
                        reported: stats::Receipts::default(),
                        stream_reported: 0,
                    });
                }
                Command::ArmStream {
                    first,
                    count,
                    nap_us,
                    windows,
                } => {
                    let open = clients.open() as u32;
                    let tally = &mut clients.check_mut().tally;
                    tally.arm_stream(first, count, open);
                    tally.keep_apart(windows);
                    protocol::send(output, &Report::Armed { seq: first, open })?;
                    armed = Some(Armed {
                        seq: first,
                        watch: Watch::Stream {
                            count,
                            expected: open,
                        },
                        nap: Duration::from_micros(nap_us),
                        napping: false,
                        last_report: Instant::now(),
                        reported: stats::Receipts::default(),
                        stream_reported: 0,
                    });
                }
                Command::EndStream => {
                    armed = None;
                    let receipts = clients.check().tally.stream_receipts();
                    let first = clients.check().tally.stream_first().unwrap_or(0);
                    protocol::send(output, &Report::StreamEnded { first, receipts })?;
                }
                Command::Finish => {
                    let observed = clients.check().tally.observed();
                    protocol::send(output, &Report::Final(Box::new(observed)))?;
                    return Ok(());
                }
            }
        }

        if let Some(a) = &mut armed {
            if report_receipts(clients, a, output)? {
                armed = None;
            }
        }

        let now = Instant::now();
        let counts = counts(clients);
        if counts != reported && now >= last_progress + PROGRESS_EVERY {
            protocol::send(output, &Report::Progress(counts))?;
            reported = counts;
            last_progress = now;
        }

        let timeout = match &armed {
            Some(a) if a.napping && !a.nap.is_zero() => Duration::ZERO,
            _ if counts != reported => PROGRESS_EVERY,
            _ => IDLE_POLL,
        };
        let events = clients.step(timeout)?;
        if let Some(a) = &mut armed {
            if !a.napping && events > 0 {
                a.napping = true;
            } else if a.napping && events < EVENTS_PER_POLL && !a.nap.is_zero() {
                thread::sleep(a.nap);
            }
        }
    }
}

/// Reports the receipts of the armed message (or stream) when it is
/// complete here, or now and then while it is not; returns whether it is
/// complete.
fn report_receipts(
    clients: &Clients<InOrder>,
    armed: &mut Armed,
    output: &mut impl Write,
) -> Result<bool, Error> {
    if let Watch::Stream { count, expected } = armed.watch {
        return report_stream(clients, armed, count, expected, output);
    }
    let receipts = *clients
        .check()
        .tally
        .receipts(armed.seq)
        .expect("armed messages are announced");
    // Connections that failed meanwhile will not receive it (those dialed
    // again will).
    let done = receipts.received as usize >= clients.coming().min(receipts.expected as usize);
    let now = Instant::now();
    if done || (receipts != armed.reported && now >= armed.last_report + RECEIVED_EVERY) {
        protocol::send(
            output,
            &Report::Received {
                seq: armed.seq,
                receipts,
                done,
            },
        )?;
        armed.reported = receipts;
        armed.last_report = now;
    }
    Ok(done)
}

/// [`report_receipts`] for a stream: done once every connection still
/// open or coming back (of those expected) has every message of it.
fn report_stream(
    clients: &Clients<InOrder>,
    armed: &mut Armed,
    count: u32,
    expected: u32,
    output: &mut impl Write,
) -> Result<bool, Error> {
    let received = clients.check().tally.stream_received();
    let wanted = u64::from(count) * clients.coming().min(expected as usize) as u64;
    let done = received >= wanted;
    let now = Instant::now();
    let changed = armed.stream_reported != received;
    if done || (changed && now >= armed.last_report + RECEIVED_EVERY) {
        protocol::send(
            output,
            &Report::StreamProgress {
                first: armed.seq,
                received,
                done,
            },
        )?;
        armed.stream_reported = received;
        armed.last_report = now;
    }
    Ok(done)
}

fn counts(clients: &Clients<InOrder>) -> Counts {
    clients.counts(clients.check().tally.failures())
}

/// A receipts worker's loop after its plan: opens its connections at its
/// pace, then reports receipts until its input ends.
fn serve_receipts(
    clients: &mut Clients<Receipts>,
    plan: &ReceiptsPlan,
    commands: &mpsc::Receiver<io::Result<Command>>,
    output: &mut impl Write,
) -> Result<(), Error> {
    let count = plan.count as usize;
    let schedule = Schedule::new(plan.rate.max(1e-3), plan.count);
    let start = Instant::now();
    let mut ready = false;
    let mut last_progress = start;
    let mut reported = Counts::default();
    let mut got_since = None;
    loop {
        match commands.try_recv() {
            Ok(command) => return Err(format!("a receipts worker got {:?}", command?).into()),
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => return flush(clients, &mut got_since, output),
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
            let counts = clients.counts(check.failed.len() as u64);
            protocol::send(output, &Report::Progress(counts))?;
            let (failed, failures) = (check.failed.clone(), check.failures.clone());
            protocol::send(output, &Report::Ready { failed, failures })?;
        } else if !ready && now >= last_progress + RECEIPTS_PROGRESS_EVERY {
            let counts = clients.counts(clients.check().failed.len() as u64);
            if counts != reported {
                protocol::send(output, &Report::Progress(counts))?;
                reported = counts;
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

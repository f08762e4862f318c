//! A worker: one process (or, in tests, one thread) holding a share of a
//! push run's connections, driven by the coordinator through the
//! [`protocol`]: it opens connections when granted, counts
//! the receipts of each broadcast, and reports.
//!
//! Commands arrive on a helper thread that wakes the epoll loop through a
//! [`mio::Waker`], so a worker blocked in `epoll_wait` reacts at once.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::mpsc::{self, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use mio::Waker;

use crate::client::clients::{ClientPlan, Clients, EVENTS_PER_POLL};
use crate::client::conn::{Expect, InOrder, Query};
use crate::fleet::protocol::{self, Command, Counts, Report};
use crate::observe::stats::{Receipts, Tally};
use crate::wire::compression::Inflating;
use crate::Error;

/// Least time between two `Progress` reports.
const PROGRESS_EVERY: Duration = Duration::from_millis(2);

/// Least time between two unfinished `Received` reports.
const RECEIVED_EVERY: Duration = Duration::from_millis(50);

/// Longest a worker blocks in `epoll_wait` when nothing is happening.
const IDLE_POLL: Duration = Duration::from_millis(100);

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
    reported: Receipts,
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
    let check = InOrder {
        expect: Expect {
            payload_len: plan.payload_bytes,
            padding: plan.padding,
            deflate: plan.deflate,
        },
        inflating: Inflating::default(),
        tally: Tally::new(),
        query: Query {
            channel: plan.channel,
            positions: plan.positions,
            epoch: None,
            offset: None,
        },
    };
    let client_plan = ClientPlan {
        servers: plan.servers,
        sources: plan.sources,
        first_id: plan.first_id,
        connect_timeout: Duration::from_millis(plan.connect_timeout_ms),
    };
    let mut clients = Clients::new(client_plan, check)?;
    let commands = spawn_command_reader(input, clients.waker()?)?;
    match serve(&mut clients, &commands, &mut output) {
        Ok(()) => Ok(()),
        Err(e) => {
            // The coordinator may be gone too; the error is returned anyway.
            let _ = protocol::send(&mut output, &Report::Failed(e.to_string()));
            Err(e)
        }
    }
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
                        reported: Receipts::default(),
                        stream_reported: 0,
                    });
                }
                Command::ArmStream {
                    first,
                    count,
                    nap_us,
                } => {
                    let open = clients.open() as u32;
                    clients.check_mut().tally.arm_stream(first, count, open);
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
                        reported: Receipts::default(),
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
    Counts {
        started: clients.started(),
        pending: clients.pending(),
        open: clients.open(),
        opened: clients.opened(),
        failed: clients.check().tally.failures(),
    }
}

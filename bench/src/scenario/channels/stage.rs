//! Servers and clients: a [`Stage`] is one server under test with its
//! client workers and the ledger of their receipts; its setup as reported
//! ([`SetupReport`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::ledger::Ledger;
use super::lines::line;
use super::options::ChannelsOptions;
use crate::client::dial;
use crate::client::pacing;
use crate::client::receipts::Paths;
use crate::fleet::coordinator::{Fleet, Launch, Setup};
use crate::fleet::protocol::{Plan, ReceiptsPlan};
use crate::observe::cpu::{CpuMark, QUIET_SHARE};
use crate::observe::format::{failures, grouped};
use crate::observe::procfs;
use crate::observe::stats::Receipts;
use crate::observe::sys;
use crate::target::server::{self, Server, ServerSpec};
use crate::target::{self, Target};
use crate::wire::message::Stamp;
use crate::Error;

/// How often a wait checks the server.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// A server under test with its clients.
pub(super) struct Stage {
    pub(super) label: String,
    command: String,
    pub(super) server: Server,
    pub(super) addr: SocketAddr,
    fleet: Option<Fleet>,
    pub(super) setup: Setup,
    pub(super) ledger: Ledger,
    pub(super) warnings: Vec<String>,
}

/// The setup as reported.
#[derive(Debug, Clone, Serialize)]
pub struct SetupReport {
    /// Label of the server.
    pub server: String,
    /// Its command line.
    pub command: String,
    /// Connections asked for.
    pub requested: u64,
    /// Connections open.
    pub open: u64,
    /// Failures by kind.
    pub failures: BTreeMap<String, u64>,
    /// Seconds until every connection was open or failed.
    pub setup_secs: f64,
    /// Client worker processes.
    pub client_processes: usize,
    /// Processes of the server's tree.
    pub server_processes: u32,
}

impl SetupReport {
    pub(super) fn render(&self) -> String {
        format!(
            "{}: {} of {} connections open in {:.1} s over {} client process(es), server {} process(es); failures: {}\n  command: {}",
            self.server,
            grouped(self.open),
            grouped(self.requested),
            self.setup_secs,
            self.client_processes,
            self.server_processes,
            failures(&self.failures),
            self.command
        )
    }
}

impl Stage {
    /// Starts `command` (a template: `{port}`, or `floor`) as `label`.
    pub(super) fn start(o: &ChannelsOptions, label: &str, command: &str) -> Result<Stage, Error> {
        let spec = ServerSpec {
            label: label.into(),
            command: command.into(),
        };
        let (server, command, port) =
            server::start_server(&spec, None, o.wait_quiet, o.start_timeout)?;
        Ok(Stage {
            label: label.into(),
            command,
            server,
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            fleet: None,
            setup: Setup::default(),
            ledger: Ledger::new(0),
            warnings: Vec::new(),
        })
    }

    /// Opens `count` connections with `paths`.
    pub(super) fn connect(
        &mut self,
        o: &ChannelsOptions,
        paths: Paths,
        count: u64,
    ) -> Result<(), Error> {
        let sources = match o.sources {
            Some(n) => n,
            None => dial::sources_for(count as usize, procfs::local_port_range()?)
                .ok_or("too many connections for 250 source addresses")?,
        };
        let plan = Plan {
            servers: vec![self.addr],
            sources: (0..sources)
                .map(|i| Ipv4Addr::new(127, 0, 0, 2 + i))
                .collect(),
            first_id: 0,
            payload_bytes: o.payload_bytes,
            padding: Default::default(),
            deflate: false,
            transports: Default::default(),
            channel: None,
            positions: false,
            mixed: false,
            token: None,
            connect_timeout_ms: o.connect_timeout * 1000,
            receipts: Some(ReceiptsPlan {
                paths,
                count,
                rate: o.rate,
                max_in_flight: o.max_in_flight,
            }),
        };
        let launch = Launch::Processes {
            exe: std::env::current_exe()?,
        };
        let parts = (count as usize).div_ceil(o.per_worker.max(1)).max(1);
        let shares = pacing::split_evenly(count as usize, parts);
        let mut fleet = Fleet::launch(&launch, &plan, &shares)?;
        let server = &mut self.server;
        let timeout = o.setup_timeout(count);
        self.setup = fleet.wait_ready(timeout, || target::check(server), &self.label)?;
        eprintln!(
            "[{}] {} of {} connections open in {:.2} s ({} failed)",
            self.label,
            self.setup.open,
            count,
            self.setup.secs,
            self.setup.failed.len()
        );
        self.fleet = Some(fleet);
        self.ledger = Ledger::new(count);
        if self.setup.open == 0 {
            return Err(format!("[{}] no connection opened", self.label).into());
        }
        Ok(())
    }

    pub(super) fn setup_report(&self) -> Result<SetupReport, Error> {
        Ok(SetupReport {
            server: self.label.clone(),
            command: self.command.clone(),
            requested: self.ledger.per_conn.len() as u64,
            open: self.setup.open,
            failures: self.setup.failures.clone(),
            setup_secs: self.setup.secs,
            client_processes: self.fleet.as_ref().map_or(0, Fleet::len),
            server_processes: self.server.usage()?.processes,
        })
    }

    /// Absorbs events until `done` holds (true) or `timeout` passes (false).
    pub(super) fn wait_for(
        &mut self,
        timeout: Duration,
        done: impl Fn(&Ledger) -> bool,
    ) -> Result<bool, Error> {
        let deadline = Instant::now() + timeout;
        let mut checked = Instant::now();
        loop {
            if done(&self.ledger) {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            if now >= checked + CHECK_EVERY {
                target::check(&mut self.server)?;
                checked = now;
            }
            let left = deadline.saturating_duration_since(now).min(CHECK_EVERY);
            let fleet = self.fleet.as_mut().expect("connected");
            if let Some(event) = fleet.next_event(left)? {
                self.ledger.absorb(event);
            }
        }
    }

    /// Absorbs events for `duration`.
    pub(super) fn pump(&mut self, duration: Duration) -> Result<(), Error> {
        self.wait_for(duration, |_| false).map(|_| ())
    }

    /// Waits `duration` without clients (checking the server).
    pub(super) fn idle(&mut self, duration: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + duration;
        while Instant::now() < deadline {
            target::check(&mut self.server)?;
            thread::sleep(
                deadline
                    .saturating_duration_since(Instant::now())
                    .min(CHECK_EVERY),
            );
        }
        Ok(())
    }

    /// CPU counters now, to tell whether others were busy.
    pub(super) fn mark(&self) -> Result<CpuMark, Error> {
        let workers = match &self.fleet {
            Some(s) => procfs::processes_usage(&s.pids())?.cpu_ns,
            None => 0,
        };
        Ok(CpuMark::take(
            self.server.usage()?.cpu_ns,
            procfs::own_cpu_ns()? + workers,
        )?)
    }

    /// Warns if others used more than [`QUIET_SHARE`] of a CPU since `before`.
    pub(super) fn warn_if_busy(&mut self, before: &CpuMark, phase: &str) -> Result<(), Error> {
        let share = self.mark()?.others_since(before);
        if share > QUIET_SHARE {
            self.warnings.push(format!(
                "[{}] other processes used {:.0}% of a CPU {phase}: numbers may be disturbed",
                self.label,
                share * 100.0
            ));
        }
        Ok(())
    }

    /// Closes the connections, then stops the server.
    pub(super) fn finish(mut self) -> Vec<String> {
        self.fleet = None;
        self.server.stop();
        self.warnings
    }

    /// Sends `prefix PAYLOAD` for each of `messages`, one at a time, each
    /// awaited at the open ones of `receivers` (or the timeout), `gap`
    /// apart; returns the send times and receipts.
    pub(super) fn one_at_a_time(
        &mut self,
        o: &ChannelsOptions,
        prefix: &str,
        messages: u32,
        receivers: &[u64],
    ) -> Result<(Vec<u64>, Vec<Receipts>), Error> {
        let mut sent = Vec::with_capacity(messages as usize);
        let mut receipts = Vec::with_capacity(messages as usize);
        for seq in 1..=messages {
            let expected = self.ledger.alive(receivers);
            let sent_ns = sys::now_ns();
            self.server
                .send_lines(&line(prefix, Stamp { seq, sent_ns }, o.payload_bytes))?;
            let complete =
                self.wait_for(o.message_timeout(), |l| l.count(seq) >= l.alive(receivers))?;
            if !complete {
                eprintln!(
                    "[{}] message {seq}: {} of {expected} receipts before the timeout",
                    self.label,
                    self.ledger.count(seq)
                );
            }
            let a = self.ledger.per_seq.get(&seq).copied().unwrap_or_default();
            sent.push(sent_ns);
            receipts.push(Receipts {
                expected,
                received: a.count,
                first_ns: a.first_ns,
                last_ns: a.last_ns,
            });
            if seq < messages {
                self.pump(Duration::from_millis(o.gap_ms))?;
            }
        }
        Ok((sent, receipts))
    }
}

pub(super) fn render_warnings(out: &mut String, warnings: &[String]) {
    for w in warnings {
        let _ = writeln!(out, "  WARNING  {w}");
    }
}

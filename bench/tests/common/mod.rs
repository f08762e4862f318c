//! Shared helpers: a wspush server embedded in the test process as the
//! bench's target, small push options, and a look at `/proc/net/tcp`.

#![allow(dead_code)] // each test file uses its own subset

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;
use std::process::Command;
use std::thread::{self, JoinHandle};

use clap::Parser;
use wspush_bench::fleet::coordinator::Launch;
use wspush_bench::observe::procfs::{self, Usage};
use wspush_bench::report::RunInfo;
use wspush_bench::report::RunReport;
use wspush_bench::scenario::push::{self, PushOptions};
use wspush_bench::target::Target;

/// wspush running on a thread of this process, driven through its `Handle`.
pub struct Embedded {
    handle: wspush::Handle,
    thread: Option<JoinHandle<io::Result<()>>>,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Source addresses of the established connections to it, as seen
    /// each time the bench sampled its usage.
    pub sources_seen: RefCell<BTreeSet<String>>,
}

impl Embedded {
    /// Binds a wspush server on 127.0.0.1:0 (echoing if `echo`) and runs it.
    pub fn start(echo: bool) -> Embedded {
        let mut server = wspush::Server::bind(wspush::Config::default().with(|c| {
            c.echo = echo;
        }))
        .expect("bind");
        let addr = server.local_addr();
        let handle = server.handle();
        let thread = thread::spawn(move || server.run());
        Embedded {
            handle,
            thread: Some(thread),
            addr,
            sources_seen: RefCell::new(BTreeSet::new()),
        }
    }

    /// The server's counters.
    pub fn metrics(&self) -> wspush::MetricsSnapshot {
        self.handle.metrics()
    }
}

impl Target for Embedded {
    fn send_line(&mut self, line: &[u8]) -> io::Result<()> {
        let text = String::from_utf8(line.to_vec()).map_err(io::Error::other)?;
        self.handle.broadcast_text(text).map_err(io::Error::other)
    }

    /// The whole test process (server, client and test harness together);
    /// also notes the source addresses of the server's connections.
    fn usage(&self) -> io::Result<Usage> {
        self.sources_seen
            .borrow_mut()
            .extend(remote_addresses(self.addr.port()));
        procfs::tree_usage(std::process::id())
    }

    fn check_alive(&mut self) -> io::Result<()> {
        match &self.thread {
            Some(t) if !t.is_finished() => Ok(()),
            _ => Err(io::Error::other("the embedded server stopped")),
        }
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = self.handle.shutdown();
        // The loop ends once its connections are closed; they are by now.
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Push options for a small, quick run: `args`, then quick settings for
/// what `args` leaves out, then the bench defaults.
pub fn push_options(args: &[&str]) -> PushOptions {
    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        options: PushOptions,
    }
    let quick = [
        "--settle-ms",
        "100",
        "--idle-secs",
        "1",
        "--gap-ms",
        "20",
        "--setup-timeout",
        "30",
        "--message-timeout",
        "10",
    ];
    let unset = quick
        .chunks(2)
        .filter(|pair| !args.contains(&pair[0]))
        .flatten();
    let argv = ["push"].iter().chain(unset).chain(args);
    Wrapper::parse_from(argv).options
}

/// Runs `push` with `args` (thread workers) against a wspush embedded in
/// this process; returns the server (for its counters) and the report.
pub fn measure_embedded(args: &[&str]) -> (Embedded, RunReport) {
    let mut server = Embedded::start(false);
    let addr = server.addr;
    let options = push_options(args);
    let report = push::measure(
        &mut server,
        addr,
        &options,
        &Launch::Threads,
        info("wspush"),
    )
    .expect("the push run");
    (server, report)
}

/// How a test run is named in its report.
pub fn info(server: &str) -> RunInfo {
    RunInfo {
        server: server.into(),
        command: "embedded".into(),
        round: 1,
    }
}

/// Remote addresses of the established connections to local `port`, as
/// `ss` (iproute2) reports them: its filter runs in the kernel, so this
/// stays cheap even when a benchmark holds a million sockets meanwhile.
pub fn remote_addresses(port: u16) -> BTreeSet<String> {
    let filter = format!("( sport = :{port} )");
    let out = Command::new("ss")
        .args(["-Htn", "state", "established", &filter])
        .output()
        .expect("ss (iproute2) lists the sockets");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let peer = line.split_whitespace().nth(3)?;
            Some(peer.rsplit_once(':')?.0.to_string())
        })
        .collect()
}

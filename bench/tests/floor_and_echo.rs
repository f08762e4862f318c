//! The floor against the bench's clients (in process, and as a supervisor
//! of two instances behind SO_REUSEPORT), and the echo measurement against
//! the floor and against wspush.

mod common;

use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

use common::{info, push_options, Embedded};
use wspush_bench::fleet::coordinator::Launch;
use wspush_bench::observe::procfs::{self, Usage};
use wspush_bench::observe::sys;
use wspush_bench::scenario::echo::{self, EchoOptions};
use wspush_bench::scenario::push;
use wspush_bench::target::floor;
use wspush_bench::target::server::{self, Server};
use wspush_bench::target::{self, Target};

/// The floor on a thread of this process, fed through a socket pair.
struct InProcessFloor {
    feed: UnixStream,
    addr: SocketAddr,
}

impl InProcessFloor {
    fn start() -> InProcessFloor {
        let listener = floor::bind((Ipv4Addr::LOCALHOST, 0).into(), false).unwrap();
        let addr = listener.local_addr().unwrap();
        let (feed, input) = UnixStream::pair().unwrap();
        // The floor runs until the test process ends.
        thread::spawn(move || floor::serve(listener, input));
        InProcessFloor { feed, addr }
    }
}

impl Target for InProcessFloor {
    fn send_line(&mut self, line: &[u8]) -> io::Result<()> {
        target::write_line(&mut self.feed, line)?;
        self.feed.flush()
    }

    fn usage(&self) -> io::Result<Usage> {
        procfs::tree_usage(std::process::id())
    }

    fn check_alive(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn echo_options(args: &[&str]) -> EchoOptions {
    let mut all: Vec<String> = ["--secs", "1", "--drain-secs", "5"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    all.extend(args.iter().map(|s| s.to_string()));
    EchoOptions::from_args(&all).unwrap()
}

#[test]
fn the_floor_delivers_every_broadcast_once() {
    let mut floor = InProcessFloor::start();
    let addr = floor.addr;
    let options = push_options(&["--conns", "500", "--sources", "2", "--messages", "3"]);
    let report =
        push::measure(&mut floor, addr, &options, &Launch::Threads, info("floor")).unwrap();
    assert_eq!(
        (report.connections.open, report.connections.failed),
        (500, 0)
    );
    assert_eq!(report.latency.count, 3 * 500);
    let d = &report.delivery;
    assert_eq!(
        (d.lost, d.duplicates, d.out_of_order, d.corrupt),
        (0, 0, 0, 0)
    );
}

#[test]
fn the_floor_echoes_every_message_intact() {
    let mut floor = InProcessFloor::start();
    let addr = floor.addr;
    let options = echo_options(&["--conns", "50", "--rate", "40", "--payload-bytes", "300"]);
    let report = echo::measure(&mut floor, addr, &options, 40.0, &info("floor")).unwrap();
    assert_eq!(report.open, 50);
    assert_eq!(report.sent, 50 * 40);
    assert_eq!((report.echoed, report.lost), (2000, 0));
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.rtt.count, 2000);
    assert!(report.mbps_up > 0.0 && report.mbps_down > 0.0);
    assert!(report.passes(1000.0), "{}", report.render_text());
}

#[test]
fn wspush_echoes_every_message_intact() {
    let mut server = Embedded::start(true);
    let addr = server.addr;
    let options = echo_options(&["--conns", "100", "--rate", "20", "--payload-bytes", "1024"]);
    let report = echo::measure(&mut server, addr, &options, 20.0, &info("wspush")).unwrap();
    assert_eq!((report.sent, report.echoed, report.lost), (2000, 2000, 0));
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert!(
        (report.achieved_rate - 20.0).abs() < 1.0,
        "{}",
        report.achieved_rate
    );
}

#[test]
fn a_floor_supervisor_spreads_connections_over_its_instances() {
    sys::install_interrupt_handler().unwrap();
    let exe = env!("CARGO_BIN_EXE_wspush-bench");
    let port = server::free_port().unwrap();
    let mut floor = Server::spawn(&format!(
        "{exe} floor --processes 2 --listen 127.0.0.1:{port}"
    ))
    .unwrap();
    floor.wait_listening(port, Duration::from_secs(10)).unwrap();
    // Both instances listen before the clients start.
    for _ in 0..100 {
        if procfs::listeners(port).unwrap() == 2 {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let options = push_options(&["--conns", "400", "--sources", "2", "--messages", "2"]);
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let launch = Launch::Processes { exe: exe.into() };
    let report = push::measure(&mut floor, addr, &options, &launch, info("floor")).unwrap();
    assert_eq!(report.memory.listeners, 2);
    assert_eq!(report.memory.processes, 3, "supervisor and two instances");
    assert_eq!(report.connections.open, 400);
    assert_eq!(report.latency.count, 2 * 400);
    assert_eq!(report.delivery.lost, 0);
}

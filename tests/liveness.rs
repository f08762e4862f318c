//! Dead peers: the heartbeats find a client that can no longer answer
//! within the documented bound, whether it was receiving broadcasts or
//! idle, and never close one that answers. Two kinds of death:
//!
//! - its process is stopped (SIGSTOP): its kernel still acknowledges
//!   everything it is sent, so only a missing pong tells;
//! - its link is down (its network namespace's veth is set down): nothing
//!   it is sent arrives. These run through `tests/liveness/run.sh`, which
//!   makes a namespace for the server and one for that client (ignored
//!   otherwise).
//!
//! The clients are separate processes: this test binary started again
//! with `client_process` and the address in [`CLIENT_ENV`].

mod util;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use util::TestServer;
use wspush::{Config, MetricsSnapshot};

/// Where a client process connects (see [`client_process`]).
const CLIENT_ENV: &str = "WSPUSH_LIVENESS_CLIENT";
/// The namespace the link-down tests' clients run in (see run.sh).
const NETNS_ENV: &str = "WSPUSH_LIVENESS_NETNS";

const PING: Duration = Duration::from_millis(200);
const IDLE: Duration = Duration::from_millis(400);
const CLOSE: Duration = Duration::from_millis(200);

/// The sweep's slice period for `PING`: a thirty-second of it, at least
/// 10 ms.
const SLICE: Duration = Duration::from_millis(10);

/// The bound docs/OPERATIONS.md gives: silent for the idle timeout, then
/// closed at most one interval late, plus up to one interval and a slice
/// period for each pass of the sweep (⌈idle / interval⌉ + 2 of them) that
/// broadcasts held back; then the close handshake's timeout, which a dead
/// client lets run out.
fn bound() -> Duration {
    let passes = IDLE.as_nanos().div_ceil(PING.as_nanos()) as u32 + 2;
    IDLE + PING + (PING + SLICE) * passes + CLOSE
}

/// Not a test by itself: the client process of the others. It upgrades,
/// says `ready`, and reads until the connection ends, answering pings
/// (tungstenite sends the pong on its next read).
#[test]
#[ignore = "the client process the liveness tests start"]
fn client_process() {
    let Ok(addr) = std::env::var(CLIENT_ENV) else {
        return;
    };
    let (mut ws, _) = tungstenite::connect(format!("ws://{addr}/")).expect("connect");
    println!("ready");
    std::io::stdout().flush().unwrap();
    while ws.read().is_ok() {}
}

/// A client process connected to `addr`, run through `wrapper` (e.g.
/// `ip netns exec NAME`) if given.
struct Peer {
    child: Child,
    _stdout: BufReader<ChildStdout>,
}

impl Peer {
    fn start(addr: SocketAddr, wrapper: &[&str]) -> Peer {
        let exe = std::env::current_exe().unwrap();
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(&exe);
                command
            }
            None => Command::new(&exe),
        };
        let mut child = command
            .args(["--ignored", "--exact", "client_process", "--nocapture"])
            .env(CLIENT_ENV, addr.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a client process");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while line.trim() != "ready" {
            line.clear();
            let n = stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "the client process ended before it was ready");
        }
        Peer {
            child,
            _stdout: stdout,
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal}");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.signal("CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server with short heartbeats listening on `listen`.
fn server(listen: SocketAddr) -> TestServer {
    TestServer::start(Config::default().with(|c| {
        c.listen = listen;
        c.ping_interval = PING;
        c.idle_timeout = IDLE;
        c.close_timeout = CLOSE;
    }))
}

/// Broadcasts a line every 20 ms until `stop` says so.
fn broadcasting(server: &TestServer) -> impl Drop {
    struct Stop(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handle = server.handle.clone();
    let flag = std::sync::Arc::clone(&stop);
    std::thread::spawn(move || {
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            if handle.broadcast_text("tick").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    Stop(stop)
}

/// Kills one of two clients (started through `wrapper`) with `kill`, and
/// checks that the server closes that one for its silence, within the
/// bound and not before the idle timeout, while the other stays.
fn a_dead_peer_is_closed_within_the_bound(
    server: &TestServer,
    wrapper: &[&str],
    receiving: bool,
    kill: impl FnOnce(&Peer),
) {
    let dead = Peer::start(server.addr, wrapper);
    let _alive = Peer::start(server.addr, &[]);
    let _feed = receiving.then(|| broadcasting(server));
    // A few intervals of both answering.
    std::thread::sleep(PING * 4);
    let before = server.handle.metrics();
    assert_eq!(
        (before.connections_open, before.closed_idle_timeout),
        (2, 0)
    );
    kill(&dead);
    let killed = Instant::now();
    let closed = |m: &MetricsSnapshot| m.closed_idle_timeout == 1;
    let m = server.wait_for("the dead client closed for its silence", closed);
    let took = killed.elapsed();
    assert!(
        took >= IDLE,
        "closed after {took:?}, before the idle timeout"
    );
    // The loop runs on a thread of a loaded test machine: slack beside
    // the bound, which the bench, not a test, measures.
    let slack = Duration::from_secs(2);
    assert!(
        took <= bound() + slack,
        "closed after {took:?}, bound {:?}",
        bound()
    );
    assert_eq!(m.connections_open, 1, "the client that answers stays");
    if receiving {
        assert!(m.broadcast_deliveries > 0);
    }
}

#[test]
fn a_stopped_client_receiving_broadcasts_is_closed_within_the_bound() {
    let server = server("127.0.0.1:0".parse().unwrap());
    a_dead_peer_is_closed_within_the_bound(&server, &[], true, |p| p.signal("STOP"));
}

#[test]
fn a_stopped_idle_client_is_closed_within_the_bound() {
    let server = server("127.0.0.1:0".parse().unwrap());
    a_dead_peer_is_closed_within_the_bound(&server, &[], false, |p| p.signal("STOP"));
}

/// The clients' namespace and the address (in the server's, where the
/// tests run) that they reach, as run.sh made them.
fn netns() -> Option<(String, SocketAddr)> {
    let name = std::env::var(NETNS_ENV).ok()?;
    let addr = std::env::var("WSPUSH_LIVENESS_LISTEN").expect("run.sh gives the address");
    Some((name, addr.parse().unwrap()))
}

/// The client namespace's link, set down (and up again on drop).
struct LinkDown(String);

impl LinkDown {
    fn set(netns: &str, up: bool) {
        let state = if up { "up" } else { "down" };
        let status = Command::new("ip")
            .args([
                "netns", "exec", netns, "ip", "link", "set", "dev", "veth0", state,
            ])
            .status()
            .unwrap();
        assert!(status.success(), "ip link set {state}");
    }
}

impl Drop for LinkDown {
    fn drop(&mut self) {
        LinkDown::set(&self.0, true);
    }
}

fn a_client_whose_link_is_down_is_closed(receiving: bool) {
    let Some((name, listen)) = netns() else {
        panic!("run through tests/liveness/run.sh, which makes the namespaces");
    };
    let server = server(listen);
    let wrapper = ["ip", "netns", "exec", &name];
    let mut link = None;
    a_dead_peer_is_closed_within_the_bound(&server, &wrapper, receiving, |_| {
        LinkDown::set(&name, false);
        link = Some(LinkDown(name.clone()));
    });
    drop(link);
}

#[test]
#[ignore = "needs the network namespaces tests/liveness/run.sh makes"]
fn a_client_receiving_broadcasts_whose_link_is_down_is_closed_within_the_bound() {
    a_client_whose_link_is_down_is_closed(true);
}

#[test]
#[ignore = "needs the network namespaces tests/liveness/run.sh makes"]
fn an_idle_client_whose_link_is_down_is_closed_within_the_bound() {
    a_client_whose_link_is_down_is_closed(false);
}

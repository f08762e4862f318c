//! `--redis`: published messages read as input beside standard input, the
//! lost feed counted, reported by `/healthz` and reconnected, and under
//! `--processes` one subscription held by the supervisor.
//!
//! The Redis here is a stand-in speaking the RESP2 pub/sub protocol
//! (SUBSCRIBE, PSUBSCRIBE, PING, messages), written from the protocol's
//! description, so that these tests need nothing installed; the
//! multi-host tests (`tests/multihost/run.sh`) run a real `redis-server`.

mod util;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use util::{connect, http_get, listening_addr, sample, Binary, Client, Logged, IO_TIMEOUT};

/// One subscriber connection of the stand-in.
struct Subscriber {
    stream: TcpStream,
    channels: Vec<String>,
    patterns: Vec<String>,
}

#[derive(Default)]
struct State {
    subscribers: Vec<Subscriber>,
    /// Connections are closed at once while false.
    accepting: bool,
    /// Connections accepted (and served) in all.
    served: u64,
    /// Connections closed at once because it was not accepting.
    refused: u64,
}

/// A Redis stand-in on a port of its own.
struct FakeRedis {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl FakeRedis {
    fn start() -> FakeRedis {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            accepting: true,
            ..State::default()
        }));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let mut state = shared.lock().unwrap();
                if !state.accepting {
                    state.refused += 1;
                    continue; // dropped: closed
                }
                state.served += 1;
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || serve(stream, &shared));
            }
        });
        FakeRedis { addr, state }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Sends `payload` on `channel` to each subscriber of it (or of a
    /// pattern matching it); returns how many got it.
    fn publish(&self, channel: &str, payload: &[u8]) -> usize {
        let mut state = self.state.lock().unwrap();
        let mut reached = 0;
        for s in &mut state.subscribers {
            let mut out = Vec::new();
            if s.channels.iter().any(|c| c == channel) {
                push_array(&mut out, &[b"message", channel.as_bytes(), payload]);
            }
            for pattern in s.patterns.iter().filter(|p| glob(p, channel)) {
                push_array(
                    &mut out,
                    &[b"pmessage", pattern.as_bytes(), channel.as_bytes(), payload],
                );
            }
            if !out.is_empty() && s.stream.write_all(&out).is_ok() {
                reached += 1;
            }
        }
        reached
    }

    /// Closes every connection and refuses new ones (`false`), or accepts
    /// them again (`true`).
    fn set_up(&self, up: bool) {
        let mut state = self.state.lock().unwrap();
        state.accepting = up;
        if !up {
            for s in state.subscribers.drain(..) {
                let _ = s.stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// Waits until `done` holds of the state; panics after [`IO_TIMEOUT`].
    fn wait_for(&self, what: &str, done: impl Fn(&State) -> bool) {
        let deadline = Instant::now() + IO_TIMEOUT;
        while !done(&self.state.lock().unwrap()) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Answers one client's commands until it goes.
fn serve(stream: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream.try_clone().unwrap();
    let mut subscribed = false;
    while let Some(command) = read_command(&mut reader) {
        let name = String::from_utf8_lossy(&command[0]).to_ascii_uppercase();
        let args: Vec<String> = command[1..]
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let mut out = Vec::new();
        match name.as_str() {
            "SUBSCRIBE" | "PSUBSCRIBE" => {
                let mut state = state.lock().unwrap();
                if !subscribed {
                    subscribed = true;
                    state.subscribers.push(Subscriber {
                        stream: stream.try_clone().unwrap(),
                        channels: Vec::new(),
                        patterns: Vec::new(),
                    });
                }
                let me = state.subscribers.last_mut().unwrap();
                let kind = name.to_ascii_lowercase();
                for arg in args {
                    let list = match name.as_str() {
                        "SUBSCRIBE" => &mut me.channels,
                        _ => &mut me.patterns,
                    };
                    list.push(arg.clone());
                    let count = me.channels.len() + me.patterns.len();
                    out.extend_from_slice(b"*3\r\n");
                    push_bulk(&mut out, kind.as_bytes());
                    push_bulk(&mut out, arg.as_bytes());
                    out.extend_from_slice(format!(":{count}\r\n").as_bytes());
                }
                // Written under the lock, so no message overtakes it.
                let _ = writer.write_all(&out);
                continue;
            }
            "PING" if subscribed => push_array(&mut out, &[b"pong", b""]),
            "PING" => out.extend_from_slice(b"+PONG\r\n"),
            _ => out.extend_from_slice(b"+OK\r\n"),
        }
        let _state = state.lock().unwrap();
        if writer.write_all(&out).is_err() {
            return;
        }
    }
}

/// Reads one command (an array of bulk strings); `None` at the end.
fn read_command(reader: &mut impl BufRead) -> Option<Vec<Vec<u8>>> {
    let mut line = String::new();
    reader.read_line(&mut line).ok().filter(|&n| n > 0)?;
    let count: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut parts = Vec::with_capacity(count);
    for _ in 0..count {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut part = vec![0; len + 2];
        reader.read_exact(&mut part).ok()?;
        part.truncate(len);
        parts.push(part);
    }
    Some(parts)
}

fn push_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(format!("${}\r\n", bytes.len()).as_bytes());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

fn push_array(out: &mut Vec<u8>, items: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
    for item in items {
        push_bulk(out, item);
    }
}

/// Redis's glob, for `*` only.
fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => name.strip_prefix(head).is_some_and(|rest| {
            (0..=rest.len()).any(|i| rest.is_char_boundary(i) && glob(tail, &rest[i..]))
        }),
    }
}

fn text(client: &mut Client) -> String {
    util::texts(client, 1).remove(0)
}

/// `/healthz`: status and body.
fn health(addr: SocketAddr) -> (u16, String) {
    let response = http_get(addr, "/healthz", "");
    (response.status, response.body.trim_end().to_string())
}

/// `/healthz` once its body is `body` (the feed's state reaches the loop
/// in order with the input's lines); panics after `IO_TIMEOUT`.
fn health_once(addr: SocketAddr, body: &str) -> (u16, String) {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let now = health(addr);
        if now.1 == body {
            return now;
        }
        assert!(Instant::now() < deadline, "{addr} still says {now:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `/healthz` of a server that may not be listening (yet).
fn health_of(addr: SocketAddr) -> Option<(u16, String)> {
    TcpStream::connect(addr).ok()?;
    Some(health(addr))
}

fn metrics(addr: SocketAddr) -> String {
    http_get(addr, "/metrics", "").body
}

#[test]
fn messages_published_on_redis_are_read_as_input_beside_standard_input() {
    let redis = FakeRedis::start();
    let url = redis.url();
    let mut server = Binary::start(&[
        "--redis",
        &url,
        "--redis-channel",
        "news",
        "--redis-channel",
        "prices.*",
    ]);
    server.process.wait_for("redis feed: subscribed on");
    let mut client = connect(server.addr, "/");
    assert_eq!(redis.publish("news", b"one"), 1);
    assert_eq!(text(&mut client), "one");
    server.process.send(b"two\n");
    assert_eq!(text(&mut client), "two");
    // A pattern's message; line ends make it several lines.
    redis.publish("prices.eur", b"three\r\nfour\n");
    assert_eq!([text(&mut client), text(&mut client)], ["three", "four"]);
    redis.publish("news", b"\xFFnot text");
    redis.publish("news", b"");
    assert_eq!(text(&mut client), "", "an empty message is an empty line");
    server.process.send(b"five\n");
    assert_eq!(text(&mut client), "five");
    let page = metrics(server.addr);
    assert_eq!(sample(&page, "wspush_input_lines_rejected_total"), 1);
    assert_eq!(sample(&page, "wspush_feed_outages_total"), 0);
    assert_eq!(health(server.addr), (200, "ok".into()));
}

#[test]
fn a_lost_feed_is_counted_once_reported_and_reconnected_while_clients_stay() {
    let redis = FakeRedis::start();
    let url = redis.url();
    let server = Binary::start(&[
        "--redis",
        &url,
        "--redis-channel",
        "news",
        "--healthz-degraded",
        "503",
    ]);
    server.process.wait_for("redis feed: subscribed on");
    let mut client = connect(server.addr, "/");
    redis.publish("news", b"before");
    assert_eq!(text(&mut client), "before");

    redis.set_up(false);
    server.process.wait_for("redis feed lost on");
    let lost = "degraded: an input feed is lost";
    assert_eq!(health_once(server.addr, lost), (503, lost.into()));
    let page = metrics(server.addr);
    assert_eq!(sample(&page, "wspush_feeds_down"), 1);
    assert_eq!(sample(&page, "wspush_feed_outages_total"), 1);
    // Several attempts fail; the outage is logged and counted once.
    redis.wait_for("three refused attempts", |s| s.refused >= 3);
    redis.set_up(true);
    let mut logged = Vec::new();
    loop {
        let line = server.process.next_line();
        if line.contains("redis feed restored on") {
            assert!(line.contains(" attempts)"), "{line}");
            break;
        }
        logged.push(line);
    }
    assert!(
        !logged.iter().any(|l| l.contains("redis feed")),
        "logged once per outage: {logged:?}"
    );

    assert_eq!(health_once(server.addr, "ok"), (200, "ok".into()));
    let page = metrics(server.addr);
    assert_eq!(sample(&page, "wspush_feeds_down"), 0);
    assert_eq!(sample(&page, "wspush_feed_outages_total"), 1);
    assert!(sample(&page, "wspush_feed_outage_milliseconds_total") > 0);
    assert_eq!(sample(&page, "wspush_connections_open"), 1);
    redis.wait_for("the subscription again", |s| s.subscribers.len() == 1);
    redis.publish("news", b"after");
    assert_eq!(text(&mut client), "after", "the client stayed");
}

#[test]
fn under_processes_the_supervisor_holds_the_one_subscription() {
    let redis = FakeRedis::start();
    let port = util::free_ports(3);
    let metrics_listen = format!("127.0.0.1:{port}");
    let mut process = Logged::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_wspush"))
            .args(["--listen", "127.0.0.1:0", "--processes", "2"])
            .args(["--redis", &redis.url(), "--redis-channel", "news"])
            .args(["--metrics-listen", &metrics_listen])
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::piped()),
    );
    let addr = listening_addr(&process.wait_for(" with 2 instances"));
    process.wait_for("redis feed: subscribed on");
    let instances: Vec<SocketAddr> = (1..=2)
        .map(|k| SocketAddr::from(([127, 0, 0, 1], port + k)))
        .collect();
    for &at in &instances {
        let deadline = Instant::now() + IO_TIMEOUT;
        while TcpStream::connect(at).is_err() {
            assert!(Instant::now() < deadline, "instance metrics on {at}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut clients: Vec<Client> = (0..8).map(|_| connect(addr, "/")).collect();
    let open: u64 = instances
        .iter()
        .map(|&at| sample(&metrics(at), "wspush_connections_open"))
        .sum();
    assert_eq!(open, 8);
    assert_eq!(redis.state.lock().unwrap().served, 1, "one subscription");
    redis.publish("news", b"hello");
    for client in &mut clients {
        assert_eq!(text(client), "hello");
    }
    process.send(b"from stdin\n");
    for client in &mut clients {
        assert_eq!(text(client), "from stdin");
    }

    redis.set_up(false);
    process.wait_for("redis feed lost on");
    for &at in &instances {
        let lost = "degraded: an input feed is lost";
        assert_eq!(health_once(at, lost), (200, lost.into()));
    }
    // An instance started again meanwhile is told at once.
    let supervisor = process.child.id();
    let children =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children")).unwrap();
    let first = children.split_whitespace().next().expect("an instance");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", first])
        .status()
        .unwrap();
    assert!(killed.success());
    process.wait_for("started again");
    for &at in &instances {
        let deadline = Instant::now() + IO_TIMEOUT;
        while health_of(at).is_none_or(|h| h.1 == "ok") {
            assert!(
                Instant::now() < deadline,
                "instance on {at} degraded after its restart"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    redis.set_up(true);
    process.wait_for("redis feed restored on");
    for &at in &instances {
        health_once(at, "ok");
        let page = metrics(at);
        assert_eq!(sample(&page, "wspush_feed_outages_total"), 1);
        assert_eq!(sample(&page, "wspush_feeds_down"), 0);
    }
    assert_eq!(redis.state.lock().unwrap().served, 2, "one reconnection");
    redis.wait_for("the subscription again", |s| s.subscribers.len() == 1);
    // The killed instance's clients went with it: new ones, on both.
    drop(clients);
    let mut clients: Vec<Client> = (0..8).map(|_| connect(addr, "/")).collect();
    redis.publish("news", b"after");
    for client in &mut clients {
        assert_eq!(text(client), "after");
    }

    // SIGUSR2 with this binary: the supervisor re-executes itself, its
    // subscription stopped and made again by its next image, and its
    // instances are upgraded; the clients stay.
    let signaled = std::process::Command::new("kill")
        .args(["-USR2", &supervisor.to_string()])
        .status()
        .unwrap();
    assert!(signaled.success());
    process.wait_for("redis feed stopped for the next image");
    process.wait_for("the supervisor re-executed with its 2 instances");
    process.wait_for("the upgrade of the 2 instances is done");
    // (The fake keeps the closed subscription among its subscribers.)
    redis.wait_for("the next image's subscription", |s| {
        s.served == 3 && s.subscribers.len() == 2
    });
    redis.publish("news", b"after the upgrade");
    for client in &mut clients {
        assert_eq!(text(client), "after the upgrade");
    }
}

#[test]
fn redis_flags_are_checked_before_starting() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wspush"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        stderr
    };
    let e = run(&["--redis", "redis://127.0.0.1:1"]);
    assert!(e.contains("--redis-channel"), "{e}");
    let e = run(&["--redis-channel", "news"]);
    assert!(e.contains("--redis"), "{e}");
    let e = run(&["--redis", "http://x", "--redis-channel", "news"]);
    assert!(e.starts_with("wspush: --redis http://x: "), "{e}");
    let e = run(&["--healthz-degraded", "404"]);
    assert!(e.contains("404"), "{e}");
}

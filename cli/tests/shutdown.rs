//! Stopping the binary. SIGINT (or SIGTERM with `--drain-time 0`) during a
//! stream of broadcasts: every client gets every message the server took
//! before the signal, the same ones, in order, then a 1001 close; the
//! process exits 0. SIGTERM drains: `/healthz` says so first, accepting
//! goes on for the grace, then the connections are closed with 1012 spread
//! over the drain time, each client with positions told when to come back;
//! a second signal exits at once.

mod util;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::Message;
use util::{
    connect, finish_close, http_get, raw, read_frame, read_response, upgrade_request, Binary,
    IO_TIMEOUT,
};

#[test]
fn sigint_during_a_broadcast_stream_delivers_what_was_sent_then_1001() {
    stop_during_a_broadcast_stream("-INT", &["--quiet"]);
}

#[test]
fn sigterm_without_a_drain_time_is_the_same_as_sigint() {
    stop_during_a_broadcast_stream("-TERM", &["--quiet", "--drain-time", "0"]);
}

/// Sends `signal` to `wspush ARGS` while five clients take a stream of
/// lines: each gets the same lines, in order, then 1001; it exits 0.
fn stop_during_a_broadcast_stream(signal: &str, args: &[&str]) {
    let mut server = Binary::start(args);
    let mut clients: Vec<_> = (0..5)
        .map(|i| connect(server.addr, &format!("/?id={i}")))
        .collect();

    // A feeder writes numbered lines as fast as the server takes them.
    let (stop, feeder) = feed(&mut server, "", Duration::ZERO);

    // Let the stream run, then signal while it is still flowing.
    for client in &mut clients[..1] {
        for expected in 1..=200u64 {
            assert_eq!(client.read().unwrap(), Message::text(expected.to_string()));
        }
    }
    kill(&server, signal);

    let mut lasts = Vec::new();
    for (i, client) in clients.iter_mut().enumerate() {
        let mut next = if i == 0 { 201 } else { 1 };
        loop {
            match client.read() {
                Ok(Message::Text(text)) => {
                    assert_eq!(
                        text.as_str(),
                        next.to_string(),
                        "client {i}: gap or reorder"
                    );
                    next += 1;
                }
                Ok(Message::Close(Some(frame))) => {
                    assert_eq!(frame.code, CloseCode::Away, "client {i}");
                    break;
                }
                other => panic!("client {i}: unexpected {other:?}"),
            }
        }
        lasts.push(next - 1);
    }
    stop.store(true, Ordering::Relaxed);
    assert!(lasts[0] >= 200, "{lasts:?}");
    assert!(
        lasts.iter().all(|&last| last == lasts[0]),
        "every client got the same messages: {lasts:?}"
    );

    // Each client answers the close (tungstenite does on read) and goes;
    // the server exits 0 as soon as all are gone.
    for client in &mut clients {
        let _ = client.read();
    }
    drop(clients);
    assert_eq!(exit_code(&mut server), Some(0));
    feeder.join().unwrap();
}

/// A thread that writes `PREFIX1`, `PREFIX2` ... to the server's input,
/// `pause` apart, until the flag is set or the server is gone.
fn feed(
    server: &mut Binary,
    prefix: &'static str,
    pause: Duration,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let mut stdin = server.process.child.stdin.take().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                if writeln!(stdin, "{prefix}{n}").is_err() {
                    break; // The server is gone.
                }
                std::thread::sleep(pause);
            }
        })
    };
    (stop, feeder)
}

/// Sends `signal` (`-TERM`, `-INT`) to the server.
fn kill(server: &Binary, signal: &str) {
    util::signal(server.process.child.id(), signal);
}

/// Waits for the server to exit; its exit code.
fn exit_code(server: &mut Binary) -> Option<i32> {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        if let Some(status) = server.process.child.try_wait().unwrap() {
            return status.code();
        }
        assert!(Instant::now() < deadline, "the server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a client with positions got until its connection was closed.
#[derive(Debug)]
struct Drained {
    /// The sequence numbers of the messages, in order.
    seqs: Vec<u64>,
    /// The last status before the close, if any.
    last_status: Option<String>,
    /// The close code.
    code: Option<u16>,
    /// When the close frame arrived.
    closed_at: Instant,
}

/// A client that asked for positions, read on its own thread until its
/// close: what it got, checked to be gapless from its first status on.
fn positioned_client(addr: SocketAddr) -> std::thread::JoinHandle<Drained> {
    let mut stream = raw(addr);
    stream
        .write_all(upgrade_request("/?positions=1").as_bytes())
        .unwrap();
    assert_eq!(read_response(&mut stream).status, 101);
    std::thread::spawn(move || {
        let mut seqs = Vec::new();
        let mut last_status = None;
        loop {
            let frame = read_frame(&mut stream).expect("a close before the end");
            match frame.opcode {
                0x1 => {
                    let text = String::from_utf8(frame.payload).unwrap();
                    if text.starts_with('{') {
                        if let Some(at) = text.find("\"position\":\"") {
                            let rest = &text[at + 12..];
                            let position = &rest[..rest.find('"').unwrap()];
                            seqs.push(seq_of(position));
                        }
                        last_status = Some(text);
                    } else {
                        let position = text.split(' ').next().unwrap();
                        seqs.push(seq_of(position));
                        last_status = None;
                    }
                }
                0x8 => {
                    let drained = Drained {
                        seqs,
                        last_status,
                        code: frame.close_code(),
                        closed_at: Instant::now(),
                    };
                    finish_close(&mut stream);
                    return drained;
                }
                _ => {}
            }
        }
    })
}

/// The sequence number of a position `EPOCH.SEQ`.
fn seq_of(position: &str) -> u64 {
    position.rsplit('.').next().unwrap().parse().unwrap()
}

/// Checks a drained client: gapless from the position it was told first,
/// the hint, then 1012. Returns the hint's delay.
fn check_drained(drained: &Drained) -> Duration {
    assert!(
        drained.seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "gapless: {:?}",
        drained.seqs
    );
    assert_eq!(drained.code, Some(1012), "{drained:?}");
    let hint = drained
        .last_status
        .as_deref()
        .expect("the hint before the close");
    let delay = hint
        .strip_prefix(r#"{"status":"reconnect","delay_ms":"#)
        .and_then(|rest| rest.strip_suffix('}'))
        .unwrap_or_else(|| panic!("not a hint: {hint}"));
    Duration::from_millis(delay.parse().unwrap())
}

#[test]
fn sigterm_drains_healthz_first_then_closes_with_1012_and_a_hint_spread_over_the_drain_time() {
    let mut server = Binary::start(&["--quiet", "--drain-time", "2s", "--drain-grace", "1s"]);
    let mut clients: Vec<_> = (0..40).map(|_| positioned_client(server.addr)).collect();
    let (stop, feeder) = feed(&mut server, "line ", Duration::from_millis(10));
    assert_eq!(http_get(server.addr, "/healthz", "").status, 200);

    kill(&server, "-TERM");
    let flipped = loop {
        let health = http_get(server.addr, "/healthz", "");
        if health.status == 503 {
            assert_eq!(health.body, "draining\n");
            break Instant::now();
        }
        assert_eq!(health.status, 200);
    };
    // The grace: a client still gets in, and is drained with the others.
    clients.push(positioned_client(server.addr));
    let drained: Vec<Drained> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    // Accepting stopped: the listener is closed.
    let refused = std::net::TcpStream::connect(server.addr).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);

    let mut times = Vec::new();
    for client in &drained {
        let delay = check_drained(client);
        // 41 closes over 2 s: a close every 49 ms, the hint within it.
        assert!(delay < Duration::from_millis(49), "{delay:?}");
        assert!(client.closed_at > flipped, "/healthz said draining first");
        times.push(client.closed_at - flipped);
    }
    times.sort();
    let span = times[40] - times[0];
    assert!(
        span >= Duration::from_secs(1),
        "spread over the drain time: {times:?}"
    );
    let most_in_a_half_second = times
        .iter()
        .map(|&t| {
            times
                .iter()
                .filter(|&&u| u >= t && u < t + Duration::from_millis(500))
                .count()
        })
        .max()
        .unwrap();
    assert!(
        most_in_a_half_second <= 20,
        "about 10 a half second: {times:?}"
    );
    assert_eq!(exit_code(&mut server), Some(0));
    feeder.join().unwrap();
}

/// SIGHUP and SIGUSR2 roll and upgrade a supervisor's instances; a lone
/// server says it ignores them and serves on (their default is death).
#[test]
fn a_lone_server_ignores_sighup_and_serves_on() {
    let mut server = Binary::start(&["--quiet"]);
    let mut client = util::connect(server.addr, "/");
    kill(&server, "-HUP");
    server.process.wait_for("(SIGHUP): only a supervisor");
    server.process.send(b"still here\n");
    match client.read().unwrap() {
        Message::Text(text) => assert_eq!(text.as_str(), "still here"),
        other => panic!("{other:?}"),
    }
    kill(&server, "-INT");
    assert_eq!(exit_code(&mut server), Some(0));
}

#[test]
fn a_second_signal_ends_a_drain_at_once() {
    let mut server = Binary::start(&["--quiet", "--drain-time", "60s", "--drain-grace", "60s"]);
    let client = positioned_client(server.addr);
    kill(&server, "-TERM");
    while http_get(server.addr, "/healthz", "").status != 503 {}
    kill(&server, "-TERM");
    assert_eq!(exit_code(&mut server), Some(130));
    assert!(client.join().is_err(), "no close: the process ended");
}

#[test]
fn a_sigterm_as_soon_as_it_listens_exits_cleanly() {
    // The handlers are set before the listener opens: a SIGTERM that
    // comes the moment a connection is first accepted by the kernel is a
    // drain (of nothing), never the signal's default death. Tried a few
    // times, each signalling at the first connect that succeeds.
    for _ in 0..10 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_wspush"))
            .args([
                "--listen",
                &addr.to_string(),
                "--quiet",
                "--drain-time",
                "0",
            ])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        // A connect to a port nothing listens on can meet itself (the
        // kernel may pick that very port as its own): not the server.
        let listens =
            || std::net::TcpStream::connect(addr).is_ok_and(|s| s.local_addr().unwrap() != addr);
        while !listens() {
            assert!(started.elapsed() < IO_TIMEOUT, "it never listened");
        }
        // From this process, not `kill`'s: at once.
        let pid = rustix::process::Pid::from_child(&child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{status:?}");
    }
}

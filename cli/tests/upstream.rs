//! Upstream: what clients send, as lines on standard output.

mod util;

use std::io::{BufRead, BufReader, Read};
use std::process::{ChildStdout, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread;

use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::CloseFrame;
use tungstenite::Message;
use util::{connect, http_get, listening_addr, sample, Logged, IO_TIMEOUT};

/// `wspush --listen 127.0.0.1:0 ARGS` with standard input and output piped.
fn start(args: &[&str]) -> (Logged, std::net::SocketAddr, ChildStdout) {
    let mut process = Logged::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_wspush"))
            .args(["--listen", "127.0.0.1:0", "--quiet"])
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    );
    let addr = listening_addr(&process.wait_for("listening on "));
    let stdout = process.child.stdout.take().unwrap();
    (process, addr, stdout)
}

/// Standard output's lines on a channel, read by a thread.
fn lines(stdout: ChildStdout) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

fn next(lines: &Receiver<String>) -> String {
    lines
        .recv_timeout(IO_TIMEOUT)
        .expect("an upstream line in time")
}

#[test]
fn client_messages_and_events_come_out_one_line_each_in_order() {
    let (mut server, addr, stdout) = start(&[
        "--upstream",
        "stdout",
        "--upstream-events",
        "--input",
        "commands",
    ]);
    let lines = lines(stdout);
    let mut alice = connect(addr, "/?id=alice&channel=news&channel=chat");
    let open = next(&lines);
    let words: Vec<&str> = open.split(' ').collect();
    assert_eq!(
        (words[0], words[2], words[3]),
        ("open", "alice", "news,chat"),
        "{open}"
    );
    let key = words[1].to_string();
    assert_eq!(key.split('.').count(), 3, "{key}");

    alice.send(Message::text("hello\nworld")).unwrap();
    alice.send(Message::binary(vec![0u8, 1, 2])).unwrap();
    alice.send(Message::text("a\\b\r")).unwrap();
    alice.send(Message::text("")).unwrap();
    assert_eq!(next(&lines), format!("msg {key} alice text hello\\nworld"));
    assert_eq!(next(&lines), format!("msg {key} alice binary AAEC"));
    assert_eq!(next(&lines), format!("msg {key} alice text a\\\\b\\r"));
    assert_eq!(next(&lines), format!("msg {key} alice text "));

    // The program answers through standard input, by key.
    server.send(format!("conn {key} got it\n").as_bytes());
    assert_eq!(alice.read().unwrap(), Message::text("got it"));

    let mut bob = connect(addr, "/");
    let bob_key = next(&lines).split(' ').nth(1).unwrap().to_string();
    for i in 0..200 {
        bob.send(Message::text(i.to_string())).unwrap();
    }
    for i in 0..200 {
        assert_eq!(next(&lines), format!("msg {bob_key} - text {i}"));
    }
    alice
        .close(Some(CloseFrame {
            code: CloseCode::from(4000),
            reason: "bye".into(),
        }))
        .unwrap();
    while alice.read().is_ok() {}
    assert_eq!(next(&lines), format!("close {key} alice 4000"));
}

/// A client that sends `count` messages of `size` bytes, from a thread.
fn sender(addr: std::net::SocketAddr, count: usize, size: usize) -> thread::JoinHandle<()> {
    let mut client = connect(addr, "/");
    thread::spawn(move || {
        for i in 0..count {
            let mut text = format!("{i:06} ");
            text.extend(std::iter::repeat_n('x', size - text.len()));
            client.send(Message::text(text)).unwrap();
        }
        client.flush().unwrap();
        // Keep the connection until the server has read everything.
        let _ = client.read();
    })
}

fn metric(addr: std::net::SocketAddr, series: &str) -> u64 {
    sample(&http_get(addr, "/metrics", "").body, series)
}

#[test]
fn a_slow_reader_pauses_the_clients_and_loses_nothing() {
    const COUNT: usize = 3000;
    let (_server, addr, mut stdout) =
        start(&["--upstream", "stdout", "--upstream-max-bytes", "8192"]);
    let _sending = sender(addr, COUNT, 1000);
    // Nobody reads standard output: its pipe fills, then the bound.
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    while metric(addr, "wspush_upstream_pauses_total") == 0 {
        assert!(std::time::Instant::now() < deadline, "reading never paused");
        thread::yield_now();
    }
    let received = metric(addr, "wspush_messages_received_total");
    assert!(received < COUNT as u64, "paused before the end: {received}");
    // Now read: every message comes out, in order.
    let mut out = Vec::new();
    let mut buf = [0u8; 1 << 16];
    let mut seen = 0;
    while seen < COUNT {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "output ended after {seen} lines");
        out.extend_from_slice(&buf[..n]);
        seen = out.iter().filter(|&&b| b == b'\n').count();
    }
    let text = String::from_utf8(out).unwrap();
    for (i, line) in text.lines().enumerate() {
        let number = line.split(' ').nth(4).unwrap();
        assert_eq!(number, format!("{i:06}"), "line {i}");
    }
    assert_eq!(metric(addr, "wspush_upstream_dropped_total"), 0);
    assert_eq!(metric(addr, "wspush_upstream_messages_total"), COUNT as u64);
}

#[test]
fn with_drop_a_slow_reader_loses_messages_but_counts_each() {
    const COUNT: u64 = 3000;
    let (_server, addr, _stdout) = start(&[
        "--upstream",
        "stdout",
        "--upstream-max-bytes",
        "8192",
        "--upstream-overflow",
        "drop",
    ]);
    let sending = sender(addr, COUNT as usize, 1000);
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    while metric(addr, "wspush_messages_received_total") < COUNT {
        assert!(std::time::Instant::now() < deadline, "not all received");
        thread::yield_now();
    }
    let written = metric(addr, "wspush_upstream_messages_total");
    let dropped = metric(addr, "wspush_upstream_dropped_total");
    assert!(dropped > 0, "the reader never fell behind");
    assert_eq!(written + dropped, COUNT, "each message written or counted");
    assert_eq!(metric(addr, "wspush_upstream_pauses_total"), 0);
    drop(sending);
}

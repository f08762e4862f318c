//! Connection limits: `max_connections` answers 503, and running out of
//! file descriptors pauses accepting instead of spinning, then recovers.

mod util;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use util::{
    connect, listening_addr, raw, read_response, upgrade_request, Logged, TestServer, IO_TIMEOUT,
};
use wspush::Config;

#[test]
fn connections_past_the_limit_get_503_and_capacity_comes_back() {
    let server = TestServer::start(Config {
        max_connections: 2,
        ..Config::default()
    });
    let first = connect(server.addr, "/");
    let _second = connect(server.addr, "/");

    let mut third = raw(server.addr);
    third.write_all(upgrade_request("/").as_bytes()).unwrap();
    let response = read_response(&mut third);
    assert_eq!(response.status, 503);
    assert!(response.body.contains("connection limit"));
    assert_eq!(server.handle.metrics().rejected_503, 1);

    drop(first);
    server.wait_for("the first client to be gone", |m| m.connections_open == 1);
    let _again = connect(server.addr, "/");
}

/// CPU time (user + system) of a process, in clock ticks (1/100 s).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    // Fields 14 and 15 of stat(5) (utime, stime), counted after the name.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn out_of_file_descriptors_pauses_accepting_without_spinning_and_recovers() {
    // The server may open 48 files: a few for itself, the rest sockets;
    // `--max-connections` above that makes it run out of descriptors
    // rather than answer 503.
    let server = Logged::spawn(
        Command::new("sh")
            .args([
                "-c",
                "ulimit -n 48 && exec \"$0\" --listen 127.0.0.1:0 --max-connections 1000",
                env!("CARGO_BIN_EXE_wspush"),
            ])
            .env("RUST_LOG", "warn,wspush=info")
            .stdin(Stdio::piped()),
    );
    let pid = server.child.id();
    let addr = listening_addr(&server.wait_for("listening on"));

    // 80 connections: the kernel completes them all, the server can take ~40.
    let mut clients: Vec<_> = (0..80).map(|_| raw(addr)).collect();
    server.wait_for("accept paused");

    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let spent = cpu_ticks(pid) - before;
    assert!(
        spent <= 10,
        "the loop spun while out of file descriptors: {spent} ticks in 1 s"
    );

    // Close every client; the server frees its descriptors and accepts again.
    clients.clear();
    let deadline = Instant::now() + IO_TIMEOUT;
    let stream = loop {
        let mut stream = raw(addr);
        stream.write_all(upgrade_request("/").as_bytes()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut first = [0u8; 12];
        if std::io::Read::read_exact(&mut stream, &mut first).is_ok() {
            assert_eq!(&first, b"HTTP/1.1 101", "recovered and upgraded");
            break stream;
        }
        assert!(Instant::now() < deadline, "the server did not recover");
    };
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
}

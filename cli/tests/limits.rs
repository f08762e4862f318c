//! The binary's own limits: running out of file descriptors pauses
//! accepting instead of spinning, then recovers; a slowloris is timed out
//! and its memory given back to the system.

mod util;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use util::{
    connect, listening_addr, need_open_files, raw, upgrade_request, Binary, Logged, IO_TIMEOUT,
};

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

/// Resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// 10,000 connections that send half a request head and stop: each is
/// closed at the handshake timeout, everyone else is served meanwhile, and
/// the buffers they held go back to the system.
#[test]
fn a_ten_thousand_socket_slowloris_is_timed_out_and_its_memory_returned() {
    const SLOW: usize = 10_000;
    // The clients' ends here; the server, a child, raises its own limit.
    need_open_files(SLOW as u64 + 64);
    let mut server = Binary::start(&["--handshake-timeout", "3s", "--quiet"]);
    let pid = server.process.child.id();
    let baseline = rss(pid);

    let slow: Vec<_> = (0..SLOW)
        .map(|i| {
            let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
            write!(stream, "GET /ws?id={i} HTTP/1.1\r\nHost: localhost\r\n").unwrap();
            stream
        })
        .collect();
    let page = |server: &Binary| util::http_get(server.addr, "/metrics", "").body;
    let timed_out = "wspush_connections_closed_total{reason=\"handshake_timeout\"}";
    // Until every one has arrived (on a loaded machine the first may time
    // out before the last connects), noting the highest resident size.
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut peak = baseline;
    loop {
        let metrics = page(&server);
        peak = peak.max(rss(pid));
        let held = util::sample(&metrics, "wspush_buffers_lent");
        if held + util::sample(&metrics, timed_out) >= SLOW as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Served meanwhile.
    let mut client = connect(server.addr, "/");
    server.process.send(b"still serving\n");
    assert_eq!(
        client.read().unwrap(),
        tungstenite::Message::text("still serving")
    );

    let deadline = Instant::now() + IO_TIMEOUT;
    let metrics = loop {
        let metrics = page(&server);
        if util::sample(&metrics, timed_out) == SLOW as u64
            && util::sample(&metrics, "wspush_buffers_idle") <= 64
        {
            break metrics;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        util::sample(&metrics, "wspush_buffers_lent"),
        0,
        "{metrics}"
    );
    assert!(util::sample(&metrics, "wspush_buffers_released_total") >= (SLOW - 64) as u64);
    let after = rss(pid);
    eprintln!("resident memory: baseline {baseline}, peak {peak}, after {after}");
    assert!(
        peak > baseline + 20_000_000,
        "the half-sent heads held their buffers: {baseline} -> {peak}"
    );
    assert!(
        after < baseline + (peak - baseline) / 4,
        "memory came back: baseline {baseline}, peak {peak}, after {after}"
    );
    drop(slow);
}

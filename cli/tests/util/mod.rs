//! The helpers of the binary's integration tests: the library's
//! (`tests/util`, shared), and a `wspush` process run with its log on a
//! channel, alone or as a supervisor of instances.
#![allow(dead_code)] // Each test binary uses a different subset.

#[path = "../../../tests/util/mod.rs"]
mod shared;

pub use shared::*;

pub mod deploy;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread::JoinHandle;
use std::time::Duration;

/// A child process whose standard error arrives line by line on a channel
/// (so waiting for a line can time out); killed when dropped.
pub struct Logged {
    pub child: std::process::Child,
    log: std::sync::mpsc::Receiver<String>,
}

impl Logged {
    /// Spawns `command` with its standard error piped to the channel.
    pub fn spawn(command: &mut std::process::Command) -> Logged {
        use std::io::BufRead;
        let mut child = command
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        Logged { child, log }
    }

    /// The next line logged; panics after [`IO_TIMEOUT`].
    pub fn next_line(&self) -> String {
        self.log
            .recv_timeout(IO_TIMEOUT)
            .expect("a log line in time")
    }

    /// Skips lines until one contains `needle`, and returns it; panics
    /// after [`IO_TIMEOUT`] in all (other lines, such as the periodic
    /// stats, do not extend it).
    pub fn wait_for(&self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + IO_TIMEOUT;
        let mut skipped = std::collections::VecDeque::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self.log.recv_timeout(left).unwrap_or_else(|e| {
                panic!("no log line with {needle:?} in time ({e:?}); the last ones: {skipped:#?}")
            });
            if line.contains(needle) {
                return line;
            }
            if skipped.len() == 20 {
                skipped.pop_front();
            }
            skipped.push_back(line);
        }
    }

    /// Lines logged so far and not read yet.
    pub fn rest(&self) -> Vec<String> {
        self.log.try_iter().collect()
    }

    /// Every line not read yet, up to the end of the log (once the child
    /// and whatever shares its standard error have exited); panics if the
    /// end does not come within [`IO_TIMEOUT`].
    pub fn until_end(&self) -> Vec<String> {
        let deadline = std::time::Instant::now() + IO_TIMEOUT;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return lines,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    panic!("the log did not end in time; so far {lines:?}")
                }
            }
        }
    }

    /// Writes to the child's standard input (which must be piped).
    pub fn send(&mut self, bytes: &[u8]) {
        let stdin = self.child.stdin.as_mut().expect("stdin is piped");
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address in a `listening on ADDR …` log line.
pub fn listening_addr(line: &str) -> SocketAddr {
    let rest = line
        .split("listening on ")
        .nth(1)
        .expect("a 'listening on' line");
    rest.split(' ').next().unwrap().parse().expect("an address")
}

/// A running `wspush` binary listening on port 0, with its stdin piped and
/// its log lines on a channel; killed when dropped.
pub struct Binary {
    pub process: Logged,
    pub addr: SocketAddr,
}

impl Binary {
    /// Starts `wspush --listen 127.0.0.1:0 ARGS` logging at `info`.
    pub fn start(args: &[&str]) -> Binary {
        Binary::start_logging(args, "info")
    }

    /// Starts it with `RUST_LOG=rust_log`.
    pub fn start_logging(args: &[&str], rust_log: &str) -> Binary {
        let process = Logged::spawn(
            std::process::Command::new(env!("CARGO_BIN_EXE_wspush"))
                .args(["--listen", "127.0.0.1:0"])
                .args(args)
                .env("RUST_LOG", rust_log)
                .stdin(std::process::Stdio::piped()),
        );
        let addr = listening_addr(&process.wait_for("listening on "));
        Binary { process, addr }
    }
}

/// What a [`resuming_client`] got.
#[derive(Debug, Default)]
pub struct Resumed {
    /// The payloads of the messages, in order.
    pub payloads: Vec<String>,
    /// Every status it was told, in order (the JSON objects).
    pub statuses: Vec<String>,
    /// The close codes of the connections that ended.
    pub closes: Vec<u16>,
    /// Connection attempts that failed (refused, reset, or not upgraded).
    pub failed_connects: usize,
}

/// A client that asks for positions and, whenever its connection ends,
/// reconnects with `since` its last position (after the delay of a
/// `reconnect` hint, if it was given one), until a message `stop_at`
/// arrives; on its own thread.
pub fn resuming_client(addr: SocketAddr, stop_at: &str) -> JoinHandle<Resumed> {
    let stop_at = stop_at.to_string();
    std::thread::spawn(move || {
        let mut resumed = Resumed::default();
        let mut position: Option<String> = None;
        let deadline = std::time::Instant::now() + 6 * IO_TIMEOUT;
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "never got {stop_at:?}: {resumed:?}"
            );
            let path = match &position {
                Some(p) => format!("/?since={p}"),
                None => "/?positions=1".to_string(),
            };
            let Ok(mut stream) = TcpStream::connect(addr) else {
                resumed.failed_connects += 1;
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
            let upgraded = stream.write_all(upgrade_request(&path).as_bytes()).is_ok()
                && read_head_status(&mut stream) == Some(101);
            if !upgraded {
                resumed.failed_connects += 1;
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            let mut hint = Duration::ZERO;
            while let Some(frame) = read_frame(&mut stream) {
                match frame.opcode {
                    0x1 => {
                        let text = String::from_utf8(frame.payload).unwrap();
                        if text.starts_with('{') {
                            if let Some(at) = text.find("\"delay_ms\":") {
                                let ms = text[at + 11..].trim_end_matches('}');
                                hint = Duration::from_millis(ms.parse().unwrap());
                            }
                            if position.is_none() {
                                if let Some(at) = text.find("\"position\":\"") {
                                    let rest = &text[at + 12..];
                                    position = Some(rest[..rest.find('"').unwrap()].to_string());
                                }
                            }
                            if text.contains("\"status\":\"gap\"") {
                                let at = text.find("\"to\":\"").unwrap();
                                let rest = &text[at + 6..];
                                position = Some(rest[..rest.find('"').unwrap()].to_string());
                            }
                            resumed.statuses.push(text);
                            continue;
                        }
                        let (at, payload) = text.split_once(' ').unwrap();
                        position = Some(at.to_string());
                        resumed.payloads.push(payload.to_string());
                        if payload == stop_at {
                            return resumed;
                        }
                    }
                    0x8 => {
                        resumed.closes.push(frame.close_code().unwrap_or(0));
                        let _ = stream.write_all(&client_frame(CLOSE, &[]));
                        break;
                    }
                    _ => {}
                }
            }
            std::thread::sleep(hint);
        }
    })
}

/// The status code of an HTTP response head, read byte by byte; `None`
/// if the connection ends (or fails) first.
fn read_head_status(stream: &mut TcpStream) -> Option<u16> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    std::str::from_utf8(head.get(9..12)?).ok()?.parse().ok()
}

/// Starts `binary --listen 127.0.0.1:0 ARGS` (with `--processes`) logging
/// at `rust_log`, with its standard input piped, and waits until the
/// supervisor and its `instances` instances listen; its log and address.
pub fn start_supervisor(
    binary: &std::path::Path,
    args: &[&str],
    instances: usize,
    rust_log: &str,
) -> (Logged, SocketAddr) {
    let process = Logged::spawn(
        std::process::Command::new(binary)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", rust_log)
            .stdin(std::process::Stdio::piped()),
    );
    let mut addr = None;
    let mut listening = 0;
    while listening < instances || addr.is_none() {
        let line = process.next_line();
        if line.contains(" instances, up to") {
            assert!(
                line.contains(&format!(" with {instances} instances")),
                "{line}"
            );
            addr = Some(listening_addr(&line));
        } else if line.contains("] listening on ") {
            listening += 1;
        }
    }
    (process, addr.unwrap())
}

/// The publishers' key a [`KeyFile`] holds.
pub const PUBLISH_KEY: &str = "the-publishers-key";

/// A key file (removed when dropped).
pub struct KeyFile(std::path::PathBuf);

impl KeyFile {
    /// A new key file holding [`PUBLISH_KEY`].
    pub fn new() -> KeyFile {
        let path = std::env::temp_dir().join(format!(
            "wspush-publish-key-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&path, format!("# publishers\n{PUBLISH_KEY}\n")).unwrap();
        KeyFile(path)
    }

    /// Its path.
    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The address of a `publish on http://ADDR/publish` log line.
pub fn publish_addr(line: &str) -> SocketAddr {
    let rest = line
        .split("publish on http://")
        .nth(1)
        .expect("a publish line");
    rest.trim_end_matches("/publish")
        .parse()
        .expect("an address")
}

/// The first of `count` free ports in a row (for `--metrics-listen`
/// under a supervisor: its own, then instance K's on PORT+K).
pub fn free_ports(count: u16) -> u16 {
    loop {
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        let rest_free = (1..count).all(|k| {
            port.checked_add(k)
                .is_some_and(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        });
        if rest_free {
            return port;
        }
    }
}

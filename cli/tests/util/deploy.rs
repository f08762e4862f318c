//! What the tests of deploys share: a copy of the binary to replace on
//! disk ([`Deployed`]), a feed of numbered lines, and the clients that
//! check every line arrived once, in order.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{read_response, upgrade_request, Logged, Resumed};

/// Feeds `line 1` … `line N` 10 ms apart from a thread, then `end`; the
/// count of lines written so far is in `fed`.
pub fn feed(
    process: &mut Logged,
    lines: usize,
    fed: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<()> {
    let mut stdin = process.child.stdin.take().unwrap();
    std::thread::spawn(move || {
        use std::io::Write;
        for n in 1..=lines {
            writeln!(stdin, "line {n}").unwrap();
            fed.store(n, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(10));
        }
        writeln!(stdin, "end").unwrap();
        // Kept open: the instances keep serving.
        std::thread::sleep(Duration::from_secs(60));
    })
}

/// Checks that `resumed` got every line of `line 1` … `line LAST` and
/// `end` after the position it was told first (the lines fed before it
/// connected are not its), once, in order; returns that position.
pub fn every_line_after_its_first(resumed: &Resumed, last: usize) -> usize {
    let first: usize = resumed.statuses[0]
        .rsplit('.')
        .next()
        .and_then(|seq| seq.trim_end_matches("\"}").parse().ok())
        .unwrap();
    let lines: Vec<String> = (first + 1..=last)
        .map(|n| format!("line {n}"))
        .chain(["end".into()])
        .collect();
    assert_eq!(resumed.payloads, lines, "{:?}", resumed.statuses);
    first
}

/// A plain client (no positions) on its own thread: every text it gets
/// until `end`, and how its connection ended if it did first.
pub fn plain_client(addr: SocketAddr) -> std::thread::JoinHandle<(Vec<String>, Option<String>)> {
    let (mut ws, _) = tungstenite::connect(format!("ws://{addr}/")).unwrap();
    std::thread::spawn(move || {
        let mut texts = Vec::new();
        loop {
            match ws.read() {
                Ok(tungstenite::Message::Text(text)) if text.as_str() == "end" => {
                    return (texts, None)
                }
                Ok(tungstenite::Message::Text(text)) => texts.push(text.to_string()),
                Ok(tungstenite::Message::Close(frame)) => {
                    return (texts, Some(format!("{frame:?}")))
                }
                Ok(_) => {}
                Err(e) => return (texts, Some(e.to_string())),
            }
        }
    })
}

/// A copy of the binary in a directory of its own, for a test to replace
/// on disk; removed on drop.
pub struct Deployed {
    pub dir: PathBuf,
}

impl Deployed {
    pub fn new(name: &str) -> Deployed {
        let dir = std::env::temp_dir().join(format!("wspush-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let deployed = Deployed { dir };
        deployed.install_from(Path::new(env!("CARGO_BIN_EXE_wspush")));
        deployed
    }

    pub fn binary(&self) -> PathBuf {
        self.dir.join("wspush")
    }

    /// Puts a copy of `source` in place of the binary, as a deploy does
    /// (a new file renamed over the old one).
    pub fn install_from(&self, source: &Path) {
        let next = self.dir.join("wspush.next");
        copy_apart(source, &next);
        std::fs::rename(&next, self.binary()).unwrap();
    }

    /// Puts a shell script in place of the binary.
    pub fn install_script(&self, script: &str) {
        use std::os::unix::fs::PermissionsExt;
        let text = self.dir.join("script.text");
        std::fs::write(&text, format!("#!/bin/sh\n{script}\n")).unwrap();
        let next = self.dir.join("script.next");
        copy_apart(&text, &next);
        std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&next, self.binary()).unwrap();
    }
}

/// Copies `source` to `to` in a process of its own: a process another
/// test of this one starts meanwhile would otherwise inherit the copy
/// open for writing until it execs, and running the copy then fails
/// (`ETXTBSY`).
fn copy_apart(source: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg(source)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success(), "cp {source:?} {to:?}");
}

impl Drop for Deployed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A thread that opens WebSocket connections one after another until
/// `stop`, counting those that were refused or not upgraded.
pub fn connecting_in_a_loop(
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, usize)> {
    std::thread::spawn(move || {
        let (mut made, mut failed) = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            let upgraded = TcpStream::connect(addr).is_ok_and(|mut stream| {
                use std::io::Write;
                stream.set_read_timeout(Some(super::IO_TIMEOUT)).unwrap();
                stream.write_all(upgrade_request("/").as_bytes()).is_ok()
                    && std::panic::catch_unwind(move || read_response(&mut stream).status)
                        .is_ok_and(|status| status == 101)
            });
            made += 1;
            failed += usize::from(!upgraded);
        }
        (made, failed)
    })
}

/// The supervisor's children: the processes of its instances.
pub fn children(supervisor: &Logged) -> Vec<u32> {
    let pid = supervisor.child.id();
    let mut pids: Vec<u32> = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    pids.sort();
    pids
}

/// The supervisor's children once there are `count` (a roll's old
/// processes exit just after it is done), read alike twice: the list is
/// read while it may change, and a read then may miss one.
pub fn children_once(supervisor: &Logged, count: usize) -> Vec<u32> {
    let deadline = std::time::Instant::now() + super::IO_TIMEOUT;
    let mut last = Vec::new();
    loop {
        let now = children(supervisor);
        if now.len() == count && now == last {
            return now;
        }
        last = now.clone();
        assert!(std::time::Instant::now() < deadline, "children {now:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Checks that every plain client got `line 1` … `line LAST` once, in
/// order, with no close, and every resuming one every line after its
/// first position, with no close and no reconnect.
pub fn every_client_got_every_line(
    plain: Vec<std::thread::JoinHandle<(Vec<String>, Option<String>)>>,
    resuming: Vec<std::thread::JoinHandle<Resumed>>,
    last: usize,
) {
    let every: Vec<String> = (1..=last).map(|n| format!("line {n}")).collect();
    for client in plain {
        let (texts, ended) = client.join().unwrap();
        assert_eq!(ended, None, "after {} lines", texts.len());
        assert_eq!(texts, every);
    }
    for client in resuming {
        let resumed = client.join().unwrap();
        every_line_after_its_first(&resumed, last);
        assert_eq!(resumed.closes, [0u16; 0], "{:?}", resumed.statuses);
        assert_eq!(resumed.statuses.len(), 1, "{:?}", resumed.statuses);
    }
}

//! A lone server's SIGUSR2: it re-executes the binary on disk in place
//! (the same process), and its next image goes on with the listener,
//! every connection, the history and standard input from where it was:
//! no client sees a close or a gap, a line written half before and half
//! after arrives whole, and a connection's key stays what it was. A
//! binary that does not run, or does not read this build's state, is
//! refused and the server serves on.

mod util;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Duration;

use tungstenite::Message;
use util::deploy::{connecting_in_a_loop, every_client_got_every_line, plain_client, Deployed};
use util::{listening_addr, resuming_client, signal, Logged, IO_TIMEOUT};

/// A lone server running `binary` with `args`, its standard input and
/// output piped (its upstream lines on the channel returned); its
/// address.
fn lone(binary: &Path, args: &[&str]) -> (Logged, SocketAddr, Receiver<String>) {
    let mut process = Logged::spawn(
        std::process::Command::new(binary)
            .args(["--listen", "127.0.0.1:0", "--quiet"])
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped()),
    );
    let stdout = process.child.stdout.take().unwrap();
    let (tx, upstream) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let addr = listening_addr(&process.wait_for("listening on "));
    (process, addr, upstream)
}

/// The next upstream line; panics after [`IO_TIMEOUT`].
fn next_upstream(upstream: &Receiver<String>) -> String {
    upstream.recv_timeout(IO_TIMEOUT).expect("an upstream line")
}

/// The next upstream line about connection `key`.
fn next_naming(upstream: &Receiver<String>, key: &str) -> String {
    loop {
        let line = next_upstream(upstream);
        if line.split(' ').nth(1) == Some(key) {
            return line;
        }
    }
}

/// The path `/proc/PID/exe` links to.
fn exe(pid: u32) -> String {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    exe.to_string_lossy().into_owned()
}

#[test]
fn sigusr2_reexecutes_a_lone_server_in_place_with_no_close_and_nothing_lost() {
    let deployed = Deployed::new("reexec");
    let args = ["--upstream", "stdout", "--upstream-events"];
    let (mut server, addr, upstream) = lone(&deployed.binary(), &args);
    let pid = server.child.id();
    let resuming: Vec<_> = (0..20).map(|_| resuming_client(addr, "end")).collect();
    let plain: Vec<_> = (0..20).map(|_| plain_client(addr)).collect();
    let (mut talker, _) = tungstenite::connect(format!("ws://{addr}/?id=talker")).unwrap();
    let opened = loop {
        let line = next_upstream(&upstream);
        if line.contains("talker") {
            break line;
        }
    };
    let key = opened.split(' ').nth(1).unwrap().to_string();
    talker.send(Message::text("before")).unwrap();
    assert_eq!(
        next_naming(&upstream, &key),
        format!("msg {key} talker text before")
    );

    let stop = Arc::new(AtomicBool::new(false));
    let connector = connecting_in_a_loop(addr, Arc::clone(&stop));
    for n in 1..=50 {
        server.send(format!("line {n}\n").as_bytes());
        std::thread::sleep(Duration::from_millis(5));
    }
    // Half a line before the exec, the rest after it.
    server.send(b"line 5");
    std::thread::sleep(Duration::from_millis(50));
    // A rebuilt binary, renamed over the one this process runs.
    deployed.install_from(Path::new(env!("CARGO_BIN_EXE_wspush")));
    assert!(exe(pid).ends_with("wspush (deleted)"), "{}", exe(pid));
    signal(pid, "-USR2");
    let stopped = server.wait_for("standard input stopped at a line's end");
    assert!(stopped.contains("(6 bytes of the next kept)"), "{stopped}");
    let took = server.wait_for("connections back from the earlier image");
    let count: usize = took
        .split("took ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    // The clients', and any of the connector's open then.
    assert!(count >= 41, "{took}");
    server.wait_for("listening on ");
    assert_eq!(
        exe(pid),
        deployed.binary().to_string_lossy(),
        "the new binary"
    );
    server.send(b"1\n");
    for n in 52..=100 {
        server.send(format!("line {n}\n").as_bytes());
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let (made, failed) = connector.join().unwrap();
    assert_eq!(failed, 0, "of {made} connections made during the exec");

    // The talker's key is the same after the exec, and no close or open
    // was written for it.
    talker.send(Message::text("after")).unwrap();
    assert_eq!(
        next_naming(&upstream, &key),
        format!("msg {key} talker text after")
    );
    server.send(b"end\n");

    every_client_got_every_line(plain, resuming, 100);
    let rest: Vec<String> = upstream.try_iter().collect();
    assert!(
        !rest.iter().any(|l| l.contains(&key)),
        "nothing more of the talker: {rest:?}"
    );
    drop(talker);
    assert_eq!(server.child.id(), pid);
}

#[test]
fn sigusr2_refuses_a_binary_that_does_not_run_or_read_the_state_and_serves_on() {
    let deployed = Deployed::new("reexec-refused");
    let (mut server, addr, _upstream) = lone(&deployed.binary(), &[]);
    let pid = server.child.id();
    let mut client = util::connect(addr, "/");
    server.send(b"one\n");

    // Not wspush at all.
    deployed.install_script("exit 1");
    signal(pid, "-USR2");
    let refused = server.wait_for("the re-exec is refused");
    assert!(refused.contains("--version"), "{refused}");

    // A wspush that does not name this build's state format.
    deployed.install_script("[ \"$1\" = --version ] && echo 'wspush 0.0.1' && exit 0; exit 3");
    signal(pid, "-USR2");
    let refused = server.wait_for("the re-exec is refused");
    assert!(refused.contains("does not read this build's"), "{refused}");
    server.send(b"two\n");

    // Then one that does, signalled twice in a row: one re-exec.
    deployed.install_from(Path::new(env!("CARGO_BIN_EXE_wspush")));
    signal(pid, "-USR2");
    server.wait_for("SIGUSR2: checking");
    signal(pid, "-USR2");
    server.wait_for("took 1 connections back from the earlier image");
    server.send(b"three\nend\n");
    // Every line, on the one connection (a close would be an error here).
    assert_eq!(util::texts(&mut client, 4), ["one", "two", "three", "end"]);
    assert_eq!(server.child.id(), pid);
    assert!(server.child.try_wait().unwrap().is_none(), "still serving");
}

/// Publishes `lines` to the publish listener at `addr`: its status.
fn publish(addr: SocketAddr, lines: &str) -> u16 {
    use std::io::Write;
    let mut stream = util::raw(addr);
    let request = format!(
        "POST /publish HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n{lines}",
        util::PUBLISH_KEY,
        lines.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    util::read_response(&mut stream).status
}

#[test]
fn a_lone_server_with_a_publish_listener_keeps_it_across_the_reexec() {
    let deployed = Deployed::new("reexec-publish");
    let key = util::KeyFile::new();
    let args = [
        "--publish-listen",
        "127.0.0.1:0",
        "--publish-key-file",
        key.path(),
    ];
    let (mut server, addr, _upstream) = lone(&deployed.binary(), &args);
    let publisher = util::publish_addr(&server.wait_for("publish on http://"));
    let mut client = util::connect(addr, "/");
    assert_eq!(publish(publisher, "all published before\n"), 200);
    assert_eq!(util::texts(&mut client, 1), ["published before"]);
    server.send(b"from standard input\n");
    assert_eq!(util::texts(&mut client, 1), ["from standard input"]);
    deployed.install_from(Path::new(env!("CARGO_BIN_EXE_wspush")));
    signal(server.child.id(), "-USR2");
    server.wait_for("publish listener stopped for the next image");
    server.wait_for("took 1 connections back from the earlier image");
    // The same listening socket: the next image's log names the same
    // address, and a publisher finds it.
    let again = util::publish_addr(&server.wait_for("publish on http://"));
    assert_eq!(again, publisher);
    assert_eq!(publish(publisher, "all published after\n"), 200);
    assert_eq!(util::texts(&mut client, 1), ["published after"]);
}

/// The supervisor's own upgrade: SIGUSR2 with a binary that reads its
/// state re-executes the supervisor in place (the same pid; its instances
/// stay its children), then its next image upgrades the instances, each
/// handing its connections over: no close, no gap, a line written half
/// before and half after arrives whole.
#[test]
fn sigusr2_reexecutes_a_supervisor_in_place_then_upgrades_its_instances() {
    let deployed = Deployed::new("supervisor-reexec");
    let key = util::KeyFile::new();
    // A port of its own (the supervisor's first log lines are read as it
    // starts).
    let publisher = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let (mut supervisor, addr) = util::start_supervisor(
        &deployed.binary(),
        &[
            "--quiet",
            "--processes",
            "2",
            "--publish-listen",
            &publisher.to_string(),
            "--publish-key-file",
            key.path(),
        ],
        2,
        "info",
    );
    let pid = supervisor.child.id();
    let before = util::deploy::children(&supervisor);
    let resuming: Vec<_> = (0..10).map(|_| resuming_client(addr, "end")).collect();
    let plain: Vec<_> = (0..10).map(|_| plain_client(addr)).collect();
    // The two sources' lines are ordered as they reach the supervisor:
    // a client of the test's own says when each is through.
    let mut watcher = util::connect(addr, "/");
    let mut through = |last: &str| while util::texts(&mut watcher, 1)[0] != last {};
    for n in 1..=30 {
        supervisor.send(format!("line {n}\n").as_bytes());
        std::thread::sleep(Duration::from_millis(5));
    }
    through("line 30");
    assert_eq!(publish(publisher, "all line 31\n"), 200);
    through("line 31");
    supervisor.send(b"line 3");
    std::thread::sleep(Duration::from_millis(50));
    deployed.install_from(Path::new(env!("CARGO_BIN_EXE_wspush")));
    signal(pid, "-USR2");
    let stopped = supervisor.wait_for("standard input stopped at a line's end");
    assert!(stopped.contains("(6 bytes of the next kept)"), "{stopped}");
    supervisor.wait_for("the supervisor re-executed with its 2 instances");
    assert_eq!(
        exe(pid),
        deployed.binary().to_string_lossy(),
        "the new binary"
    );
    let again = util::publish_addr(&supervisor.wait_for("publish on http://"));
    assert_eq!(again, publisher, "the same publish listener");
    supervisor.send(b"2\n");
    supervisor.wait_for("the upgrade of the 2 instances is done");
    let after = util::deploy::children_once(&supervisor, 2);
    assert!(
        after.iter().all(|p| !before.contains(p)),
        "{before:?} → {after:?}"
    );
    for n in 33..=60 {
        supervisor.send(format!("line {n}\n").as_bytes());
    }
    through("line 60");
    assert_eq!(publish(publisher, "all line 61\n"), 200);
    through("line 61");
    supervisor.send(b"end\n");
    every_client_got_every_line(plain, resuming, 61);
    assert_eq!(supervisor.child.id(), pid);
    assert!(
        supervisor.child.try_wait().unwrap().is_none(),
        "still serving"
    );
}

/// This build's binary with the history's ring in another layout (the
/// `next-ring-layout` feature), built beside the tests' own (once; a
/// build of its own target directory, so the tests' binary stays).
fn next_layout_binary() -> std::path::PathBuf {
    let ours = Path::new(env!("CARGO_BIN_EXE_wspush"));
    let target = ours.parent().and_then(Path::parent).unwrap();
    let dir = target.join("next-ring-layout");
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--offline", "--quiet", "-p", "wspush-cli"])
        .args(["--features", "next-ring-layout", "--target-dir"])
        .arg(&dir)
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .status()
        .unwrap();
    assert!(status.success(), "building the next layout's binary");
    dir.join("debug").join("wspush")
}

/// Feeds `line 1` … `line COUNT` to `process` and returns their
/// positions, as a client with positions connected before got them.
fn fed_with_positions(process: &mut util::Logged, addr: SocketAddr, count: usize) -> Vec<String> {
    let mut watcher = util::connect(addr, "/?positions=1");
    util::texts(&mut watcher, 1);
    for n in 1..=count {
        process.send(format!("line {n}\n").as_bytes());
    }
    util::texts(&mut watcher, count)
        .iter()
        .map(|text| text.split_once(' ').unwrap().0.to_string())
        .collect()
}

/// A client that resumes `since` a position (that of `line FIRST - 1`)
/// until `stop`, again and again, each time checking it is told
/// `recovered` and given every line after it, through the last one `fed`
/// when it connected, in the position's epoch; how many times it did.
fn resuming_again_and_again(
    addr: SocketAddr,
    since: String,
    first: usize,
    fed: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let epoch = since.rsplit_once('.').unwrap().0.to_string();
        let mut times = 0;
        while times == 0 || !stop.load(Ordering::Relaxed) {
            let last = fed.load(Ordering::Relaxed);
            let mut client = util::connect(addr, &format!("/?since={since}"));
            let status = util::texts(&mut client, 1).remove(0);
            assert!(status.contains("\"recovered\""), "{status}");
            for n in first..=last {
                let text = util::texts(&mut client, 1).remove(0);
                let (position, payload) = text.split_once(' ').unwrap();
                assert_eq!(payload, format!("line {n}"), "after {status}");
                assert_eq!(position, format!("{epoch}.{n}"), "the same epoch");
            }
            times += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        times
    })
}

#[test]
fn a_supervisor_reexecuted_with_a_new_history_layout_keeps_its_epoch_and_every_position() {
    let next = next_layout_binary();
    let deployed = Deployed::new("layout-reexec");
    let (mut supervisor, addr) = util::start_supervisor(
        &deployed.binary(),
        &["--quiet", "--processes", "2"],
        2,
        "info",
    );
    let pid = supervisor.child.id();
    let resuming: Vec<_> = (0..6).map(|_| resuming_client(addr, "end")).collect();
    let plain: Vec<_> = (0..6).map(|_| plain_client(addr)).collect();
    let positions = fed_with_positions(&mut supervisor, addr, 20);
    // Resumes from line 10 all through the upgrade: the instances of the
    // earlier binary replay from the earlier layout, written alike, the
    // new ones from the ring it was carried into.
    let stop = Arc::new(AtomicBool::new(false));
    let fed = Arc::new(AtomicUsize::new(20));
    let again: Vec<_> = (0..4)
        .map(|_| {
            let (fed, stop) = (Arc::clone(&fed), Arc::clone(&stop));
            resuming_again_and_again(addr, positions[9].clone(), 11, fed, stop)
        })
        .collect();
    deployed.install_from(&next);
    signal(pid, "-USR2");
    let feed = |supervisor: &mut util::Logged, lines: std::ops::RangeInclusive<usize>, pause| {
        for n in lines {
            supervisor.send(format!("line {n}\n").as_bytes());
            fed.store(n, Ordering::Relaxed);
            std::thread::sleep(pause);
        }
    };
    feed(&mut supervisor, 21..=40, Duration::from_millis(20));
    let carried = supervisor.wait_for("was carried into this build's layout");
    assert!(carried.contains("the same epoch"), "{carried}");
    supervisor.wait_for("the supervisor re-executed with its 2 instances");
    supervisor.wait_for("the upgrade of the 2 instances is done");
    supervisor.wait_for("the history's earlier layout is no longer written");
    feed(&mut supervisor, 41..=50, Duration::from_millis(20));
    stop.store(true, Ordering::Relaxed);
    for again in again {
        assert!(again.join().unwrap() > 5);
    }
    feed(&mut supervisor, 51..=60, Duration::ZERO);
    supervisor.send(b"end\n");
    // Every line in the new ring, with the positions it had: no gap, no
    // `unknown`, no new epoch.
    for (since, first) in [(9, 11), (0, 2)] {
        let since = positions[since].clone();
        let client =
            resuming_again_and_again(addr, since, first, Arc::clone(&fed), Arc::clone(&stop));
        assert_eq!(client.join().unwrap(), 1);
    }
    every_client_got_every_line(plain, resuming, 60);
    assert_eq!(
        exe(pid),
        deployed.binary().to_string_lossy(),
        "the new binary"
    );
}

#[test]
fn a_lone_server_reexecuted_with_a_new_history_layout_keeps_its_epoch_and_every_position() {
    let next = next_layout_binary();
    let deployed = Deployed::new("lone-layout-reexec");
    let (mut server, addr, _upstream) = lone(&deployed.binary(), &[]);
    let pid = server.child.id();
    let positions = fed_with_positions(&mut server, addr, 20);
    deployed.install_from(&next);
    signal(pid, "-USR2");
    let carried = server.wait_for("was carried into this build's layout");
    assert!(carried.contains("(20 messages)"), "{carried}");
    server.wait_for("listening on ");
    for n in 21..=30 {
        server.send(format!("line {n}\n").as_bytes());
    }
    // Lines 6 to 30: those carried, and those written after.
    let fed = Arc::new(AtomicUsize::new(30));
    let stop = Arc::new(AtomicBool::new(true));
    let client = resuming_again_and_again(addr, positions[4].clone(), 6, fed, stop);
    assert_eq!(client.join().unwrap(), 1);
    assert_eq!(
        exe(pid),
        deployed.binary().to_string_lossy(),
        "the new binary"
    );
}

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
use std::sync::atomic::{AtomicBool, Ordering};
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

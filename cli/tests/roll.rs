//! Rolling restarts under `--processes`: SIGHUP replaces the instances one
//! at a time, each by a process that starts beside it (on the listener
//! the supervisor holds) and takes its connections over before it
//! listens, so no client sees a close or a gap; SIGUSR2 does the same
//! with the binary on disk, once it answers `--version`, and refuses one
//! that does not run or does not listen.

mod util;

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use util::deploy::{
    children, children_once, connecting_in_a_loop, every_line_after_its_first, feed, plain_client,
    Deployed,
};
use util::{resuming_client, signal, Logged};

/// A supervisor of `instances` instances running `binary`, logging at
/// `info`, with a short drain; its address once every instance listens.
fn supervise(binary: &Path, instances: usize) -> (Logged, SocketAddr) {
    let count = instances.to_string();
    let args = ["--quiet", "--drain-time", "1s", "--processes", &count];
    util::start_supervisor(binary, &args, instances, "info")
}

/// The nice value of process `pid`'s main thread (`/proc/PID/stat`).
fn nice(pid: u32) -> i64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's closing parenthesis; nice is the
    // 19th field in all, the 17th after it.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split_whitespace().nth(16).unwrap().parse().unwrap()
}

#[test]
fn sighup_replaces_every_instance_with_no_refusal_no_close_and_nothing_lost() {
    let binary = Path::new(env!("CARGO_BIN_EXE_wspush"));
    let (mut supervisor, addr) = supervise(binary, 3);
    let before = children(&supervisor);
    assert_eq!(before.len(), 3);
    let clients: Vec<_> = (0..30).map(|_| resuming_client(addr, "end")).collect();
    let plain: Vec<_> = (0..30).map(|_| plain_client(addr)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let connector = connecting_in_a_loop(addr, Arc::clone(&stop));
    let fed = Arc::new(AtomicUsize::new(0));
    let _feeder = feed(&mut supervisor, 600, Arc::clone(&fed));
    while fed.load(Ordering::Relaxed) < 50 {
        std::thread::sleep(Duration::from_millis(5));
    }

    signal(supervisor.child.id(), "-HUP");
    supervisor.wait_for("SIGHUP: restarting the 3 instances one at a time");
    let mut roll = Vec::new();
    while !roll
        .last()
        .is_some_and(|l: &String| l.contains("the restart of the 3 instances is done"))
    {
        roll.push(supervisor.next_line());
    }
    let has = |needle: &str| roll.iter().filter(|l| l.contains(needle)).count();
    assert_eq!(has(" connections over in "), 3, "each took over: {roll:#?}");
    assert_eq!(has("starting it again"), 0, "no death: {roll:#?}");
    assert!(
        fed.load(Ordering::Relaxed) < 600,
        "the roll ended while lines were fed"
    );
    stop.store(true, Ordering::Relaxed);
    let (made, failed) = connector.join().unwrap();
    assert_eq!(failed, 0, "of {made} connections made during the roll");
    let after = children_once(&supervisor, 3);
    assert_eq!(after.len(), 3);
    assert!(
        after.iter().all(|pid| !before.contains(pid)),
        "{before:?} → {after:?}"
    );
    // A handover runs at a raised priority; the new processes then serve
    // at the supervisor's.
    let supervisor_nice = nice(supervisor.child.id());
    for pid in &after {
        assert_eq!(nice(*pid), supervisor_nice, "process {pid}");
    }

    // Plain clients: every line, once, in order, on the one connection.
    let every: Vec<String> = (1..=600).map(|n| format!("line {n}")).collect();
    for client in plain {
        let (texts, ended) = client.join().unwrap();
        assert_eq!(ended, None, "after {} lines", texts.len());
        assert_eq!(texts, every);
    }
    for client in clients {
        let resumed = client.join().unwrap();
        // Every line after the position it was told first, once, in
        // order, with no close and no reconnect.
        let first = every_line_after_its_first(&resumed, 600);
        assert!(first < 50, "it connected before the roll: {first}");
        assert_eq!(resumed.closes, [0u16; 0], "{:?}", resumed.statuses);
        assert_eq!(resumed.statuses.len(), 1, "{:?}", resumed.statuses);
    }
}

#[test]
fn sigusr2_refuses_a_binary_that_does_not_run_or_listen_and_upgrades_to_one_that_does() {
    let deployed = Deployed::new("upgrade");
    let (mut supervisor, addr) = supervise(&deployed.binary(), 2);
    let before = children(&supervisor);
    let client = resuming_client(addr, "end");

    // Not wspush at all: refused at the check.
    deployed.install_script("exit 1");
    signal(supervisor.child.id(), "-USR2");
    let refused = supervisor.wait_for("the upgrade is refused");
    assert!(refused.contains("--version"), "{refused}");
    assert_eq!(children(&supervisor), before, "nothing was started");

    // Answers --version but never listens: refused at its first instance.
    deployed.install_script("[ \"$1\" = --version ] && echo 'wspush 99.0.0' && exit 0; exit 3");
    signal(supervisor.child.id(), "-USR2");
    supervisor.wait_for("upgrading the 2 instances one at a time");
    let refused = supervisor.wait_for("the upgrade is refused");
    assert!(
        refused.contains("exited with status 3 before it listened"),
        "{refused}"
    );
    assert_eq!(
        children(&supervisor),
        before,
        "the old instances keep running"
    );
    supervisor.send(b"still served\n");

    // A binary that runs: every instance is replaced by it, and then
    // the check on disk changes nothing (the instances keep the file).
    deployed.install_from(Path::new(env!("CARGO_BIN_EXE_wspush")));
    signal(supervisor.child.id(), "-USR2");
    supervisor.wait_for("the upgrade of the 2 instances is done");
    let after = children_once(&supervisor, 2);
    assert!(
        after.iter().all(|pid| !before.contains(pid)),
        "{before:?} → {after:?}"
    );
    for pid in &after {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
        assert!(exe.starts_with(&deployed.dir), "{exe:?}");
    }
    deployed.install_script("exit 1");
    signal(after[0], "-KILL");
    supervisor.wait_for("started again");
    let restarted = children(&supervisor);
    assert_eq!(restarted.len(), 2);
    for pid in restarted.iter().filter(|pid| !after.contains(pid)) {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
        let exe = exe.to_string_lossy();
        assert!(
            exe.ends_with("wspush (deleted)"),
            "the upgraded binary, kept: {exe}"
        );
    }

    supervisor.send(b"after\nend\n");
    let resumed = client.join().unwrap();
    assert_eq!(
        resumed.payloads,
        ["still served", "after", "end"],
        "{:?}",
        resumed.statuses
    );
}

/// Waits until the instance's own `/metrics` at `metrics` (its process's,
/// whichever that is) shows `wspush_instance_restarts` at `count`.
fn restarts_become(metrics: SocketAddr, count: u64) {
    let deadline = std::time::Instant::now() + util::IO_TIMEOUT;
    let mut last = None;
    loop {
        if TcpStream::connect(metrics).is_ok() {
            let page = util::http_get(metrics, "/metrics", "").body;
            let now = util::sample(&page, "wspush_instance_restarts");
            if now == count {
                return;
            }
            last = Some(now);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "wspush_instance_restarts stayed {last:?}, not {count}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_instance_counts_its_earlier_processes_and_its_metrics_port_outlives_a_roll() {
    let port = util::free_ports(2);
    let listen = format!("127.0.0.1:{port}");
    // Instance 1's own.
    let metrics = SocketAddr::from(([127, 0, 0, 1], port + 1));
    let args = [
        "--quiet",
        "--drain-time",
        "1s",
        "--processes",
        "1",
        "--metrics-listen",
        &listen,
    ];
    let binary = Path::new(env!("CARGO_BIN_EXE_wspush"));
    let (supervisor, _) = util::start_supervisor(binary, &args, 1, "info");
    restarts_become(metrics, 0);
    signal(children(&supervisor)[0], "-KILL");
    supervisor.wait_for("instance 1 started again");
    restarts_become(metrics, 1);
    // Its replacement in a roll serves the same port.
    signal(supervisor.child.id(), "-HUP");
    supervisor.wait_for("instance 1: pid");
    supervisor.wait_for("the restart of the 1 instances is done");
    restarts_become(metrics, 2);
    signal(supervisor.child.id(), "-INT");
}

/// The newest child of the supervisor (the process a roll started).
fn newest_child(supervisor: &Logged, before: &[u32]) -> u32 {
    let deadline = std::time::Instant::now() + util::IO_TIMEOUT;
    loop {
        if let Some(pid) = children(supervisor)
            .into_iter()
            .find(|p| !before.contains(p))
        {
            return pid;
        }
        assert!(std::time::Instant::now() < deadline, "no new process");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_new_process_killed_during_the_handover_loses_no_line_and_the_next_roll_works() {
    let binary = Path::new(env!("CARGO_BIN_EXE_wspush"));
    let (mut supervisor, addr) = supervise(binary, 1);
    let before = children(&supervisor);
    let resuming: Vec<_> = (0..20).map(|_| resuming_client(addr, "end")).collect();
    let plain: Vec<_> = (0..20).map(|_| plain_client(addr)).collect();
    let fed = Arc::new(AtomicUsize::new(0));
    let _feeder = feed(&mut supervisor, 600, Arc::clone(&fed));
    while fed.load(Ordering::Relaxed) < 20 {
        std::thread::sleep(Duration::from_millis(5));
    }
    signal(supervisor.child.id(), "-HUP");
    // Killed the moment its predecessor hears it ask: before, during or
    // just after the connections move; each must end well.
    supervisor.wait_for("a successor asks for the connections");
    signal(newest_child(&supervisor, &before), "-KILL");
    // The roll ends either way: given up (killed before it listened), or
    // done (after: the instance is then started again).
    loop {
        let line = supervisor.next_line();
        if line.contains("the restart is refused") || line.contains("instances is done") {
            break;
        }
    }
    // Whatever happened, the instance serves on, and a roll then works.
    while fed.load(Ordering::Relaxed) < 300 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let serving = children(&supervisor);
    assert_eq!(serving.len(), 1, "{serving:?}");
    signal(supervisor.child.id(), "-HUP");
    supervisor.wait_for("the restart of the 1 instances is done");
    assert!(children_once(&supervisor, 1)
        .iter()
        .all(|p| !serving.contains(p)));

    for client in resuming {
        every_line_after_its_first(&client.join().unwrap(), 600);
    }
    // A plain client kept its connection and got every line, or saw it
    // end (it was lost with the killed process); never a gap on one.
    let every: Vec<String> = (1..=600).map(|n| format!("line {n}")).collect();
    for client in plain {
        let (texts, ended) = client.join().unwrap();
        match ended {
            None => assert_eq!(texts, every),
            Some(_) => assert_eq!(texts, every[..texts.len()]),
        }
    }
}

#[test]
fn sigusr2_twice_upgrades_once_and_closes_nothing() {
    let deployed = Deployed::new("twice");
    let (mut supervisor, addr) = supervise(&deployed.binary(), 2);
    let before = children(&supervisor);
    let plain: Vec<_> = (0..10).map(|_| plain_client(addr)).collect();
    signal(supervisor.child.id(), "-USR2");
    // The second once the first is heard (two sent at once may reach the
    // process as one).
    supervisor.wait_for("SIGUSR2: checking");
    signal(supervisor.child.id(), "-USR2");
    supervisor.wait_for("SIGHUP/SIGUSR2 ignored");
    supervisor.wait_for("the upgrade of the 2 instances is done");
    let after = children_once(&supervisor, 2);
    assert!(after.iter().all(|pid| !before.contains(pid)));
    supervisor.send(b"after the upgrade\nend\n");
    for client in plain {
        let (texts, ended) = client.join().unwrap();
        assert_eq!(
            (texts, ended),
            (vec!["after the upgrade".to_string()], None)
        );
    }
    let rest = supervisor.rest().join("\n");
    assert_eq!(
        rest.matches("upgrading the 2 instances").count(),
        0,
        "{rest}"
    );
}

//! `--processes N` and `--reuse-port`: several single-threaded instances on
//! one address, every input line delivered once to every connection.

mod util;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tungstenite::Message;
use util::sse::{status_of, Stream};
use util::{connect, listening_addr, raw_upgraded, signal, Logged, TestServer, IO_TIMEOUT};
use wspush::Config;

/// A supervisor with its stdin, and the lines all its processes log.
struct Supervised(Logged);

impl Supervised {
    fn start(instances: usize) -> (Supervised, SocketAddr) {
        Supervised::start_with(&["--processes", &instances.to_string()], instances)
    }

    /// Starts `wspush --listen 127.0.0.1:0 ARGS` and waits until the
    /// supervisor and its `instances` instances listen.
    fn start_with(args: &[&str], instances: usize) -> (Supervised, SocketAddr) {
        let binary = std::path::Path::new(env!("CARGO_BIN_EXE_wspush"));
        let log = "info,wspush::server::conn=debug";
        let (process, addr) = util::start_supervisor(binary, args, instances, log);
        (Supervised(process), addr)
    }

    /// The instance number of each upgrade logged, until `count` are seen.
    fn upgrades(&self, count: usize) -> Vec<usize> {
        (0..count)
            .map(|_| {
                let line = self.0.wait_for("upgraded /");
                let tag = line.split("wspush#").nth(1).unwrap();
                tag.split(']').next().unwrap().parse().unwrap()
            })
            .collect()
    }

    /// For each upgrade logged, until `count` are seen: the instance
    /// number and the client's `?id=`.
    fn upgrades_by_id(&self, count: usize) -> Vec<(usize, usize)> {
        (0..count)
            .map(|_| {
                let line = self.0.wait_for("upgraded /?id=");
                let tag = line.split("wspush#").nth(1).unwrap();
                let instance = tag.split(']').next().unwrap().parse().unwrap();
                let query = line.rsplit("?id=").next().unwrap();
                let id = query.split('&').next().unwrap().trim().parse().unwrap();
                (instance, id)
            })
            .collect()
    }

    /// The process id of instance `number` (from its environment).
    fn instance_pid(&self, number: usize) -> u32 {
        let wanted = format!("WSPUSH_INSTANCE={number}");
        *self
            .instance_pids()
            .iter()
            .find(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .unwrap_or_default()
                    .split(|&b| b == 0)
                    .any(|var| var == wanted.as_bytes())
            })
            .unwrap_or_else(|| panic!("no instance {number}"))
    }

    /// The supervisor's children (its instances).
    fn instance_pids(&self) -> Vec<u32> {
        let pid = self.0.child.id();
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
        children
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect()
    }

    /// Waits for the supervisor to exit; its exit code and what it logged last.
    fn wait(&mut self) -> (Option<i32>, Vec<String>) {
        let deadline = Instant::now() + IO_TIMEOUT;
        loop {
            if let Some(status) = self.0.child.try_wait().unwrap() {
                return (status.code(), self.0.until_end());
            }
            assert!(Instant::now() < deadline, "the supervisor did not exit");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

#[test]
fn three_instances_share_the_connections_and_each_line_reaches_every_one_once() {
    let (mut supervised, addr) = Supervised::start(3);
    assert_eq!(supervised.instance_pids().len(), 3);
    let mut clients: Vec<_> = (0..60)
        .map(|i| connect(addr, &format!("/?id={i}")))
        .collect();
    let mut spread = supervised.upgrades(60);
    spread.sort();
    spread.dedup();
    assert!(
        spread.len() >= 2,
        "all 60 connections landed on instance {spread:?}"
    );

    supervised.0.send(b"hello\n");
    supervised.0.send(b"end\n");
    for client in &mut clients {
        assert_eq!(client.read().unwrap(), Message::text("hello"));
        assert_eq!(
            client.read().unwrap(),
            Message::text("end"),
            "nothing delivered twice"
        );
    }

    signal(supervised.0.child.id(), "-INT");
    for client in &mut clients {
        match client.read().unwrap() {
            Message::Close(Some(frame)) => assert_eq!(u16::from(frame.code), 1001),
            other => panic!("expected close 1001, got {other:?}"),
        }
    }
    drop(clients);
    let (code, _) = supervised.wait();
    assert_eq!(code, Some(0), "a requested stop is a success");
}

/// The memory file an instance names in its environment variable `env`,
/// as its device and inode (`/proc/PID/fd/N` followed).
fn inherited_memory(pid: u32, env: &str) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let prefix = format!("{env}=");
    let fd = environ
        .split(|&b| b == 0)
        .find_map(|var| var.strip_prefix(prefix.as_bytes()))
        .map(|fd| std::str::from_utf8(fd).unwrap().to_owned())
        .unwrap_or_else(|| panic!("no {env} in instance {pid}'s environment"));
    let meta = std::fs::metadata(format!("/proc/{pid}/fd/{fd}")).unwrap();
    (meta.dev(), meta.ino())
}

/// How an instance maps the memory files whose names start with `name`
/// (`/memfd:NAME`): each mapping's permissions (`r--s`, `rw-s`).
fn mappings(pid: u32, name: &str) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let wanted = format!("/memfd:{name}");
    maps.lines()
        .filter(|line| line.contains(&wanted))
        .map(|line| line.split_whitespace().nth(1).unwrap().to_owned())
        .collect()
}

#[test]
fn the_instances_share_the_hosts_words_and_map_the_history_read_only() {
    let (mut supervised, _addr) = Supervised::start(2);
    let pids = [supervised.instance_pid(1), supervised.instance_pid(2)];
    let host = pids.map(|pid| inherited_memory(pid, "WSPUSH_HOST_FD"));
    let history = pids.map(|pid| inherited_memory(pid, "WSPUSH_HISTORY_FD"));
    assert_eq!(host[0], host[1], "one memory of the host's words");
    assert_eq!(history[0], history[1], "one history");
    assert_ne!(
        host[0], history[0],
        "the host's words are apart from the history"
    );
    for pid in pids {
        let history = mappings(pid, "wspush-history");
        assert!(!history.is_empty(), "instance {pid} maps the history");
        assert!(
            history.iter().all(|perms| !perms.contains('w')),
            "instance {pid} maps the history {history:?}"
        );
        assert_eq!(mappings(pid, "wspush-host"), ["rw-s"], "instance {pid}");
    }
    signal(supervised.0.child.id(), "-INT");
    let (code, _) = supervised.wait();
    assert_eq!(code, Some(0));
}

#[test]
fn three_instances_give_every_connection_every_line_of_a_burst_once() {
    const LINES: usize = 2000;
    let (mut supervised, addr) = Supervised::start(3);
    let mut clients: Vec<_> = (0..30)
        .map(|i| connect(addr, &format!("/?id={i}")))
        .collect();
    supervised.upgrades(30);
    let burst: String = (0..LINES).map(|i| format!("line {i}\n")).collect();
    supervised.0.send(burst.as_bytes());
    supervised.0.send(b"end\n");
    for client in &mut clients {
        for i in 0..LINES {
            assert_eq!(client.read().unwrap(), Message::text(format!("line {i}")));
        }
        assert_eq!(
            client.read().unwrap(),
            Message::text("end"),
            "nothing twice"
        );
    }
    drop(clients);
    signal(supervised.0.child.id(), "-INT");
    assert_eq!(supervised.wait().0, Some(0));
}

#[test]
fn processes_auto_starts_enough_instances_for_the_total() {
    // 10 connections per instance, planned at 9: 50 connections need 6
    // instances (or one per core, if there are more cores).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let expected = cores.max(6);
    let args = [
        "--processes",
        "auto",
        "--max-connections",
        "10",
        "--total-connections",
        "50",
    ];
    let (mut supervised, addr) = Supervised::start_with(&args, expected);
    assert_eq!(supervised.instance_pids().len(), expected);
    let mut client = connect(addr, "/");
    supervised.0.send(b"to all\n");
    assert_eq!(client.read().unwrap(), Message::text("to all"));
    drop(client);
    signal(supervised.0.child.id(), "-INT");
    assert_eq!(supervised.wait().0, Some(0));
}

#[test]
fn too_few_processes_for_the_total_are_named_in_a_warning() {
    let args = [
        "--processes",
        "2",
        "--max-connections",
        "10",
        "--total-connections",
        "50",
    ];
    let process = Logged::spawn(
        Command::new(env!("CARGO_BIN_EXE_wspush"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::piped()),
    );
    let warning = process.wait_for("--total-connections");
    assert!(
        warning.contains("WARN")
            && warning.contains("2 instances hold at most 20 connections (10 each)"),
        "{warning}"
    );
    let mut supervised = Supervised(process);
    supervised.0.wait_for(" with 2 instances");
    signal(supervised.0.child.id(), "-INT");
    assert_eq!(supervised.wait().0, Some(0));
}

#[test]
fn with_on_instance_exit_stop_a_dying_instance_stops_the_supervisor_with_a_clear_error() {
    let (mut supervised, _) =
        Supervised::start_with(&["--processes", "2", "--on-instance-exit", "stop"], 2);
    let victim = supervised.instance_pids()[0];
    signal(victim, "-KILL");
    let (code, log) = supervised.wait();
    assert_eq!(code, Some(1));
    let message = format!("(pid {victim}) was killed by signal 9; stopped the others");
    assert!(
        log.iter()
            .any(|line| line.starts_with("wspush: instance ") && line.contains(&message)),
        "{log:#?}"
    );
}

#[test]
fn two_servers_share_one_port_with_reuse_port() {
    let first = TestServer::start(Config::default().with(|c| {
        c.reuse_port = true;
    }));
    let second = TestServer::start(Config::default().with(|c| {
        c.listen = first.addr;
        c.reuse_port = true;
    }));
    let without = wspush::Server::bind(Config::default().with(|c| {
        c.listen = first.addr;
    }));
    match without.unwrap_err() {
        wspush::BindError::Io(e) => {
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::AddrInUse,
                "sharing needs the option"
            )
        }
        other => panic!("{other}"),
    }

    let _clients: Vec<_> = (0..40)
        .map(|i| connect(first.addr, &format!("/?id={i}")))
        .collect();
    let (a, b) = (
        first.handle.metrics().upgrades,
        second.handle.metrics().upgrades,
    );
    assert_eq!(a + b, 40);
    assert!(
        a > 0 && b > 0,
        "the kernel spreads connections over both: {a} + {b}"
    );
}

#[test]
fn a_full_server_leaves_the_reuse_port_group_until_it_has_room() {
    let small = TestServer::start(Config::default().with(|c| {
        c.reuse_port = true;
        c.max_connections = 5;
    }));
    let large = TestServer::start(Config::default().with(|c| {
        c.listen = small.addr;
        c.reuse_port = true;
    }));
    // One after another: each is upgraded (raw_upgraded checks the 101),
    // none refused by the full one.
    let clients: Vec<_> = (0..60).map(|_| raw_upgraded(small.addr)).collect();
    let full = small.wait_for("the small one full", |m| m.upgrades == 5);
    assert_eq!(full.rejected_503, 0);
    large.wait_for("the others on the large one", |m| m.upgrades == 55);

    // With room again, it is back in the group.
    drop(clients);
    small.wait_for("its clients gone", |m| m.connections_open == 0);
    let _more: Vec<_> = (0..40).map(|_| raw_upgraded(small.addr)).collect();
    let again = small.handle.metrics().upgrades - 5;
    assert!(again > 0, "the kernel sends it some again");
    assert_eq!(small.handle.metrics().rejected_503, 0);
}

#[test]
fn a_full_instance_gets_no_new_connections_while_the_others_have_room() {
    const MAX: usize = 600;
    // An instance is full (steered away from) 1% short of its limit.
    const FULL: usize = MAX - MAX / 100;
    // 1,600 clients held at the end, beyond a default soft limit of 1,024.
    util::need_open_files(4096);
    let (mut supervised, addr) =
        Supervised::start_with(&["--processes", "3", "--max-connections", "600"], 3);
    // Fill instance 1: connect one at a time, keeping only those it took.
    let mut kept = Vec::new();
    let (mut id, mut steered) = (0, false);
    while kept.len() < FULL {
        let mut stream = util::raw(addr);
        use std::io::Write;
        stream
            .write_all(util::upgrade_request(&format!("/?id={id}")).as_bytes())
            .unwrap();
        assert_eq!(util::read_response(&mut stream).status, 101);
        // Its upgrade's log line says which instance took it.
        let instance = loop {
            let line = supervised.0.next_line();
            steered |= line.contains("instance 1 is full: new connections go to the others");
            if let Some(tag) = line.split("wspush#").nth(1) {
                if line.ends_with(&format!("upgraded /?id={id}")) {
                    break tag.split(']').next().unwrap().parse::<usize>().unwrap();
                }
            }
        };
        if instance == 1 {
            kept.push(stream);
        }
        id += 1;
    }
    while !steered {
        let line = supervised.0.next_line();
        steered = line.contains("instance 1 is full: new connections go to the others");
    }
    // 1,000 more from this one address: every one is let in.
    let more: Vec<_> = (0..1000)
        .map(|i| {
            let mut stream = util::raw(addr);
            use std::io::Write;
            stream
                .write_all(util::upgrade_request("/").as_bytes())
                .unwrap();
            assert_eq!(util::read_response(&mut stream).status, 101, "client {i}");
            stream
        })
        .collect();
    drop((kept, more));
    signal(supervised.0.child.id(), "-INT");
    assert_eq!(supervised.wait().0, Some(0));
}

/// `clients[id]` connected with `?id=ID`, and which instance holds each.
fn connect_spread(
    supervised: &Supervised,
    addr: SocketAddr,
    ids: std::ops::Range<usize>,
) -> Vec<(usize, util::Client)> {
    connect_spread_with(supervised, addr, ids, "")
}

/// [`connect_spread`] with `more` after the id in the query.
fn connect_spread_with(
    supervised: &Supervised,
    addr: SocketAddr,
    ids: std::ops::Range<usize>,
    more: &str,
) -> Vec<(usize, util::Client)> {
    let clients: Vec<_> = ids
        .clone()
        .map(|i| connect(addr, &format!("/?id={i}{more}")))
        .collect();
    let mut on = vec![0; ids.end];
    for (instance, id) in supervised.upgrades_by_id(ids.len()) {
        on[id] = instance;
    }
    ids.zip(clients).map(|(id, c)| (on[id], c)).collect()
}

/// Every client not on `victim` reads `line` next; every one on it has
/// lost its connection.
fn only_the_victims_clients_are_gone(
    clients: &mut [(usize, util::Client)],
    victim: usize,
    line: &str,
) {
    for (instance, client) in clients.iter_mut() {
        if *instance == victim {
            assert!(
                !matches!(client.read(), Ok(Message::Text(_))),
                "a client of the dead instance got a message"
            );
        } else {
            assert_eq!(client.read().unwrap(), Message::text(line));
        }
    }
}

/// A new process of `victim` serves again: of new clients, some land on
/// it (in rounds of 30: new connections go to it once the supervisor
/// has heard it listens, which a loaded machine may take a while to
/// say), and all of them get the next line.
fn the_victim_serves_again(supervised: &mut Supervised, addr: SocketAddr, victim: usize) {
    let mut fresh = Vec::new();
    for round in 0..10 {
        let from = 100 + 30 * round;
        fresh.extend(connect_spread(supervised, addr, from..from + 30));
        if fresh.iter().any(|(instance, _)| *instance == victim) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(
        fresh.iter().any(|(instance, _)| *instance == victim),
        "none of {} new connections reached instance {victim}",
        fresh.len()
    );
    supervised.0.send(b"again\n");
    for (_, client) in &mut fresh {
        // An instance may frame the line before ("after") once it has
        // upgraded a new client: that is the upgrade rule.
        let mut got = client.read().unwrap();
        if got == Message::text("after") {
            got = client.read().unwrap();
        }
        assert_eq!(got, Message::text("again"));
    }
    drop(fresh);
    signal(supervised.0.child.id(), "-INT");
    assert_eq!(
        supervised.wait().0,
        Some(0),
        "a requested stop is a success"
    );
}

#[test]
fn a_killed_instance_is_started_again_and_the_others_keep_their_clients() {
    let (mut supervised, addr) = Supervised::start(3);
    let mut clients = connect_spread(&supervised, addr, 0..45);
    let victim = clients[0].0;
    let pid = supervised.instance_pid(victim);
    signal(pid, "-KILL");
    let died = supervised.0.wait_for(&format!(
        "instance {victim} (pid {pid}) was killed by signal 9"
    ));
    assert!(died.contains("starting it again in 100ms"), "{died}");
    let again = supervised
        .0
        .wait_for(&format!("instance {victim} started again"));
    assert!(again.contains("restart 1 of it, 1 in all"), "{again}");

    supervised.0.send(b"after\n");
    only_the_victims_clients_are_gone(&mut clients, victim, "after");
    assert_ne!(supervised.instance_pid(victim), pid);
    the_victim_serves_again(&mut supervised, addr, victim);
}

/// A stopped instance's input waits in the supervisor; the others get
/// the feed on time, in order. Past the stall timeout, or past the backlog
/// bound, the stopped one is replaced by a new process.
#[test]
fn a_stopped_instance_holds_nobody_back_and_is_replaced() {
    let bounds = [
        (["--instance-stall-timeout", "1s"], "has taken no input for"),
        (
            ["--instance-backlog", "200000"],
            "bytes of input waiting (the bound is 200000)",
        ),
    ];
    for (flags, why) in bounds {
        let mut args = vec!["--processes", "3"];
        args.extend(flags);
        let (mut supervised, addr) = Supervised::start_with(&args, 3);
        let mut clients = connect_spread(&supervised, addr, 0..45);
        let victim = clients[0].0;
        let pid = supervised.instance_pid(victim);
        signal(pid, "-STOP");
        // 300 lines of 1 KiB: several times what the stopped one's pipe holds.
        let pad = "x".repeat(1024);
        for i in 0..300 {
            supervised.0.send(format!("{i} {pad}\n").as_bytes());
            if i % 50 == 49 {
                for (instance, client) in clients.iter_mut().filter(|(n, _)| *n != victim) {
                    for j in i - 49..=i {
                        let got = client.read().unwrap();
                        assert_eq!(got, Message::text(format!("{j} {pad}")), "on {instance}");
                    }
                }
            }
        }
        let stuck = supervised
            .0
            .wait_for(&format!("instance {victim} (pid {pid}) is stuck"));
        assert!(stuck.contains(why), "{stuck}");
        supervised
            .0
            .wait_for(&format!("instance {victim} started again"));
        supervised.0.send(b"after\n");
        only_the_victims_clients_are_gone(&mut clients, victim, "after");
        the_victim_serves_again(&mut supervised, addr, victim);
    }
}

#[test]
fn upstream_lines_of_every_instance_come_out_whole_and_in_order() {
    const CLIENTS: usize = 12;
    const MESSAGES: usize = 40;
    let mut command = Command::new(env!("CARGO_BIN_EXE_wspush"));
    command
        .args(["--listen", "127.0.0.1:0", "--processes", "3", "--quiet"])
        .args([
            "--upstream",
            "stdout",
            "--upstream-events",
            "--input",
            "commands",
        ])
        .env("RUST_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut process = Logged::spawn(&mut command);
    let stdout = process.child.stdout.take().unwrap();
    let (mut addr, mut listening) = (None, 0);
    while listening < 3 || addr.is_none() {
        let line = process.next_line();
        if line.contains(" with 3 instances") {
            addr = Some(listening_addr(&line));
        } else if line.contains("] listening on ") {
            listening += 1;
        }
    }
    let addr = addr.unwrap();
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let next = || lines.recv_timeout(IO_TIMEOUT).expect("an upstream line");
    let mut clients: Vec<_> = (0..CLIENTS)
        .map(|c| connect(addr, &format!("/?id=c{c}")))
        .collect();
    // Each client's key, from its open line.
    let mut keys = vec![String::new(); CLIENTS];
    for _ in 0..CLIENTS {
        let line = next();
        let words: Vec<&str> = line.split(' ').collect();
        assert_eq!(words[0], "open", "{line}");
        let client: usize = words[2][1..].parse().unwrap();
        keys[client] = words[1].to_string();
    }
    let instances: std::collections::BTreeSet<&str> =
        keys.iter().map(|k| k.split('.').next().unwrap()).collect();
    assert!(
        instances.len() >= 2,
        "one instance took every client: {keys:?}"
    );
    // Lines longer than a pipe writes atomically, from every client at once.
    let payload = |c: usize, i: usize| format!("{c}:{i}:{}", "y".repeat(6000 + c * 100));
    for i in 0..MESSAGES {
        for (c, client) in clients.iter_mut().enumerate() {
            client.send(Message::text(payload(c, i))).unwrap();
        }
    }
    let mut seen = [0; CLIENTS];
    for _ in 0..CLIENTS * MESSAGES {
        let line = next();
        let words: Vec<&str> = line.splitn(5, ' ').collect();
        assert_eq!(
            words[..4],
            ["msg", words[1], words[2], "text"],
            "{:.80}",
            line
        );
        let client: usize = words[2][1..].parse().unwrap();
        assert_eq!(words[1], keys[client]);
        assert_eq!(
            words[4],
            payload(client, seen[client]),
            "a whole line, in order"
        );
        seen[client] += 1;
    }
    // Answers by key reach the right instance's client.
    for (c, key) in keys.iter().enumerate() {
        process.send(format!("conn {key} for c{c}\n").as_bytes());
    }
    for (c, client) in clients.iter_mut().enumerate() {
        assert_eq!(client.read().unwrap(), Message::text(format!("for c{c}")));
    }
}

/// The next text message of `client`.
fn text(client: &mut util::Client) -> String {
    match client.read().unwrap() {
        Message::Text(text) => text.to_string(),
        other => panic!("not text: {other:?}"),
    }
}

#[test]
fn every_instance_gives_a_line_the_same_position_and_a_client_resumes_on_any() {
    let (mut supervised, addr) = Supervised::start(3);
    let mut clients = connect_spread_with(&supervised, addr, 0..30, "&positions=1");
    let mut on: Vec<usize> = clients.iter().map(|(instance, _)| *instance).collect();
    on.sort();
    on.dedup();
    assert!(
        on.len() >= 2,
        "all 30 connections landed on instance {on:?}"
    );
    let statuses: Vec<String> = clients.iter_mut().map(|(_, c)| text(c)).collect();
    assert!(
        statuses[0].contains(r#""status":"position""#),
        "{}",
        statuses[0]
    );
    assert!(
        statuses.iter().all(|s| *s == statuses[0]),
        "one epoch, one position on every instance: {statuses:?}"
    );
    // A rejected line takes a number too, on every instance alike.
    supervised.0.send(b"a\n\xff\nb\nc\n");
    let expected: Vec<String> = (0..3).map(|_| text(&mut clients[0].1)).collect();
    let epoch = statuses[0]
        .split(r#""position":""#)
        .nth(1)
        .unwrap()
        .split('.')
        .next()
        .unwrap();
    assert_eq!(
        expected,
        [1, 3, 4].map(|n| format!("{epoch}.{n} {}", ["a", "", "b", "c"][n - 1]))
    );
    for (instance, client) in &mut clients[1..] {
        let got: Vec<String> = (0..3).map(|_| text(client)).collect();
        assert_eq!(got, expected, "on instance {instance}");
    }
    // Clients that drop after "a" come back with its position, wherever
    // the kernel puts them, while more lines come.
    let since = expected[0].split(' ').next().unwrap().to_string();
    drop(clients);
    supervised.0.send(b"d\n");
    let mut back = connect_spread_with(&supervised, addr, 100..124, &format!("&since={since}"));
    let mut on: Vec<usize> = back.iter().map(|(instance, _)| *instance).collect();
    on.sort();
    on.dedup();
    assert!(on.len() >= 2, "all 24 resumes landed on instance {on:?}");
    supervised.0.send(b"e\n");
    for (instance, client) in &mut back {
        assert!(
            text(client).contains(r#""status":"recovered""#),
            "on {instance}"
        );
        let got: Vec<String> = (0..4).map(|_| text(client)).collect();
        let payloads: Vec<&str> = got.iter().map(|m| m.split_once(' ').unwrap().1).collect();
        assert_eq!(payloads, ["b", "c", "d", "e"], "on instance {instance}");
        assert_eq!(got[3], format!("{epoch}.6 e"));
    }
    drop(back);
    signal(supervised.0.child.id(), "-INT");
    assert_eq!(supervised.wait().0, Some(0));
}

#[test]
fn the_clients_of_a_killed_instance_resume_on_any_other_and_lose_nothing() {
    let (mut supervised, addr) = Supervised::start(3);
    let mut clients = connect_spread_with(&supervised, addr, 0..30, "&positions=1");
    let victim = clients[0].0;
    for (_, client) in &mut clients {
        assert!(text(client).contains(r#""status":"position""#));
    }
    let feed = |supervised: &mut Supervised, lines: std::ops::Range<usize>| {
        for i in lines {
            supervised.0.send(format!("line {i}\n").as_bytes());
        }
    };
    feed(&mut supervised, 0..50);
    let mut last = Vec::new();
    for (_, client) in &mut clients {
        let got: Vec<String> = (0..50).map(|_| text(client)).collect();
        last.push(got[49].split(' ').next().unwrap().to_string());
    }
    let pid = supervised.instance_pid(victim);
    signal(pid, "-KILL");
    supervised.0.wait_for(&format!(
        "instance {victim} (pid {pid}) was killed by signal 9"
    ));
    feed(&mut supervised, 50..100);
    let mut resumed = Vec::new();
    for ((instance, client), since) in clients.iter_mut().zip(&last) {
        if *instance != victim {
            let got: Vec<String> = (50..100).map(|_| text(client)).collect();
            assert_eq!(got.last().unwrap().split_once(" ").unwrap().1, "line 99");
            continue;
        }
        assert!(
            !matches!(client.read(), Ok(Message::Text(_))),
            "the victim's client lost its connection"
        );
        let mut back = connect(addr, &format!("/?since={since}"));
        assert!(text(&mut back).contains(r#""status":"recovered""#));
        let got: Vec<String> = (50..100).map(|_| text(&mut back)).collect();
        let payloads: Vec<&str> = got.iter().map(|m| m.split_once(' ').unwrap().1).collect();
        let expected: Vec<String> = (50..100).map(|i| format!("line {i}")).collect();
        assert_eq!(payloads, expected, "what it missed, once, in order");
        resumed.push(back);
    }
    assert!(!resumed.is_empty());
    // Its new process listens (the supervisor's "started again" line may
    // come before or after this one).
    supervised
        .0
        .wait_for(&format!("wspush#{victim}] listening on "));
    // Resumes on the new process of the victim too (of 20, some land there).
    let mut fresh =
        connect_spread_with(&supervised, addr, 200..220, &format!("&since={}", last[0]));
    assert!(
        fresh.iter().any(|(instance, _)| *instance == victim),
        "none of 20 resumes reached the new instance {victim}"
    );
    for (instance, client) in &mut fresh {
        assert!(
            text(client).contains(r#""status":"recovered""#),
            "on {instance}"
        );
        let got: Vec<String> = (50..100).map(|_| text(client)).collect();
        assert_eq!(
            got[0].split_once(' ').unwrap().1,
            "line 50",
            "on {instance}"
        );
        assert_eq!(
            got[49].split_once(' ').unwrap().1,
            "line 99",
            "on {instance}"
        );
    }
    drop((clients, resumed, fresh));
    signal(supervised.0.child.id(), "-INT");
    assert_eq!(supervised.wait().0, Some(0));
}

#[test]
fn a_skipped_line_keeps_its_number_alone_as_under_a_supervisor_and_after_a_restart() {
    // The same feed, alone and under a supervisor: "x1", a line that is
    // not UTF-8, "x3".
    let feed = b"x1\n\xff\nx3\n";
    let lone = util::Binary::start(&[]);
    let mut process = lone.process;
    let mut client = connect(lone.addr, "/?positions=1");
    let epoch = |status: &str| status.split(r#""position":""#).nth(1).unwrap()[..16].to_string();
    let alone = epoch(&text(&mut client));
    process.send(feed);
    assert_eq!(
        [text(&mut client), text(&mut client)],
        [format!("{alone}.1 x1"), format!("{alone}.3 x3")],
        "alone: a position is its input line's number"
    );
    process.wait_for("input line 2 skipped: not valid UTF-8");

    let (mut supervised, addr) = Supervised::start(1);
    let mut client = connect(addr, "/?positions=1");
    let epoch = epoch(&text(&mut client));
    supervised.0.send(feed);
    assert_eq!(
        [text(&mut client), text(&mut client)],
        [format!("{epoch}.1 x1"), format!("{epoch}.3 x3")],
        "under a supervisor, the same numbers"
    );
    supervised
        .0
        .wait_for("input line 2 skipped: not valid UTF-8");
    // An instance started again numbers its lines as the supervisor does.
    let pid = supervised.instance_pid(1);
    signal(pid, "-KILL");
    supervised
        .0
        .wait_for(&format!("instance 1 (pid {pid}) was killed"));
    supervised.0.wait_for("wspush#1] listening on ");
    let mut client = connect(addr, "/?positions=1");
    text(&mut client);
    supervised.0.send(b"x4\n\xff\nx6\n");
    assert_eq!(text(&mut client), format!("{epoch}.4 x4"));
    supervised
        .0
        .wait_for("input line 5 skipped: not valid UTF-8");
    assert_eq!(text(&mut client), format!("{epoch}.6 x6"));
    signal(supervised.0.child.id(), "-INT");
    assert_eq!(supervised.wait().0, Some(0));
}

#[test]
fn under_two_processes_with_deflate_each_transport_gets_every_line_once() {
    let (mut process, addr) = util::start_supervisor(
        std::path::Path::new(env!("CARGO_BIN_EXE_wspush")),
        &[
            "--processes",
            "2",
            "--deflate",
            "on",
            "--deflate-min-bytes",
            "16",
        ],
        2,
        "info",
    );
    let mut streams: Vec<Stream> = (0..6)
        .map(|_| Stream::open(addr, "/", "").2.expect("a stream"))
        .collect();
    for stream in &mut streams {
        assert_eq!(status_of(&stream.event()), "position");
    }
    let mut sockets: Vec<_> = (0..6).map(|_| util::connect(addr, "/")).collect();
    // Both kinds on both instances, most likely; every one is counted
    // open before the lines go out.
    std::thread::sleep(Duration::from_millis(300));
    let lines: Vec<String> = (0..100)
        .map(|i| format!("line {i} {}", "compressible ".repeat(i % 4)))
        .collect();
    process.send(
        lines
            .iter()
            .map(|l| format!("{l}\n"))
            .collect::<String>()
            .as_bytes(),
    );
    for socket in &mut sockets {
        assert_eq!(util::texts(socket, lines.len()), lines);
    }
    for stream in &mut streams {
        let got: Vec<String> = (0..lines.len()).map(|_| stream.event().data).collect();
        assert_eq!(got, lines);
    }
}

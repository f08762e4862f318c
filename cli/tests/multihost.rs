//! wspush on three hosts fed through one real `redis-server`, across a
//! network boundary (and writing what their clients send into a stream
//! there): each host is a network namespace of its own, joined to
//! the others by a bridge. `tests/multihost/run.sh` makes the namespaces and
//! runs these tests (ignored otherwise) inside the clients' one; they start
//! `redis-server` and the wspush hosts in theirs with `ip netns exec`.

mod util;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use util::{http_get, sample, texts, Client, Logged, IO_TIMEOUT};

/// The Redis host's address (see run.sh).
const REDIS: [u8; 4] = [10, 77, 0, 1];
const REDIS_PORT: u16 = 6379;
/// The wspush hosts' addresses.
const HOSTS: [[u8; 4]; 3] = [[10, 77, 0, 11], [10, 77, 0, 12], [10, 77, 0, 13]];
const PORT: u16 = 8080;
/// The channel the hosts subscribe to.
const FEED: &str = "feed";

/// The namespace of `host`, as run.sh named it.
fn netns(host: &str) -> String {
    let prefix = std::env::var("WSPUSH_NETNS_PREFIX")
        .expect("run these through tests/multihost/run.sh, which makes the namespaces");
    format!("{prefix}{host}")
}

/// `command args` in the namespace of `host`, its standard error logged.
fn spawn_in(host: &str, program: &str, args: &[&str]) -> Logged {
    Logged::spawn(
        Command::new("ip")
            .args(["netns", "exec", &netns(host), program])
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::null()),
    )
}

/// Waits until something listens on `addr`.
fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + IO_TIMEOUT;
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// redis-server in its namespace, without persistence.
fn start_redis() -> Logged {
    let program = std::env::var("WSPUSH_REDIS_SERVER").unwrap_or("redis-server".into());
    let bind = SocketAddr::from((REDIS, REDIS_PORT));
    let redis = spawn_in(
        "redis",
        &program,
        &[
            "--bind",
            &bind.ip().to_string(),
            "--port",
            &REDIS_PORT.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--logfile",
            "",
        ],
    );
    wait_listening(bind);
    redis
}

/// A publisher: one connection to Redis.
struct Publisher(BufReader<TcpStream>);

impl Publisher {
    fn connect() -> Publisher {
        let stream =
            TcpStream::connect(SocketAddr::from((REDIS, REDIS_PORT))).expect("connect to redis");
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        Publisher(BufReader::new(stream))
    }

    /// Sends each of `payloads` on `channel` (pipelined); returns the
    /// subscriptions each reached, as Redis answers.
    fn publish(&mut self, channel: &str, payloads: &[&str]) -> Vec<u64> {
        let mut out = Vec::new();
        for payload in payloads {
            out.extend_from_slice(b"*3\r\n$7\r\nPUBLISH\r\n");
            for part in [channel, payload] {
                out.extend_from_slice(format!("${}\r\n{part}\r\n", part.len()).as_bytes());
            }
        }
        self.0.get_mut().write_all(&out).unwrap();
        (0..payloads.len())
            .map(|_| {
                let mut line = String::new();
                self.0.read_line(&mut line).unwrap();
                let count = line.trim_end().strip_prefix(':');
                count
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("{line:?}"))
            })
            .collect()
    }

    /// Publishes `payload` on the hosts' channel; returns the subscriptions
    /// it reached.
    fn publish_one(&mut self, payload: &str) -> u64 {
        self.publish(FEED, &[payload])[0]
    }
}

impl Publisher {
    /// Sends one command and reads its reply: a status, an integer or a
    /// bulk string (`nil` for none); an error reply fails the test.
    fn call(&mut self, args: &[&str]) -> String {
        let mut out = format!("*{}\r\n", args.len());
        for arg in args {
            out.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        self.0.get_mut().write_all(out.as_bytes()).unwrap();
        let mut line = String::new();
        self.0.read_line(&mut line).unwrap();
        let line = line.trim_end();
        match line.split_at(1) {
            ("+" | ":", rest) => rest.to_string(),
            ("$", "-1") => "nil".to_string(),
            ("$", _) => {
                let mut bulk = String::new();
                self.0.read_line(&mut bulk).unwrap();
                bulk.trim_end().to_string()
            }
            _ => panic!("{args:?}: {line}"),
        }
    }

    /// Adds an entry to the hosts' stream with `line` (after `maxlen`,
    /// the stream is trimmed to that many, exactly); returns its id.
    fn add(&mut self, line: &str, maxlen: Option<usize>) -> String {
        let maxlen = maxlen.map(|n| n.to_string());
        let mut args = vec!["XADD", FEED];
        if let Some(n) = &maxlen {
            args.extend(["MAXLEN", n]);
        }
        args.extend(["*", "line", line]);
        self.call(&args)
    }
}

/// A wspush host.
struct Host {
    addr: SocketAddr,
    process: Logged,
}

impl Host {
    /// Host `index` subscribed to the channel [`FEED`].
    fn start(index: usize, extra: &[&str]) -> Host {
        Host::reading(
            index,
            &["--redis-channel", FEED],
            extra,
            "redis feed: subscribed on",
        )
    }

    /// Host `index` reading the stream [`FEED`].
    fn streaming(index: usize, extra: &[&str]) -> Host {
        Host::reading(
            index,
            &["--redis-stream", FEED],
            extra,
            "redis stream feed: reading on",
        )
    }

    fn reading(index: usize, input: &[&str], extra: &[&str], ready: &str) -> Host {
        let addr = SocketAddr::from((HOSTS[index], PORT));
        let listen = addr.to_string();
        let redis = format!("redis://{}", SocketAddr::from((REDIS, REDIS_PORT)));
        let mut args = vec!["--listen", &listen, "--redis", &redis, "--quiet"];
        args.extend_from_slice(input);
        args.extend_from_slice(extra);
        let process = spawn_in(
            &format!("h{}", index + 1),
            env!("CARGO_BIN_EXE_wspush"),
            &args,
        );
        let host = Host { addr, process };
        host.process.wait_for(ready);
        host
    }

    fn metrics(&self) -> String {
        http_get(self.addr, "/metrics", "").body
    }

    /// Waits until `series` reads `value` on this host's `/metrics`.
    fn wait_metric(&self, series: &str, value: u64) {
        let deadline = Instant::now() + IO_TIMEOUT;
        while sample(&self.metrics(), series) != value {
            assert!(
                Instant::now() < deadline,
                "{series} never {value} on {}",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Three hosts started with `extra` flags.
fn hosts(extra: &[&str]) -> Vec<Host> {
    (0..HOSTS.len()).map(|i| Host::start(i, extra)).collect()
}

fn connect(host: &Host, path: &str) -> Client {
    util::connect(host.addr, path)
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn a_message_published_once_reaches_every_client_on_every_host_once_in_order() {
    let _redis = start_redis();
    // The third host runs two instances: its supervisor holds its one
    // subscription (each PUBLISH still reaches three).
    let hosts = [
        Host::start(0, &[]),
        Host::start(1, &[]),
        Host::start(2, &["--processes", "2"]),
    ];
    // Lines published after a client has its 101 reach it (on whichever
    // instance it reached).
    let mut clients: Vec<Client> = hosts
        .iter()
        .flat_map(|h| (0..10).map(move |_| connect(h, "/")))
        .collect();
    let messages: Vec<String> = (1..=300).map(|i| format!("m{i}")).collect();
    let payloads: Vec<&str> = messages.iter().map(String::as_str).collect();
    let mut publisher = Publisher::connect();
    assert!(publisher.publish(FEED, &payloads).iter().all(|&n| n == 3));
    assert_eq!(publisher.publish_one("end"), 3);
    let mut expected = messages.clone();
    expected.push("end".into());
    for client in &mut clients {
        assert_eq!(texts(client, expected.len()), expected);
    }
    // Every instance framed every line (whichever answers on the third).
    for h in &hosts {
        let page = h.metrics();
        assert_eq!(sample(&page, "wspush_broadcasts_total"), 301);
        assert_eq!(sample(&page, "wspush_input_lines_rejected_total"), 0);
    }
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn channel_publishes_and_sends_to_an_id_work_across_hosts() {
    let _redis = start_redis();
    let hosts = hosts(&["--input", "commands"]);
    let mut alice_1 = connect(&hosts[0], "/?id=alice&channel=room");
    let mut bob_2 = connect(&hosts[1], "/?id=bob&channel=room");
    let mut alice_3 = connect(&hosts[2], "/?id=alice");
    let mut carol_3 = connect(&hosts[2], "/?id=carol");
    for (h, open) in hosts.iter().zip([1, 1, 2]) {
        h.wait_metric("wspush_connections_open", open);
    }
    let mut publisher = Publisher::connect();
    let sent = publisher.publish(FEED, &["pub room hello room", "id alice psst", "all end"]);
    assert_eq!(sent, [3, 3, 3]);
    assert_eq!(texts(&mut alice_1, 3), ["hello room", "psst", "end"]);
    assert_eq!(texts(&mut bob_2, 2), ["hello room", "end"]);
    assert_eq!(texts(&mut alice_3, 2), ["psst", "end"]);
    assert_eq!(texts(&mut carol_3, 1), ["end"]);
    // Each host acted on its own connections; the others counted the
    // commands that reached none there.
    let unmatched: Vec<u64> = hosts
        .iter()
        .map(|h| sample(&h.metrics(), "wspush_commands_unmatched_total"))
        .collect();
    assert_eq!(unmatched, [0, 1, 1], "room: none on h3; alice: none on h2");
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn a_restarted_redis_is_reconnected_by_every_host_and_no_client_is_dropped() {
    let mut redis = start_redis();
    let hosts = hosts(&[]);
    let mut clients: Vec<Client> = hosts
        .iter()
        .flat_map(|h| (0..5).map(move |_| connect(h, "/")))
        .collect();
    let mut publisher = Publisher::connect();
    assert_eq!(publisher.publish_one("before"), 3);
    for client in &mut clients {
        assert_eq!(texts(client, 1), ["before"]);
    }

    drop(publisher);
    drop(redis); // killed
    for h in &hosts {
        h.wait_metric("wspush_feeds_down", 1);
        let health = http_get(h.addr, "/healthz", "");
        assert_eq!(health.status, 200);
        assert_eq!(health.body.trim_end(), "degraded: an input feed is lost");
    }
    redis = start_redis();
    for h in &hosts {
        h.wait_metric("wspush_feeds_down", 0);
        let page = h.metrics();
        assert_eq!(sample(&page, "wspush_feed_outages_total"), 1);
        assert_eq!(
            sample(&page, "wspush_connections_open"),
            5,
            "no client dropped"
        );
        assert_eq!(http_get(h.addr, "/healthz", "").body.trim_end(), "ok");
    }
    let mut publisher = Publisher::connect();
    assert_eq!(publisher.publish_one("after"), 3);
    for client in &mut clients {
        assert_eq!(texts(client, 1), ["after"]);
    }
    drop(redis);
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn a_killed_host_leaves_the_others_serving() {
    let _redis = start_redis();
    let mut hosts = hosts(&[]);
    let mut clients: Vec<Vec<Client>> = hosts
        .iter()
        .map(|h| (0..5).map(|_| connect(h, "/")).collect())
        .collect();
    let mut publisher = Publisher::connect();
    assert_eq!(publisher.publish_one("one"), 3);
    for client in clients.iter_mut().flatten() {
        assert_eq!(texts(client, 1), ["one"]);
    }
    let killed = hosts.remove(0);
    drop(killed);
    for client in &mut clients[0] {
        assert!(
            client.read().is_err(),
            "a client of the killed host lost its connection"
        );
    }
    assert_eq!(publisher.publish_one("two"), 2);
    for client in clients[1..].iter_mut().flatten() {
        assert_eq!(texts(client, 1), ["two"]);
    }
    for h in &hosts {
        assert_eq!(sample(&h.metrics(), "wspush_connections_open"), 5);
    }
}

/// What a client with positions got: the statuses, and each message as
/// (position, payload).
#[derive(Debug, Default)]
struct Got {
    statuses: Vec<String>,
    messages: Vec<(String, String)>,
}

impl Got {
    fn payloads(&self) -> Vec<&str> {
        self.messages.iter().map(|(_, p)| p.as_str()).collect()
    }

    /// The last position given: a message's, or a status's if none came.
    fn last_position(&self) -> String {
        if let Some((position, _)) = self.messages.last() {
            return position.clone();
        }
        let status = self.statuses.last().expect("a status");
        let at = status.rfind("\"position\":\"").unwrap() + 12;
        status[at..at + status[at..].find('"').unwrap()].to_string()
    }
}

/// Reads statuses and messages until `n` messages have come.
fn read_positioned(client: &mut Client, n: usize, got: &mut Got) {
    let until = got.messages.len() + n;
    while got.messages.len() < until {
        let text = texts(client, 1).remove(0);
        if text.starts_with('{') {
            got.statuses.push(text);
        } else {
            let (position, payload) = text.split_once(' ').expect("a position");
            got.messages.push((position.into(), payload.into()));
        }
    }
}

/// Lines `from..=to` as the publisher words them.
fn lines(from: usize, to: usize) -> Vec<String> {
    (from..=to).map(|i| format!("m{i}")).collect()
}

/// Adds lines `from..=to` to the stream.
fn add_lines(publisher: &mut Publisher, from: usize, to: usize, maxlen: Option<usize>) {
    for line in lines(from, to) {
        publisher.add(&line, maxlen);
    }
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn a_stream_gives_every_host_the_same_positions_and_a_client_moving_between_them_loses_nothing() {
    let _redis = start_redis();
    let hosts = [
        Host::streaming(0, &[]),
        Host::streaming(1, &[]),
        Host::streaming(2, &["--processes", "2"]),
    ];
    let mut watchers: Vec<(Client, Got)> = hosts
        .iter()
        .map(|h| (connect(h, "/?positions=1"), Got::default()))
        .collect();
    let mut publisher = Publisher::connect();
    // A malformed entry (no `line`) is skipped and counted by every host.
    publisher.call(&["XADD", FEED, "*", "text", "no line field"]);
    add_lines(&mut publisher, 1, 10, None);
    for (client, got) in &mut watchers {
        read_positioned(client, 10, got);
        assert_eq!(got.payloads(), lines(1, 10));
    }
    assert_eq!(
        watchers[0].1.messages, watchers[1].1.messages,
        "the same positions"
    );
    assert_eq!(
        watchers[0].1.messages, watchers[2].1.messages,
        "the same positions"
    );
    for h in &hosts {
        h.wait_metric("wspush_input_lines_rejected_total", 1);
    }
    // A client moves to another host after every few lines, missing some
    // while it is away: each move is recovered, and it gets every line once.
    let mut mover = Got::default();
    let mut client = connect(&hosts[0], "/?positions=1");
    read_positioned(&mut client, 0, &mut mover);
    texts(&mut client, 1); // The first status.
    let mut next = 11;
    for hop in 1..=6 {
        add_lines(&mut publisher, next, next + 4, None);
        read_positioned(&mut client, 5, &mut mover);
        drop(client);
        add_lines(&mut publisher, next + 5, next + 9, None);
        next += 10;
        let since = mover.last_position();
        client = connect(&hosts[hop % 3], &format!("/?since={since}"));
        let status = texts(&mut client, 1).remove(0);
        assert!(
            status.starts_with(r#"{"status":"recovered""#),
            "hop {hop}: {status}"
        );
        read_positioned(&mut client, 5, &mut mover);
    }
    assert_eq!(
        mover.payloads(),
        lines(11, next - 1),
        "every line once, in order"
    );
    assert!(
        mover.statuses.is_empty(),
        "no status but the recoveries: {:?}",
        mover.statuses
    );
    // What every host gave the watchers agrees with what the mover got.
    for (client, got) in &mut watchers {
        read_positioned(client, next - 11, got);
    }
    assert_eq!(watchers[0].1.messages[10..], mover.messages[..]);
    assert_eq!(watchers[2].1.messages[10..], mover.messages[..]);
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn a_restarted_host_fills_its_history_from_the_stream_and_a_resume_is_recovered() {
    let _redis = start_redis();
    let mut publisher = Publisher::connect();
    let host = Host::streaming(0, &["--processes", "2"]);
    let mut client = connect(&host, "/?positions=1");
    let mut got = Got::default();
    add_lines(&mut publisher, 1, 5, None);
    read_positioned(&mut client, 5, &mut got);
    let since = got.last_position();
    drop(client);
    drop(host); // Killed, supervisor and instances.
    add_lines(&mut publisher, 6, 10, None);
    let host = Host::streaming(0, &["--processes", "2"]);
    host.wait_metric("wspush_history_messages", 10);
    let mut client = connect(&host, &format!("/?since={since}"));
    let mut after = Got::default();
    read_positioned(&mut client, 5, &mut after);
    assert!(
        after.statuses[0].starts_with(r#"{"status":"recovered""#),
        "{:?}",
        after.statuses
    );
    assert_eq!(after.payloads(), lines(6, 10));
    // From before the first line: everything, from the history.
    let first = &got.messages[0].0;
    let mut client = connect(&host, &format!("/?since={first}"));
    let mut all = Got::default();
    read_positioned(&mut client, 9, &mut all);
    assert_eq!(all.payloads(), lines(2, 10));
    assert_eq!(
        all.messages[..4],
        got.messages[1..],
        "the same positions as before the restart"
    );
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn a_reexecuted_supervisor_reads_the_stream_on_where_it_was_with_the_same_positions() {
    reexecuted_host_reads_the_stream_on(&["--processes", "2"]);
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn a_reexecuted_lone_server_reads_the_stream_on_with_its_history() {
    reexecuted_host_reads_the_stream_on(&[]);
}

/// A host started with `extra` flags, re-executed by SIGUSR2 while
/// entries are added, reads the stream on from where it was: every line
/// once, in order, at the positions it had, and a resume from before is
/// recovered from the history it kept.
fn reexecuted_host_reads_the_stream_on(extra: &[&str]) {
    let _redis = start_redis();
    let mut publisher = Publisher::connect();
    let host = Host::streaming(0, extra);
    let mut client = connect(&host, "/?positions=1");
    let mut got = Got::default();
    read_positioned(&mut client, 0, &mut got);
    texts(&mut client, 1); // The first status.
    add_lines(&mut publisher, 1, 5, None);
    read_positioned(&mut client, 5, &mut got);
    // SIGUSR2: the process re-executes itself (the binary on disk reads
    // its state; a supervisor then upgrades its instances); entries
    // added meanwhile are read on from where it was.
    util::signal(host.process.child.id(), "-USR2");
    add_lines(&mut publisher, 6, 10, None);
    host.process
        .wait_for("redis stream feed stopped for the next image after entry");
    match extra.is_empty() {
        true => host
            .process
            .wait_for("connections back from the earlier image"),
        false => host
            .process
            .wait_for("the upgrade of the 2 instances is done"),
    };
    add_lines(&mut publisher, 11, 15, None);
    read_positioned(&mut client, 10, &mut got);
    assert_eq!(got.payloads(), lines(1, 15), "{:?}", got.statuses);
    // A resume from before the re-exec: recovered, in the same epoch.
    let since = &got.messages[2].0;
    let mut back = connect(&host, &format!("/?since={since}"));
    let mut after = Got::default();
    read_positioned(&mut back, 12, &mut after);
    assert!(
        after.statuses[0].starts_with(r#"{"status":"recovered""#),
        "{:?}",
        after.statuses
    );
    assert_eq!(after.messages[..], got.messages[3..], "the same positions");
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn a_position_a_supervised_host_has_not_reached_waits_rather_than_being_unknown() {
    let _redis = start_redis();
    let mut publisher = Publisher::connect();
    let host = Host::streaming(0, &["--processes", "2"]);
    let mut client = connect(&host, "/?positions=1");
    let mut got = Got::default();
    read_positioned(&mut client, 0, &mut got);
    texts(&mut client, 1); // The first status.
    add_lines(&mut publisher, 1, 2, None);
    read_positioned(&mut client, 2, &mut got);
    // A position past the last one given (as a client moving from a host
    // ahead of this one brings): its instances read the stream's epoch
    // from their supervisor, so the client waits for it.
    let last = got.last_position();
    let (epoch, seq) = last.split_once('.').unwrap();
    let ahead = format!("{epoch}.{}", seq.parse::<u64>().unwrap() + 1);
    let mut early = connect(&host, &format!("/?since={ahead}"));
    let status = texts(&mut early, 1).remove(0);
    assert!(status.starts_with(r#"{"status":"recovered""#), "{status}");
    add_lines(&mut publisher, 3, 3, None);
    let mut after = Got::default();
    read_positioned(&mut early, 1, &mut after);
    assert_eq!(after.payloads(), lines(3, 3));
}

/// Cuts host `index` off from Redis (`on`), or joins it again.
fn cut_from_redis(index: usize, on: bool) {
    let redis = std::net::Ipv4Addr::from(REDIS).to_string();
    let verb = if on { "add" } else { "del" };
    let status = Command::new("ip")
        .args([
            "-n",
            &netns(&format!("h{}", index + 1)),
            "route",
            verb,
            "unreachable",
            &redis,
        ])
        .status()
        .unwrap();
    assert!(status.success(), "ip route {verb} unreachable {redis}");
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn an_outage_loses_nothing_the_stream_holds_and_what_it_trimmed_is_told_as_a_gap() {
    let _redis = start_redis();
    let mut publisher = Publisher::connect();
    let host = Host::streaming(0, &[]);
    let mut client = connect(&host, "/?positions=1");
    let mut got = Got::default();
    add_lines(&mut publisher, 1, 3, None);
    read_positioned(&mut client, 3, &mut got);
    // Added while the host is cut off: read when it is back.
    cut_from_redis(0, true);
    host.wait_metric("wspush_feeds_down", 1);
    add_lines(&mut publisher, 4, 8, None);
    cut_from_redis(0, false);
    host.wait_metric("wspush_feeds_down", 0);
    read_positioned(&mut client, 5, &mut got);
    assert_eq!(got.payloads(), lines(1, 8));
    assert_eq!(got.statuses.len(), 1, "no gap: {:?}", got.statuses);
    let since = got.last_position();
    drop(client);
    // Connected through the next outage: one with positions, one without.
    let mut live = connect(&host, "/?positions=1");
    let mut plain = connect(&host, "/");
    let mut live_got = Got::default();
    // Trimmed while it is cut off: m9..m15 are gone when it is back.
    cut_from_redis(0, true);
    host.wait_metric("wspush_feeds_down", 1);
    add_lines(&mut publisher, 9, 20, Some(5));
    cut_from_redis(0, false);
    host.wait_metric("wspush_stream_gaps_total", 1);
    host.wait_metric("wspush_feeds_down", 0);
    let mut client = connect(&host, &format!("/?since={since}"));
    let mut after = Got::default();
    read_positioned(&mut client, 5, &mut after);
    assert_eq!(after.payloads(), lines(16, 20));
    assert!(
        after.statuses[0].starts_with(r#"{"status":"recovered""#),
        "{:?}",
        after.statuses
    );
    assert_eq!(after.statuses.len(), 2, "{:?}", after.statuses);
    let gap = &after.statuses[1];
    assert!(gap.starts_with(r#"{"status":"gap","from":""#), "{gap}");
    // The gap is told before m16, and names what lies between m8 and m16.
    let field = |name: &str| {
        let at = gap.find(&format!("\"{name}\":\"")).unwrap() + name.len() + 4;
        let position = &gap[at..at + gap[at..].find('"').unwrap()];
        position.split_once('.').unwrap().1.parse::<u64>().unwrap()
    };
    let seq = |position: &str| position.split_once('.').unwrap().1.parse::<u64>().unwrap();
    assert!(
        seq(&since) < field("from") && field("to") < seq(&after.messages[0].0),
        "{gap}"
    );
    // The connected client with positions is told the same gap in the
    // stream, before m16; the one without gets an empty pong in its
    // place (a heartbeat), then the messages.
    read_positioned(&mut live, 5, &mut live_got);
    assert_eq!(live_got.payloads(), lines(16, 20));
    assert_eq!(live_got.statuses.len(), 2, "{:?}", live_got.statuses);
    let told = &live_got.statuses[1];
    let named = |status: &str| status[..status.find(r#","position""#).unwrap()].to_string();
    assert_eq!(named(told), named(gap), "{told}");
    match plain.read().expect("a message") {
        tungstenite::Message::Pong(payload) => assert!(payload.is_empty()),
        other => panic!("not a pong: {other:?}"),
    }
    assert_eq!(texts(&mut plain, 5), lines(16, 20));
    assert_eq!(sample(&host.metrics(), "wspush_feed_outages_total"), 2);
}

/// The stream the hosts write what their clients send into.
const UP: &str = "up";

impl Host {
    /// Host `index` writing what its clients send into the stream [`UP`],
    /// as `h1`, `h2`...
    fn upstreaming(index: usize, extra: &[&str]) -> Host {
        let name = format!("h{}", index + 1);
        let upstream = [
            "--upstream",
            "redis-stream",
            "--upstream-stream",
            UP,
            "--host-name",
            &name,
        ];
        let ready = format!("redis upstream stream {UP} (as {name}): writing on");
        Host::reading(index, &upstream, extra, &ready)
    }

    /// Waits until `done` holds of this host's `/metrics`.
    fn wait_page(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + 3 * IO_TIMEOUT;
        loop {
            let page = self.metrics();
            if done(&page) {
                return page;
            }
            assert!(Instant::now() < deadline, "never {what} on {}", self.addr);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A connection to the Redis host, with the `redis` crate.
fn redis_connection() -> redis::Connection {
    let url = format!("redis://{}", SocketAddr::from((REDIS, REDIS_PORT)));
    let client = redis::Client::open(url).unwrap();
    let connection = client.get_connection_with_timeout(IO_TIMEOUT).unwrap();
    connection.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    connection
}

/// An entry of the stream [`UP`]: its fields.
#[derive(Debug)]
struct Entry {
    host: String,
    seq: u64,
    line: String,
}

impl Entry {
    /// An entry's fields (`host HOST seq N line LINE`), as Redis gives them.
    fn of(fields: &[String]) -> Entry {
        assert_eq!(fields.len(), 6, "{fields:?}");
        assert_eq!(
            (&*fields[0], &*fields[2], &*fields[4]),
            ("host", "seq", "line")
        );
        Entry {
            host: fields[1].clone(),
            seq: fields[3].parse().unwrap(),
            line: fields[5].clone(),
        }
    }

    /// The client id and the payload of a `msg KEY ID text PAYLOAD` line.
    fn message(&self) -> (&str, &str) {
        let words: Vec<&str> = self.line.splitn(5, ' ').collect();
        assert_eq!((words[0], words[3]), ("msg", "text"), "{}", self.line);
        (words[2], words[4])
    }
}

/// The entries of the stream [`UP`], all, in order.
fn stream_entries(redis: &mut redis::Connection) -> Vec<Entry> {
    let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(UP)
        .arg("-")
        .arg("+")
        .query(redis)
        .unwrap();
    entries
        .iter()
        .map(|(_, fields)| Entry::of(fields))
        .collect()
}

/// The stream's length.
fn stream_len(redis: &mut redis::Connection) -> usize {
    redis::cmd("XLEN").arg(UP).query(redis).unwrap()
}

/// Waits until the stream holds `n` entries.
fn wait_stream_len(redis: &mut redis::Connection, n: usize) {
    let deadline = Instant::now() + 3 * IO_TIMEOUT;
    while stream_len(redis) != n {
        assert!(
            Instant::now() < deadline,
            "the stream holds {} entries, not {n}",
            stream_len(redis)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads `n` entries through the consumer group `group` (entries not
/// delivered to it yet), acknowledging each.
fn read_group(redis: &mut redis::Connection, group: &str, n: usize) -> Vec<Entry> {
    type Reply = Option<Vec<(String, Vec<(String, Vec<String>)>)>>;
    let deadline = Instant::now() + 3 * IO_TIMEOUT;
    let mut out = Vec::new();
    while out.len() < n {
        assert!(Instant::now() < deadline, "{} entries of {n}", out.len());
        let reply: Reply = redis::cmd("XREADGROUP")
            .arg(&["GROUP", group, "reader", "COUNT", "1000", "BLOCK", "500"][..])
            .arg(&["STREAMS", UP, ">"][..])
            .query(redis)
            .unwrap();
        for (_, entries) in reply.unwrap_or_default() {
            for (id, fields) in entries {
                let _: u64 = redis::cmd("XACK")
                    .arg(&[UP, group, &id][..])
                    .query(redis)
                    .unwrap();
                out.push(Entry::of(&fields));
            }
        }
    }
    out
}

/// The payload of message `i` of client `id`, padded with `pad` bytes: a
/// line feed and a backslash in it, escaped in its line.
fn upstream_payload(id: &str, i: usize, pad: usize) -> String {
    format!("{id} {i} {}a\\b\nc", "x".repeat(pad))
}

/// The message number in a payload of [`upstream_payload`], escaped.
fn message_number(id: &str, escaped: &str) -> usize {
    let rest = escaped.strip_prefix(&format!("{id} ")).expect(escaped);
    let (i, tail) = rest.split_once(' ').expect(escaped);
    assert_eq!(
        tail.trim_start_matches('x'),
        "a\\\\b\\nc",
        "whole: {escaped}"
    );
    i.parse().unwrap()
}

/// Sends messages `from..to` from each client, padded with `pad` bytes.
fn send_upstream(clients: &mut [(String, Client)], from: usize, to: usize, pad: usize) {
    for i in from..to {
        for (id, client) in clients.iter_mut() {
            let text = upstream_payload(id, i, pad);
            client.send(tungstenite::Message::text(text)).expect("send");
        }
    }
}

/// Each client's message numbers, in the order of `entries`.
fn by_client(entries: &[Entry]) -> std::collections::BTreeMap<String, Vec<usize>> {
    let mut got = std::collections::BTreeMap::<String, Vec<usize>>::new();
    for entry in entries {
        let (id, payload) = entry.message();
        assert!(id.starts_with(&entry.host), "{id} from {}", entry.host);
        got.entry(id.to_string())
            .or_default()
            .push(message_number(id, payload));
    }
    got
}

/// Clients of `host` (`h1`...), `count` of them, with ids.
fn upstream_clients(host: &Host, name: &str, count: usize) -> Vec<(String, Client)> {
    (0..count)
        .map(|c| {
            let id = format!("{name}c{c}");
            let client = connect(host, &format!("/?id={id}"));
            (id, client)
        })
        .collect()
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn what_clients_send_on_two_hosts_reaches_the_stream_once_whole_in_each_clients_order() {
    let _redis = start_redis();
    let mut redis = redis_connection();
    let _: () = redis::cmd("XGROUP")
        .arg(&["CREATE", UP, "backend", "$", "MKSTREAM"][..])
        .query(&mut redis)
        .unwrap();
    // The second host's supervisor writes what its two instances merge.
    let hosts = [
        Host::upstreaming(0, &[]),
        Host::upstreaming(1, &["--processes", "2"]),
    ];
    const CLIENTS: usize = 8;
    const MESSAGES: usize = 200;
    let mut clients = upstream_clients(&hosts[0], "h1", CLIENTS);
    clients.extend(upstream_clients(&hosts[1], "h2", CLIENTS));
    send_upstream(&mut clients, 0, MESSAGES, 0);
    let entries = read_group(&mut redis, "backend", clients.len() * MESSAGES);
    let got = by_client(&entries);
    assert_eq!(got.len(), clients.len());
    for (id, numbers) in &got {
        assert_eq!(*numbers, (0..MESSAGES).collect::<Vec<_>>(), "{id}");
    }
    // Each host numbers its lines 1, 2, 3... in the stream's order.
    for name in ["h1", "h2"] {
        let seqs: Vec<u64> = (entries.iter())
            .filter(|e| e.host == name)
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, (1..=(CLIENTS * MESSAGES) as u64).collect::<Vec<_>>());
    }
    for host in &hosts {
        let page = host.wait_page("every entry counted", |page| {
            sample(page, "wspush_upstream_stream_entries_total") == (CLIENTS * MESSAGES) as u64
        });
        assert_eq!(sample(&page, "wspush_upstream_dropped_total"), 0);
        let found = r#"wspush_upstream_stream_batches_total{result="found"}"#;
        assert_eq!(sample(&page, found), 0);
        assert_eq!(sample(&page, "wspush_upstream_stream_outages_total"), 0);
    }
}

/// Lets Redis answer nothing to host `index` (`on`: its replies have no
/// route), or answer again: what the host sends still arrives.
fn cut_replies(index: usize, on: bool) {
    let host = std::net::Ipv4Addr::from(HOSTS[index]).to_string();
    let verb = if on { "add" } else { "del" };
    let status = Command::new("ip")
        .args(["-n", &netns("redis"), "route", verb, "unreachable", &host])
        .status()
        .unwrap();
    assert!(status.success(), "ip route {verb} unreachable {host}");
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn an_upstream_outage_loses_nothing_and_a_batch_whose_reply_was_lost_is_not_written_twice() {
    let _redis = start_redis();
    let mut redis = redis_connection();
    let host = Host::upstreaming(0, &[]);
    let mut clients = upstream_clients(&host, "h1", 1);
    send_upstream(&mut clients, 0, 100, 0);
    wait_stream_len(&mut redis, 100);
    // Redis takes what the host sends, and its answers are lost: the
    // batch under way is written, and the host takes Redis for lost.
    cut_replies(0, true);
    send_upstream(&mut clients, 100, 200, 0);
    host.wait_metric("wspush_upstream_stream_down", 1);
    let written = stream_len(&mut redis);
    assert!(written > 100, "the batch whose reply was lost was written");
    // Sent while it is away: they wait.
    send_upstream(&mut clients, 200, 300, 0);
    cut_replies(0, false);
    wait_stream_len(&mut redis, 300);
    host.wait_metric("wspush_upstream_stream_down", 0);
    // And after it, on in sequence.
    send_upstream(&mut clients, 300, 400, 0);
    wait_stream_len(&mut redis, 400);
    let entries = stream_entries(&mut redis);
    assert_eq!(by_client(&entries)["h1c0"], (0..400).collect::<Vec<_>>());
    let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=400).collect::<Vec<_>>());
    let page = host.wait_page("every entry counted", |page| {
        sample(page, "wspush_upstream_stream_entries_total") == 400
    });
    let found = r#"wspush_upstream_stream_batches_total{result="found"}"#;
    assert_eq!(sample(&page, found), 1, "sent again, found written");
    let log = host.process.rest();
    let said = |what: &str| log.iter().filter(|l| l.contains(what)).count();
    assert_eq!(
        said("redis upstream stream up (as h1) lost on"),
        1,
        "{log:#?}"
    );
    assert_eq!(
        said("redis upstream stream up (as h1) restored on"),
        1,
        "{log:#?}"
    );
    assert_eq!(
        said("stood at"),
        0,
        "the sequence was where it was left: {log:#?}"
    );
    assert_eq!(sample(&page, "wspush_upstream_stream_outages_total"), 1);
    assert_eq!(sample(&page, "wspush_upstream_dropped_total"), 0);
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn an_upstream_outage_past_the_bound_drops_only_what_it_counts() {
    let _redis = start_redis();
    let mut redis = redis_connection();
    let host = Host::upstreaming(
        0,
        &[
            "--processes",
            "2",
            "--upstream-max-bytes",
            "4096",
            "--upstream-overflow",
            "drop",
        ],
    );
    let mut clients = upstream_clients(&host, "h1", 4);
    send_upstream(&mut clients, 0, 10, 0);
    wait_stream_len(&mut redis, 40);
    // Cut off: the supervisor's writer waits, the merge behind it, the
    // instances' pipes, then their bounds fill and they drop.
    cut_from_redis(0, true);
    const MESSAGES: usize = 1500;
    send_upstream(&mut clients, 10, MESSAGES, 1000);
    let sent = (4 * MESSAGES) as u64;
    host.wait_metric("wspush_messages_received_total", sent);
    host.wait_metric("wspush_upstream_stream_down", 1);
    cut_from_redis(0, false);
    let page = host.wait_page("every message written or dropped", |page| {
        let written = sample(page, "wspush_upstream_stream_entries_total");
        written + sample(page, "wspush_upstream_dropped_total") == sent
    });
    let dropped = sample(&page, "wspush_upstream_dropped_total");
    assert!(dropped > 0, "the bound was passed");
    let entries = stream_entries(&mut redis);
    assert_eq!(
        entries.len() as u64 + dropped,
        sent,
        "what is missing is what was dropped"
    );
    // What arrived, each once and in its client's order.
    for (id, numbers) in by_client(&entries) {
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{id}: {numbers:?}");
    }
    assert_eq!(sample(&page, "wspush_upstream_stream_outages_total"), 1);
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn a_reexecuted_supervisor_writes_the_stream_on_from_its_sequence() {
    reexecuted_host_writes_the_stream_on(&["--processes", "2"]);
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn a_reexecuted_lone_server_writes_the_stream_on_from_its_sequence() {
    reexecuted_host_writes_the_stream_on(&[]);
}

/// A host started with `extra` flags, re-executed by SIGUSR2, writes
/// what its clients send on after what it wrote before: each line once,
/// its sequence on from where it was. A supervisor's counts go on from
/// its earlier image's (on the host's board); a lone server's start over,
/// as all its counters do.
fn reexecuted_host_writes_the_stream_on(extra: &[&str]) {
    let _redis = start_redis();
    let mut redis = redis_connection();
    let host = Host::upstreaming(0, extra);
    let mut clients = upstream_clients(&host, "h1", 2);
    send_upstream(&mut clients, 0, 100, 0);
    wait_stream_len(&mut redis, 200);
    util::signal(host.process.child.id(), "-USR2");
    match extra.is_empty() {
        true => host
            .process
            .wait_for("connections back from the earlier image"),
        false => host
            .process
            .wait_for("the upgrade of the 2 instances is done"),
    };
    send_upstream(&mut clients, 100, 200, 0);
    wait_stream_len(&mut redis, 400);
    let entries = stream_entries(&mut redis);
    for (id, numbers) in by_client(&entries) {
        assert_eq!(numbers, (0..200).collect::<Vec<_>>(), "{id}");
    }
    let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=400).collect::<Vec<_>>());
    let counted = if extra.is_empty() { 200 } else { 400 };
    host.wait_page("the entries counted", |page| {
        sample(page, "wspush_upstream_stream_entries_total") == counted
    });
}

/// A fleet's presence as a reader finds it in Redis: the hosts whose
/// hash has not expired, and each one's counts by channel.
fn fleet_presence(redis: &mut redis::Connection) -> Vec<(String, Vec<(String, String)>)> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let hosts: Vec<String> = redis::cmd("ZRANGEBYSCORE")
        .arg("wspush:presence:hosts")
        .arg(now as u64)
        .arg("+inf")
        .query(redis)
        .unwrap();
    hosts
        .into_iter()
        .map(|host| {
            let mut counts: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(format!("wspush:presence:{host}"))
                .query(redis)
                .unwrap();
            counts.sort();
            (host, counts)
        })
        .collect()
}

/// Waits until the fleet's presence in Redis is `expected`.
fn wait_fleet(redis: &mut redis::Connection, expected: &[(&str, &[(&str, &str)])]) {
    let expected: Vec<(String, Vec<(String, String)>)> = expected
        .iter()
        .map(|(host, counts)| {
            let counts = counts
                .iter()
                .map(|(c, n)| (c.to_string(), n.to_string()))
                .collect();
            (host.to_string(), counts)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let found = fleet_presence(redis);
        if found == expected {
            return;
        }
        assert!(Instant::now() < deadline, "{found:?}, not {expected:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs the namespaces of tests/multihost/run.sh"]
fn a_fleets_channel_counts_are_read_from_redis_and_a_gone_host_expires() {
    let _redis = start_redis();
    let presence = |name: &'static str| ["--presence-ttl", "3s", "--host-name", name];
    let lone = Host::reading(0, &presence("h1"), &[], "listening on");
    let supervised = Host::reading(1, &presence("h2"), &["--processes", "2"], "listening on");
    let mut clients: Vec<Client> = (0..3)
        .map(|_| connect(&lone, "/?channel=room"))
        .chain([connect(&lone, "/?id=a&channel=other&channel=room")])
        .collect();
    let mut theirs: Vec<Client> = (0..5)
        .map(|_| connect(&supervised, "/?channel=room"))
        .collect();
    let mut redis = redis_connection();
    wait_fleet(
        &mut redis,
        &[
            ("h1", &[("other", "1"), ("room", "4")]),
            ("h2", &[("room", "5")]),
        ],
    );
    // Closes are counted at the next write; a host with no channel has
    // no hash, and is still a host.
    theirs.clear();
    clients.pop();
    wait_fleet(&mut redis, &[("h1", &[("room", "3")]), ("h2", &[])]);
    // A host that stops writing expires after its TTL.
    drop(supervised);
    wait_fleet(&mut redis, &[("h1", &[("room", "3")])]);
    let exists: bool = redis::cmd("EXISTS")
        .arg("wspush:presence:h2")
        .query(&mut redis)
        .unwrap();
    assert!(!exists);
    drop(clients);
}

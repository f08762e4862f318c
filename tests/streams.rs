//! Broadcast streams: messages queued together go out as one batch, each
//! exactly once and in order; a pass over the connections gives each one
//! everything it is owed and leaves the loop serving everyone else; slow
//! consumers are counted per message; the queue from the producer is
//! bounded by bytes.

mod util;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use util::{
    channels, client_frame, poll_until, raw, raw_upgraded, read_frame, read_response,
    upgrade_request, TestServer, PING,
};
use wspush::{Config, MessageKind, Server, SlowConsumerPolicy};

/// `count` raw clients upgraded against a server polled meanwhile.
fn upgraded_clients(server: &mut Server, count: usize) -> Vec<TcpStream> {
    upgraded_clients_at(server, count, "/")
}

/// `count` raw clients upgraded at `path` against a server polled meanwhile.
fn upgraded_clients_at(server: &mut Server, count: usize, path: &str) -> Vec<TcpStream> {
    let addr = server.local_addr();
    let before = server.connections().count();
    let path = path.to_string();
    let clients = thread::spawn(move || {
        (0..count)
            .map(|_| {
                let mut stream = raw(addr);
                stream.write_all(upgrade_request(&path).as_bytes()).unwrap();
                assert_eq!(read_response(&mut stream).status, 101);
                stream
            })
            .collect()
    });
    poll_until(server, "the upgrades", |s| {
        s.connections().count() == before + count
    });
    clients.join().unwrap()
}

/// The next data frame's text (pings skipped).
fn next_text(stream: &mut impl Read) -> String {
    loop {
        let frame = read_frame(stream).expect("a frame");
        match frame.opcode {
            0x1 => return String::from_utf8(frame.payload).unwrap(),
            0x9 => continue,
            other => panic!("unexpected opcode {other}: {frame:?}"),
        }
    }
}

#[test]
fn a_burst_queued_together_goes_out_as_one_batch_in_order() {
    const CLIENTS: usize = 20;
    const LINES: usize = 200;
    let mut server = Server::bind(Config::default()).unwrap();
    let mut clients = upgraded_clients(&mut server, CLIENTS);
    let handle = server.handle();
    let before = server.metrics();
    for i in 0..LINES {
        handle.broadcast_text(format!("line {i}")).unwrap();
    }
    poll_until(&mut server, "every delivery", |s| {
        s.metrics().broadcast_deliveries == (CLIENTS * LINES) as u64
    });
    let after = server.metrics();
    assert_eq!(after.broadcasts - before.broadcasts, LINES as u64);
    assert_eq!(
        after.broadcast_batches - before.broadcast_batches,
        1,
        "one batch"
    );
    let batch: usize = (0..LINES).map(|i| 2 + format!("line {i}").len()).sum();
    assert_eq!(
        after.bytes_written - before.bytes_written,
        (CLIENTS * batch) as u64,
        "each frame written once to each client"
    );
    for client in &mut clients {
        for i in 0..LINES {
            assert_eq!(next_text(client), format!("line {i}"));
        }
    }
}

#[test]
fn a_connection_that_upgrades_during_a_pass_gets_exactly_the_lines_taken_after_it() {
    // One connection per loop iteration: a fan-out to 40 takes 40 of them.
    let mut server = Server::bind(Config::default().with(|c| {
        c.fanout_budget = 1;
    }))
    .unwrap();
    let addr = server.local_addr();
    let mut clients = upgraded_clients(&mut server, 40);
    // Free a slot inside the key range, for the late client to take.
    drop(clients.remove(30));
    poll_until(&mut server, "the close", |s| s.connections().count() == 39);

    server.broadcast(MessageKind::Text, b"A").unwrap();
    assert_eq!(server.metrics().broadcast_deliveries, 1, "one slice so far");
    // A client the fan-out has not reached sends a ping; a new client's
    // request waits in the kernel; one iteration serves both.
    clients[20]
        .write_all(&client_frame(PING, b"are you there"))
        .unwrap();
    // On loopback the request is in the server's queue once write returns.
    let mut late = raw(addr);
    late.write_all(upgrade_request("/").as_bytes()).unwrap();
    let late = thread::spawn(move || {
        assert_eq!(read_response(&mut late).status, 101);
        late
    });
    server.poll_once(Some(Duration::ZERO)).unwrap();
    let late_upgraded_at = server.metrics().broadcast_deliveries;
    poll_until(&mut server, "the late upgrade", |_| late.is_finished());
    let mut late = late.join().unwrap();
    assert!(
        late_upgraded_at < 39,
        "upgraded during the fan-out ({late_upgraded_at} of 39 delivered)"
    );
    let pong = read_frame(&mut clients[20]).unwrap();
    assert_eq!(
        (pong.opcode, &pong.payload[..]),
        (0xA, &b"are you there"[..]),
        "the pong came before the fan-out reached this client"
    );

    poll_until(&mut server, "the fan-out", |s| {
        s.metrics().broadcast_deliveries == 39
    });
    server.broadcast(MessageKind::Text, b"B").unwrap();
    poll_until(&mut server, "the second fan-out", |s| {
        s.metrics().broadcast_deliveries == 39 + 40
    });
    assert_eq!(next_text(&mut late), "B", "A began before its upgrade");
    for client in &mut clients {
        assert_eq!(next_text(client), "A");
        assert_eq!(next_text(client), "B");
    }
}

#[test]
fn a_ping_during_a_long_channel_delivery_is_answered_before_it_ends() {
    // One connection per loop iteration: a message to 40 subscribers of
    // a channel takes 40 of them, as a broadcast's pass does.
    let mut server = Server::bind(Config::default().with(|c| {
        c.fanout_budget = 1;
    }))
    .unwrap();
    let mut clients = upgraded_clients_at(&mut server, 40, "/?channel=hot");
    let handle = server.handle();
    let hot = || channels(&["hot"]);
    handle.send(hot(), MessageKind::Text, "A").unwrap();
    poll_until(&mut server, "the first delivery", |s| {
        s.metrics().broadcast_deliveries >= 1
    });
    let reached = server.metrics().broadcast_deliveries;
    assert!(reached < 10, "{reached} of 40 at a time");
    clients[20]
        .write_all(&client_frame(PING, b"still there?"))
        .unwrap();
    // On loopback the ping is in the server's queue once write returns.
    server.poll_once(Some(Duration::ZERO)).unwrap();
    let pong = read_frame(&mut clients[20]).unwrap();
    assert_eq!(
        (pong.opcode, &pong.payload[..]),
        (0xA, &b"still there?"[..]),
        "the pong came before the delivery reached this subscriber"
    );
    assert!(server.metrics().broadcast_deliveries < 20);
    poll_until(&mut server, "every delivery", |s| {
        s.metrics().broadcast_deliveries == 40
    });
    for client in &mut clients {
        assert_eq!(next_text(client), "A");
    }
}

#[test]
fn a_line_framed_during_a_pass_reaches_the_connections_ahead_in_that_pass() {
    let mut server = Server::bind(Config::default().with(|c| {
        c.fanout_budget = 1;
    }))
    .unwrap();
    let mut clients = upgraded_clients(&mut server, 10);
    server.broadcast(MessageKind::Text, b"A").unwrap();
    assert_eq!(server.metrics().broadcast_deliveries, 1, "client 0 has A");
    server.broadcast(MessageKind::Text, b"B").unwrap();
    assert_eq!(server.metrics().broadcast_batches, 2);
    server.poll_once(Some(Duration::ZERO)).unwrap();
    assert_eq!(
        server.metrics().broadcast_deliveries,
        1 + 2,
        "client 1 got A and B at once, not B only after A's fan-out"
    );
    poll_until(&mut server, "both everywhere", |s| {
        s.metrics().broadcast_deliveries == 2 * 10
    });
    for client in &mut clients {
        assert_eq!(next_text(client), "A");
        assert_eq!(next_text(client), "B");
    }
}

/// A producer thread broadcasting `lines` numbered lines as fast as the
/// queue takes them, with a pause after every `burst` of them.
fn produce(
    handle: wspush::Handle,
    lines: usize,
    burst: usize,
    size: usize,
) -> thread::JoinHandle<()> {
    produce_in_step(handle, lines, burst, size, None)
}

/// [`produce`], and with `read` given, each burst waits (instead of the
/// pause) until the reader counted in `read` has every line sent before
/// it: the reader is never more than one burst behind, however the threads
/// are scheduled.
fn produce_in_step(
    handle: wspush::Handle,
    lines: usize,
    burst: usize,
    size: usize,
    read: Option<Arc<AtomicUsize>>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        for i in 0..lines {
            if let (Some(read), 0) = (&read, i % burst) {
                while read.load(Ordering::Acquire) < i {
                    thread::sleep(Duration::from_micros(200));
                }
            }
            handle.broadcast_text(numbered(i, size)).unwrap();
            if read.is_none() && (i + 1) % burst == 0 {
                thread::sleep(Duration::from_millis(5));
            }
        }
    })
}

/// Line `i`: its number, padded with `x` to at least `size` bytes.
fn numbered(i: usize, size: usize) -> String {
    format!("{i:08}{}", "x".repeat(size.saturating_sub(8)))
}

fn number_of(text: &str) -> usize {
    text[..8].parse().unwrap()
}

#[test]
fn bursts_mixed_with_lone_lines_keep_their_order() {
    let server = TestServer::start(Config::default());
    let mut clients: Vec<_> = (0..10).map(|_| raw_upgraded(server.addr)).collect();
    server.wait_for("the upgrades", |m| m.upgrades == 10);
    // Bursts of 1, 2, 3 ... 40 lines with pauses between them.
    let handle = server.handle.clone();
    let producer = thread::spawn(move || {
        let mut i = 0;
        for burst in 1..=40 {
            for _ in 0..burst {
                handle.broadcast_text(numbered(i, 8)).unwrap();
                i += 1;
            }
            thread::sleep(Duration::from_millis(2));
        }
    });
    let total = (1..=40).sum::<usize>();
    for client in &mut clients {
        for i in 0..total {
            assert_eq!(number_of(&next_text(client)), i);
        }
    }
    producer.join().unwrap();
    let m = server.wait_for("every delivery", |m| {
        m.broadcast_deliveries == 10 * total as u64
    });
    assert_eq!(m.broadcasts, total as u64);
}

/// Reads a stalled client's frames after the fact: the numbers of the
/// lines it got, and the close code if a close frame ended them.
fn drain(stream: &mut TcpStream) -> (Vec<usize>, Option<u16>) {
    let mut got = Vec::new();
    loop {
        let Some(frame) = read_frame(stream) else {
            return (got, None);
        };
        match frame.opcode {
            0x1 => got.push(number_of(std::str::from_utf8(&frame.payload).unwrap())),
            0x8 => return (got, frame.close_code()),
            _ => {}
        }
    }
}

/// Lines a stalled client is sent in bursts: 10 MB, more than its socket
/// buffers hold (4 MiB at most by Linux's default `tcp_wmem`).
const STALLED_LINES: usize = 10_000;

/// A server with a 16 KiB queue limit and `policy`, a client that reads
/// nothing until the end and one that reads everything: bursts of 12
/// lines of 1,000 bytes (12 KiB, within the limit), each sent once the
/// reader has the one before, until the reader has every line. Returns the
/// server and the stalled client, unread.
fn stalled_under_bursts(policy: SlowConsumerPolicy) -> (TestServer, TcpStream) {
    // No history: what is tested is the queue bound alone.
    let server = TestServer::start(Config::default().with(|c| {
        c.max_queued_bytes = 16 * 1024;
        c.slow_consumer = policy;
        c.history_messages = 0;
    }));
    let stalled = util::stalling_client(server.addr);
    // The reader is never more than one burst (12 KiB) behind, so only the
    // stalled client goes over the queue limit.
    let mut reader = std::io::BufReader::with_capacity(64 * 1024, raw_upgraded(server.addr));
    server.wait_for("the upgrades", |m| m.upgrades == 2);
    let read = Arc::new(AtomicUsize::new(0));
    let producer = produce_in_step(
        server.handle.clone(),
        STALLED_LINES,
        12,
        1000,
        Some(read.clone()),
    );
    for i in 0..STALLED_LINES {
        let line = next_text(&mut reader);
        assert_eq!(number_of(&line), i, "the reader gets all");
        read.store(i + 1, Ordering::Release);
    }
    producer.join().unwrap();
    (server, stalled)
}

/// The slow-consumer policies, each with a client that reads nothing while
/// bursts go out (the reader gets every line either way): `drop` skips
/// lines for it, each one counted, and keeps it; `close` sends it a gapless
/// prefix, then closes it with 1008.
#[test]
fn a_stalled_client_under_bursts_is_dealt_with_by_the_policy() {
    for policy in [SlowConsumerPolicy::Drop, SlowConsumerPolicy::Close] {
        let (server, mut stalled) = stalled_under_bursts(policy);
        match policy {
            SlowConsumerPolicy::Drop => stalled_lines_are_dropped(&server, &mut stalled),
            SlowConsumerPolicy::Close => {
                let (got, code) = drain(&mut stalled);
                assert_eq!(code, Some(1008));
                assert!(got.len() < STALLED_LINES);
                assert!(
                    got.iter().enumerate().all(|(i, &n)| i == n),
                    "a prefix, in order"
                );
                // The client's side of the closing handshake.
                drop(stalled);
                server.wait_for("the close", |m| m.closed_slow_consumer == 1);
            }
        }
    }
}

/// Under `drop`: every line reached the stalled client or was counted as
/// dropped for it, in order, and it stays open.
fn stalled_lines_are_dropped(server: &TestServer, stalled: &mut TcpStream) {
    const LINES: usize = STALLED_LINES;
    let m = server.wait_for("every line offered to both", |m| {
        m.broadcast_deliveries + m.slow_consumer_drops == 2 * LINES as u64
    });
    let dropped = m.slow_consumer_drops as usize;
    assert!(
        dropped > 0,
        "10 MB do not fit in the stalled client's buffers"
    );
    assert!(
        m.broadcast_batches < m.broadcasts,
        "bursts were batched: {m:?}"
    );

    // Each line not counted as dropped arrives (however long a loaded
    // machine takes to write it), and nothing more.
    let got: Vec<usize> = (0..LINES - dropped)
        .map(|i| read_one(stalled).unwrap_or_else(|| panic!("line {i} of those not dropped")))
        .collect();
    stalled
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert_eq!(
        read_one(stalled),
        None,
        "nothing beyond what was not dropped"
    );
    assert!(got.windows(2).all(|w| w[0] < w[1]), "in order, once each");
    assert_eq!(server.handle.metrics().closed_slow_consumer, 0);
}

/// The next line number on a stream, or `None` once nothing more comes.
fn read_one(stream: &mut TcpStream) -> Option<usize> {
    let mut first = [0u8; 1];
    match stream.read(&mut first) {
        Ok(1) => {}
        _ => return None,
    }
    let mut rest = [0u8; 3];
    stream.read_exact(&mut rest).unwrap();
    assert_eq!(
        (first[0], rest[0]),
        (0x81, 126),
        "a text frame of 1000 bytes"
    );
    let len = u16::from_be_bytes([rest[1], rest[2]]) as usize;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).unwrap();
    Some(number_of(std::str::from_utf8(&payload).unwrap()))
}

#[test]
fn a_producer_faster_than_the_fan_out_waits_and_loses_nothing() {
    const LINES: usize = 20_000;
    const BOUND: usize = 32 * 1024;
    let mut server = Server::bind(Config::default().with(|c| {
        c.max_pending_bytes = BOUND;
    }))
    .unwrap();
    let addr = server.local_addr();
    let connecting: Vec<_> = (0..20)
        .map(|_| thread::spawn(move || raw_upgraded(addr)))
        .collect();
    poll_until(&mut server, "the upgrades", |s| s.metrics().upgrades == 20);
    let clients: Vec<_> = connecting.into_iter().map(|c| c.join().unwrap()).collect();

    // The loop stands still (this thread steps it): the producer fills the
    // queue to its bound and waits there.
    let producer = produce(server.handle(), LINES, LINES, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.metrics().broadcast_queue_bytes <= (BOUND / 2) as u64 {
        assert!(Instant::now() < deadline, "the queue never filled");
        thread::sleep(Duration::from_millis(1));
    }
    let readers: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            thread::spawn(move || {
                for i in 0..LINES {
                    assert_eq!(number_of(&next_text(&mut client)), i);
                }
            })
        })
        .collect();
    let mut highest = 0;
    poll_until(&mut server, "every delivery", |s| {
        let m = s.metrics();
        highest = highest.max(m.broadcast_queue_bytes);
        m.broadcast_deliveries == 20 * LINES as u64
    });
    producer.join().unwrap();
    for reader in readers {
        reader.join().unwrap();
    }
    let m = server.metrics();
    assert_eq!(m.broadcasts, LINES as u64);
    assert_eq!(m.slow_consumer_drops + m.frames_discarded, 0);
    assert!(highest as usize <= BOUND, "{highest} bytes pending");
    assert!(
        highest as usize > BOUND / 2,
        "the queue filled: {highest} bytes"
    );
}

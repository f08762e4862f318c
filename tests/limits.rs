//! Limits and misbehaving clients: `max_connections` answers 503 and
//! `max_connections_per_ip` 429; clients that never read cost at most
//! their queue limit. (Running out of file descriptors and a slowloris are
//! the binary's tests: they need a process of their own.)

mod util;

use std::io::Write;
use std::time::{Duration, Instant};

use util::{connect, raw, read_response, upgrade_request, TestServer, IO_TIMEOUT};
use wspush::Config;

#[test]
fn connections_past_the_limit_get_503_and_capacity_comes_back() {
    let server = TestServer::start(Config::default().with(|c| {
        c.max_connections = 2;
    }));
    let first = connect(server.addr, "/");
    let _second = connect(server.addr, "/");

    let mut third = raw(server.addr);
    third.write_all(upgrade_request("/").as_bytes()).unwrap();
    let response = read_response(&mut third);
    assert_eq!(response.status, 503);
    assert!(response.body.contains("connection limit"));
    assert_eq!(server.handle.metrics().rejected_503, 1);

    drop(first);
    server.wait_for("the first client to be gone", |m| {
        m.connections_open + m.connections_http == 1
    });
    let _again = connect(server.addr, "/");
}

/// A TCP connection to `addr` from the loopback address `source`.
fn connect_from(source: [u8; 4], addr: std::net::SocketAddr) -> std::net::TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&std::net::SocketAddr::from((source, 0)).into())
        .unwrap();
    socket.connect(&addr.into()).unwrap();
    let stream: std::net::TcpStream = socket.into();
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream
}

/// Sends an upgrade request on `stream` and returns the status.
fn upgrade(stream: &mut std::net::TcpStream) -> u16 {
    stream.write_all(upgrade_request("/").as_bytes()).unwrap();
    read_response(stream).status
}

#[test]
fn an_address_past_its_connection_limit_gets_429_and_others_do_not() {
    let server = TestServer::start(Config::default().with(|c| {
        c.max_connections_per_ip = Some(2);
    }));
    let mut first = connect_from([127, 0, 0, 1], server.addr);
    let mut second = connect_from([127, 0, 0, 1], server.addr);
    assert_eq!((upgrade(&mut first), upgrade(&mut second)), (101, 101));
    for _ in 0..20 {
        let mut flood = connect_from([127, 0, 0, 1], server.addr);
        let response = {
            flood.write_all(upgrade_request("/").as_bytes()).unwrap();
            read_response(&mut flood)
        };
        assert_eq!(response.status, 429);
        assert!(response.body.contains("too many connections"));
    }
    let mut other = connect_from([127, 0, 0, 2], server.addr);
    assert_eq!(upgrade(&mut other), 101, "another address is not limited");
    assert_eq!(server.handle.metrics().rejected_429, 20);

    drop(first);
    server.wait_for("the first one to close", |m| {
        m.connections_open + m.connections_http == 2
    });
    let mut again = connect_from([127, 0, 0, 1], server.addr);
    assert_eq!(upgrade(&mut again), 101, "a freed slot is available again");
}

/// Clients that stop reading during a stream of broadcasts cost at most
/// their queue limit each, counted in `queued_bytes`; with the drop
/// policy they stay connected and every skipped message is counted, while
/// a reading client gets everything.
#[test]
fn clients_that_never_read_hold_at_most_their_queue_limit() {
    const STALLED: usize = 20;
    const LIMIT: usize = 64 * 1024;
    const MESSAGES: usize = 400;
    const SIZE: usize = 16 * 1024;
    let server = TestServer::start(Config::default().with(|c| {
        c.max_queued_bytes = LIMIT;
        c.slow_consumer = wspush::SlowConsumerPolicy::Drop;
    }));
    let stalled: Vec<_> = (0..STALLED).map(|_| stalled_client(server.addr)).collect();
    let addr = server.addr;
    let reader = std::thread::spawn(move || {
        let mut client = connect(addr, "/");
        (0..MESSAGES)
            .map(|_| client.read().unwrap().into_data().len())
            .sum::<usize>()
    });
    server.wait_for("every client", |m| m.upgrades == STALLED as u64 + 1);

    let payload = "x".repeat(SIZE);
    let bound = (STALLED + 1) * (LIMIT + SIZE + 4);
    let mut peak = 0;
    for sent in 1..=MESSAGES as u64 {
        server.handle.broadcast_text(payload.clone()).unwrap();
        let queued = server
            .wait_for("the broadcast", |m| m.broadcasts == sent)
            .queued_bytes as usize;
        assert!(queued <= bound, "{queued} bytes queued, bound {bound}");
        peak = peak.max(queued);
    }
    assert_eq!(
        reader.join().unwrap(),
        MESSAGES * SIZE,
        "the reader got all"
    );
    // The reader is gone; the policy keeps every stalled client.
    let m = server.wait_for("only the stalled clients left", |m| {
        m.broadcasts == MESSAGES as u64 && m.connections_open == STALLED as u64
    });
    assert!(
        peak > STALLED * LIMIT / 2,
        "the stalled queues filled: {peak}"
    );
    assert!(
        m.slow_consumer_drops >= (STALLED * MESSAGES / 2) as u64,
        "most messages were dropped for the stalled clients: {m:?}"
    );
    drop(stalled);
    // The loop publishes byte counts at the end of an iteration, after the
    // closes of that iteration were counted: wait for both.
    server.wait_for(
        "the stalled clients to go and their queues to be freed",
        |m| m.connections_open == 0 && m.queued_bytes == 0,
    );
}

/// A shutdown that gives up on a client that never reads closes it and
/// uncounts its queue: once `run` returns, the metrics show nothing open
/// and nothing queued.
#[test]
fn a_shutdown_that_gives_up_on_a_stalled_client_uncounts_its_queue() {
    let mut server = wspush::Server::bind(Config::default().with(|c| {
        c.shutdown_timeout = Duration::from_millis(200);
        c.max_queued_bytes = 64 * 1024;
        c.slow_consumer = wspush::SlowConsumerPolicy::Drop;
    }))
    .unwrap();
    let addr = server.local_addr();
    let handle = server.handle();
    let running = std::thread::spawn(move || server.run());
    let _stalled = stalled_client(addr);
    // More than the kernel's buffers hold between the two ends.
    let payload = "x".repeat(16 * 1024);
    let deadline = Instant::now() + IO_TIMEOUT;
    while handle.metrics().queued_bytes == 0 {
        handle.broadcast_text(payload.clone()).unwrap();
        assert!(
            Instant::now() < deadline,
            "nothing queued: {:?}",
            handle.metrics()
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    handle.shutdown().unwrap();
    running.join().unwrap().unwrap();
    let m = handle.metrics();
    assert_eq!(
        (m.connections_open, m.closed_shutdown, m.queued_bytes),
        (0, 1, 0),
        "{m:?}"
    );
}

/// With `--slow-consumer close`, nothing meant for the stalled client goes
/// uncounted: the broadcast that overflowed its queue is a drop, and every
/// frame queued for it is either received whole or counted as discarded.
#[test]
fn a_slow_consumer_closed_has_every_frame_meant_for_it_accounted_for() {
    let server = TestServer::start(Config::default().with(|c| {
        c.max_queued_bytes = 64 * 1024;
        c.close_timeout = Duration::from_millis(200);
    }));
    let mut stalled = stalled_client(server.addr);
    let payload = "x".repeat(16 * 1024);
    let mut sent = 0;
    while server.handle.metrics().slow_consumer_drops == 0 {
        assert!(sent < 1000, "never over its queue limit");
        server.handle.broadcast_text(payload.clone()).unwrap();
        sent += 1;
        server.wait_for("the broadcast", |m| m.broadcasts == sent);
    }
    let m = server.wait_for("the close to time out", |m| m.connections_open == 0);
    assert_eq!((m.closed_slow_consumer, m.slow_consumer_drops), (1, 1));
    assert_eq!(m.broadcast_deliveries, sent - 1, "{m:?}");

    let mut received = Vec::new();
    std::io::Read::read_to_end(&mut stalled, &mut received).unwrap();
    let (broadcasts, closes) = whole_frames(&received);
    // The discards are counted as the loop publishes its tally, which may
    // come just after the gauge of open connections fell.
    let accounted = |m: &wspush::MetricsSnapshot| {
        broadcasts + closes + m.frames_discarded == m.broadcast_deliveries + 1
    };
    let what = format!(
        "every frame meant for it accounted for: {broadcasts} broadcasts and {closes} \
         close frames received whole"
    );
    server.wait_for(&what, accounted);
}

/// Whole text and close frames in a server's byte stream; a cut-off frame
/// at the end is not counted.
fn whole_frames(mut bytes: &[u8]) -> (u64, u64) {
    let (mut texts, mut closes) = (0, 0);
    while bytes.len() >= 2 {
        let (len, header) = match bytes[1] {
            126 if bytes.len() >= 4 => (u16::from_be_bytes([bytes[2], bytes[3]]) as usize, 4),
            127 if bytes.len() >= 10 => (
                u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
                10,
            ),
            126 | 127 => break,
            n => (n as usize, 2),
        };
        if bytes.len() < header + len {
            break;
        }
        match bytes[0] {
            0x81 => texts += 1,
            0x88 => closes += 1,
            other => panic!("unexpected frame {other:#x}"),
        }
        bytes = &bytes[header + len..];
    }
    (texts, closes)
}

/// A client whose receive buffer is small and which never reads after
/// its upgrade, so the server's output to it queues up.
fn stalled_client(addr: std::net::SocketAddr) -> std::net::TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&addr.into()).unwrap();
    let mut stream: std::net::TcpStream = socket.into();
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    assert_eq!(upgrade(&mut stream), 101);
    stream
}

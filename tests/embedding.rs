//! The library API: a server on port 0 driven one step at a time, or run on
//! its own thread and driven through a `Handle`.

mod util;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tungstenite::Message;
use util::{
    client_frame, connect, poll_until, raw, read_frame, read_response, upgrade_request, TestServer,
    IO_TIMEOUT,
};
use wspush::{
    BindError, BroadcastError, Config, Handle, MessageKind, MessageTooBig, Recipients, Server,
    ServerGone, SharedHistory,
};

#[test]
fn a_server_stepped_with_poll_once_upgrades_and_broadcasts() {
    let mut server = Server::bind(Config::default()).unwrap();
    let addr = server.local_addr();
    assert_ne!(addr.port(), 0, "port 0 resolves to a real port");

    let client = thread::spawn(move || {
        let mut client = connect(addr, "/ws?id=01");
        client.read().unwrap()
    });
    poll_until(&mut server, "the upgrade", |s| s.connections().count() == 1);
    let info = server.connections().next().unwrap();
    assert_eq!(
        (info.target, info.path(), info.query()),
        ("/ws?id=01", "/ws", Some("id=01"))
    );

    server
        .broadcast(MessageKind::Text, b"from the loop thread")
        .unwrap();
    poll_until(&mut server, "the client to read", |_| client.is_finished());
    assert_eq!(
        client.join().unwrap(),
        Message::text("from the loop thread")
    );
}

#[test]
fn a_handle_broadcasts_and_shuts_down_from_other_threads() {
    let mut server = Server::bind(Config::default()).unwrap();
    let addr = server.local_addr();
    let handle = server.handle();
    let loop_thread = thread::spawn(move || server.run());

    let mut client = connect(addr, "/");
    let upgraded = Instant::now();
    while handle.metrics().upgrades == 0 {
        assert!(upgraded.elapsed() < IO_TIMEOUT);
        thread::sleep(Duration::from_millis(2));
    }
    let other = handle.clone();
    thread::spawn(move || {
        other.broadcast_text("one").unwrap();
        other.broadcast_binary(vec![2u8]).unwrap();
        other.shutdown().unwrap();
    })
    .join()
    .unwrap();

    assert_eq!(client.read().unwrap(), Message::text("one"));
    assert_eq!(client.read().unwrap(), Message::binary(vec![2u8]));
    match client.read().unwrap() {
        Message::Close(Some(frame)) => assert_eq!(u16::from(frame.code), 1001),
        other => panic!("expected close 1001, got {other:?}"),
    }
    // tungstenite answers the close; the server then closes and `run` returns.
    while client.read().is_ok() {}
    drop(client);
    loop_thread.join().unwrap().unwrap();
    assert_eq!(handle.metrics().closed_shutdown, 1);
    assert_eq!(
        handle.broadcast_text("too late"),
        Err(BroadcastError::Gone(ServerGone))
    );
}

#[test]
fn bind_refuses_invalid_settings_and_taken_ports() {
    let bad = Config::default().with(|c| {
        c.max_connections = 0;
    });
    match Server::bind(bad).unwrap_err() {
        BindError::Config(e) => assert!(e.to_string().contains("max connections"), "{e}"),
        other => panic!("{other}"),
    }

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = Config::default().with(|c| {
        c.listen = taken.local_addr().unwrap();
    });
    match Server::bind(config).unwrap_err() {
        BindError::Io(e) => assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse),
        other => panic!("{other}"),
    }
}

#[test]
fn broadcasts_over_the_message_limit_are_refused_and_counted() {
    let mut server = Server::bind(Config::default().with(|c| {
        c.max_message_bytes = 4;
    }))
    .unwrap();
    let too_big = MessageTooBig { len: 5, limit: 4 };
    assert_eq!(server.broadcast(MessageKind::Text, b"12345"), Err(too_big));
    assert!(server.broadcast(MessageKind::Text, b"1234").is_ok());
    // A handle says so too, from any thread.
    let handle = server.handle();
    assert_eq!(
        handle.broadcast_binary(vec![0; 5]),
        Err(BroadcastError::TooBig(too_big))
    );
    assert_eq!(
        BroadcastError::TooBig(too_big).to_string(),
        "a broadcast of 5 bytes is over the 4-byte message limit"
    );
    let metrics = server.metrics();
    assert_eq!((metrics.broadcasts, metrics.broadcasts_rejected), (1, 2));
}

/// Upgrades two raw clients on a stepped server with `batch_delay`, then
/// has both send a ping at once and polls three times: the poll that finds
/// both pings, the one after it, and one more. Returns the batch waits
/// counted before each of the last two polls and after them.
fn batch_waits_around_two_pings(batch_delay: Duration) -> [u64; 3] {
    let mut server = Server::bind(Config::default().with(|c| {
        c.batch_delay = batch_delay;
    }))
    .unwrap();
    let addr = server.local_addr();
    let mut clients = [raw(addr), raw(addr)];
    for client in &mut clients {
        client.write_all(upgrade_request("/").as_bytes()).unwrap();
    }
    poll_until(&mut server, "both upgrades", |s| s.metrics().upgrades == 2);
    for client in &mut clients {
        assert_eq!(read_response(client).status, 101);
    }
    // Two polls that find nothing leave the loop idle.
    for _ in 0..2 {
        server.poll_once(Some(Duration::from_millis(1))).unwrap();
    }

    // A loopback write is in the server's socket when `write` returns.
    for client in &mut clients {
        client.write_all(&client_frame(0x89, b"now")).unwrap();
    }
    let mut waits = [0; 3];
    for count in &mut waits[..2] {
        *count = server.metrics().loop_batch_waits;
        server.poll_once(Some(Duration::from_millis(20))).unwrap();
    }
    waits[2] = server.metrics().loop_batch_waits;
    server.poll_once(Some(Duration::from_millis(1))).unwrap();
    assert_eq!(
        server.metrics().loop_batch_waits,
        waits[2],
        "a poll after one that found nothing does not wait"
    );
    for client in &mut clients {
        let pong = read_frame(client).expect("a pong");
        assert_eq!((pong.opcode, &pong.payload[..]), (0xA, &b"now"[..]));
    }
    waits
}

#[test]
fn a_poll_after_one_that_found_several_events_waits_the_batch_delay() {
    let [before_first, before_second, after] =
        batch_waits_around_two_pings(Duration::from_millis(2));
    assert_eq!(
        before_second, before_first,
        "the first poll was not put off"
    );
    assert_eq!(after, before_second + 1, "the poll after two events waited");
}

#[test]
fn a_zero_batch_delay_never_waits() {
    let [before_first, _, after] = batch_waits_around_two_pings(Duration::ZERO);
    assert_eq!(after, before_first);
}

/// A client that counts text messages until the server's close, and
/// answers the close; returns the count and the close code.
fn count_until_close(addr: std::net::SocketAddr) -> thread::JoinHandle<(u64, Option<u16>)> {
    thread::spawn(move || {
        let mut client = connect(addr, "/");
        let mut got = 0;
        loop {
            match client.read() {
                Ok(Message::Text(_)) => got += 1,
                Ok(Message::Close(frame)) => {
                    while client.read().is_ok() {}
                    return (got, frame.map(|f| u16::from(f.code)));
                }
                Ok(other) => panic!("unexpected {other:?}"),
                Err(_) => return (got, None),
            }
        }
    })
}

/// A producer far ahead of the loop: it broadcasts `total` messages and
/// counts those the queue took; the loop is not polled meanwhile, so it
/// blocks once the queue holds `max_pending_bytes`. Returns when it waits
/// for room (nothing gives room back while the loop stands still).
fn fill_the_queue(handle: &Handle, total: u64) -> (thread::JoinHandle<()>, Arc<AtomicU64>) {
    let sent = Arc::new(AtomicU64::new(0));
    let producer = {
        let (handle, sent) = (handle.clone(), Arc::clone(&sent));
        thread::spawn(move || {
            for _ in 0..total {
                if handle.broadcast_text("m").is_err() {
                    return;
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let waiting = Instant::now();
    while handle.metrics().broadcast_producers_waiting == 0 {
        assert!(waiting.elapsed() < IO_TIMEOUT, "the producer never waited");
        assert!(!producer.is_finished(), "the queue took all {total}");
        thread::yield_now();
    }
    (producer, sent)
}

/// Calls `shutdown` on another thread and fails unless it returns at once.
fn shut_down_without_blocking(handle: &Handle) {
    let (done, returned) = std::sync::mpsc::channel();
    let handle = handle.clone();
    thread::spawn(move || done.send(handle.shutdown()));
    assert_eq!(
        returned.recv_timeout(IO_TIMEOUT),
        Ok(Ok(())),
        "shutdown blocked behind the full queue"
    );
}

#[test]
fn a_shutdown_behind_a_full_queue_returns_at_once_and_sends_what_came_before_it() {
    const TOTAL: u64 = 6000;
    let mut server = Server::bind(Config::default().with(|c| {
        // About 1,000 one-byte messages.
        c.max_pending_bytes = 64 * 1024;
    }))
    .unwrap();
    let handle = server.handle();
    let client = count_until_close(server.local_addr());
    poll_until(&mut server, "the upgrade", |s| s.connections().count() == 1);
    let (producer, sent) = fill_the_queue(&handle, TOTAL);
    let before = sent.load(Ordering::SeqCst);
    assert!(before < TOTAL, "the queue took everything");

    shut_down_without_blocking(&handle);
    poll_until(&mut server, "the shutdown", |s| s.is_finished());
    // The producer's send that was waiting for room began before the
    // shutdown, so its message goes out too.
    let before = before + 1;
    assert_eq!(client.join().unwrap(), (before, Some(1001)));
    // The producer may be waiting for room again: the server's drop
    // refuses it that and what it still had to send.
    drop(server);
    producer.join().unwrap();
    let m = handle.metrics();
    assert_eq!(m.broadcasts, before, "{m:?}");
    assert_eq!(
        m.broadcasts + m.broadcasts_abandoned,
        sent.load(Ordering::SeqCst),
        "every queued broadcast was sent or counted as abandoned: {m:?}"
    );
    assert_eq!(handle.shutdown(), Err(ServerGone));
}

#[test]
fn a_shutdown_gives_queued_broadcasts_half_its_timeout_then_abandons_the_rest() {
    const TIMEOUT: Duration = Duration::from_millis(100);
    let mut server = Server::bind(Config::default().with(|c| {
        c.shutdown_timeout = TIMEOUT;
        c.max_pending_bytes = 64 * 1024;
    }))
    .unwrap();
    let handle = server.handle();
    let client = count_until_close(server.local_addr());
    poll_until(&mut server, "the upgrade", |s| s.connections().count() == 1);
    let (producer, sent) = fill_the_queue(&handle, u64::MAX);

    shut_down_without_blocking(&handle);
    // The first iteration frames what is queued; given room, the producer
    // queues more (the send it was waiting in counted before the shutdown).
    poll_until(&mut server, "the first batch", |s| {
        s.metrics().broadcasts > 0
    });
    let waiting = Instant::now();
    while handle.metrics().broadcast_queue_bytes == 0 {
        assert!(
            waiting.elapsed() < IO_TIMEOUT,
            "the producer queued no more"
        );
        thread::yield_now();
    }
    // Past half the timeout, what is still queued is abandoned, not sent.
    thread::sleep(TIMEOUT);
    poll_until(&mut server, "the shutdown", |s| s.is_finished());
    drop(server);
    producer.join().unwrap();
    let m = handle.metrics();
    let (got, _) = client.join().unwrap();
    assert!(m.broadcasts > 0 && m.broadcasts_abandoned > 0, "{m:?}");
    assert_eq!(got, m.broadcasts, "the client got what was sent");
    assert_eq!(
        m.broadcasts + m.broadcasts_abandoned,
        sent.load(Ordering::SeqCst),
        "every queued broadcast was sent or counted as abandoned"
    );
}

#[test]
fn servers_read_a_shared_history_through_duplicates_of_its_descriptor() {
    let mut history = SharedHistory::create(&Config::default()).unwrap();
    for (seq, text) in [(1, "one"), (2, "two")] {
        history.append(seq, &Recipients::All, MessageKind::Text, text.as_bytes());
    }
    let epoch = history.epoch();
    let fd = Arc::new(history.reader_fd().unwrap());
    // Two servers, one after the other, from the same descriptor: each
    // reads a duplicate, so the first's end leaves the second its own.
    for _ in 0..2 {
        let server = TestServer::start(Config::default().with(|c| {
            c.history_fd = Some(Arc::clone(&fd));
            c.first_position = 3;
        }));
        let mut client = util::connect(server.addr, &format!("/?since={epoch}.1"));
        let got = util::texts(&mut client, 2);
        assert!(got[0].contains(r#""status":"recovered""#), "{got:?}");
        assert_eq!(got[1], format!("{epoch}.2 two"));
    }
}

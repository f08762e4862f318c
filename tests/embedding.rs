//! The library API: a server on port 0 driven one step at a time, or run on
//! its own thread and driven through a `Handle`.

mod util;

use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

use tungstenite::Message;
use util::{client_frame, connect, raw, read_frame, read_response, upgrade_request, IO_TIMEOUT};
use wspush::{Config, MessageKind, Server, ServerGone};

/// Polls the server until `done` holds.
fn poll_until(server: &mut Server, what: &str, mut done: impl FnMut(&Server) -> bool) {
    let deadline = Instant::now() + IO_TIMEOUT;
    while !done(server) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        server.poll_once(Some(Duration::from_millis(10))).unwrap();
    }
}

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
    assert_eq!(handle.broadcast_text("too late"), Err(ServerGone));
}

#[test]
fn bind_refuses_invalid_settings_and_taken_ports() {
    let bad = Config {
        max_connections: 0,
        ..Config::default()
    };
    assert_eq!(
        Server::bind(bad).unwrap_err().kind(),
        std::io::ErrorKind::InvalidInput
    );

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = Config {
        listen: taken.local_addr().unwrap(),
        ..Config::default()
    };
    assert_eq!(
        Server::bind(config).unwrap_err().kind(),
        std::io::ErrorKind::AddrInUse
    );
}

#[test]
fn broadcasts_over_the_message_limit_are_refused_and_counted() {
    let mut server = Server::bind(Config {
        max_message_bytes: 4,
        ..Config::default()
    })
    .unwrap();
    assert!(server.broadcast(MessageKind::Text, b"12345").is_err());
    assert!(server.broadcast(MessageKind::Text, b"1234").is_ok());
    let metrics = server.metrics();
    assert_eq!((metrics.broadcasts, metrics.broadcasts_rejected), (1, 1));
}

/// Upgrades two raw clients on a stepped server with `batch_delay`, then
/// has both send a ping at once and polls three times: the poll that finds
/// both pings, the one after it, and one more. Returns the batch waits
/// counted before each of the last two polls and after them.
fn batch_waits_around_two_pings(batch_delay: Duration) -> [u64; 3] {
    let mut server = Server::bind(Config {
        batch_delay,
        ..Config::default()
    })
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

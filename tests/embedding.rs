//! The library API: a server on port 0 driven one step at a time, or run on
//! its own thread and driven through a `Handle`.

mod util;

use std::thread;
use std::time::{Duration, Instant};

use tungstenite::Message;
use util::{connect, IO_TIMEOUT};
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

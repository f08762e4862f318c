//! Broadcast delivery: exactly once, in order, to every connection, and
//! nothing a client sends reaches the others. (A client that stops
//! reading: the slow-consumer test in `streams.rs`.)

mod util;

use tungstenite::Message;
use util::{connect, need_open_files, TestServer};
use wspush::Config;

fn text(client: &mut util::Client) -> String {
    loop {
        match client.read().expect("read a broadcast") {
            Message::Text(text) => return text.as_str().to_owned(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn a_thousand_clients_get_a_burst_of_two_thousand_lines_exactly_once_in_order() {
    const CLIENTS: usize = 1000;
    const MESSAGES: usize = 2000;
    // Both ends of every connection, and the rest.
    need_open_files(2 * CLIENTS as u64 + 64);
    let server = TestServer::start(Config::default());
    let mut clients: Vec<_> = (0..CLIENTS)
        .map(|i| connect(server.addr, &format!("/ws?id={i}")))
        .collect();
    server.wait_for("every upgrade", |m| m.upgrades == CLIENTS as u64);

    for seq in 1..=MESSAGES {
        server.handle.broadcast_text(seq.to_string()).unwrap();
    }
    for (i, client) in clients.iter_mut().enumerate() {
        for seq in 1..=MESSAGES {
            assert_eq!(text(client), seq.to_string(), "client {i}");
        }
    }
    // Nothing more was sent to anyone: a marker is the very next message.
    server.handle.broadcast_text("end").unwrap();
    for client in &mut clients {
        assert_eq!(text(client), "end");
    }
    // Counters are added once a fan-out loop completes, just after the
    // last write, so wait for them rather than race them.
    let deliveries = (CLIENTS * (MESSAGES + 1)) as u64;
    let metrics = server.wait_for("every delivery counted", |m| {
        m.broadcast_deliveries >= deliveries
    });
    assert_eq!(metrics.broadcasts, MESSAGES as u64 + 1);
    assert_eq!(metrics.broadcast_deliveries, deliveries);
    assert_eq!(
        metrics.slow_consumer_drops + metrics.closed_slow_consumer,
        0
    );
}

/// Only standard input (or the embedding program) publishes: what a client
/// sends is counted and dropped, never relayed to anyone.
#[test]
fn nothing_a_client_sends_reaches_the_others() {
    let server = TestServer::start(Config::default());
    let mut sender = connect(server.addr, "/");
    let mut listener = connect(server.addr, "/");
    for message in [
        Message::text("publish me"),
        Message::binary(b"and me".to_vec()),
    ] {
        sender.send(message).unwrap();
    }
    server.wait_for("both messages", |m| m.messages_received == 2);
    server.handle.broadcast_text("from the server").unwrap();
    for client in [&mut listener, &mut sender] {
        assert_eq!(text(client), "from the server", "nothing else came first");
    }
    let m = server.handle.metrics();
    assert_eq!((m.broadcasts, m.messages_echoed), (1, 0));
}

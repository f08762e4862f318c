//! Broadcast delivery: exactly once, in order, to every connection, and a
//! client that stops reading never holds the others back.

mod util;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use tungstenite::Message;
use util::{connect, need_open_files, read_frame, stalling_client, TestServer};
use wspush::{Config, SlowConsumerPolicy};

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

/// The payload of broadcast `seq`: its number, padded to `size` bytes.
fn numbered(seq: usize, size: usize) -> String {
    format!("{seq:08}{}", "x".repeat(size - 8))
}

fn seq_of(payload: &[u8]) -> usize {
    std::str::from_utf8(&payload[..8]).unwrap().parse().unwrap()
}

#[test]
fn a_client_that_never_reads_is_closed_and_the_others_get_everything() {
    const READERS: usize = 8;
    const MESSAGES: usize = 200;
    const SIZE: usize = 64 * 1024;
    /// Readers may fall this many messages behind the broadcaster (well
    /// under the queue limit), so only the stalled client can overflow.
    const WINDOW: usize = 8;
    let server = TestServer::start(Config {
        max_queued_bytes: 1 << 20,
        slow_consumer: SlowConsumerPolicy::Close,
        close_timeout: std::time::Duration::from_secs(60),
        ..Config::default()
    });
    let mut stalled = stalling_client(server.addr);
    let progress: Arc<Vec<AtomicUsize>> =
        Arc::new((0..READERS).map(|_| AtomicUsize::new(0)).collect());
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let mut client = connect(server.addr, "/");
            let progress = Arc::clone(&progress);
            thread::spawn(move || {
                (0..MESSAGES)
                    .map(|_| {
                        let seq = seq_of(text(&mut client).as_bytes());
                        progress[r].fetch_add(1, Ordering::Relaxed);
                        seq
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    server.wait_for("every upgrade", |m| m.upgrades == READERS as u64 + 1);

    for seq in 0..MESSAGES {
        server.handle.broadcast_text(numbered(seq, SIZE)).unwrap();
        let deadline = Instant::now() + util::IO_TIMEOUT;
        while progress
            .iter()
            .any(|p| p.load(Ordering::Relaxed) + WINDOW < seq + 1)
        {
            assert!(
                Instant::now() < deadline,
                "readers stopped making progress at message {seq}"
            );
            thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    for reader in readers {
        assert_eq!(
            reader.join().unwrap(),
            (0..MESSAGES).collect::<Vec<_>>(),
            "a reading client missed messages"
        );
    }

    // What reaches the stalled client once it reads: a gapless prefix of
    // whole frames, then close 1008.
    let mut expected = 0;
    let code = loop {
        let frame = read_frame(&mut stalled).expect("close frame before EOF");
        if frame.opcode == 0x8 {
            break frame.close_code();
        }
        assert_eq!(
            seq_of(&frame.payload),
            expected,
            "frames stay whole and in order"
        );
        expected += 1;
    };
    assert_eq!(code, Some(1008));
    assert!(
        expected < MESSAGES,
        "the stalled client cannot have taken all {MESSAGES} messages"
    );
    stalled
        .write_all(&util::client_frame(util::CLOSE, &1008u16.to_be_bytes()))
        .unwrap();
    util::expect_eof(&mut stalled);
    drop(stalled); // The server waits for our FIN before counting the close.
    server.wait_for("the slow consumer to be counted", |m| {
        m.closed_slow_consumer == 1
    });
}

#[test]
fn the_drop_policy_skips_messages_for_a_slow_client_and_counts_each_one() {
    const MESSAGES: usize = 100;
    const SIZE: usize = 128 * 1024;
    let server = TestServer::start(Config {
        max_queued_bytes: 64 * 1024,
        slow_consumer: SlowConsumerPolicy::Drop,
        ..Config::default()
    });
    let mut slow = stalling_client(server.addr);
    server.wait_for("the upgrade", |m| m.upgrades == 1);
    for seq in 0..MESSAGES {
        server.handle.broadcast_text(numbered(seq, SIZE)).unwrap();
    }
    // A broadcast is counted as it starts, its deliveries and drops once
    // its fan-out is done: wait for those of the last one.
    server.wait_for("every broadcast", |m| m.broadcasts == MESSAGES as u64);
    let metrics = server.wait_for("every fan-out", |m| {
        m.broadcast_deliveries + m.slow_consumer_drops >= MESSAGES as u64
    });
    let dropped = metrics.slow_consumer_drops as usize;
    assert!(
        dropped > 0,
        "a 64 KiB receive buffer cannot hold 12.5 MiB: some messages must be dropped"
    );
    assert_eq!(
        metrics.broadcast_deliveries as usize + dropped,
        MESSAGES,
        "each message delivered or counted as dropped"
    );

    let received: Vec<usize> = (0..MESSAGES - dropped)
        .map(|_| seq_of(&read_frame(&mut slow).unwrap().payload))
        .collect();
    assert!(
        received.windows(2).all(|w| w[0] < w[1]),
        "in order, no duplicates: {received:?}"
    );
    assert_eq!(
        server.handle.metrics().closed_slow_consumer,
        0,
        "the drop policy keeps the connection"
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

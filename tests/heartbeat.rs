//! Heartbeats: every open connection is pinged once per interval, a client
//! that answers stays, and one that sends nothing is closed with 1001.

mod util;

use std::time::{Duration, Instant};

use tungstenite::Message;
use util::{connect, raw_upgraded, read_frame, TestServer};
use wspush::Config;

const PING: u8 = 0x9;
const CLOSE: u8 = 0x8;

fn heartbeat_server(ping_ms: u64, idle_ms: u64) -> TestServer {
    TestServer::start(Config::default().with(|c| {
        c.ping_interval = Duration::from_millis(ping_ms);
        c.idle_timeout = Duration::from_millis(idle_ms);
        c.close_timeout = Duration::from_millis(200);
    }))
}

#[test]
fn a_client_that_answers_pings_is_pinged_every_interval_and_stays() {
    let server = heartbeat_server(100, 300);
    let mut client = connect(server.addr, "/");
    let started = Instant::now();
    let mut pings = 0;
    // tungstenite answers each ping with a pong on its next read.
    while started.elapsed() < Duration::from_millis(1500) {
        match client.read().unwrap() {
            Message::Ping(payload) => {
                assert!(payload.is_empty());
                pings += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // 15 intervals; the first ping comes one to two intervals in.
    assert!((10..=16).contains(&pings), "{pings} pings in 1.5 s");
    // (The counter may trail the last ping's arrival by a moment.)
    let m = server.wait_for("the pings counted", |m| m.pings_sent >= pings);
    assert_eq!((m.connections_open, m.closed_idle_timeout), (1, 0));
}

#[test]
fn a_silent_client_is_pinged_then_closed_with_1001_after_the_idle_timeout() {
    let server = heartbeat_server(100, 300);
    // Before the request is sent: the server's idle time starts later, so
    // however long this thread waits for the 101, it is a lower bound.
    let upgraded = Instant::now();
    let mut silent = raw_upgraded(server.addr);
    let mut pings = 0;
    let close = loop {
        let frame = read_frame(&mut silent).expect("a frame before EOF");
        match frame.opcode {
            PING => pings += 1,
            CLOSE => break frame,
            other => panic!("unexpected opcode {other}"),
        }
    };
    let silent_for = upgraded.elapsed();
    assert_eq!(close.close_code(), Some(1001));
    assert_eq!(&close.payload[2..], b"idle timeout");
    assert!(pings >= 2, "pinged before being given up: {pings}");
    assert!(
        silent_for >= Duration::from_millis(300),
        "closed after {silent_for:?}, before the idle timeout"
    );
    // The client never answers the close either: dropped at the close timeout.
    server.wait_for("the idle close", |m| m.closed_idle_timeout == 1);
    assert_eq!(server.handle.metrics().connections_open, 0);
}

#[test]
fn any_client_traffic_counts_as_alive() {
    let server = heartbeat_server(100, 200);
    let mut talker = connect(server.addr, "/");
    let mut silent = raw_upgraded(server.addr);
    // The talker sends a message every 50 ms and never reads (so it never
    // answers a ping): its data alone keeps it open.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(800) {
        talker.send(Message::text("still here")).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    loop {
        let frame = read_frame(&mut silent).expect("a frame");
        if frame.opcode == CLOSE {
            assert_eq!(frame.close_code(), Some(1001));
            break;
        }
    }
    let m = server.wait_for("the silent one to go", |m| m.closed_idle_timeout == 1);
    assert_eq!(m.connections_open, 1, "the talker is still open: {m:?}");
    drop(silent);
}

//! Receipts workers (the `channels` clients) under the one coordinator:
//! every message each connection receives comes back with its connection.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use wspush_bench::client::receipts::{spread, Event, Paths};
use wspush_bench::fleet::coordinator::{Fleet, Launch};
use wspush_bench::fleet::protocol::{Plan, ReceiptsPlan};
use wspush_bench::observe::sys;
use wspush_bench::target::{self, floor};
use wspush_bench::wire::message::{self, Padding};

/// The receipts (connection, sequence number) of 25 connections with
/// `paths`, by three workers, of two lines sent through a floor with
/// `options`, sorted; `expected` of them, waited for.
fn floor_receipts(options: floor::FloorOptions, paths: Paths, expected: usize) -> Vec<(u64, u32)> {
    let listener = floor::bind((Ipv4Addr::LOCALHOST, 0).into(), false).unwrap();
    let server: SocketAddr = listener.local_addr().unwrap();
    let (mut feed, input) = UnixStream::pair().unwrap();
    // The floor runs until the test process ends.
    thread::spawn(move || floor::serve_with(listener, input, options));
    let plan = Plan {
        servers: vec![server],
        sources: vec![Ipv4Addr::LOCALHOST],
        first_id: 0,
        payload_bytes: 32,
        padding: Padding::Dots,
        deflate: false,
        transports: Default::default(),
        channel: None,
        positions: false,
        mixed: false,
        token: None,
        connect_timeout_ms: 10_000,
        receipts: Some(ReceiptsPlan {
            paths,
            count: 25,
            rate: 10_000.0,
            max_in_flight: 8,
        }),
    };
    // Three workers: 9, 8 and 8 connections.
    let mut fleet = Fleet::launch(&Launch::Threads, &plan, &[9, 8, 8]).unwrap();
    let setup = fleet
        .wait_ready(Duration::from_secs(20), || Ok(()), "test")
        .unwrap();
    assert_eq!((setup.open, setup.failed.len()), (25, 0), "{setup:?}");
    for seq in [1, 2] {
        let stamp = message::Stamp {
            seq,
            sent_ns: sys::now_ns(),
        };
        target::write_line(&mut feed, &message::encode(stamp, 32).unwrap()).unwrap();
        feed.flush().unwrap();
    }
    let mut got: Vec<(u64, u32)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < expected && Instant::now() < deadline {
        match fleet.next_event(Duration::from_millis(100)).unwrap() {
            Some(Event::Got(receipts)) => {
                for (conn, seq, sent, recv) in receipts {
                    assert!(recv >= sent);
                    got.push((conn, seq));
                }
            }
            Some(other) => panic!("{other:?}"),
            None => {}
        }
    }
    // Anything more would be there by now, behind the lines awaited.
    let after = fleet.next_event(Duration::from_millis(200)).unwrap();
    assert!(after.is_none(), "after the lines: {after:?}");
    got.sort_unstable();
    got
}

#[test]
fn workers_report_every_receipt_with_its_connection() {
    let got = floor_receipts(Default::default(), Paths::IdChannel { channels: 3 }, 50);
    let expected: Vec<(u64, u32)> = (0..25).flat_map(|c| [(c, 1), (c, 2)]).collect();
    assert_eq!(got, expected);
}

#[test]
fn a_floor_with_a_channel_writes_only_to_the_connections_that_named_it() {
    let options = floor::FloorOptions {
        channel: Some("hot".into()),
        ..Default::default()
    };
    let paths = Paths::Hot {
        subscribers: 5,
        total: 25,
    };
    let got = floor_receipts(options, paths, 10);
    let expected: Vec<(u64, u32)> = (0..25)
        .filter(|&c| spread(c, 5, 25))
        .flat_map(|c| [(c, 1), (c, 2)])
        .collect();
    assert_eq!(got, expected);
}

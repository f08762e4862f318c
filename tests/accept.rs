//! Accepting in batches: connections that stream in are accepted a few at
//! a time (at most every 5 ms), and none is left waiting in the backlog.

mod util;

use std::io::Write;
use std::thread;
use std::time::Duration;

use util::{raw, read_response, upgrade_request, TestServer};
use wspush::Config;

#[test]
fn connections_that_stream_in_are_accepted_in_batches_and_none_is_left_waiting() {
    const CLIENTS: usize = 100;
    let server = TestServer::start(Config::default());
    // One every half millisecond for 50 ms, each with its request: far
    // more often than one per 5 ms, so arrivals wait for the next batch.
    // The last ones come with no arrival after them: only the batch's own
    // deadline accepts them.
    let mut clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let mut stream = raw(server.addr);
            stream
                .write_all(upgrade_request("/").as_bytes())
                .expect("request sent");
            thread::sleep(Duration::from_micros(500));
            stream
        })
        .collect();
    for stream in &mut clients {
        assert_eq!(read_response(stream).status, 101);
    }
    let m = server.wait_for("every connection open", |m| {
        m.connections_open == CLIENTS as u64
    });
    assert_eq!(m.upgrades, CLIENTS as u64);
    assert!(
        m.accept_batches_deferred >= 1,
        "no arrival waited for a batch: {m:?}"
    );
}

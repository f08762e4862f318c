//! The stream mode against wspush embedded in the test process: a burst
//! written at once and a feed at a steady rate reach every connection
//! exactly once, in order, and the feed search reports its steps.

mod common;

use common::measure_embedded;

#[test]
fn a_burst_and_a_feed_reach_every_connection_once() {
    let (server, report) = measure_embedded(&[
        "--conns",
        "300",
        "--per-worker",
        "150",
        "--messages",
        "2",
        "--payload-bytes",
        "64",
        "--burst",
        "200",
        "--feed-rate",
        "400",
        "--feed-secs",
        "1",
        "--probe-ms",
        "20",
    ]);

    assert_eq!(report.streams.len(), 2);
    let (burst, feed) = (&report.streams[0], &report.streams[1]);
    assert_eq!(
        (burst.kind.as_str(), burst.lines, burst.rate),
        ("burst", 200, None)
    );
    assert_eq!(
        (feed.kind.as_str(), feed.lines, feed.rate),
        ("feed", 400, Some(400.0))
    );
    for stream in &report.streams {
        assert!(stream.complete, "{}", stream.render());
        assert_eq!(stream.connections, 300);
        assert_eq!(stream.received, stream.expected);
        assert_eq!(stream.latency.count, stream.expected);
        assert!(stream.completion_secs > 0.0 && stream.deliveries_per_sec > 0.0);
    }
    assert!(
        feed.completion_secs >= 0.99,
        "paced over a second: {}",
        feed.render()
    );
    for stream in &report.streams {
        let probes = stream.probes.as_ref().expect("probed");
        assert!(
            probes.upgrade.count >= 1 && probes.ping.count >= 1,
            "{}",
            stream.render()
        );
    }
    let probes = feed.probes.as_ref().unwrap();
    assert!(
        probes.ping.count >= 10,
        "a sample every 20 ms for a second: {}",
        feed.render()
    );
    // Streams are counted apart from the messages sent one at a time ...
    assert_eq!(report.latency.count, 2 * 300);
    // ... and checked with them: every message once, in order.
    let d = &report.delivery;
    assert_eq!(
        (d.lost, d.duplicates, d.out_of_order, d.corrupt),
        (0, 0, 0, 0)
    );
    let m = server.metrics();
    assert_eq!(m.broadcasts, 2 + 200 + 400);
    assert!(
        m.upgrades > 300,
        "the upgrade probe's connections too: {m:?}"
    );
    assert!(
        m.broadcast_batches < m.broadcasts,
        "the burst was batched: {m:?}"
    );
    assert!(report
        .render_text()
        .contains("stream       burst: 200 lines of 64 B"));
}

#[test]
fn the_feed_search_halves_the_rate_while_none_holds() {
    // A p99 limit of 1 ns: no rate holds, so the search halves from 64/s
    // down to a line a second and ends with nothing found.
    let (_server, report) = measure_embedded(&[
        "--conns",
        "20",
        "--messages",
        "1",
        "--find-max-feed-rate",
        "--feed-rate",
        "64",
        "--feed-search-secs",
        "1",
        "--feed-max-p99-ms",
        "0.000001",
    ]);
    let rates: Vec<f64> = report.feed_search.iter().map(|s| s.rate.unwrap()).collect();
    assert_eq!(rates, [64.0, 32.0, 16.0, 8.0, 4.0, 2.0, 1.0], "down to 1/s");
    assert_eq!(report.max_feed_rate, None);
    assert!(report.streams.is_empty(), "nothing held, nothing to hold");
    assert_eq!(report.delivery.lost, 0);
}

#[test]
fn a_reconnect_storm_during_a_feed_loses_nothing_with_positions() {
    let (server, report) = measure_embedded(&[
        "--conns",
        "300",
        "--per-worker",
        "150",
        "--messages",
        "1",
        "--payload-bytes",
        "64",
        "--positions",
        "--feed-rate",
        "200",
        "--feed-secs",
        "2",
        "--storm-at-secs",
        "0.5",
        "--storm-within-ms",
        "500",
    ]);
    let feed = &report.streams[0];
    assert!(feed.complete, "{}", feed.render());
    assert_eq!(feed.received, feed.expected, "{}", feed.render());
    let d = &report.delivery;
    assert_eq!(
        (d.lost, d.duplicates, d.out_of_order, d.corrupt),
        (0, 0, 0, 0)
    );
    let told = &report.connections.statuses;
    assert_eq!(told.get("position"), Some(&300), "{told:?}");
    assert_eq!(
        told.get("recovered"),
        Some(&300),
        "every connection resumed: {told:?}"
    );
    let m = server.metrics();
    assert_eq!(
        (m.resumes_recovered, m.resumes_gap, m.resumes_unknown),
        (300, 0, 0)
    );
    assert_eq!(m.upgrades, 600);
}

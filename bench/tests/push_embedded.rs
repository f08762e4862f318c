//! The bench's own client against wspush embedded in the test process:
//! 2,000 connections over four source addresses, every broadcast delivered
//! exactly once and in order; once with thread workers, once with worker
//! processes talking over pipes; and event streams beside WebSockets.

mod common;

use common::{info, measure_embedded, push_options, Embedded};
use wspush_bench::fleet::coordinator::Launch;
use wspush_bench::scenario::push;

#[test]
fn two_thousand_connections_over_four_sources_get_every_broadcast_once() {
    let (server, report) = measure_embedded(&[
        "--conns",
        "2000",
        "--sources",
        "4",
        "--per-worker",
        "1000",
        "--messages",
        "5",
    ]);

    let c = &report.connections;
    assert_eq!((c.open, c.failed), (2000, 0), "{:?}", c.failures);
    assert_eq!((c.workers, c.sources), (2, 4));
    let seen: Vec<String> = server.sources_seen.borrow().iter().cloned().collect();
    assert_eq!(seen, ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]);
    assert_eq!(server.metrics().upgrades, 2000);

    let b = &report.broadcast;
    assert_eq!((b.messages, b.complete), (5, 5));
    assert!(b.per_message.iter().all(|m| m.received == 2000));
    let d = &report.delivery;
    assert_eq!(
        (d.lost, d.duplicates, d.out_of_order, d.corrupt),
        (0, 0, 0, 0)
    );
    assert_eq!(report.latency.count, 5 * 2000);
    assert!(report.latency.min_us > 0.0 && report.latency.p50_us <= report.latency.max_us);
    assert!(report.connections.ramp.last().unwrap().1 == 2000);
    assert!(report.render_text().contains("2,000 of 2,000 open"));
}

#[test]
fn worker_processes_report_through_pipes() {
    let mut server = Embedded::start(false);
    let addr = server.addr;
    let options = push_options(&[
        "--conns",
        "600",
        "--sources",
        "2",
        "--per-worker",
        "200",
        "--messages",
        "3",
    ]);
    let launch = Launch::Processes {
        exe: env!("CARGO_BIN_EXE_wspush-bench").into(),
    };
    let report = push::measure(&mut server, addr, &options, &launch, info("wspush")).unwrap();
    assert_eq!(report.connections.open, 600);
    assert_eq!(report.connections.workers, 3);
    assert_eq!(report.latency.count, 3 * 600);
    assert_eq!(report.delivery.lost, 0);
    let client = report.memory.client.expect("worker processes are measured");
    assert!(client.rss_bytes > 0 && client.pss_bytes > 0);
}

#[test]
fn a_setup_cut_short_leaves_idle_workers_that_do_not_hold_up_broadcasts() {
    // 150 connections a second for at most 1 s, filled one worker at a
    // time: the first of three workers gets them all.
    let (_server, report) = measure_embedded(&[
        "--conns",
        "600",
        "--per-worker",
        "200",
        "--active-workers",
        "1",
        "--rate",
        "150",
        "--setup-timeout",
        "1",
        "--messages",
        "3",
        "--message-timeout",
        "20",
    ]);
    // Some opened (fewer on a loaded machine), all in the first worker.
    let open = report.connections.open;
    assert!((1..=200).contains(&open), "{open}");
    assert_eq!(report.broadcast.complete, 3);
    assert_eq!(report.delivery.lost, 0);
    // Had the idle workers been waited for, each message would have taken
    // its whole timeout: 60 s for the three. Done, they take well under
    // a second (the bound leaves room for a machine busy with other work).
    assert!(
        report.cpu.broadcast_wall_secs < 20.0,
        "{}",
        report.cpu.broadcast_wall_secs
    );
}

#[test]
fn event_streams_and_websockets_mixed_get_every_broadcast_once() {
    let (server, report) = measure_embedded(&[
        "--conns",
        "400",
        "--transport",
        "mixed",
        "--messages",
        "4",
        "--burst",
        "50",
    ]);
    assert_eq!(report.connections.open, 400);
    assert_eq!(report.broadcast.complete, 4);
    let d = &report.delivery;
    assert_eq!(
        (d.lost, d.duplicates, d.out_of_order, d.corrupt),
        (0, 0, 0, 0)
    );
    let m = server.metrics();
    assert_eq!(m.upgrades, 400, "both kinds are counted as upgrades");
    // Every message reached the 200 event streams, each batch made into
    // events once for all of them.
    assert_eq!(m.event_stream_deliveries, 200 * (4 + 50));
    assert_eq!(m.event_stream_batches, m.broadcast_batches);
}

//! `/healthz`, `/metrics` in Prometheus format (on the main listener or
//! one of its own); the binary's tests have the `--demo` page, `HEAD`
//! and the periodic stats line.

mod util;

use std::io::Write;
use std::net::SocketAddr;

use tungstenite::Message;
use util::{connect, http_get, raw, read_response, sample, upgrade_request, TestServer};
use wspush::Config;

#[test]
fn metrics_count_what_happened() {
    let server = TestServer::start(Config::default().with(|c| {
        c.path = Some("/ws".into());
    }));
    let mut a = connect(server.addr, "/ws");
    let mut b = connect(server.addr, "/ws");
    server.handle.broadcast_text("hello").unwrap();
    for client in [&mut a, &mut b] {
        assert_eq!(client.read().unwrap(), Message::text("hello"));
    }
    let mut wrong_path = raw(server.addr);
    Write::write_all(&mut wrong_path, upgrade_request("/nope").as_bytes()).unwrap();
    assert_eq!(read_response(&mut wrong_path).status, 404);

    let page = http_get(server.addr, "/metrics", "");
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let m = &page.body;
    // Two clients; the 404 one possibly still lingering, and this request.
    assert_eq!(sample(m, "wspush_connections_open"), 2, "{m}");
    assert!(
        (1..=2).contains(&sample(m, "wspush_connections_http")),
        "{m}"
    );
    assert_eq!(sample(m, "wspush_upgrades_total"), 2);
    assert_eq!(sample(m, "wspush_broadcasts_total"), 1);
    assert_eq!(sample(m, "wspush_broadcast_deliveries_total"), 2);
    assert_eq!(sample(m, "wspush_frames_sent_total"), 2);
    assert_eq!(
        sample(m, "wspush_requests_rejected_total{status=\"404\"}"),
        1
    );
    assert_eq!(
        sample(m, "wspush_http_requests_total{path=\"/metrics\"}"),
        1
    );
    // Two 101 responses and two 7-byte frames went out, and the 404.
    assert!(
        sample(m, "wspush_bytes_written_total") > 2 * 129 + 14,
        "{m}"
    );
    assert!(sample(m, "wspush_loop_iteration_seconds_count") > 0);
    assert!(m.contains("# TYPE wspush_loop_iteration_seconds histogram"));
    assert!(m.contains("wspush_loop_iteration_seconds_bucket{le=\"+Inf\"}"));
    assert!(m.contains("# TYPE wspush_connections_closed_total counter"));

    let health = http_get(server.addr, "/healthz", "");
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
}

#[test]
fn a_metrics_listener_serves_metrics_and_nothing_else() {
    let server = TestServer::start(Config::default().with(|c| {
        c.metrics_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    }));
    let metrics_addr = server.metrics_addr.expect("a metrics listener");
    let _client = connect(server.addr, "/");

    let page = http_get(metrics_addr, "/metrics", "");
    assert_eq!(page.status, 200);
    assert_eq!(sample(&page.body, "wspush_upgrades_total"), 1);
    assert_eq!(http_get(metrics_addr, "/healthz", "").status, 200);
    let mut upgrade = raw(metrics_addr);
    Write::write_all(&mut upgrade, upgrade_request("/").as_bytes()).unwrap();
    assert_eq!(read_response(&mut upgrade).status, 404, "no WebSocket here");

    assert_eq!(
        http_get(server.addr, "/metrics", "").status,
        404,
        "not on the public listener"
    );
    assert_eq!(http_get(server.addr, "/healthz", "").status, 200);
}

/// `wspush_connections_open` counts WebSocket connections only: not the
/// scrape that reads it, nor a client still sending its request head;
/// those are `wspush_connections_http`, on either listener.
#[test]
fn the_open_gauge_counts_websocket_connections_only() {
    for metrics_listen in [None, Some(SocketAddr::from(([127, 0, 0, 1], 0)))] {
        let server = TestServer::start(Config::default().with(|c| {
            c.metrics_listen = metrics_listen;
        }));
        let scrape_at = server.metrics_addr.unwrap_or(server.addr);
        let gauges = || {
            let page = http_get(scrape_at, "/metrics", "").body;
            let open = sample(&page, "wspush_connections_open");
            (open, sample(&page, "wspush_connections_http"))
        };
        assert_eq!(gauges(), (0, 1), "the scrape alone, {metrics_listen:?}");
        let _clients: Vec<_> = (0..3).map(|_| connect(server.addr, "/")).collect();
        let mut half = raw(server.addr);
        Write::write_all(&mut half, b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap();
        server.wait_for("the half head in and the first scrape gone", |m| {
            m.connections_accepted == 5 && m.connections_http == 1
        });
        assert_eq!(gauges(), (3, 2), "3 clients, a half head and the scrape");
        drop(half);
        let m = server.wait_for("the half head to go", |m| m.connections_http == 0);
        assert_eq!((m.connections_open, m.upgrades), (3, 3));
    }
}

#[test]
fn the_delivery_latency_counts_each_broadcast_once_whatever_the_connections() {
    let server = TestServer::start(Config::default());
    let mut clients: Vec<_> = (0..3).map(|_| connect(server.addr, "/")).collect();
    let (status, _, events) = util::sse::Stream::open(server.addr, "/", "");
    assert_eq!(status, 200);
    let mut events = events.unwrap();
    for n in 0..4 {
        server.handle.broadcast_text(format!("m{n}")).unwrap();
    }
    for client in &mut clients {
        for n in 0..4 {
            assert_eq!(client.read().unwrap(), Message::text(format!("m{n}")));
        }
    }
    for _ in 0..4 {
        events.event();
    }
    let count = |m: &str, transport: &str| {
        let series = format!("wspush_delivery_latency_seconds_count{{transport=\"{transport}\"}}");
        sample(m, &series)
    };
    let mut m = http_get(server.addr, "/metrics", "").body;
    // The pass that delivered the last batch may end after the clients
    // read it.
    let deadline = std::time::Instant::now() + util::IO_TIMEOUT;
    while count(&m, "websocket") < 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        m = http_get(server.addr, "/metrics", "").body;
    }
    // Four messages, each counted once: not once per connection.
    assert_eq!(count(&m, "websocket"), 4, "{m}");
    assert_eq!(count(&m, "event_stream"), 4, "{m}");
    let inf = "wspush_delivery_latency_seconds_bucket{transport=\"websocket\",le=\"+Inf\"}";
    assert_eq!(sample(&m, inf), 4);
    assert!(m.contains("# TYPE wspush_delivery_latency_seconds histogram"));
}

#[test]
fn the_delivery_latency_counts_a_targeted_batch_once_its_last_recipient_has_it() {
    let server = TestServer::start(Config::default());
    let mut subscribers: Vec<_> = (0..3)
        .map(|_| connect(server.addr, "/?channel=news"))
        .collect();
    let mut bob = connect(server.addr, "/?id=bob");
    let (status, _, events) = util::sse::Stream::open(server.addr, "/?channel=news", "");
    assert_eq!(status, 200);
    let mut events = events.unwrap();
    server
        .handle
        .send(
            util::channels(&["news"]),
            wspush::MessageKind::Text,
            "to news",
        )
        .unwrap();
    server
        .handle
        .send(
            wspush::Recipients::Id(util::client_id("bob")),
            wspush::MessageKind::Text,
            "to bob",
        )
        .unwrap();
    for client in &mut subscribers {
        assert_eq!(client.read().unwrap(), Message::text("to news"));
    }
    assert_eq!(bob.read().unwrap(), Message::text("to bob"));
    events.event();
    let count = |m: &str, transport: &str| {
        let series = format!("wspush_delivery_latency_seconds_count{{transport=\"{transport}\"}}");
        sample(m, &series)
    };
    // Handed to its last recipient before that one reads it.
    let m = http_get(server.addr, "/metrics", "").body;
    // Each batch once, for the transports of its own recipients: the
    // channel's for both, bob's for WebSocket only.
    assert_eq!(count(&m, "websocket"), 2, "{m}");
    assert_eq!(count(&m, "event_stream"), 1, "{m}");
}

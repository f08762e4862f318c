//! `/healthz`, `/metrics` in Prometheus format (on the main listener or
//! one of its own), the `--demo` page, and the periodic stats line.

mod util;

use std::io::{Read, Write};
use std::net::SocketAddr;

use tungstenite::Message;
use util::{connect, http_get, raw, read_response, sample, upgrade_request, Binary, TestServer};
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
fn with_demo_a_plain_get_of_the_root_is_the_page_and_the_upgrade_still_works() {
    let mut server = Binary::start(&["--demo"]);
    let page = http_get(server.addr, "/", "");
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("Content-Type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(page.body, wspush::protocol::http::DEMO_PAGE);
    assert!(
        page.body.starts_with("<!doctype html>")
            && page.body.contains("wspush.connect(url")
            && page.body.contains("location.origin + \"/\""),
        "{}",
        page.body
    );
    let script = http_get(server.addr, "/wspush.js", "");
    assert_eq!(script.status, 200);
    assert_eq!(
        script.header("Content-Type"),
        Some("text/javascript; charset=utf-8")
    );
    assert_eq!(script.body, wspush::protocol::http::CLIENT_SCRIPT);
    let mut client = connect(server.addr, "/");
    server.process.send(b"to the page\n");
    assert_eq!(client.read().unwrap(), Message::text("to the page"));
    let metrics = http_get(server.addr, "/metrics", "").body;
    assert_eq!(
        sample(&metrics, "wspush_http_requests_total{path=\"/\"}"),
        1
    );
    assert_eq!(
        sample(&metrics, "wspush_http_requests_total{path=\"/wspush.js\"}"),
        1
    );
    assert_eq!(sample(&metrics, "wspush_upgrades_total"), 1);

    // Without --demo, / answers as it always has: an upgrade is expected.
    let plain = Binary::start(&[]);
    let answer = http_get(plain.addr, "/", "");
    assert_eq!(answer.status, 400);
    assert_eq!(answer.body, "missing Upgrade: websocket header\n");
}

#[test]
fn a_stats_line_is_logged_periodically() {
    let server = Binary::start(&["--stats-interval", "200ms"]);
    let _client = connect(server.addr, "/");
    let line = server.process.wait_for(" open (+");
    assert!(
        line.contains("broadcasts") && line.contains("loop max"),
        "{line}"
    );
    server.process.wait_for("1 open (+");
}

#[test]
fn head_answers_each_page_as_get_does_without_the_body() {
    let server = Binary::start(&["--demo"]);
    for (path, body) in [
        ("/wspush.js", wspush::protocol::http::CLIENT_SCRIPT),
        ("/", wspush::protocol::http::DEMO_PAGE),
        ("/healthz", "ok\n"),
    ] {
        let get = http_get(server.addr, path, "");
        let mut stream = raw(server.addr);
        let request = format!("HEAD {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        let answer = String::from_utf8(answer).unwrap();
        let (head, rest) = answer.split_once("\r\n\r\n").expect("a whole head");
        assert_eq!(rest, "", "{path}: no body after the head");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{path}: {head}");
        assert!(
            head.contains(&format!("\r\nContent-Length: {}", body.len())),
            "{path}: the length of what GET sends: {head}"
        );
        assert!(
            head.contains(&format!(
                "\r\nContent-Type: {}",
                get.header("Content-Type").unwrap()
            )),
            "{path}: {head}"
        );
    }
    // An upgrade is still a GET; a refusal of a HEAD is its head alone.
    for request in [
        upgrade_request("/").replacen("GET", "HEAD", 1),
        "HEAD /elsewhere HTTP/1.1\r\nHost: localhost\r\n\r\n".to_string(),
    ] {
        let mut stream = raw(server.addr);
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        let answer = String::from_utf8(answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 405 "), "{answer}");
        assert!(answer.ends_with("\r\n\r\n"), "no body: {answer}");
    }
}

//! What the binary shows of itself: its pages over HTTP (the `--demo`
//! page, `HEAD`), its periodic stats line, and that a token never reaches
//! its log.

mod util;

use std::io::{Read, Write};

use tungstenite::Message;
use util::{connect, http_get, raw, read_response, sample, upgrade_request, Binary};

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

#[test]
fn tokens_are_never_logged() {
    let dir = std::env::temp_dir().join(format!("wspush-tokens-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tokens");
    std::fs::write(&file, "# one per line\nvery-s3cret-value\n").unwrap();
    let server = Binary::start_logging(&["--token-file", file.to_str().unwrap()], "debug");
    let client = util::connect(server.addr, "/ws?id=7&token=very-s3cret-value");
    let mut logged = vec![];
    let mut log_until = |needle: &str| loop {
        let line = server.process.next_line();
        logged.push(line.clone());
        if line.contains(needle) {
            break;
        }
    };
    log_until("upgraded /ws?id=7");
    let mut wrong = raw(server.addr);
    write!(
        wrong,
        "GET /ws?token=very-s3cret-valuX HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Version: 13\r\nAuthorization: Bearer very-s3cret-value2\r\n\r\n"
    )
    .unwrap();
    assert_eq!(read_response(&mut wrong).status, 401);
    log_until("handshake rejected: Unauthorized");
    drop(client);
    log_until("closed: Abnormal");
    for line in logged {
        assert!(!line.contains("s3cret"), "a token was logged: {line}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

//! The opening handshake over real sockets (RFC 6455 §4): the accept key,
//! requests in pieces and with a pipelined first frame, every rejection
//! status with its counter, token lists, paths, and the handshake timeout.

mod util;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use tungstenite::client::IntoClientRequest;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::Message;
use util::{HttpResponse, TestServer, TEXT};
use wspush::{Config, MetricsSnapshot};

/// A request with the RFC 6455 sample key, as `upgrade_request` writes it,
/// for tests that change one header.
fn request() -> String {
    util::upgrade_request("/")
}

/// Long enough that a lingering connection can never end by its close
/// timeout before a test's read (10 s) gives up: an EOF seen by a test
/// was sent on purpose.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

fn echo_config() -> Config {
    Config::default().with(|c| {
        c.echo = true;
        c.close_timeout = CLOSE_TIMEOUT;
    })
}

fn server() -> TestServer {
    TestServer::start(echo_config())
}

/// Sends `request` on a fresh connection and checks it is refused with
/// `status`, a short plain-text explanation mentioning `about`, and that the
/// server then ends the connection.
fn expect_rejected(server: &TestServer, request: &[u8], status: u16, about: &str) -> HttpResponse {
    let mut stream = util::raw(server.addr);
    stream.write_all(request).unwrap();
    let response = read_rejection(&mut stream, status, about);
    util::expect_eof(&mut stream);
    response
}

/// Reads an HTTP error response and checks its status and body.
fn read_rejection(stream: &mut TcpStream, status: u16, about: &str) -> HttpResponse {
    let response = util::read_response(stream);
    assert_eq!(response.status, status, "{response:?}");
    let body = &response.body;
    assert!(
        !body.trim().is_empty() && body.len() <= 100 && body.ends_with('\n'),
        "the body should be a one-line explanation: {response:?}"
    );
    assert_eq!(body.trim().lines().count(), 1, "{response:?}");
    assert!(
        body.to_ascii_lowercase()
            .contains(&about.to_ascii_lowercase()),
        "the explanation should mention {about:?}: {response:?}"
    );
    assert_eq!(response.header("content-type"), Some("text/plain"));
    assert_eq!(response.header("connection"), Some("close"));
    assert!(
        response.header("sec-websocket-accept").is_none(),
        "{response:?}"
    );
    response
}

/// Checks a `101 Switching Protocols` answering the RFC sample key.
fn assert_switching(response: &HttpResponse) {
    assert_eq!(response.status, 101, "{response:?}");
    assert_eq!(
        response.header("sec-websocket-accept"),
        Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    );
    assert!(response
        .header("upgrade")
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket")));
    assert!(response
        .header("connection")
        .is_some_and(|v| v.eq_ignore_ascii_case("upgrade")));
    assert!(response.body.is_empty(), "{response:?}");
}

/// Sends a text frame on an upgraded raw connection and expects it echoed.
fn assert_echoes(stream: &mut TcpStream, text: &[u8]) {
    stream.write_all(&util::client_frame(TEXT, text)).unwrap();
    let frame = util::read_frame(stream).expect("an echo");
    assert_eq!(
        (frame.fin, frame.opcode, &frame.payload[..]),
        (true, 0x1, text)
    );
}

/// A tungstenite client exchanges one message with the echo server.
fn assert_tungstenite_echo(server: &TestServer, path: &str) {
    let mut client = util::connect(server.addr, path);
    client.send(Message::text("still here")).unwrap();
    assert_eq!(client.read().unwrap(), Message::text("still here"));
    close_cleanly(client);
}

/// Completes the close handshake from the client side and reads until the
/// server ends the connection (so the server counts a normal close, not a
/// reset).
fn close_cleanly(mut client: util::Client) {
    client.close(None).unwrap();
    loop {
        match client.read() {
            Ok(Message::Close(frame)) => {
                assert!(
                    frame.as_ref().is_none_or(|f| u16::from(f.code) == 1000),
                    "{frame:?}"
                )
            }
            Ok(other) => panic!("unexpected message while closing: {other:?}"),
            Err(tungstenite::Error::ConnectionClosed) => return,
            Err(e) => panic!("closing: {e}"),
        }
    }
}

/// Waits for `rejected` to hold, then (once the client is gone) for the
/// connection to be counted as closed after a rejection, and checks that
/// nothing was upgraded.
fn assert_rejections_counted(
    server: &TestServer,
    what: &str,
    rejected: impl Fn(&MetricsSnapshot) -> bool,
    closed: u64,
) {
    let m = server.wait_for(what, |m| rejected(m) && m.closed_rejected == closed);
    assert_eq!(m.upgrades, 0, "{m:#?}");
    let rejections =
        m.rejected_400 + m.rejected_404 + m.rejected_405 + m.rejected_426 + m.rejected_431;
    assert_eq!(rejections, closed, "one rejection per connection: {m:#?}");
}

// ---------------------------------------------------------------------------
// Successful upgrades

#[test]
fn rfc_6455_accept_key_vector_over_a_real_socket() {
    let server = server();
    let mut stream = util::raw(server.addr);
    stream.write_all(request().as_bytes()).unwrap();
    let response = util::read_response(&mut stream);
    assert_switching(&response);
    assert_eq!(response.header("content-length"), None);
    assert_echoes(&mut stream, b"upgraded");
    drop(stream);
    let m = server.wait_for("the upgrade", |m| m.upgrades == 1 && m.closed_abnormal == 1);
    assert_eq!(m.rejected_400, 0);
}

#[test]
fn a_request_fed_one_byte_at_a_time_is_upgraded_and_works() {
    let server = server();
    let mut stream = util::raw(server.addr);
    let mut wire = request().into_bytes();
    // The first frame too, one byte per segment.
    wire.extend_from_slice(&util::client_frame(TEXT, b"slowly"));
    for byte in &wire {
        stream.write_all(std::slice::from_ref(byte)).unwrap();
        stream.flush().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_switching(&util::read_response(&mut stream));
    let frame = util::read_frame(&mut stream).expect("the echo");
    assert_eq!((frame.opcode, &frame.payload[..]), (0x1, &b"slowly"[..]));
    assert_echoes(&mut stream, b"and then quickly");
    drop(stream);
    let m = server.wait_for("the close", |m| {
        m.closed_abnormal == 1 && m.buffers_lent == 0
    });
    assert_eq!((m.upgrades, m.messages_echoed), (1, 2));
}

#[test]
fn a_pipelined_first_frame_is_echoed_right_after_the_101() {
    let server = server();
    let mut stream = util::raw(server.addr);
    let mut wire = request().into_bytes();
    wire.extend_from_slice(&util::client_frame(TEXT, b"pipelined"));
    wire.extend_from_slice(&util::client_frame(util::PING, b"too"));
    stream.write_all(&wire).unwrap();
    assert_switching(&util::read_response(&mut stream));
    let echo = util::read_frame(&mut stream).expect("the echo");
    assert_eq!((echo.opcode, &echo.payload[..]), (0x1, &b"pipelined"[..]));
    let pong = util::read_frame(&mut stream).expect("the pong");
    assert_eq!((pong.opcode, &pong.payload[..]), (0xA, &b"too"[..]));
}

#[test]
fn a_request_and_the_clients_fin_at_once_are_answered_then_closed() {
    // The first read after accept stops at a short read: the end of input
    // that came with the request must still be seen.
    let server = server();
    let mut stream = util::raw(server.addr);
    stream.write_all(request().as_bytes()).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    assert_switching(&util::read_response(&mut stream));
    util::expect_eof(&mut stream);
    let m = server.wait_for("the close", |m| {
        m.connections_open + m.connections_http == 0
    });
    assert_eq!((m.upgrades, m.closed_abnormal), (1, 1));
}

#[test]
fn a_head_completed_in_the_same_segment_as_the_first_frame_is_upgraded() {
    // The first half of the head is held back by the server; the second
    // half arrives together with a frame.
    let server = server();
    let mut stream = util::raw(server.addr);
    let head = request().into_bytes();
    let (first, second) = head.split_at(head.len() / 2);
    stream.write_all(first).unwrap();
    server.wait_for("the partial head to be held", |m| m.buffers_lent == 1);
    let mut rest = second.to_vec();
    rest.extend_from_slice(&util::client_frame(TEXT, b"after a split head"));
    stream.write_all(&rest).unwrap();
    assert_switching(&util::read_response(&mut stream));
    let echo = util::read_frame(&mut stream).expect("the echo");
    assert_eq!(&echo.payload[..], b"after a split head");
}

#[test]
fn token_lists_and_case_are_accepted() {
    let server = server();
    let variants = [
        request().replace("Connection: Upgrade", "Connection: keep-alive, Upgrade"),
        request().replace("Upgrade: websocket", "Upgrade: WebSocket"),
        request()
            .replace("Connection: Upgrade", "connection: keep-alive,upgrade")
            .replace("Upgrade: websocket", "UPGRADE: WEBSOCKET")
            .replace("Sec-WebSocket-Version: 13", "sec-websocket-version:  13 "),
    ];
    for wire in &variants {
        let mut stream = util::raw(server.addr);
        stream.write_all(wire.as_bytes()).unwrap();
        assert_switching(&util::read_response(&mut stream));
        assert_echoes(&mut stream, b"tokens");
    }
    server.wait_for("the upgrades", |m| m.upgrades == 3);
}

#[test]
fn token_lists_and_case_are_accepted_from_tungstenite() {
    let server = server();
    let mut request = format!("ws://{}/", server.addr)
        .into_client_request()
        .unwrap();
    let headers = request.headers_mut();
    headers.insert("Connection", "keep-alive, Upgrade".parse().unwrap());
    headers.insert("Upgrade", "WebSocket".parse().unwrap());
    let (mut client, response) = tungstenite::connect(request).expect("upgrade");
    assert_eq!(response.status(), 101);
    if let MaybeTlsStream::Plain(stream) = client.get_ref() {
        stream.set_read_timeout(Some(util::IO_TIMEOUT)).unwrap();
    }
    client.send(Message::binary(vec![1, 2, 3])).unwrap();
    assert_eq!(client.read().unwrap(), Message::binary(vec![1, 2, 3]));
    close_cleanly(client);
    // And with tungstenite's own headers.
    assert_tungstenite_echo(&server, "/");
    server.wait_for("the upgrades", |m| m.upgrades == 2);
}

#[test]
fn a_path_with_a_query_is_served_when_a_path_is_set() {
    let server = TestServer::start(echo_config().with(|c| {
        c.path = Some("/ws".into());
    }));
    let mut stream = util::raw(server.addr);
    stream
        .write_all(util::upgrade_request("/ws?id=01").as_bytes())
        .unwrap();
    assert_switching(&util::read_response(&mut stream));
    assert_echoes(&mut stream, b"with a query");
    assert_tungstenite_echo(&server, "/ws?id=02&x=y");
    assert_tungstenite_echo(&server, "/ws");
    expect_rejected(
        &server,
        util::upgrade_request("/ws/x").as_bytes(),
        404,
        "path",
    );
    expect_rejected(&server, util::upgrade_request("/").as_bytes(), 404, "path");
    let m = server.wait_for("the 404s", |m| m.rejected_404 == 2);
    assert_eq!(m.upgrades, 3);
}

// ---------------------------------------------------------------------------
// Rejections: each status, its explanation, the EOF and the counters

#[test]
fn a_malformed_request_line_is_400() {
    let server = server();
    expect_rejected(&server, b"this is not http\r\n\r\n", 400, "malformed");
    expect_rejected(&server, b"GET / HTTP/1.1 extra\r\n\r\n", 400, "malformed");
    assert_rejections_counted(&server, "two 400s", |m| m.rejected_400 == 2, 2);
}

#[test]
fn a_missing_host_is_400() {
    let server = server();
    let wire = request().replace("Host: localhost\r\n", "");
    expect_rejected(&server, wire.as_bytes(), 400, "host");
    assert_rejections_counted(&server, "a 400", |m| m.rejected_400 == 1, 1);
}

#[test]
fn a_missing_upgrade_header_is_400() {
    let server = server();
    let wire = request().replace("Upgrade: websocket\r\n", "");
    expect_rejected(&server, wire.as_bytes(), 400, "upgrade");
    assert_rejections_counted(&server, "a 400", |m| m.rejected_400 == 1, 1);
}

#[test]
fn an_upgrade_to_something_else_is_400() {
    let server = server();
    for other in ["h2c", "websocket2", "web socket"] {
        let wire = request().replace("Upgrade: websocket", &format!("Upgrade: {other}"));
        expect_rejected(&server, wire.as_bytes(), 400, "upgrade");
    }
    assert_rejections_counted(&server, "three 400s", |m| m.rejected_400 == 3, 3);
}

#[test]
fn a_connection_header_without_the_upgrade_token_is_400() {
    let server = server();
    for value in ["keep-alive", "close", "upgrade-insecure"] {
        let wire = request().replace("Connection: Upgrade", &format!("Connection: {value}"));
        expect_rejected(&server, wire.as_bytes(), 400, "connection");
    }
    let missing = request().replace("Connection: Upgrade\r\n", "");
    expect_rejected(&server, missing.as_bytes(), 400, "connection");
    assert_rejections_counted(&server, "four 400s", |m| m.rejected_400 == 4, 4);
}

#[test]
fn a_missing_key_is_400() {
    let server = server();
    let wire = request().replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", "");
    expect_rejected(&server, wire.as_bytes(), 400, "key");
    assert_rejections_counted(&server, "a 400", |m| m.rejected_400 == 1, 1);
}

#[test]
fn a_key_that_is_not_base64_of_16_bytes_is_400() {
    let server = server();
    let bad_keys = [
        "dGhlIHNhbXBsZQ==",         // 10 bytes
        "dGhlIHNhbXBsZSBub25jZSEh", // 18 bytes
        "!!!!!!!!!!!!!!!!!!!!!!==", // 24 characters, not base64
        "dGhlIHNhbXBsZSBub25jZQ",   // unpadded
        "",                         // empty
    ];
    for key in bad_keys {
        let wire = request().replace("dGhlIHNhbXBsZSBub25jZQ==", key);
        expect_rejected(&server, wire.as_bytes(), 400, "key");
    }
    assert_rejections_counted(&server, "five 400s", |m| m.rejected_400 == 5, 5);
}

#[test]
fn http_1_0_is_400() {
    let server = server();
    let wire = request().replace("HTTP/1.1", "HTTP/1.0");
    expect_rejected(&server, wire.as_bytes(), 400, "HTTP/1.1");
    assert_rejections_counted(&server, "a 400", |m| m.rejected_400 == 1, 1);
}

#[test]
fn another_path_is_404_when_a_path_is_set() {
    let server = TestServer::start(echo_config().with(|c| {
        c.path = Some("/ws".into());
    }));
    expect_rejected(
        &server,
        util::upgrade_request("/other").as_bytes(),
        404,
        "path",
    );
    expect_rejected(
        &server,
        util::upgrade_request("/other?x=/ws").as_bytes(),
        404,
        "path",
    );
    assert_rejections_counted(&server, "two 404s", |m| m.rejected_404 == 2, 2);
}

#[test]
fn a_post_is_405_with_allow_get() {
    let server = server();
    for method in ["POST", "PUT"] {
        let wire = request().replace("GET", method);
        let response = expect_rejected(&server, wire.as_bytes(), 405, "GET");
        assert_eq!(response.header("allow"), Some("GET"));
    }
    // To a HEAD, the same head without the body.
    let mut stream = util::raw(server.addr);
    stream
        .write_all(request().replace("GET", "HEAD").as_bytes())
        .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut stream, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 405 "), "{answer}");
    assert!(answer.contains("\r\nAllow: GET\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\n"), "no body: {answer}");
    drop(stream);
    assert_rejections_counted(&server, "three 405s", |m| m.rejected_405 == 3, 3);
}

#[test]
fn a_missing_or_unsupported_version_is_426_naming_version_13() {
    let server = server();
    let cases = [
        request().replace("Sec-WebSocket-Version: 13\r\n", ""),
        request().replace("Version: 13", "Version: 8"),
        request().replace("Version: 13", "Version: 14"),
    ];
    for wire in &cases {
        let response = expect_rejected(&server, wire.as_bytes(), 426, "version");
        assert_eq!(response.header("sec-websocket-version"), Some("13"));
    }
    assert_rejections_counted(&server, "three 426s", |m| m.rejected_426 == 3, 3);
}

#[test]
fn a_head_over_8_kib_is_431() {
    let server = server();
    let padding = format!("X-Padding: {}\r\nHost", "a".repeat(9000));
    let wire = request().replacen("Host", &padding, 1);
    expect_rejected(
        &server,
        wire.as_bytes(),
        431,
        "larger than the limit: 8192 bytes",
    );
    assert_rejections_counted(&server, "a 431", |m| m.rejected_431 == 1, 1);
}

#[test]
fn a_head_that_never_ends_is_431_once_past_8_kib() {
    let server = server();
    let mut stream = util::raw(server.addr);
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Padding: ")
        .unwrap();
    // 9 KiB of one header value in 1 KiB pieces, and never the end of the head.
    for _ in 0..9 {
        stream.write_all(&[b'a'; 1024]).unwrap();
        stream.flush().unwrap();
    }
    read_rejection(&mut stream, 431, "larger than the limit: 8192 bytes");
    util::expect_eof(&mut stream);
    drop(stream);
    assert_rejections_counted(&server, "a 431", |m| m.rejected_431 == 1, 1);
}

#[test]
fn more_headers_than_the_parser_holds_is_431() {
    let server = server();
    let headers = |n: usize| -> String { (0..n).map(|i| format!("X-Header-{i}: v\r\n")).collect() };
    // 100 header lines are fine (hyper's default limit)...
    let hundred = request().replacen("Host", &format!("{}Host", headers(95)), 1);
    let other = self::server();
    let mut stream = util::raw(other.addr);
    stream.write_all(hundred.as_bytes()).unwrap();
    assert_eq!(util::read_response(&mut stream).status, 101);
    drop(stream);
    // ... 129 are not.
    let wire = request().replacen("Host", &format!("{}Host", headers(124)), 1);
    assert!(wire.len() < 8192, "small, but too many headers");
    expect_rejected(
        &server,
        wire.as_bytes(),
        431,
        "more header lines than the limit: 128",
    );
    assert_rejections_counted(&server, "a 431", |m| m.rejected_431 == 1, 1);
}

#[test]
fn the_server_stays_healthy_after_rejections() {
    let server = TestServer::start(echo_config().with(|c| {
        c.path = Some("/ws".into());
    }));
    let bad: Vec<Vec<u8>> = vec![
        b"garbage\r\n\r\n".to_vec(),
        util::upgrade_request("/nope").into_bytes(),
        util::upgrade_request("/ws")
            .replace("GET", "POST")
            .into_bytes(),
        util::upgrade_request("/ws")
            .replace("Version: 13", "Version: 8")
            .into_bytes(),
        util::upgrade_request("/ws")
            .replacen("Host", &format!("X-Big: {}\r\nHost", "b".repeat(9000)), 1)
            .into_bytes(),
    ];
    // Several rejected connections open at once, then answered.
    let mut streams: Vec<TcpStream> = bad
        .iter()
        .map(|wire| {
            let mut stream = util::raw(server.addr);
            stream.write_all(wire).unwrap();
            stream
        })
        .collect();
    for (stream, status) in streams.iter_mut().zip([400, 404, 405, 426, 431]) {
        assert_eq!(util::read_response(stream).status, status);
        util::expect_eof(stream);
    }
    drop(streams);
    server.wait_for("every rejection", |m| {
        (
            m.rejected_400,
            m.rejected_404,
            m.rejected_405,
            m.rejected_426,
            m.rejected_431,
        ) == (1, 1, 1, 1, 1)
            && m.closed_rejected == 5
    });
    assert_tungstenite_echo(&server, "/ws");
    let m = server.wait_for("the upgrade", |m| {
        m.upgrades == 1 && m.connections_open + m.connections_http == 0 && m.buffers_lent == 0
    });
    assert_eq!((m.messages_echoed, m.closed_normal), (1, 1));
}

#[test]
fn a_client_that_connects_and_sends_nothing_is_closed_by_the_handshake_timeout() {
    // The listener defers accepting until data arrives (TCP_DEFER_ACCEPT):
    // a silent client is accepted only once the kernel gives up waiting
    // (about a second), and then its handshake deadline applies as usual.
    let server = TestServer::start(echo_config().with(|c| {
        c.handshake_timeout = Duration::from_millis(300);
    }));
    let mut silent = util::raw(server.addr);
    util::expect_eof(&mut silent);
    let m = server.wait_for("the timeout", |m| m.closed_handshake_timeout == 1);
    assert_eq!((m.connections_accepted, m.upgrades), (1, 0));
    // A client that does send its request is not held back by the first.
    let upgraded = util::connect(server.addr, "/");
    close_cleanly(upgraded);
}

#[test]
fn a_handshake_that_does_not_complete_in_time_is_closed() {
    let server = TestServer::start(echo_config().with(|c| {
        c.handshake_timeout = Duration::from_millis(300);
    }));
    // An upgraded connection has no handshake deadline any more.
    let mut upgraded = util::connect(server.addr, "/");
    let mut stream = util::raw(server.addr);
    let head = request();
    stream
        .write_all(&head.as_bytes()[..head.len() / 2])
        .unwrap();
    // The server closes it, without a response.
    util::expect_eof(&mut stream);
    drop(stream);
    let m = server.wait_for("the timeout", |m| m.closed_handshake_timeout == 1);
    assert_eq!((m.upgrades, m.rejected_400, m.closed_rejected), (1, 0, 0));
    upgraded.send(Message::text("outlived it")).unwrap();
    assert_eq!(upgraded.read().unwrap(), Message::text("outlived it"));
    close_cleanly(upgraded);
    let m = server.wait_for("the close", |m| {
        m.connections_open + m.connections_http == 0
    });
    assert_eq!((m.closed_handshake_timeout, m.closed_normal), (1, 1));
}

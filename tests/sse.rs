//! Event streams (SSE) on the same port: the request, the head, messages
//! as events (text line by line, binary in base64, positions as ids), the
//! status event, resume through `Last-Event-ID`, heartbeat comments, the
//! refusals, and WebSocket and event-stream clients side by side.
//!
//! The reader (`util::sse`) follows the HTML standard's event stream
//! interpretation, written apart from the server's writer.

mod util;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use util::sse::{status_of, Event, Stream};
use util::{client_id, raw, read_response, TestServer};
use wspush::{Config, MessageKind, Recipients};

#[test]
fn messages_arrive_as_events_with_their_positions_as_ids() {
    let server = TestServer::start(Config::default());
    let (status, head, stream) = Stream::open(server.addr, "/?id=alice", "");
    assert_eq!(status, 200, "{head}");
    for header in ["Content-Type: text/event-stream", "Cache-Control: no-store"] {
        assert!(head.contains(header), "{header}: {head}");
    }
    let mut stream = stream.unwrap();
    let first = stream.event();
    assert_eq!(status_of(&first), "position");
    let retry = stream.retry.expect("a retry field first");
    assert!((15_000..=30_000).contains(&retry), "{retry}");
    server.wait_for("open", |m| m.connections_open == 1);
    let handle = &server.handle;
    handle.broadcast_text("one line").unwrap();
    handle.broadcast_text("two\nlines\r\nand a third").unwrap();
    handle.broadcast_binary(vec![0u8, 255]).unwrap();
    handle
        .send(Recipients::Id(client_id("alice")), MessageKind::Text, "")
        .unwrap();
    let events: Vec<Event> = (0..4).map(|_| stream.event()).collect();
    let data: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e.kind.as_str(), e.data.as_str()))
        .collect();
    assert_eq!(
        data,
        [
            ("message", "one line"),
            ("message", "two\nlines\nand a third"),
            ("binary", "AP8="),
            ("message", ""),
        ]
    );
    server.wait_for("the deliveries counted", |m| m.event_stream_deliveries == 4);
    let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids rise: {ids:?}");
    assert!(ids[0].contains('.'), "a position: {ids:?}");
}

#[test]
fn a_stream_resumes_after_its_last_event_id() {
    let server = TestServer::start(Config::default());
    let (_, _, stream) = Stream::open(server.addr, "/", "");
    let mut stream = stream.unwrap();
    stream.event();
    server.wait_for("open", |m| m.connections_open == 1);
    server.handle.broadcast_text("before").unwrap();
    let before = stream.event();
    drop(stream);
    server.wait_for("gone", |m| m.connections_open == 0);
    server.handle.broadcast_text("while away 1").unwrap();
    server.handle.broadcast_text("while away 2").unwrap();
    let last = format!("Last-Event-ID: {}\r\n", before.id);
    let (_, _, stream) = Stream::open(server.addr, "/", &last);
    let mut stream = stream.unwrap();
    assert_eq!(status_of(&stream.event()), "recovered");
    let missed: Vec<String> = (0..2).map(|_| stream.event().data).collect();
    assert_eq!(missed, ["while away 1", "while away 2"]);
    server.handle.broadcast_text("live").unwrap();
    assert_eq!(stream.event().data, "live");
    assert_eq!(server.handle.metrics().resumes_recovered, 1);
}

#[test]
fn an_idle_stream_gets_heartbeat_comments() {
    let server = TestServer::start(Config::default().with(|c| {
        c.ping_interval = Duration::from_millis(200);
        c.idle_timeout = Duration::from_millis(400);
    }));
    let (_, _, stream) = Stream::open(server.addr, "/", "");
    let mut stream = stream.unwrap();
    stream.event();
    // A proxy that ends a connection silent for twice the ping interval
    // never would: no gap between the bytes that come is that long. The
    // client says nothing meanwhile, yet the stream stays past the idle
    // timeout.
    let started = std::time::Instant::now();
    let (mut last, mut longest) = (started, Duration::ZERO);
    let mut byte = [0u8; 1];
    while started.elapsed() < Duration::from_millis(1500) {
        assert_eq!(
            stream.socket.read(&mut byte).unwrap(),
            1,
            "the stream ended"
        );
        stream.buf.push(byte[0]);
        longest = longest.max(last.elapsed());
        last = std::time::Instant::now();
    }
    assert!(
        longest < Duration::from_millis(400),
        "silent for {longest:?}"
    );
    server.handle.broadcast_text("still here").unwrap();
    assert_eq!(stream.event().data, "still here");
    assert!(stream.comments >= 3, "{} comments", stream.comments);
    drop(stream);
    let m = server.wait_for("its end counted", |m| m.connections_open == 0);
    assert_eq!((m.closed_normal, m.closed_idle_timeout), (1, 0));
}

#[test]
fn refusals_come_before_any_event() {
    let server = TestServer::start(Config::default().with(|c| {
        c.path = Some("/events".into());
        c.allowed_origins = vec!["https://app.example".into()];
        c.tokens = Some(wspush::Tokens::new(["t0ken"]).unwrap());
    }));
    let origin = "Origin: https://app.example\r\n";
    assert_eq!(
        Stream::open(server.addr, "/other?token=t0ken", origin).0,
        404
    );
    assert_eq!(Stream::open(server.addr, "/events", origin).0, 401);
    let evil = "Origin: https://evil.example\r\n";
    assert_eq!(
        Stream::open(server.addr, "/events?token=t0ken", evil).0,
        403
    );
    let (status, head, _) = Stream::open(server.addr, "/events?token=t0ken", origin);
    assert_eq!(status, 200);
    assert!(
        head.contains("Access-Control-Allow-Origin: https://app.example"),
        "{head}"
    );
}

#[test]
fn a_drain_sets_the_retry_to_its_hint_and_ends_the_stream() {
    let server = TestServer::start(Config::default().with(|c| {
        c.drain_time = Duration::from_millis(300);
        c.drain_grace = Duration::ZERO;
    }));
    let (_, _, stream) = Stream::open(server.addr, "/", "");
    let mut stream = stream.unwrap();
    stream.event();
    server.wait_for("counted", |m| m.connections_event_stream == 1);
    server.handle.drain().unwrap();
    let hint = stream.event();
    assert_eq!(status_of(&hint), "reconnect");
    let delay: u32 = hint
        .data
        .split("\"delay_ms\":")
        .nth(1)
        .unwrap()
        .trim_end_matches('}')
        .parse()
        .unwrap();
    assert_eq!(stream.retry, Some(delay), "the retry is the hint's delay");
    let mut rest = Vec::new();
    stream.socket.read_to_end(&mut rest).unwrap();
    assert!(
        rest.is_empty() || rest.iter().all(|&b| b == b'\n' || b == b':'),
        "{rest:?}"
    );
    drop(stream); // The client goes too, as `EventSource` does.
    let m = server.wait_for("closed", |m| m.connections_open == 0);
    assert_eq!(
        (m.closed_drain, m.connections_event_stream),
        (1, 0),
        "{m:#?}"
    );
}

#[test]
fn websocket_and_event_stream_clients_each_get_every_message_once() {
    let server = TestServer::start(Config::default());
    let mut sockets: Vec<_> = (0..3).map(|_| util::connect(server.addr, "/")).collect();
    let mut streams: Vec<Stream> = (0..3)
        .map(|_| Stream::open(server.addr, "/", "").2.expect("a stream"))
        .collect();
    for stream in &mut streams {
        stream.event();
    }
    server.wait_for("all open", |m| m.connections_open == 6);
    for i in 0..50 {
        server.handle.broadcast_text(format!("m{i}")).unwrap();
    }
    let want: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
    for ws in &mut sockets {
        assert_eq!(util::texts(ws, 50), want);
    }
    for stream in &mut streams {
        let got: Vec<String> = (0..50).map(|_| stream.event().data).collect();
        assert_eq!(got, want);
    }
    // Each batch was made into events once, for the three streams.
    let m = server.handle.metrics();
    assert_eq!(m.event_stream_deliveries, 150);
    assert!(m.broadcast_batches >= 1);
    assert_eq!(m.event_stream_batches, m.broadcast_batches);
    // A plain GET without the event stream's Accept is not one.
    let mut plain = raw(server.addr);
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut plain).status, 400);
}

#[test]
fn a_stalled_stream_is_closed_as_a_slow_consumer_and_the_others_go_on() {
    let server = TestServer::start(Config::default().with(|c| {
        c.max_queued_bytes = 64 << 10;
    }));
    // A reader with a small receive buffer that reads nothing.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&server.addr.into()).unwrap();
    let mut stalled: TcpStream = socket.into();
    stalled
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        .unwrap();
    let (_, _, reader) = Stream::open(server.addr, "/", "");
    let mut reader = reader.unwrap();
    reader.event();
    server.wait_for("both open", |m| m.connections_event_stream == 2);
    // More than the kernel's buffers hold for the stalled one.
    let payload = "x".repeat(32 << 10);
    for i in 0..400 {
        server
            .handle
            .broadcast_text(format!("{i} {payload}"))
            .unwrap();
        let event = reader.event();
        assert!(event.data.starts_with(&format!("{i} ")), "{i}");
    }
    let m = server.wait_for("the stalled one closed", |m| m.closed_slow_consumer == 1);
    assert_eq!(m.connections_event_stream, 1, "the reader is still open");
    assert_eq!(m.closed_event_stream, 1);
    assert!(m.event_stream_drops >= 1 && m.event_stream_drops == m.slow_consumer_drops);
}

#[test]
fn a_stream_a_publisher_closes_is_told_the_code_and_reason() {
    let server = TestServer::start(Config::default());
    let (_, _, stream) = Stream::open(server.addr, "/?id=alice", "");
    let mut stream = stream.unwrap();
    assert_eq!(status_of(&stream.event()), "position");
    server.handle.broadcast_text("first").unwrap();
    let reason = r#"moved "elsewhere""#;
    let alice = Recipients::Id(client_id("alice"));
    server
        .handle
        .close(alice, wspush::CloseCode(4100), reason)
        .unwrap();
    assert_eq!(stream.event().data, "first");
    let closed = stream.event();
    assert_eq!(status_of(&closed), "closed");
    assert_eq!(
        closed.data,
        r#"{"status":"closed","code":4100,"reason":"moved \"elsewhere\""}"#
    );
    let mut rest = Vec::new();
    stream.socket.read_to_end(&mut rest).unwrap();
    assert!(
        rest.iter().all(|&b| b == b'\n' || b == b':'),
        "only heartbeats may follow: {rest:?}"
    );
    server.wait_for("closed", |m| m.closed_publisher == 1);
}

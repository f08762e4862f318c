//! The WebSocket framing rules over real sockets (RFC 6455 §5, §7, §8): one
//! test per rule, each asserting the close code the server fails the
//! connection with and the counter it is recorded in; echo of every length
//! encoding, fragmentation, control frames, the close handshake, push mode
//! and garbage input.

mod util;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use tungstenite::Message;
use util::{
    client_frame, ServerFrame, TestServer, BINARY, CLOSE, CONTINUATION, CONTINUATION_END, MASK,
    PING, PONG, TEXT, TEXT_START,
};
use wspush::{Config, MetricsSnapshot};

/// Long enough that a connection can never end by its close timeout before
/// a test's read (10 s) gives up: every EOF a test sees was sent on purpose.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

fn config() -> Config {
    Config::default().with(|c| {
        c.echo = true;
        c.close_timeout = CLOSE_TIMEOUT;
    })
}

fn echo_server() -> TestServer {
    TestServer::start(config())
}

/// Sends `bytes` on a fresh upgraded connection; the very next thing the
/// server sends must be a close frame. Completes the close (our close, the
/// server's EOF) and returns the server's code.
fn violation(server: &TestServer, bytes: &[u8]) -> u16 {
    let mut stream = util::raw_upgraded(server.addr);
    stream.write_all(bytes).unwrap();
    let code = expect_close_next(&mut stream);
    util::finish_close(&mut stream);
    code
}

/// Reads one frame and checks it is a close with a code and a short UTF-8
/// reason; returns the code.
fn expect_close_next(stream: &mut TcpStream) -> u16 {
    let frame = util::read_frame(stream).expect("a close frame, not EOF");
    assert_eq!(frame.opcode, 0x8, "expected a close frame: {frame:?}");
    assert!(frame.fin);
    let code = frame.close_code().expect("a close code");
    assert!(frame.payload.len() <= 125);
    std::str::from_utf8(&frame.payload[2..]).expect("a UTF-8 close reason");
    code
}

/// Checks every connection in `cases` is failed with `code`, then that the
/// right counter (and only it) counted them once the clients are gone.
fn assert_violations(
    server: &TestServer,
    cases: &[(&str, Vec<u8>)],
    code: u16,
    counter: fn(&MetricsSnapshot) -> u64,
) {
    for (name, bytes) in cases {
        assert_eq!(violation(server, bytes), code, "{name}");
    }
    let n = cases.len() as u64;
    let m = server.wait_for("the failed connections to close", |m| {
        counter(m) == n && m.connections_open == 0
    });
    let failed = m.closed_protocol_error + m.closed_invalid_payload + m.closed_message_too_big;
    assert_eq!(failed, n, "counted once, under one reason: {m:#?}");
    assert_eq!((m.closed_normal, m.closed_abnormal), (0, 0), "{m:#?}");
}

fn protocol_errors(m: &MetricsSnapshot) -> u64 {
    m.closed_protocol_error
}

fn invalid_payloads(m: &MetricsSnapshot) -> u64 {
    m.closed_invalid_payload
}

fn too_big(m: &MetricsSnapshot) -> u64 {
    m.closed_message_too_big
}

/// Reads one frame and checks its opcode and payload.
fn expect_frame(stream: &mut TcpStream, opcode: u8, payload: &[u8]) -> ServerFrame {
    let frame = util::read_frame(stream).expect("a frame, not EOF");
    let summary = |p: &[u8]| format!("{} bytes {:?}", p.len(), &p[..p.len().min(40)]);
    assert_eq!(
        frame.opcode,
        opcode,
        "opcode of a frame of {}",
        summary(&frame.payload)
    );
    assert!(frame.fin, "server frames are final");
    assert!(
        frame.payload == payload,
        "payload: got {}, expected {}",
        summary(&frame.payload),
        summary(payload)
    );
    frame
}

/// Proves nothing else was queued before it: a ping's pong is the next frame.
fn expect_nothing_pending(stream: &mut TcpStream) {
    stream.write_all(&client_frame(PING, b"sync")).unwrap();
    expect_frame(stream, 0xA, b"sync");
}

/// A close frame payload: code and reason.
fn close_payload(code: u16, reason: &[u8]) -> Vec<u8> {
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(reason);
    payload
}

/// A client frame whose header carries `header_len` instead of the real
/// length: only its header, for sizes the test does not send.
fn header_only(first_byte: u8, len: u16) -> Vec<u8> {
    let mut out = vec![first_byte, 0x80 | 126];
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&MASK);
    out
}

// ---------------------------------------------------------------------------
// Frame rules → 1002

#[test]
fn an_unmasked_client_frame_is_1002() {
    let server = echo_server();
    let unmasked_text = vec![0x81, 0x02, b'h', b'i'];
    let unmasked_ping = vec![0x89, 0x00];
    assert_violations(
        &server,
        &[("text", unmasked_text), ("ping", unmasked_ping)],
        1002,
        protocol_errors,
    );
}

#[test]
fn reserved_bits_are_1002() {
    let server = echo_server();
    let cases = [
        ("rsv1", client_frame(TEXT | 0x40, b"a")),
        ("rsv2", client_frame(BINARY | 0x20, b"a")),
        ("rsv3", client_frame(TEXT | 0x10, b"a")),
        ("rsv3 on a ping", client_frame(PING | 0x10, b"")),
    ];
    assert_violations(&server, &cases, 1002, protocol_errors);
}

#[test]
fn reserved_opcodes_are_1002() {
    let server = echo_server();
    let cases: Vec<(&str, Vec<u8>)> = [0x3, 0x7, 0xB, 0xF]
        .into_iter()
        .map(|opcode| ("reserved opcode", client_frame(0x80 | opcode, b"x")))
        .collect();
    assert_violations(&server, &cases, 1002, protocol_errors);
}

#[test]
fn a_control_frame_without_fin_is_1002() {
    let server = echo_server();
    let cases = [
        ("ping", client_frame(PING & 0x7F, b"x")),
        ("pong", client_frame(PONG & 0x7F, b"")),
        ("close", client_frame(CLOSE & 0x7F, &1000u16.to_be_bytes())),
    ];
    assert_violations(&server, &cases, 1002, protocol_errors);
}

#[test]
fn a_ping_with_a_126_byte_payload_is_1002() {
    let server = echo_server();
    let cases = [
        ("ping 126", client_frame(PING, &[b'p'; 126])),
        ("pong 200", client_frame(PONG, &[b'p'; 200])),
        // Refused from the header alone: the payload never comes.
        ("ping header of 1000", header_only(PING, 1000)),
    ];
    assert_violations(&server, &cases, 1002, protocol_errors);
}

#[test]
fn a_continuation_without_a_started_message_is_1002() {
    let server = echo_server();
    let cases = [
        ("final", client_frame(CONTINUATION_END, b"x")),
        ("not final", client_frame(CONTINUATION, b"x")),
        (
            "after a complete message",
            [
                client_frame(TEXT, b"done"),
                client_frame(CONTINUATION_END, b"x"),
            ]
            .concat(),
        ),
    ];
    // The echo of the complete message comes first in the last case.
    for (name, bytes) in &cases {
        let mut stream = util::raw_upgraded(server.addr);
        stream.write_all(bytes).unwrap();
        if name.starts_with("after") {
            expect_frame(&mut stream, 0x1, b"done");
        }
        assert_eq!(expect_close_next(&mut stream), 1002, "{name}");
        util::finish_close(&mut stream);
    }
    server.wait_for("the failed connections", |m| {
        m.closed_protocol_error == 3 && m.connections_open == 0
    });
}

#[test]
fn a_new_data_frame_inside_a_fragmented_message_is_1002() {
    let server = echo_server();
    let cases = [
        (
            "text in text",
            [client_frame(TEXT_START, b"a"), client_frame(TEXT, b"b")].concat(),
        ),
        (
            "binary in text",
            [client_frame(TEXT_START, b"a"), client_frame(BINARY, b"b")].concat(),
        ),
        (
            "text start in binary",
            [
                client_frame(BINARY & 0x7F, b"a"),
                client_frame(CONTINUATION, b"b"),
                client_frame(TEXT_START, b"c"),
            ]
            .concat(),
        ),
    ];
    assert_violations(&server, &cases, 1002, protocol_errors);
}

#[test]
fn a_64_bit_length_with_the_top_bit_set_is_1002() {
    let server = echo_server();
    let mut frame = vec![BINARY, 0x80 | 127];
    frame.extend_from_slice(&(1u64 << 63).to_be_bytes());
    frame.extend_from_slice(&MASK);
    let mut all_ones = vec![TEXT, 0x80 | 127];
    all_ones.extend_from_slice(&u64::MAX.to_be_bytes());
    all_ones.extend_from_slice(&MASK);
    assert_violations(
        &server,
        &[("top bit", frame), ("all ones", all_ones)],
        1002,
        protocol_errors,
    );
}

// ---------------------------------------------------------------------------
// Lengths and echo

/// Reads one frame, checking the length field uses the shortest encoding
/// (RFC 6455 §5.2: "the minimal number of bytes MUST be used").
fn read_frame_checking_length_encoding(stream: &mut TcpStream) -> ServerFrame {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).expect("frame header");
    assert_eq!(head[1] & 0x80, 0, "server frames are not masked");
    let len = match head[1] & 0x7F {
        126 => {
            let mut b = [0u8; 2];
            stream.read_exact(&mut b).unwrap();
            let len = u16::from_be_bytes(b) as u64;
            assert!(len >= 126, "16-bit length {len} should be 7-bit");
            len
        }
        127 => {
            let mut b = [0u8; 8];
            stream.read_exact(&mut b).unwrap();
            let len = u64::from_be_bytes(b);
            assert!(len > 0xFFFF, "64-bit length {len} should be shorter");
            len
        }
        n => u64::from(n),
    };
    let mut payload = vec![0u8; len as usize];
    stream.read_exact(&mut payload).expect("frame payload");
    ServerFrame {
        fin: head[0] & 0x80 != 0,
        rsv: (head[0] >> 4) & 0x07,
        opcode: head[0] & 0x0F,
        payload,
    }
}

#[test]
fn payloads_of_every_length_encoding_are_echoed_identical() {
    let server = echo_server();
    let mut stream = util::raw_upgraded(server.addr);
    let lengths = [0usize, 1, 125, 126, 127, 65535, 65536, (1 << 20) - 1];
    for len in lengths {
        let text: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
        let binary: Vec<u8> = (0..len).map(|i| (i ^ (i >> 8) ^ (i >> 16)) as u8).collect();
        for (first_byte, payload) in [(TEXT, &text), (BINARY, &binary)] {
            stream
                .write_all(&client_frame(first_byte, payload))
                .unwrap();
            let echo = read_frame_checking_length_encoding(&mut stream);
            assert_eq!((echo.fin, echo.opcode), (true, first_byte & 0x0F), "{len}");
            assert!(echo.payload == *payload, "{len}-byte payload differs");
        }
    }
    drop(stream);
    let m = server.wait_for("the close", |m| {
        m.connections_open == 0 && m.buffers_lent == 0
    });
    let n = 2 * lengths.len() as u64;
    assert_eq!((m.messages_received, m.messages_echoed), (n, n));
}

#[test]
fn a_message_of_exactly_the_limit_is_echoed() {
    let server = TestServer::start(config().with(|c| {
        c.max_message_bytes = 1000;
    }));
    let mut stream = util::raw_upgraded(server.addr);
    stream.write_all(&client_frame(BINARY, &[7; 1000])).unwrap();
    expect_frame(&mut stream, 0x2, &[7; 1000]);
    stream
        .write_all(
            &[
                client_frame(TEXT_START, &[b'a'; 600]),
                client_frame(CONTINUATION_END, &[b'b'; 400]),
            ]
            .concat(),
        )
        .unwrap();
    let expected = [[b'a'; 600].as_slice(), [b'b'; 400].as_slice()].concat();
    expect_frame(&mut stream, 0x1, &expected);
    expect_nothing_pending(&mut stream);
}

// ---------------------------------------------------------------------------
// Fragmentation

#[test]
fn a_fragmented_text_with_interleaved_ping_and_pong_is_echoed_once() {
    let server = echo_server();
    let mut stream = util::raw_upgraded(server.addr);
    let wire = [
        client_frame(TEXT_START, b"Hello"),
        client_frame(PING, b"in between"),
        client_frame(CONTINUATION, b", "),
        client_frame(PONG, b"unsolicited"),
        client_frame(CONTINUATION_END, b"world"),
    ]
    .concat();
    stream.write_all(&wire).unwrap();
    expect_frame(&mut stream, 0xA, b"in between");
    expect_frame(&mut stream, 0x1, b"Hello, world");
    expect_nothing_pending(&mut stream);
    // The same, one frame per segment.
    for frame in [
        client_frame(BINARY & 0x7F, &[1, 2]),
        client_frame(PING, b""),
        client_frame(CONTINUATION, &[]),
        client_frame(CONTINUATION_END, &[3]),
    ] {
        stream.write_all(&frame).unwrap();
    }
    expect_frame(&mut stream, 0xA, b"");
    expect_frame(&mut stream, 0x2, &[1, 2, 3]);
    expect_nothing_pending(&mut stream);
    drop(stream);
    let m = server.wait_for("the close", |m| {
        m.connections_open == 0 && m.buffers_lent == 0
    });
    assert_eq!((m.messages_received, m.messages_echoed), (2, 2));
    assert_eq!(m.pings_received, 4);
}

#[test]
fn a_utf8_code_point_split_across_fragments_is_fine() {
    let server = echo_server();
    let mut stream = util::raw_upgraded(server.addr);
    let text = "€ and 𝄞";
    let b = text.as_bytes();
    // € is 3 bytes (split 1/2), 𝄞 is 4 bytes (split 2/1/1).
    let clef = b.len() - 4;
    let wire = [
        client_frame(TEXT_START, &b[..1]),
        client_frame(CONTINUATION, &b[1..clef + 2]),
        client_frame(CONTINUATION, &b[clef + 2..clef + 3]),
        client_frame(CONTINUATION, &[]),
        client_frame(CONTINUATION_END, &b[clef + 3..]),
    ]
    .concat();
    stream.write_all(&wire).unwrap();
    expect_frame(&mut stream, 0x1, b);
    expect_nothing_pending(&mut stream);
}

// ---------------------------------------------------------------------------
// Invalid UTF-8 → 1007

#[test]
fn invalid_utf8_in_one_frame_is_1007() {
    let server = echo_server();
    let cases = [
        ("0xFF", client_frame(TEXT, b"ok\xff")),
        ("surrogate", client_frame(TEXT, b"\xed\xa0\x80")),
        ("overlong", client_frame(TEXT, b"\xc0\xaf")),
        ("above U+10FFFF", client_frame(TEXT, b"\xf4\x90\x80\x80")),
        ("ends mid code point", client_frame(TEXT, b"\xe2\x82")),
    ];
    assert_violations(&server, &cases, 1007, invalid_payloads);
}

#[test]
fn invalid_utf8_across_fragments_is_1007() {
    let server = echo_server();
    let cases = [
        (
            "surrogate split",
            [
                client_frame(TEXT_START, "κ".as_bytes()),
                client_frame(CONTINUATION, b"\xed"),
                client_frame(CONTINUATION_END, b"\xa0\x80"),
            ]
            .concat(),
        ),
        (
            // Failed on the second fragment: the message never ends.
            "F4 | 90 before the end",
            [
                client_frame(TEXT_START, b"abc\xf4"),
                client_frame(CONTINUATION, b"\x90\x80\x80"),
            ]
            .concat(),
        ),
        (
            "ends mid code point",
            [
                client_frame(TEXT_START, b"a\xe2\x82"),
                client_frame(CONTINUATION_END, b""),
            ]
            .concat(),
        ),
    ];
    assert_violations(&server, &cases, 1007, invalid_payloads);
}

#[test]
fn invalid_utf8_fails_fast_inside_a_frame_whose_rest_never_comes() {
    let server = echo_server();
    let mut payload = "κόσμε".as_bytes().to_vec();
    payload.extend_from_slice(b"\xf4\x90\x80\x80");
    payload.resize(1000, b'z');
    let frame = client_frame(TEXT, &payload);
    let header_len = frame.len() - payload.len();
    assert_eq!(header_len, 8);
    // The header says 1000 bytes; only 20 are sent, and the rest never is.
    let prefix = &frame[..header_len + 20];
    assert_violations(
        &server,
        &[("20 of 1000 bytes", prefix.to_vec())],
        1007,
        invalid_payloads,
    );
}

// ---------------------------------------------------------------------------
// Message size limit → 1009

fn limited_server() -> TestServer {
    TestServer::start(config().with(|c| {
        c.max_message_bytes = 1000;
    }))
}

#[test]
fn a_frame_over_the_limit_is_1009_from_its_header_alone() {
    let server = limited_server();
    let cases = [
        ("binary 1001, header only", header_only(BINARY, 1001)),
        ("text 65535, header only", header_only(TEXT, 65535)),
        (
            "binary 2^62, header only",
            [
                vec![BINARY, 0x80 | 127],
                (1u64 << 62).to_be_bytes().to_vec(),
                MASK.to_vec(),
            ]
            .concat(),
        ),
    ];
    assert_violations(&server, &cases, 1009, too_big);
}

#[test]
fn fragments_adding_up_to_over_the_limit_are_1009() {
    let server = limited_server();
    let cases = [
        (
            "600 + 401",
            [
                client_frame(TEXT_START, &[b'a'; 600]),
                client_frame(CONTINUATION_END, &[b'b'; 401]),
            ]
            .concat(),
        ),
        (
            // Refused at the third header; its payload is not sent.
            "500 + 500 + 1, header only",
            [
                client_frame(BINARY & 0x7F, &[1; 500]),
                client_frame(CONTINUATION, &[2; 500]),
                client_frame(CONTINUATION_END, &[3])[..6].to_vec(),
            ]
            .concat(),
        ),
    ];
    assert_violations(&server, &cases, 1009, too_big);
}

// ---------------------------------------------------------------------------
// Ping and pong

#[test]
fn a_ping_gets_a_pong_with_the_same_payload() {
    let server = echo_server();
    let mut stream = util::raw_upgraded(server.addr);
    let longest: Vec<u8> = (0..125u8).collect();
    for payload in [&b""[..], b"x", &longest] {
        stream.write_all(&client_frame(PING, payload)).unwrap();
        expect_frame(&mut stream, 0xA, payload);
    }
    // An unsolicited pong gets no answer.
    stream.write_all(&client_frame(PONG, b"ignored")).unwrap();
    expect_nothing_pending(&mut stream);
    drop(stream);
    let m = server.wait_for("the close", |m| m.connections_open == 0);
    assert_eq!((m.pings_received, m.messages_received), (4, 0));
}

// ---------------------------------------------------------------------------
// The close handshake

#[test]
fn a_close_with_1000_and_a_reason_is_echoed_then_the_server_ends_tcp() {
    let server = echo_server();
    let mut stream = util::raw_upgraded(server.addr);
    stream
        .write_all(&client_frame(CLOSE, &close_payload(1000, b"bye now")))
        .unwrap();
    assert_eq!(expect_close_next(&mut stream), 1000);
    util::expect_eof(&mut stream);
    drop(stream);
    // The open gauge is published at the end of the loop's iteration.
    let m = server.wait_for("the close", |m| {
        m.closed_normal == 1 && m.connections_open == 0
    });
    assert_eq!(m.closed_abnormal, 0);
}

#[test]
fn a_close_without_a_code_gets_a_close_then_the_server_ends_tcp() {
    let server = echo_server();
    let mut stream = util::raw_upgraded(server.addr);
    stream.write_all(&client_frame(CLOSE, b"")).unwrap();
    let frame = util::read_frame(&mut stream).expect("a close frame");
    assert_eq!(frame.opcode, 0x8);
    assert!(
        frame.payload.is_empty() || frame.close_code() == Some(1000),
        "an empty close, or 1000 (never 1005 on the wire): {frame:?}"
    );
    util::expect_eof(&mut stream);
    drop(stream);
    server.wait_for("the close", |m| m.closed_normal == 1);
}

#[test]
fn valid_close_codes_are_echoed() {
    let server = echo_server();
    let codes = [
        1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999, 4000,
        4999,
    ];
    for code in codes {
        let mut stream = util::raw_upgraded(server.addr);
        stream
            .write_all(&client_frame(CLOSE, &close_payload(code, b"reason")))
            .unwrap();
        assert_eq!(expect_close_next(&mut stream), code);
        util::expect_eof(&mut stream);
    }
    let m = server.wait_for("the closes", |m| {
        m.closed_normal == codes.len() as u64 && m.connections_open == 0
    });
    assert_eq!(m.closed_protocol_error, 0);
}

#[test]
fn invalid_close_codes_are_1002() {
    let server = echo_server();
    let codes = [
        0, 999, 1004, 1005, 1006, 1015, 1016, 2000, 2999, 5000, 65535,
    ];
    let cases: Vec<(&str, Vec<u8>)> = codes
        .iter()
        .map(|&code| {
            (
                "invalid code",
                client_frame(CLOSE, &close_payload(code, b"")),
            )
        })
        .collect();
    assert_violations(&server, &cases, 1002, protocol_errors);
}

#[test]
fn a_close_with_a_one_byte_payload_is_1002() {
    let server = echo_server();
    assert_violations(
        &server,
        &[("one byte", client_frame(CLOSE, &[0x03]))],
        1002,
        protocol_errors,
    );
}

#[test]
fn a_close_reason_that_is_not_utf8_is_1007() {
    let server = echo_server();
    let cases = [
        ("0xFF", client_frame(CLOSE, &close_payload(1000, b"\xff"))),
        (
            "truncated",
            client_frame(CLOSE, &close_payload(1000, b"ok \xe2\x82")),
        ),
    ];
    assert_violations(&server, &cases, 1007, invalid_payloads);
}

#[test]
fn after_the_clients_close_the_server_sends_only_its_close() {
    let server = echo_server();
    let mut stream = util::raw_upgraded(server.addr);
    // A message before the close is echoed; what follows the close is not
    // answered at all, not even the ping or the invalid frame.
    let wire = [
        client_frame(TEXT, b"before"),
        client_frame(CLOSE, &close_payload(1001, b"")),
        client_frame(TEXT, b"after"),
        client_frame(PING, b"after"),
        client_frame(0x83, b"reserved opcode after"),
    ]
    .concat();
    stream.write_all(&wire).unwrap();
    expect_frame(&mut stream, 0x1, b"before");
    assert_eq!(expect_close_next(&mut stream), 1001);
    util::expect_eof(&mut stream);
    drop(stream);
    let m = server.wait_for("the close", |m| m.closed_normal == 1);
    assert_eq!((m.messages_echoed, m.pings_received), (1, 0));
    assert_eq!(m.closed_protocol_error, 0);
}

// ---------------------------------------------------------------------------
// Push mode

#[test]
fn push_mode_discards_and_counts_client_messages_but_answers_pings() {
    let server = TestServer::start(Config::default().with(|c| {
        c.close_timeout = CLOSE_TIMEOUT;
    }));
    let mut stream = util::raw_upgraded(server.addr);
    let wire = [
        client_frame(TEXT, b"nobody listens"),
        client_frame(BINARY, &[0; 70_000]),
        client_frame(TEXT_START, b"frag"),
        client_frame(CONTINUATION_END, b"mented"),
        client_frame(PING, b"are you there"),
    ]
    .concat();
    stream.write_all(&wire).unwrap();
    // Nothing came back before the pong.
    expect_frame(&mut stream, 0xA, b"are you there");
    let m = server.wait_for("the messages", |m| m.messages_received == 3);
    assert_eq!((m.messages_echoed, m.pings_received), (0, 1));
    // A broadcast still arrives, then the close handshake is normal.
    server.handle.broadcast_text("news").unwrap();
    expect_frame(&mut stream, 0x1, b"news");
    stream
        .write_all(&client_frame(CLOSE, &close_payload(1000, b"")))
        .unwrap();
    assert_eq!(expect_close_next(&mut stream), 1000);
    util::expect_eof(&mut stream);
    drop(stream);
    server.wait_for("the close", |m| m.closed_normal == 1 && m.buffers_lent == 0);
}

// ---------------------------------------------------------------------------
// Garbage

/// Sends `garbage` after the upgrade, half-closes, and collects what the
/// server sends until it ends the connection.
fn send_garbage(server: &TestServer, garbage: &[u8]) -> Vec<ServerFrame> {
    let mut stream = util::raw_upgraded(server.addr);
    // The server may fail the connection before taking it all.
    let _ = stream.write_all(garbage);
    let _ = stream.shutdown(Shutdown::Write);
    let mut frames = Vec::new();
    while let Some(frame) = util::read_frame(&mut stream) {
        let is_close = frame.opcode == 0x8;
        frames.push(frame);
        if is_close {
            util::expect_eof(&mut stream);
            break;
        }
    }
    frames
}

#[test]
fn ff_bytes_after_the_upgrade_are_1002() {
    let server = echo_server();
    let frames = send_garbage(&server, &[0xFF; 1024]);
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0].close_code(), Some(1002));
    server.wait_for("the close", |m| {
        m.closed_protocol_error == 1 && m.connections_open == 0
    });
    let mut client = util::connect(server.addr, "/");
    client.send(Message::text("after garbage")).unwrap();
    assert_eq!(client.read().unwrap(), Message::text("after garbage"));
}

#[test]
fn random_bytes_after_the_upgrade_end_the_connection_and_the_server_survives() {
    let server = echo_server();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut random = |len: usize| -> Vec<u8> {
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect()
    };
    // Whatever the bytes parse as (frames to echo, a failure, a frame
    // still waiting for its payload at our EOF), the connection ends.
    for _ in 0..20 {
        send_garbage(&server, &random(1024));
    }
    let m = server.wait_for("every garbage connection to close", |m| {
        m.connections_open == 0 && m.buffers_lent == 0
    });
    assert_eq!(m.upgrades, 20);
    let closed = m.closed_protocol_error
        + m.closed_invalid_payload
        + m.closed_message_too_big
        + m.closed_normal
        + m.closed_abnormal;
    assert_eq!(closed, 20, "{m:#?}");
    let mut client = util::connect(server.addr, "/");
    client.send(Message::binary(vec![0xFF; 3])).unwrap();
    assert_eq!(client.read().unwrap(), Message::binary(vec![0xFF; 3]));
}

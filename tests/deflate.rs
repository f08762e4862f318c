//! permessage-deflate (RFC 7692) on the wire: the 101's answer, compressed
//! client messages inflated, echoes and broadcasts compressed (these
//! once for every connection that negotiated it), and the errors: a zip
//! bomb, corrupt data, RSV1 where it does not belong. The compressed
//! payloads are made, and the server's inflated, by zlib (flate2) here,
//! as a browser does.

mod util;

use std::io::Write;

use util::deflate::{deflated, inflated, upgrade, BROWSER_OFFER, RSV1};
use util::{client_frame, expect_close, read_frame, TestServer, TEXT};
use wspush::Config;

/// A server that echoes, with deflate on (or off).
fn echo_server(deflate: bool) -> TestServer {
    TestServer::start(Config::default().with(|c| {
        c.echo = true;
        c.deflate = deflate;
        c.max_message_bytes = 64 * 1024;
    }))
}

#[test]
fn an_offer_is_answered_without_context_takeover_and_messages_are_inflated() {
    let server = echo_server(true);
    let (mut client, answer) = upgrade(server.addr, Some(BROWSER_OFFER));
    assert_eq!(
        answer.as_deref(),
        Some("permessage-deflate; server_no_context_takeover; client_no_context_takeover")
    );
    // Echoes of --deflate-min-bytes (256) or more go back compressed.
    let big = "{\"price\":1.0842}".repeat(500);
    for message in ["hello", "", &big] {
        let frame = client_frame(TEXT | RSV1, &deflated(message.as_bytes()));
        client.write_all(&frame).unwrap();
        let echoed = read_frame(&mut client).unwrap();
        assert_eq!(echoed.opcode, 1);
        if message.len() >= 256 {
            assert_eq!(echoed.rsv, 4, "compressed");
            assert!(echoed.payload.len() < message.len() / 10);
            assert_eq!(inflated(&echoed.payload), message.as_bytes());
        } else {
            assert_eq!(
                (echoed.rsv, echoed.payload.as_slice()),
                (0, message.as_bytes())
            );
        }
    }
    // A plain message on the same connection is still a message: echoed
    // plain when small, compressed when big.
    client.write_all(&client_frame(TEXT, b"plain")).unwrap();
    assert_eq!(read_frame(&mut client).unwrap().payload, b"plain");
    client
        .write_all(&client_frame(TEXT, big.as_bytes()))
        .unwrap();
    let echoed = read_frame(&mut client).unwrap();
    assert_eq!(
        (echoed.rsv, inflated(&echoed.payload)),
        (4, big.clone().into_bytes())
    );
    let m = server.wait_for("the messages", |m| m.messages_echoed == 5);
    assert_eq!(m.messages_received, 5);

    // One that asked for a window under 32 KiB gets its echoes plain.
    let offer = "permessage-deflate; server_max_window_bits=9";
    let (mut small_window, _) = upgrade(server.addr, Some(offer));
    let frame = client_frame(TEXT | RSV1, &deflated(big.as_bytes()));
    small_window.write_all(&frame).unwrap();
    let echoed = read_frame(&mut small_window).unwrap();
    assert_eq!((echoed.rsv, echoed.payload.as_slice()), (0, big.as_bytes()));
}

#[test]
fn a_fragmented_compressed_message_is_inflated_whole() {
    let server = echo_server(true);
    let (mut client, _) = upgrade(server.addr, Some("permessage-deflate"));
    let message = "fragments ".repeat(300);
    let payload = deflated(message.as_bytes());
    let (a, b) = payload.split_at(payload.len() / 2);
    // First frame: text, RSV1, FIN clear; then a final continuation.
    client.write_all(&client_frame(0x01 | RSV1, a)).unwrap();
    client.write_all(&client_frame(0x80, b)).unwrap();
    let echoed = read_frame(&mut client).unwrap();
    assert_eq!(
        (echoed.rsv, inflated(&echoed.payload)),
        (4, message.into_bytes())
    );
}

#[test]
fn without_deflate_on_or_offered_there_is_no_answer_and_rsv1_is_an_error() {
    for (deflate, offer) in [(false, Some(BROWSER_OFFER)), (true, None)] {
        let server = echo_server(deflate);
        let (mut client, answer) = upgrade(server.addr, offer);
        assert_eq!(answer, None);
        client
            .write_all(&client_frame(TEXT | RSV1, &deflated(b"x")))
            .unwrap();
        assert_eq!(expect_close(&mut client), 1002);
    }
}

#[test]
fn rsv1_on_a_control_frame_or_a_continuation_is_a_protocol_error() {
    let server = echo_server(true);
    let (mut client, _) = upgrade(server.addr, Some(BROWSER_OFFER));
    client
        .write_all(&client_frame(0x89 | RSV1, b"ping"))
        .unwrap();
    assert_eq!(expect_close(&mut client), 1002);

    let (mut client, _) = upgrade(server.addr, Some(BROWSER_OFFER));
    let payload = deflated(b"two frames");
    client
        .write_all(&client_frame(0x01 | RSV1, &payload[..3]))
        .unwrap();
    client
        .write_all(&client_frame(0x80 | RSV1, &payload[3..]))
        .unwrap();
    assert_eq!(expect_close(&mut client), 1002);
}

#[test]
fn a_zip_bomb_gets_1009_without_being_inflated_whole() {
    let server = echo_server(true);
    let (mut client, _) = upgrade(server.addr, Some(BROWSER_OFFER));
    // 16 MiB of zeros in about 16 KiB: within the 64 KiB limit on the
    // wire, 256 times over it inflated.
    let bomb = deflated(&vec![0u8; 16 << 20]);
    assert!(bomb.len() < 64 * 1024, "{} bytes", bomb.len());
    client.write_all(&client_frame(0x82 | RSV1, &bomb)).unwrap();
    assert_eq!(expect_close(&mut client), 1009);
    let m = server.wait_for("the close", |m| m.connections_open == 0);
    assert_eq!(m.messages_echoed, 0);
}

#[test]
fn corrupt_data_and_compressed_text_that_is_not_utf8_get_1007() {
    let server = echo_server(true);
    let (mut client, _) = upgrade(server.addr, Some(BROWSER_OFFER));
    // A block of the reserved type 11.
    client
        .write_all(&client_frame(TEXT | RSV1, &[0xff, 0xff, 0xff, 0xff]))
        .unwrap();
    assert_eq!(expect_close(&mut client), 1007);

    let (mut client, _) = upgrade(server.addr, Some(BROWSER_OFFER));
    client
        .write_all(&client_frame(TEXT | RSV1, &deflated(b"caf\xe9")))
        .unwrap();
    assert_eq!(expect_close(&mut client), 1007);
    // As binary, the same bytes are fine.
    let (mut client, _) = upgrade(server.addr, Some(BROWSER_OFFER));
    client
        .write_all(&client_frame(0x82 | RSV1, &deflated(b"caf\xe9")))
        .unwrap();
    assert_eq!(read_frame(&mut client).unwrap().payload, b"caf\xe9");
}

#[test]
fn a_broadcast_is_compressed_once_for_the_connections_that_negotiated_it() {
    let server = TestServer::start(Config::default().with(|c| {
        c.deflate = true;
        c.deflate_min_bytes = 256;
    }));
    // Nothing is compressed while no connection has deflate.
    let (mut plain, _) = upgrade(server.addr, None);
    let big = "{\"symbol\":\"EURUSD\",\"bid\":1.0842,\"ask\":1.0843}".repeat(30);
    server.handle.broadcast_text(big.clone()).unwrap();
    assert_eq!(read_frame(&mut plain).unwrap().payload, big.as_bytes());
    assert_eq!(server.handle.metrics().broadcasts_compressed, 0);

    let (mut deflating, answer) = upgrade(server.addr, Some(BROWSER_OFFER));
    assert!(answer.is_some());
    server.wait_for("the deflate connection", |m| m.connections_deflate == 1);
    // A big one, a small one and a big binary one, framed together.
    let small = "tick".to_string();
    server.handle.broadcast_text(big.clone()).unwrap();
    server.handle.broadcast_text(small.clone()).unwrap();
    server.handle.broadcast_binary(big.as_bytes()).unwrap();
    for (opcode, message) in [(1, &big), (1, &small), (2, &big)] {
        let frame = read_frame(&mut plain).unwrap();
        assert_eq!((frame.rsv, frame.opcode), (0, opcode));
        assert_eq!(frame.payload, message.as_bytes());
        let frame = read_frame(&mut deflating).unwrap();
        let compressed = message.len() >= 256;
        assert_eq!(
            (frame.rsv, frame.opcode),
            (if compressed { 4 } else { 0 }, opcode)
        );
        if compressed {
            assert!(
                frame.payload.len() < message.len() / 5,
                "{}",
                frame.payload.len()
            );
            assert_eq!(inflated(&frame.payload), message.as_bytes());
        } else {
            assert_eq!(frame.payload, message.as_bytes());
        }
    }
    assert_eq!(server.handle.metrics().broadcasts_compressed, 2);

    // One that asked for a window under 32 KiB gets them plain.
    let (mut small_window, answer) = upgrade(
        server.addr,
        Some("permessage-deflate; server_max_window_bits=10"),
    );
    assert!(answer.unwrap().ends_with("; server_max_window_bits=10"));
    server.handle.broadcast_text(big.clone()).unwrap();
    let frame = read_frame(&mut small_window).unwrap();
    assert_eq!((frame.rsv, frame.payload.as_slice()), (0, big.as_bytes()));
    assert_eq!(read_frame(&mut deflating).unwrap().rsv, 4);
    drop((deflating, small_window));
    server.wait_for("their closes", |m| m.connections_deflate == 0);
}

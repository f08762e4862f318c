//! Echo mode (`--echo`): every message comes back whole, with its opcode,
//! up to the configured size, however it was fragmented.

mod util;

use std::io::Write;

use tungstenite::Message;
use util::{
    client_frame, connect, raw_upgraded, read_frame, TestServer, BINARY, CONTINUATION,
    CONTINUATION_END, PING, TEXT_START,
};
use wspush::Config;

const MIB: usize = 1 << 20;

fn big_echo_server() -> TestServer {
    TestServer::start(Config::default().with(|c| {
        c.echo = true;
        c.max_message_bytes = 16 * MIB as u64;
    }))
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn text_and_binary_messages_come_back_with_their_opcode() {
    let server = TestServer::echo();
    let mut client = connect(server.addr, "/");
    let messages = [
        Message::text("hello"),
        Message::text(""),
        Message::text("κόσμε 𝄞"),
        Message::binary(vec![0u8, 255, 1, 254]),
        Message::binary(Vec::new()),
    ];
    for message in messages {
        client.send(message.clone()).unwrap();
        assert_eq!(client.read().unwrap(), message);
    }
    assert_eq!(server.handle.metrics().messages_echoed, 5);
}

#[test]
fn sixteen_mebibyte_messages_echo_when_configured() {
    let server = big_echo_server();
    let mut client = connect(server.addr, "/");
    let binary = pattern(16 * MIB);
    client.send(Message::binary(binary.clone())).unwrap();
    assert_eq!(client.read().unwrap().into_data(), binary);
    let text = "é".repeat(8 * MIB); // 16 MiB of two-byte code points
    client.send(Message::text(text.clone())).unwrap();
    assert_eq!(client.read().unwrap(), Message::text(text));
}

#[test]
fn a_fragmented_sixteen_mebibyte_message_comes_back_whole() {
    let server = big_echo_server();
    let mut stream = raw_upgraded(server.addr);
    let payload = pattern(16 * MIB);
    let quarters: Vec<&[u8]> = payload.chunks(4 * MIB).collect();
    let mut wire = client_frame(BINARY & 0x0F, quarters[0]); // FIN clear, binary
    wire.extend(client_frame(PING, b"mid-message"));
    wire.extend(client_frame(CONTINUATION, quarters[1]));
    wire.extend(client_frame(CONTINUATION, quarters[2]));
    wire.extend(client_frame(CONTINUATION_END, quarters[3]));
    stream.write_all(&wire).unwrap();

    let pong = read_frame(&mut stream).unwrap();
    assert_eq!(
        (pong.opcode, pong.payload.as_slice()),
        (0xA, &b"mid-message"[..])
    );
    let echo = read_frame(&mut stream).unwrap();
    assert!(echo.fin);
    assert_eq!(echo.opcode, 0x2);
    assert!(echo.payload == payload, "the echoed message differs");
}

#[test]
fn fragmented_text_is_echoed_as_one_message() {
    let server = TestServer::echo();
    let mut stream = raw_upgraded(server.addr);
    let text = "fragmented κόσμε".as_bytes();
    let mut wire = client_frame(TEXT_START, &text[..12]); // splits a code point
    wire.extend(client_frame(CONTINUATION, &text[12..13]));
    wire.extend(client_frame(CONTINUATION_END, &text[13..]));
    stream.write_all(&wire).unwrap();
    let echo = read_frame(&mut stream).unwrap();
    assert_eq!(
        (echo.fin, echo.opcode, echo.payload.as_slice()),
        (true, 0x1, text)
    );
}

//! The HTTP publish listener of the binary (`--publish-listen`): every
//! status it answers, 1,000 requests on one keep-alive connection, a
//! request written a byte at a time, command lines taken whatever
//! `--input` is, `/stats`, backpressure (503 and nothing taken lost), and
//! under `--processes 3` an id's message reaching its clients on every
//! instance.

mod util;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use util::{
    publish_addr, raw, read_response, texts, Binary, HttpResponse, KeyFile, PUBLISH_KEY as KEY,
};

/// A server with a publish listener, and that listener's address.
fn start(key: &KeyFile, args: &[&str]) -> (Binary, SocketAddr) {
    let mut all = vec![
        "--publish-listen",
        "127.0.0.1:0",
        "--publish-key-file",
        key.path(),
    ];
    all.extend_from_slice(args);
    let server = Binary::start(&all);
    let addr = publish_addr(&server.process.wait_for("publish on http://"));
    (server, addr)
}

fn post(target: &str, body: &[u8], extra: &str) -> Vec<u8> {
    let mut request = format!(
        "POST {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

fn ask(stream: &mut TcpStream, request: &[u8]) -> HttpResponse {
    stream.write_all(request).unwrap();
    read_response(stream)
}

#[test]
fn each_status_names_what_it_refused_and_the_connection_goes_on() {
    let key = KeyFile::new();
    let (server, publish) = start(&key, &["--max-pending-bytes", "4096"]);
    let mut client = util::connect(server.addr, "/?id=alice&channel=news");
    let mut stream = raw(publish);
    let mut status = |request: Vec<u8>| {
        let response = ask(&mut stream, &request);
        (response.status, response.body.trim_end().to_string())
    };
    assert_eq!(
        status(post("/publish", b"all one\npub news two\n", "")),
        (200, r#"{"lines":2}"#.into())
    );
    let (code, why) = status(post("/publish", b"all fine\nshout it\n", ""));
    assert_eq!(code, 400);
    assert!(why.starts_with("line 2: unknown command"), "{why}");
    assert_eq!(status(post("/elsewhere", b"", "")).0, 404);
    assert_eq!(status(b"GET /publish HTTP/1.1\r\n\r\n".to_vec()).0, 405);
    assert_eq!(
        status(post("/publish?id=alice", b"three", "")),
        (200, r#"{"lines":1}"#.into())
    );
    let binary = "Content-Type: application/octet-stream\r\n";
    assert_eq!(
        status(post("/publish?id=alice", b"\x00\xff", binary)).0,
        200
    );
    // What was taken arrived, in order; what was refused did not.
    assert_eq!(texts(&mut client, 3), ["one", "two", "three"]);
    match client.read().unwrap() {
        tungstenite::Message::Binary(bytes) => assert_eq!(&bytes[..], b"\x00\xff"),
        other => panic!("not binary: {other:?}"),
    }
    // Refusals that leave a body unread close the connection.
    let closing = [
        (post("/publish", b"all x", "").replace_key("wrong-key"), 401),
        (
            b"POST /publish HTTP/1.1\r\nAuthorization: Bearer the-publishers-key\r\n\r\n".to_vec(),
            411,
        ),
        (post("/publish", &[b'a'; 5000], ""), 413),
        (post("/publish", b"", "Transfer-Encoding: chunked\r\n"), 501),
    ];
    for (request, want) in closing {
        let mut stream = raw(publish);
        let response = ask(&mut stream, &request);
        assert_eq!(response.status, want, "{}", response.body);
        assert_eq!(response.header("Connection"), Some("close"));
        if want == 401 {
            assert_eq!(response.header("WWW-Authenticate"), Some("Bearer"));
        }
        let mut rest = Vec::new();
        assert_eq!(stream.read_to_end(&mut rest).unwrap(), 0, "closed");
    }
    let stats = ask(
        &mut raw(publish),
        format!("GET /stats HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n\r\n").as_bytes(),
    );
    assert_eq!(stats.status, 200);
    assert!(
        stats
            .body
            .starts_with(r#"{"connections":1,"channels":1,"publish":{"#),
        "{}",
        stats.body
    );
    assert!(
        stats.body.contains(r#""lines":4"#) && stats.body.contains(r#""401":1"#),
        "{}",
        stats.body
    );
}

trait ReplaceKey {
    fn replace_key(self, with: &str) -> Vec<u8>;
}

impl ReplaceKey for Vec<u8> {
    fn replace_key(self, with: &str) -> Vec<u8> {
        String::from_utf8(self)
            .unwrap()
            .replace(KEY, with)
            .into_bytes()
    }
}

#[test]
fn a_thousand_requests_on_one_connection_and_one_a_byte_at_a_time() {
    let key = KeyFile::new();
    // Lines mode: the published lines are commands all the same.
    let (server, publish) = start(&key, &[]);
    let mut client = util::connect(server.addr, "/?id=reader");
    let mut stream = raw(publish);
    for i in 0..1000 {
        let response = ask(
            &mut stream,
            &post("/publish", format!("id reader m{i}").as_bytes(), ""),
        );
        assert_eq!(response.status, 200, "request {i}: {}", response.body);
    }
    // Pipelined: 100 more written at once, answered in order.
    let pipelined: Vec<u8> = (1000..1100)
        .flat_map(|i| post("/publish?all", format!("m{i}").as_bytes(), ""))
        .collect();
    stream.write_all(&pipelined).unwrap();
    for i in 1000..1100 {
        assert_eq!(read_response(&mut stream).status, 200, "request {i}");
    }
    // One request, a byte per write.
    let mut slow = raw(publish);
    for byte in post("/publish", b"all split\nid reader at every byte", "") {
        slow.write_all(&[byte]).unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(read_response(&mut slow).body.trim_end(), r#"{"lines":2}"#);
    let want: Vec<String> = (0..1100)
        .map(|i| format!("m{i}"))
        .chain(["split".into(), "at every byte".into()])
        .collect();
    assert_eq!(texts(&mut client, want.len()), want);
}

#[test]
fn while_the_feed_is_behind_publishers_get_503_and_nothing_taken_is_lost() {
    let key = KeyFile::new();
    util::need_open_files(2000);
    let (mut server, publish) = start(
        &key,
        &["--max-pending-bytes", "2048", "--input", "commands"],
    );
    let mut reader = util::connect(server.addr, "/?id=reader");
    // 1,000 connections of alice, whose 16 subscriptions standard input
    // changes 16 times: seconds of the loop's work, the feed behind.
    let alices: Vec<TcpStream> = (0..1000)
        .map(|_| {
            let mut stream = raw(server.addr);
            stream
                .write_all(util::upgrade_request("/?id=alice").as_bytes())
                .unwrap();
            assert_eq!(read_response(&mut stream).status, 101);
            stream
        })
        .collect();
    let channels: Vec<String> = (0..16).map(|c| format!("c{c}")).collect();
    let churn: String = (0..16)
        .map(|i| format!("{} alice {}\n", ["sub", "unsub"][i % 2], channels.join(",")))
        .collect();
    let mut stdin = server.process.child.stdin.take().unwrap();
    let feeding = std::thread::spawn(move || {
        stdin.write_all(churn.as_bytes()).unwrap();
        stdin
    });
    let mut stream = raw(publish);
    let (mut taken, mut busy) = (Vec::new(), 0);
    for i in 0..300 {
        let response = ask(
            &mut stream,
            &post("/publish?id=reader", format!("m{i}").as_bytes(), ""),
        );
        match response.status {
            200 => taken.push(format!("m{i}")),
            503 => {
                assert_eq!(response.header("Retry-After"), Some("1"));
                assert_eq!(response.header("Connection"), Some("keep-alive"));
                busy += 1;
            }
            other => panic!("request {i}: {other} {}", response.body),
        }
    }
    assert!(busy > 0, "the feed never backed up");
    assert!(!taken.is_empty(), "nothing taken");
    drop(feeding.join().unwrap());
    // Once the feed has caught up, requests are taken again.
    let mut last = 0;
    while ask(&mut stream, &post("/publish?id=reader", b"end", "")).status != 200 {
        last += 1;
        assert!(last < 100, "the feed never caught up");
        std::thread::sleep(Duration::from_millis(100));
    }
    taken.push("end".into());
    assert_eq!(
        texts(&mut reader, taken.len()),
        taken,
        "every message taken, once, in order ({busy} refused)"
    );
    drop(alices);
}

#[test]
fn under_three_processes_an_ids_message_reaches_it_on_every_instance() {
    let key = KeyFile::new();
    let mut process = util::Logged::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_wspush"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--processes",
                "3",
                "--publish-listen",
            ])
            .args(["127.0.0.1:0", "--publish-key-file", key.path()])
            .stdin(std::process::Stdio::piped()),
    );
    // The supervisor's address and the publish listener's, and each
    // instance listening, in whatever order they are logged.
    let (mut addr, mut publish, mut listening) = (None, None, 0);
    while addr.is_none() || publish.is_none() || listening < 3 {
        let line = process.next_line();
        if line.contains(" instances, up to") {
            addr = Some(util::listening_addr(&line));
        } else if line.contains("publish on http://") {
            publish = Some(publish_addr(&line));
        } else if line.contains("] listening on ") {
            listening += 1;
        }
    }
    let (addr, publish) = (addr.unwrap(), publish.unwrap());
    let stats = |stream: &mut TcpStream| {
        let request = format!("GET /stats HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n\r\n");
        ask(stream, request.as_bytes()).body
    };
    let mut stream = raw(publish);
    // Clients of alice until every instance holds some (SO_REUSEPORT
    // spreads them), as /stats says once each instance has told it.
    let mut clients = Vec::new();
    let spread = |body: &str| {
        body.matches(r#""connections":0"#).count() == 0
            && body.matches("\"instance\":").count() == 3
    };
    for round in 0.. {
        assert!(round < 50, "never on all three: {}", stats(&mut stream));
        clients.extend((0..10).map(|_| util::connect(addr, "/?id=alice")));
        std::thread::sleep(Duration::from_millis(1100));
        let body = stats(&mut stream);
        if spread(&body) && body.starts_with(&format!("{{\"connections\":{},", clients.len())) {
            break;
        }
    }
    let response = ask(
        &mut stream,
        &post("/publish?id=alice", b"to alice everywhere", ""),
    );
    assert_eq!(response.status, 200);
    for client in &mut clients {
        assert_eq!(texts(client, 1), ["to alice everywhere"]);
    }
    // Standard input is read in lines mode: a line is a message to all.
    process.send(b"from stdin too\n");
    for client in &mut clients {
        assert_eq!(texts(client, 1), ["from stdin too"]);
    }
}

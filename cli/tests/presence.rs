//! Presence on the publish listener (`GET /presence`, `GET /clients`):
//! across the instances of `--processes 3` (merged, paged through the
//! cursor), and, alone as under a supervisor, after `sub` and `unsub`
//! commands and closes, down to an empty channel once its last
//! subscriber left.

mod util;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;
use util::{publish_addr, raw, read_response, KeyFile, PUBLISH_KEY as KEY};

/// A server (with `args`) with a publish listener: its process, its
/// address and its publish listener's.
fn start(key: &KeyFile, args: &[&str]) -> (util::Logged, SocketAddr, SocketAddr) {
    let process = util::Logged::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_wspush"))
            .args(["--listen", "127.0.0.1:0", "--input", "commands"])
            .args(["--publish-listen", "127.0.0.1:0"])
            .args(["--publish-key-file", key.path()])
            .args(args)
            .stdin(std::process::Stdio::piped()),
    );
    let supervised = args.contains(&"--processes");
    let (mut addr, mut publish) = (None, None);
    while addr.is_none() || publish.is_none() {
        let line = process.next_line();
        if line.contains("publish on http://") {
            publish = Some(publish_addr(&line));
        } else if line.contains(" instances, up to")
            || !supervised && line.contains("listening on ")
        {
            addr = Some(util::listening_addr(&line));
        }
    }
    (process, addr.unwrap(), publish.unwrap())
}

/// Asks `target` of the publish listener: its status and JSON.
fn get(publish: SocketAddr, target: &str) -> (u16, Value) {
    let mut stream = raw(publish);
    let request = format!("GET {target} HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let response = read_response(&mut stream);
    let body = serde_json::from_str(&response.body).unwrap_or(Value::String(response.body));
    (response.status, body)
}

fn ok(publish: SocketAddr, target: &str) -> Value {
    let (status, body) = get(publish, target);
    assert_eq!(status, 200, "{target}: {body}");
    body
}

fn publish_lines(publish: SocketAddr, lines: &str) {
    let mut stream: TcpStream = raw(publish);
    let request = format!(
        "POST /publish HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nContent-Length: {}\r\n\r\n{lines}",
        lines.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    assert_eq!(read_response(&mut stream).status, 200);
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// A channel's connection count and ids, as `/presence` says.
fn presence(publish: SocketAddr, channel: &str) -> (u64, Vec<String>) {
    let body = ok(publish, &format!("/presence?channel={channel}"));
    (body["connections"].as_u64().unwrap(), strings(&body["ids"]))
}

/// Asks until `done` holds of the answer (a close is noticed by the
/// server a little after the client closes); the last answer.
fn until(
    publish: SocketAddr,
    channel: &str,
    done: impl Fn(&(u64, Vec<String>)) -> bool,
) -> (u64, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = presence(publish, channel);
        if done(&answer) || Instant::now() > deadline {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn presence_covers_every_instance_and_pages_through_its_cursor() {
    let key = KeyFile::new();
    let (_server, addr, publish) = start(&key, &["--processes", "3"]);
    let ids: Vec<String> = (0..30).map(|n| format!("u{n:02}")).collect();
    let mut clients: Vec<_> = ids
        .iter()
        .map(|id| util::connect(addr, &format!("/?id={id}&channel=room")))
        .collect();
    clients.extend((0..3).map(|_| util::connect(addr, "/?channel=room")));
    let mut event_stream = raw(addr);
    event_stream
        .write_all(b"GET /?id=reader&channel=room HTTP/1.1\r\nAccept: text/event-stream\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut event_stream).status, 200);

    // Every connection counts; every id comes once, in order.
    let (connections, listed) = presence(publish, "room");
    let mut all = ids.clone();
    all.push("reader".into());
    all.sort();
    assert_eq!((connections, listed), (34, all.clone()));

    // Page by page, 7 at a time, the cursor goes through them all.
    let mut paged = Vec::new();
    let mut target = "/presence?channel=room&limit=7".to_string();
    loop {
        let body = ok(publish, &target);
        let page = strings(&body["ids"]);
        assert!(page.len() <= 7);
        assert_eq!(body["connections"], 34);
        paged.extend(page);
        match body["next"].as_str() {
            Some(next) => target = format!("/presence?channel=room&limit=7&after={next}"),
            None => break,
        }
    }
    assert_eq!(paged, all);

    // Each client's connection, on whichever instance holds it.
    let mut instances = std::collections::BTreeSet::new();
    for id in &ids {
        let body = ok(publish, &format!("/clients?id={id}"));
        let conns = body["connections"].as_array().unwrap();
        assert_eq!(conns.len(), 1, "{body}");
        assert_eq!(conns[0]["transport"], "websocket");
        assert_eq!(strings(&conns[0]["channels"]), ["room"]);
        let instance = conns[0]["instance"].as_u64().unwrap();
        assert!(conns[0]["key"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{instance}.")));
        instances.insert(instance);
    }
    assert!(instances.len() > 1, "all on one instance: {instances:?}");
    let reader = ok(publish, "/clients?id=reader");
    assert_eq!(reader["connections"][0]["transport"], "event_stream");

    // Every channel's count, merged across the instances.
    let channels = ok(publish, "/presence");
    assert_eq!(
        channels["channels"],
        serde_json::json!([{"channel": "room", "connections": 34}])
    );
    assert_eq!(get(publish, "/presence?channel=room&limit=0").0, 400);
    assert_eq!(get(publish, "/clients").0, 400);
    drop(clients);
}

/// Subscriptions made and undone by commands, and closes, as presence
/// sees them, down to nothing.
fn follows_commands_and_closes(args: &[&str]) {
    let key = KeyFile::new();
    let (_server, addr, publish) = start(&key, args);
    let mut alices: Vec<_> = (0..2)
        .map(|_| util::connect(addr, "/?id=alice&channel=room"))
        .collect();
    let bob = util::connect(addr, "/?id=bob&channel=room");
    assert_eq!(
        presence(publish, "room"),
        (3, vec!["alice".into(), "bob".into()])
    );
    assert_eq!(presence(publish, "extra"), (0, vec![]));

    // Taken before the question, so answered in it.
    publish_lines(publish, "sub alice extra\n");
    assert_eq!(presence(publish, "extra"), (2, vec!["alice".into()]));
    let body = ok(publish, "/clients?id=alice");
    for conn in body["connections"].as_array().unwrap() {
        assert_eq!(strings(&conn["channels"]), ["extra", "room"]);
    }
    publish_lines(publish, "unsub alice room\n");
    assert_eq!(presence(publish, "room"), (1, vec!["bob".into()]));
    publish_lines(publish, "unsub alice extra\n");
    assert_eq!(presence(publish, "extra"), (0, vec![]));
    let listed = ok(publish, "/presence");
    assert_eq!(
        listed["channels"],
        serde_json::json!([{"channel": "room", "connections": 1}])
    );
    // Alice's connections, in no channel, are still hers.
    let body = ok(publish, "/clients?id=alice");
    assert_eq!(body["connections"].as_array().unwrap().len(), 2);

    // The last subscriber leaves: the channel is empty, and no channel
    // is listed.
    drop(bob);
    assert_eq!(until(publish, "room", |a| a.0 == 0), (0, vec![]));
    assert_eq!(ok(publish, "/presence")["channels"], serde_json::json!([]));
    alices.pop();
    let gone = |body: &Value| body["connections"].as_array().unwrap().len();
    let deadline = Instant::now() + Duration::from_secs(10);
    while gone(&ok(publish, "/clients?id=alice")) != 1 {
        assert!(
            Instant::now() < deadline,
            "a closed connection still listed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(alices);
}

#[test]
fn alone_presence_follows_commands_and_closes_and_empties() {
    follows_commands_and_closes(&[]);
}

#[test]
fn under_processes_presence_follows_commands_and_closes_and_empties() {
    follows_commands_and_closes(&["--processes", "3"]);
}

//! Positions and resume: a client that asks for positions gets each
//! message as its position, a space and the payload; one that comes back
//! with `?since=` is told whether everything it missed follows (recovered),
//! only what the history still holds (gap), or nothing (unknown), gets it
//! in order and exactly once, then goes on live.

mod util;

use std::time::Duration;

use tungstenite::Message;
use util::{channels, client_id, connect, texts, Client, TestServer};
use wspush::{Config, MessageKind, Recipients, Server};

/// The status message a client is told first: (status, position, from).
fn status(client: &mut Client) -> (String, String, Option<String>) {
    let text = texts(client, 1).remove(0);
    assert!(text.starts_with('{'), "not a status: {text}");
    let field = |name: &str| {
        let key = format!("\"{name}\":\"");
        let start = text.find(&key)? + key.len();
        Some(text[start..start + text[start..].find('"')?].to_string())
    };
    (
        field("status").expect("a status"),
        field("position").expect("a position"),
        field("from"),
    )
}

/// The next `n` positioned messages: (position, payload).
fn positioned(client: &mut Client, n: usize) -> Vec<(String, String)> {
    texts(client, n)
        .into_iter()
        .map(|text| {
            let (position, payload) = text.split_once(' ').expect("position, space, payload");
            (position.to_string(), payload.to_string())
        })
        .collect()
}

fn payloads(messages: &[(String, String)]) -> Vec<&str> {
    messages.iter().map(|(_, p)| p.as_str()).collect()
}

/// Broadcasts `lines` and waits until the loop has taken them all.
fn publish(server: &TestServer, lines: &[&str]) {
    let before = server.handle.metrics().broadcasts;
    for line in lines {
        server.handle.broadcast_text(*line).unwrap();
    }
    let taken = before + lines.len() as u64;
    server.wait_for("the loop to take the lines", |m| m.broadcasts >= taken);
}

#[test]
fn positions_go_to_those_who_ask_and_nothing_changes_for_the_others() {
    let server = TestServer::start(Config::default());
    let mut plain = connect(server.addr, "/");
    let mut with = connect(server.addr, "/?positions=1");
    let (name, first, _) = status(&mut with);
    assert_eq!(name, "position");
    let epoch = first.split_once('.').unwrap().0.to_string();
    assert_eq!(first, format!("{epoch}.0"), "nothing given out yet");
    server.handle.broadcast_text("hello").unwrap();
    server.handle.broadcast_binary(vec![0u8, 255, 32]).unwrap();
    assert_eq!(texts(&mut plain, 1), ["hello"]);
    assert_eq!(
        plain.read().unwrap(),
        Message::Binary(vec![0u8, 255, 32].into())
    );
    assert_eq!(
        positioned(&mut with, 1),
        [(format!("{epoch}.1"), "hello".into())]
    );
    let mut expected = format!("{epoch}.2 ").into_bytes();
    expected.extend_from_slice(&[0, 255, 32]);
    assert_eq!(
        with.read().unwrap(),
        Message::Binary(expected.into()),
        "a binary message stays binary, its bytes exact"
    );
    let metrics = server.handle.metrics();
    assert_eq!(metrics.resumes_position, 1);
}

#[test]
fn a_resume_is_given_what_it_missed_in_order_then_goes_on_live() {
    let server = TestServer::start(Config::default());
    let mut client = connect(server.addr, "/?positions=1");
    status(&mut client);
    publish(&server, &["1", "2", "3"]);
    let got = positioned(&mut client, 3);
    assert_eq!(payloads(&got), ["1", "2", "3"]);
    let since = got[2].0.clone();
    drop(client);
    publish(&server, &["4", "5", "6"]);

    let mut back = connect(server.addr, &format!("/?since={since}"));
    let (name, current, _) = status(&mut back);
    assert_eq!(name, "recovered");
    let replayed = positioned(&mut back, 3);
    assert_eq!(payloads(&replayed), ["4", "5", "6"]);
    assert_eq!(
        replayed[2].0, current,
        "the replay ends at the position told"
    );
    server.handle.broadcast_text("7").unwrap();
    let seventh = positioned(&mut back, 1).remove(0);
    assert_eq!(seventh.1, "7");

    // Nothing missed: recovered, nothing replayed.
    let mut again = connect(server.addr, &format!("/?since={}", seventh.0));
    assert_eq!(status(&mut again), ("recovered".into(), seventh.0, None));
    server.handle.broadcast_text("8").unwrap();
    assert_eq!(payloads(&positioned(&mut again, 1)), ["8"]);
    assert_eq!(payloads(&positioned(&mut back, 1)), ["8"]);
    assert_eq!(server.handle.metrics().resumes_recovered, 2);
}

#[test]
fn a_resume_from_before_the_history_is_told_the_gap_and_gets_what_is_held() {
    let server = TestServer::start(Config::default().with(|c| {
        c.history_messages = 3;
    }));
    let mut client = connect(server.addr, "/?positions=1");
    status(&mut client);
    publish(&server, &["a", "b"]);
    let since = positioned(&mut client, 2)[0].0.clone();
    drop(client);
    publish(&server, &["c", "d", "e", "f"]);
    let mut back = connect(server.addr, &format!("/?since={since}"));
    let (name, current, from) = status(&mut back);
    assert_eq!(name, "gap");
    let held = positioned(&mut back, 3);
    assert_eq!(payloads(&held), ["d", "e", "f"], "the three held");
    let epoch = since.split_once('.').unwrap().0;
    assert_eq!(from, Some(format!("{epoch}.2")), "b, after since, is lost");
    assert_eq!(seq(&held[0].0), 4, "c, before d, is lost too");
    assert_eq!(held[2].0, current);
    assert_eq!(server.handle.metrics().resumes_gap, 1);
}

#[test]
fn a_since_of_another_epoch_or_none_at_all_is_unknown_and_never_an_error() {
    let server = TestServer::start(Config::default());
    publish(&server, &["x"]);
    let mut client = connect(server.addr, "/?positions=1");
    let (_, mut current, _) = status(&mut client);
    let (epoch, seq) = current.split_once('.').unwrap();
    let (epoch, seq) = (epoch.to_string(), seq.to_string());
    let other_epoch = if epoch.starts_with('0') { "1" } else { "0" }.to_string() + &epoch[1..];
    let long = "9".repeat(2000);
    for since in [
        format!("{other_epoch}.{seq}"),
        format!("{epoch}.99"),
        format!("{epoch}.01"),
        "garbage".into(),
        String::new(),
        "%00%ff".into(),
        long,
    ] {
        let mut back = connect(server.addr, &format!("/?since={since}"));
        let (name, position, _) = status(&mut back);
        assert_eq!(
            (name.as_str(), position.as_str()),
            ("unknown", current.as_str()),
            "{since}"
        );
        server.handle.broadcast_text("live").unwrap();
        assert_eq!(payloads(&positioned(&mut back, 1)), ["live"]);
        current = positioned(&mut client, 1).remove(0).0;
    }
    assert_eq!(server.handle.metrics().resumes_unknown, 7);
}

#[test]
fn a_replay_gives_only_what_was_addressed_to_the_client_each_once() {
    let server = TestServer::start(Config::default());
    let mut client = connect(server.addr, "/?positions=1&id=ann&channel=a&channel=b");
    let since = status(&mut client).1;
    drop(client);
    let h = &server.handle;
    let sends = [
        (channels(&["a"]), "to a"),
        (channels(&["c"]), "to c"),
        (channels(&["a", "b"]), "to a and b"),
        (Recipients::Id(client_id("ann")), "to ann"),
        (Recipients::Id(client_id("bob")), "to bob"),
        (Recipients::All, "to all"),
        (channels(&["b", "c"]), "to b and c"),
    ];
    let before = h.metrics().broadcasts;
    for (to, text) in sends.clone() {
        h.send(to, MessageKind::Text, text).unwrap();
    }
    server.wait_for("the loop to take the sends", |m| m.broadcasts >= before + 7);
    let mut back = connect(
        server.addr,
        &format!("/?since={since}&id=ann&channel=a&channel=b"),
    );
    assert_eq!(status(&mut back).0, "recovered");
    let got = positioned(&mut back, 5);
    assert_eq!(
        payloads(&got),
        ["to a", "to a and b", "to ann", "to all", "to b and c"]
    );
    // A client of channel c only, resuming from the same place.
    let mut other = connect(server.addr, &format!("/?since={since}&channel=c"));
    assert_eq!(status(&mut other).0, "recovered");
    assert_eq!(
        payloads(&positioned(&mut other, 3)),
        ["to c", "to all", "to b and c"]
    );
    h.broadcast_text("end").unwrap();
    assert_eq!(payloads(&positioned(&mut back, 1)), ["end"]);
    assert_eq!(payloads(&positioned(&mut other, 1)), ["end"]);
}

#[test]
fn a_replay_larger_than_the_queue_goes_out_in_parts_in_order() {
    let server = TestServer::start(Config::default().with(|c| {
        c.max_queued_bytes = 4096;
    }));
    let mut client = connect(server.addr, "/?positions=1");
    let since = status(&mut client).1;
    drop(client);
    let lines: Vec<String> = (0..3000).map(|i| format!("{i:0>2000}")).collect();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    publish(&server, &refs);
    let mut back = connect(server.addr, &format!("/?since={since}"));
    assert_eq!(status(&mut back).0, "recovered");
    // Read slowly at first, so the server's queue fills and the replay waits.
    std::thread::sleep(Duration::from_millis(200));
    server.handle.broadcast_text("live").unwrap();
    let got = positioned(&mut back, 3001);
    assert_eq!(payloads(&got[..3000]), refs, "every line once, in order");
    assert_eq!(got[3000].1, "live");
    let metrics = server.handle.metrics();
    assert_eq!(metrics.slow_consumer_drops + metrics.replay_overruns, 0);
}

#[test]
fn a_client_that_keeps_reconnecting_during_a_feed_gets_every_line_once() {
    let server = TestServer::start(Config::default());
    let handle = server.handle.clone();
    const LINES: usize = 2000;
    let mut client = connect(server.addr, "/?positions=1");
    let mut last = status(&mut client).1;
    let feed = std::thread::spawn(move || {
        for i in 0..LINES {
            handle.broadcast_text(i.to_string()).unwrap();
            if i % 50 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    let mut got: Vec<usize> = Vec::new();
    let mut resumes = 0;
    while got.len() < LINES {
        // A few messages, then drop the connection and resume.
        for _ in 0..7 {
            if got.len() == LINES {
                break;
            }
            let (position, payload) = positioned(&mut client, 1).remove(0);
            got.push(payload.parse().unwrap());
            last = position;
        }
        drop(client);
        client = connect(server.addr, &format!("/?since={last}"));
        assert_eq!(status(&mut client).0, "recovered");
        resumes += 1;
    }
    feed.join().unwrap();
    assert_eq!(got, (0..LINES).collect::<Vec<_>>(), "none lost, none twice");
    assert!(resumes > 100, "{resumes} resumes");
}

/// The text payloads of the next `n` frames on a raw connection.
fn raw_texts(stream: &mut std::net::TcpStream, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let frame = util::read_frame(stream).expect("a frame");
            assert_eq!(frame.opcode, 0x1, "text");
            String::from_utf8(frame.payload).unwrap()
        })
        .collect()
}

/// Sends an upgrade request for `path` and steps `server` until it has
/// answered it; returns the connection after the 101.
fn upgrade_in_step(
    server: &mut Server,
    path: &str,
    with_the_request: impl FnOnce(&mut Server),
) -> std::net::TcpStream {
    let mut stream = util::raw(server.local_addr());
    std::io::Write::write_all(&mut stream, util::upgrade_request(path).as_bytes()).unwrap();
    with_the_request(server);
    let upgrades = server.handle().metrics().upgrades;
    util::poll_until(server, "the upgrade", |s| {
        s.handle().metrics().upgrades > upgrades
    });
    assert_eq!(util::read_response(&mut stream).status, 101);
    stream
}

#[test]
fn a_message_published_at_the_upgrade_arrives_once_whichever_side_of_the_seam_it_falls() {
    let mut server = Server::bind(Config::default()).unwrap();
    let handle = server.handle();
    let step = |server: &mut Server| {
        for _ in 0..20 {
            server.poll_once(Some(Duration::from_millis(5))).unwrap();
        }
    };
    let mut first = upgrade_in_step(&mut server, "/?positions=1", |_| {});
    let current = |status: &str| status.split(r#""position":""#).nth(1).unwrap()[..18].to_string();
    let since = current(&raw_texts(&mut first, 1)[0]);
    // Queued before the request is read: the loop reads the request, then
    // frames the message in the same iteration, so it is live for the
    // new connection (after the seam).
    let mut after = upgrade_in_step(&mut server, &format!("/?since={since}"), |_| {
        handle.broadcast_text("during").unwrap();
    });
    step(&mut server);
    let got = raw_texts(&mut after, 2);
    assert!(got[0].contains(r#""status":"recovered""#), "{got:?}");
    assert!(got[1].ends_with(" during"), "{got:?}");
    // Framed one iteration before the request is read (and not yet
    // delivered to anyone): in the history, so replayed (before the seam).
    handle.broadcast_text("framed").unwrap();
    server.poll_once(Some(Duration::ZERO)).unwrap();
    let mut before = upgrade_in_step(&mut server, &format!("/?since={since}"), |_| {});
    step(&mut server);
    handle.broadcast_text("end").unwrap();
    step(&mut server);
    let got = raw_texts(&mut before, 4);
    assert!(got[0].contains(r#""status":"recovered""#), "{got:?}");
    let payloads: Vec<&str> = got[1..]
        .iter()
        .map(|m| m.split_once(' ').unwrap().1)
        .collect();
    assert_eq!(payloads, ["during", "framed", "end"], "each once, in order");
    let got = raw_texts(&mut after, 2);
    let payloads: Vec<&str> = got.iter().map(|m| m.split_once(' ').unwrap().1).collect();
    assert_eq!(payloads, ["framed", "end"]);
}

/// What a positioned client reads: a status (its JSON), a message (its
/// position's number and its payload), or the close (its code).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Status(String),
    Message(u64, String),
    Closed(u16),
}

/// A string field of a status message.
fn field(status: &str, name: &str) -> Option<String> {
    let key = format!("\"{name}\":\"");
    let start = status.find(&key)? + key.len();
    Some(status[start..start + status[start..].find('"')?].to_string())
}

/// The name of the status `event` is.
fn told(event: &Event) -> String {
    match event {
        Event::Status(status) => field(status, "status").expect("a status"),
        other => panic!("not a status: {other:?}"),
    }
}

/// The number of a printed position.
fn seq(position: &str) -> u64 {
    position.split_once('.').unwrap().1.parse().unwrap()
}

/// Reads `client` until a message numbered `last` or later, or the close.
fn read_through(client: &mut Client, last: u64) -> Vec<Event> {
    let mut events = Vec::new();
    loop {
        let event = match client.read() {
            Ok(Message::Text(text)) if text.starts_with('{') => Event::Status(text.to_string()),
            Ok(Message::Text(text)) => {
                let (position, payload) = text.split_once(' ').expect("position, payload");
                Event::Message(seq(position), payload.to_string())
            }
            Ok(Message::Close(frame)) => Event::Closed(frame.map_or(1005, |f| f.code.into())),
            Ok(other) => panic!("not text: {other:?}"),
            Err(e) => panic!("reading: {e} after {events:?}"),
        };
        let done = match event {
            Event::Message(n, _) => n >= last,
            Event::Closed(_) => true,
            Event::Status(_) => false,
        };
        events.push(event);
        if done {
            return events;
        }
    }
}

/// Checks that `events`, read after position `since`, account for every
/// position up to the last one read, each once: a message, or inside a
/// gap status that named it (`from` and `to`, both included) before
/// anything later came. Returns the payloads and the last position
/// accounted for.
fn every_hole_told(since: u64, events: &[Event]) -> (Vec<String>, u64) {
    let mut upto = since;
    let mut payloads = Vec::new();
    for event in events {
        match event {
            Event::Message(n, payload) => {
                assert_eq!(
                    *n,
                    upto + 1,
                    "a hole after {upto} no status named: {events:?}"
                );
                upto = *n;
                payloads.push(payload.clone());
            }
            Event::Status(status) if field(status, "status").as_deref() == Some("gap") => {
                let from = seq(&field(status, "from").expect("from"));
                let to = seq(&field(status, "to").expect("a gap names its last lost position"));
                assert_eq!(
                    from,
                    upto + 1,
                    "the gap begins where the client is: {events:?}"
                );
                assert!(to >= from, "{status}");
                upto = to;
            }
            Event::Status(_) | Event::Closed(_) => {}
        }
    }
    (payloads, upto)
}

#[test]
fn a_replay_the_history_outruns_is_told_exactly_what_it_lost_and_nothing_older_follows() {
    let server = TestServer::start(Config::default().with(|c| {
        c.history_messages = 10;
        c.max_message_bytes = 2 << 20;
    }));
    let mut first = connect(server.addr, "/?positions=1");
    let since = status(&mut first).1;
    drop(first);
    // Ten large messages, 1.1 to 2 MiB: 15 MiB, far more than the
    // kernel's buffers of the two sockets hold, even raised a little.
    let big: Vec<String> = (1..=10)
        .map(|i| format!("m{i} {}", "x".repeat((1000 + 100 * i) << 10)))
        .collect();
    publish(&server, &big.iter().map(String::as_str).collect::<Vec<_>>());
    // A client that reads nothing for a while: its replay stalls.
    let mut back = util::connect_slow_reader(server.addr, &format!("/?since={since}"));
    std::thread::sleep(Duration::from_millis(300));
    // Twenty short ones: the history (10 messages) now holds m21..m30.
    let short: Vec<String> = (11..=30).map(|i| format!("m{i}")).collect();
    publish(
        &server,
        &short.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let events = read_through(&mut back, 30);
    assert_eq!(told(&events[0]), "recovered");
    let (payloads, upto) = every_hole_told(seq(&since), &events[1..]);
    assert_eq!(upto, 30);
    let live: Vec<&str> = payloads
        .iter()
        .rev()
        .take(20)
        .rev()
        .map(|p| p.as_str())
        .collect();
    assert_eq!(live, short, "every live message, after the hole");
    let gaps = events
        .iter()
        .filter(|e| matches!(e, Event::Status(s) if s.contains("\"gap\"")))
        .count();
    assert!(gaps >= 1, "the history outran the replay: {events:?}");
    assert_eq!(server.handle.metrics().replay_overruns, 1);
}

#[test]
fn a_positioned_client_is_never_skipped_silently_under_the_drop_policy() {
    let server = TestServer::start(Config::default().with(|c| {
        c.slow_consumer = wspush::SlowConsumerPolicy::Drop;
        c.max_queued_bytes = 64 << 10;
    }));
    let mut first = connect(server.addr, "/?positions=1");
    let since = status(&mut first).1;
    drop(first);
    publish(&server, &["before"]);
    let mut slow = util::connect_slow_reader(server.addr, &format!("/?since={since}"));
    // 12.5 MiB: more than the kernel's buffers of the two sockets hold.
    let lines: Vec<String> = (2..=400).map(|i| format!("{i:0>32768}")).collect();
    publish(
        &server,
        &lines.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    server.wait_for("messages skipped for the slow client", |m| {
        m.slow_consumer_drops > 0
    });
    let events = read_through(&mut slow, 400);
    let (mut payloads, upto) = every_hole_told(seq(&since), &events[1..]);
    if let Some(Event::Closed(code)) = events.last() {
        // Closed rather than skipped: it resumes and loses nothing.
        assert_eq!(*code, 1008, "closed as a slow consumer");
        let epoch = since.split_once('.').unwrap().0;
        let mut back = connect(server.addr, &format!("/?since={epoch}.{upto}"));
        let events = read_through(&mut back, 400);
        assert_eq!(told(&events[0]), "recovered");
        let (rest, end) = every_hole_told(upto, &events[1..]);
        assert_eq!(end, 400);
        payloads.extend(rest);
    }
    assert_eq!(payloads[0], "before");
    assert_eq!(&payloads[1..], &lines[..], "every line, in order, once");
}

#[test]
fn a_message_larger_than_the_history_is_refused_alone_and_a_resume_across_it_is_told() {
    let server = TestServer::start(Config::default().with(|c| {
        c.history_bytes = 100_000;
    }));
    let mut first = connect(server.addr, "/?positions=1");
    let since = status(&mut first).1;
    drop(first);
    let huge = "h".repeat(200_000);
    publish(&server, &["a", "b", &huge, "c"]);
    // Counted once the loop's iteration is published.
    server.wait_for("the refusal counted", |m| m.history_refused == 1);
    let mut back = connect(server.addr, &format!("/?since={since}"));
    let events = read_through(&mut back, 4);
    assert_eq!(told(&events[0]), "recovered", "{events:?}");
    let (payloads, upto) = every_hole_told(seq(&since), &events[1..]);
    assert_eq!(
        (payloads, upto),
        (vec!["a".into(), "b".into(), "c".into()], 4)
    );
    let Event::Status(gap) = &events[3] else {
        panic!("{events:?}")
    };
    assert_eq!(
        (field(gap, "from"), field(gap, "to")),
        (
            Some(format!("{}.3", since.split_once('.').unwrap().0)),
            Some(format!("{}.3", since.split_once('.').unwrap().0))
        ),
        "the one position refused"
    );
}

#[test]
fn a_client_ahead_of_a_server_sharing_its_epoch_waits_for_it_or_is_told_to_try_again() {
    // Servers that share an epoch (hosts reading one stream) give the
    // same positions; this one has framed 1 to 3 when a client comes from
    // one that gave 4 and 5 already.
    let mut config = Config::default();
    config.epoch = Some(wspush::Epoch(0x5eed));
    config.handshake_timeout = Duration::from_secs(1);
    let server = TestServer::start(config);
    let send = |seq: u64, text: &str| {
        server
            .handle
            .send_at(seq, Recipients::All, MessageKind::Text, text)
            .unwrap()
    };
    for (seq, text) in [(1, "a"), (2, "b"), (3, "c")] {
        send(seq, text);
    }
    server.wait_for("the loop to take 1 to 3", |m| m.broadcasts >= 3);
    let epoch = "0000000000005eed";
    let mut client = connect(server.addr, &format!("/?since={epoch}.5"));
    let (name, position, _) = status(&mut client);
    assert_eq!(
        (name.as_str(), position),
        ("recovered", format!("{epoch}.3"))
    );
    // What it had is skipped once this server gets there; it goes on after.
    for (seq, text) in [(4, "d"), (5, "e"), (6, "f")] {
        send(seq, text);
    }
    assert_eq!(
        positioned(&mut client, 1),
        [(format!("{epoch}.6"), "f".to_string())]
    );
    // A position this server does not reach within the handshake timeout:
    // the client is told to try again (1013), and it is counted.
    let mut early = connect(server.addr, &format!("/?since={epoch}.1000"));
    assert_eq!(status(&mut early).0, "recovered");
    match early.read() {
        Ok(Message::Close(Some(frame))) => {
            assert_eq!(u16::from(frame.code), 1013);
            assert_eq!(frame.reason, "position ahead of this server");
        }
        other => panic!("not a close: {other:?}"),
    }
    // Its answer goes out, the server ends the connection, and so does it.
    assert!(matches!(
        early.read(),
        Err(tungstenite::Error::ConnectionClosed)
    ));
    drop(early);
    server.wait_for("the close counted", |m| m.closed_ahead == 1);
    send(7, "g");
    assert_eq!(
        positioned(&mut client, 1),
        [(format!("{epoch}.7"), "g".to_string())],
        "the others go on"
    );
    assert_eq!(server.handle.metrics().resumes_recovered, 2);
}

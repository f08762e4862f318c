//! Channels, client ids and targeted push: who asks for what at the
//! upgrade, and who gets each message, exactly once and in order.

mod util;

use std::net::SocketAddr;
use std::thread;

use tungstenite::protocol::frame::coding::CloseCode as WsCloseCode;
use tungstenite::Message;
use util::{
    channel, channels, client_id, connect, poll_until, raw, read_response, texts, upgrade_request,
    Client, TestServer,
};
use wspush::protocol::presence::{Answer, Query, Transport};
use wspush::{CloseCode, Config, MessageKind, Pattern, Recipients, Server, Tokens};

fn id(name: &str) -> Recipients {
    Recipients::Id(client_id(name))
}

/// Broadcasts `END` and checks that it is the next thing every client
/// gets: nothing else was sent to it.
fn nothing_more(server: &TestServer, clients: &mut [&mut Client]) {
    server.handle.broadcast_text("END").unwrap();
    for client in clients {
        assert_eq!(texts(client, 1), ["END"]);
    }
}

/// The status of an upgrade request for `path`.
fn status(addr: SocketAddr, path: &str) -> u16 {
    let mut stream = raw(addr);
    std::io::Write::write_all(&mut stream, upgrade_request(path).as_bytes()).unwrap();
    read_response(&mut stream).status
}

#[test]
fn channel_publishes_reach_each_subscriber_once_in_order() {
    let server = TestServer::start(Config::default());
    let mut a = connect(server.addr, "/?channel=a");
    let mut b = connect(server.addr, "/?channel=b");
    let mut both = connect(server.addr, "/?channel=a&channel=b&channel=a");
    let mut none = connect(server.addr, "/");
    let h = &server.handle;
    h.send(channels(&["a"]), MessageKind::Text, "1").unwrap();
    h.send(channels(&["b"]), MessageKind::Text, "2").unwrap();
    h.send(channels(&["a", "b"]), MessageKind::Text, "3")
        .unwrap();
    h.broadcast_text("4").unwrap();
    h.send(channels(&["b", "a", "b"]), MessageKind::Text, "5")
        .unwrap();
    h.send(channels(&["nobody"]), MessageKind::Text, "6")
        .unwrap();
    assert_eq!(texts(&mut a, 4), ["1", "3", "4", "5"]);
    assert_eq!(texts(&mut b, 4), ["2", "3", "4", "5"]);
    assert_eq!(texts(&mut both, 5), ["1", "2", "3", "4", "5"]);
    assert_eq!(texts(&mut none, 1), ["4"]);
    nothing_more(&server, &mut [&mut a, &mut b, &mut both, &mut none]);
    let m = server.handle.metrics();
    assert_eq!(m.commands_unmatched, 1, "the channel nobody is in");
    assert_eq!((m.channels, m.subscriptions), (2, 4), "{m:?}");
}

#[test]
fn a_burst_to_a_channel_goes_out_in_order_beside_broadcasts() {
    let server = TestServer::start(Config::default());
    let mut sub = connect(server.addr, "/?channel=news");
    let mut other = connect(server.addr, "/");
    for i in 0..300 {
        let to = if i % 3 == 0 {
            Recipients::All
        } else {
            channels(&["news"])
        };
        server
            .handle
            .send(to, MessageKind::Text, i.to_string())
            .unwrap();
    }
    let want: Vec<String> = (0..300).map(|i| i.to_string()).collect();
    assert_eq!(texts(&mut sub, 300), want);
    let broadcasts: Vec<String> = (0..300).step_by(3).map(|i| i.to_string()).collect();
    assert_eq!(texts(&mut other, 100), broadcasts);
    nothing_more(&server, &mut [&mut sub, &mut other]);
}

#[test]
fn a_send_to_an_id_reaches_every_connection_holding_it() {
    let server = TestServer::start(Config::default());
    let mut tabs: Vec<Client> = (0..3).map(|_| connect(server.addr, "/?id=alice")).collect();
    let mut bob = connect(server.addr, "/?id=bob");
    server
        .handle
        .send(id("alice"), MessageKind::Text, "hi alice")
        .unwrap();
    server
        .handle
        .send(id("carol"), MessageKind::Text, "nobody")
        .unwrap();
    server
        .handle
        .send(id("bob"), MessageKind::Binary, vec![1, 2])
        .unwrap();
    for tab in &mut tabs {
        assert_eq!(texts(tab, 1), ["hi alice"]);
    }
    assert_eq!(bob.read().unwrap(), Message::binary(vec![1, 2]));
    let mut all: Vec<&mut Client> = tabs.iter_mut().collect();
    all.push(&mut bob);
    nothing_more(&server, &mut all);
    let m = server.handle.metrics();
    assert_eq!((m.commands_unmatched, m.connections_with_id), (1, 4));
}

#[test]
fn a_send_to_a_connection_key_reaches_that_connection_and_never_a_later_one() {
    let mut server = Server::bind(Config::default()).unwrap();
    let addr = server.local_addr();
    let handle = server.handle();
    let connecting: Vec<_> = (0..3)
        .map(|i| thread::spawn(move || connect(addr, &format!("/?id=c{i}"))))
        .collect();
    poll_until(&mut server, "three upgrades", |s| {
        s.connections().count() == 3
    });
    let mut clients: Vec<Client> = connecting.into_iter().map(|c| c.join().unwrap()).collect();
    let key_of = |server: &Server, id: &str| {
        let info = server
            .connections()
            .find(|c| c.query() == Some(&format!("id={id}")[..]));
        info.expect("that connection").key
    };
    let middle = key_of(&server, "c1");
    handle
        .send(Recipients::Conn(middle), MessageKind::Text, "only you")
        .unwrap();
    poll_until(&mut server, "the delivery", |s| {
        s.metrics().broadcast_deliveries == 1
    });
    assert_eq!(texts(&mut clients[1], 1), ["only you"]);

    // The middle one goes; a new connection takes its slot.
    let gone = clients.remove(1);
    drop(gone);
    poll_until(&mut server, "the close", |s| s.connections().count() == 2);
    let late = thread::spawn(move || connect(addr, "/?id=late"));
    poll_until(&mut server, "the new upgrade", |s| {
        s.connections().count() == 3
    });
    let mut late = late.join().unwrap();
    let reused = key_of(&server, "late");
    assert_eq!(reused.slot, middle.slot, "the slot is reused");
    assert_ne!(reused, middle, "but not the key");
    handle
        .send(Recipients::Conn(middle), MessageKind::Text, "stale")
        .unwrap();
    handle
        .send(Recipients::Conn(reused), MessageKind::Text, "fresh")
        .unwrap();
    poll_until(&mut server, "the delivery", |s| {
        s.metrics().broadcast_deliveries == 2
    });
    assert_eq!(texts(&mut late, 1), ["fresh"]);
    assert_eq!(server.metrics().commands_unmatched, 1, "the stale key");
}

#[test]
fn subscriptions_change_at_run_time() {
    let server = TestServer::start(Config::default());
    let mut alice = connect(server.addr, "/?id=alice");
    let mut alice2 = connect(server.addr, "/?id=alice&channel=chat");
    let mut bob = connect(server.addr, "/?id=bob&channel=news");
    let h = &server.handle;
    h.send(channels(&["news"]), MessageKind::Text, "before")
        .unwrap();
    h.subscribe(client_id("alice"), [channel("news"), channel("sport")])
        .unwrap();
    h.send(channels(&["news"]), MessageKind::Text, "during")
        .unwrap();
    h.send(channels(&["sport"]), MessageKind::Text, "sport")
        .unwrap();
    h.unsubscribe(client_id("alice"), [channel("news"), channel("chat")])
        .unwrap();
    h.send(channels(&["news"]), MessageKind::Text, "after")
        .unwrap();
    h.send(channels(&["chat"]), MessageKind::Text, "chat")
        .unwrap();
    h.subscribe(client_id("nobody"), [channel("news")]).unwrap();
    assert_eq!(texts(&mut alice, 2), ["during", "sport"]);
    assert_eq!(texts(&mut alice2, 2), ["during", "sport"]);
    assert_eq!(texts(&mut bob, 3), ["before", "during", "after"]);
    nothing_more(&server, &mut [&mut alice, &mut alice2, &mut bob]);
    let m = server.handle.metrics();
    assert_eq!(
        m.commands_unmatched, 2,
        "chat after its last subscriber left, and nobody"
    );
}

#[test]
fn a_close_by_id_comes_after_what_was_sent_before_it() {
    let server = TestServer::start(Config::default());
    let mut alice = connect(server.addr, "/?id=alice");
    let mut alice2 = connect(server.addr, "/?id=alice");
    let mut bob = connect(server.addr, "/?id=bob");
    let h = &server.handle;
    h.broadcast_text("before").unwrap();
    h.close(id("alice"), CloseCode(4001), "go away").unwrap();
    assert!(
        h.close(id("alice"), CloseCode(1005), "").is_err(),
        "not a code to send"
    );
    for client in [&mut alice, &mut alice2] {
        assert_eq!(texts(client, 1), ["before"]);
        match client.read() {
            Ok(Message::Close(Some(frame))) => {
                assert_eq!(frame.code, WsCloseCode::from(4001));
                assert_eq!(frame.reason, "go away");
            }
            other => panic!("not the close: {other:?}"),
        }
    }
    assert_eq!(texts(&mut bob, 1), ["before"]);
    nothing_more(&server, &mut [&mut bob]);
    server.wait_for("the closes", |m| m.closed_publisher == 2);
}

#[test]
fn upgrades_ask_for_an_id_and_channels_within_the_limits() {
    let server = TestServer::start(Config::default().with(|c| {
        c.max_channels_per_connection = 2;
        c.max_channels = 3;
        c.allowed_channels = vec![Pattern::parse("news.*").unwrap()];
    }));
    let addr = server.addr;
    assert_eq!(status(addr, "/?id=a&id=b"), 400);
    assert_eq!(status(addr, "/?id=a%20b"), 400);
    assert_eq!(status(addr, &format!("/?id={}", "x".repeat(65))), 400);
    assert_eq!(status(addr, "/?channel=news.a,news.b"), 400);
    assert_eq!(
        status(addr, "/?channel=news.a&channel=news.b&channel=news.c"),
        400
    );
    assert_eq!(status(addr, "/?channel=chat"), 403);
    let _one = connect(addr, "/?channel=news.1&channel=news.2");
    let _two = connect(addr, "/?channel=news.3&channel=news.1");
    assert_eq!(status(addr, "/?channel=news.4"), 503, "a fourth channel");
    let _three = connect(addr, "/?channel=news.2");
    // Gauges are published at the end of the loop's iteration, which may
    // follow the 101.
    server.wait_for("the subscriptions", |m| m.subscriptions == 5);
    let m = server.handle.metrics();
    assert_eq!((m.rejected_400, m.rejected_403, m.rejected_503), (5, 1, 1));
    assert_eq!((m.channels, m.subscriptions), (3, 5));
}

#[test]
fn a_token_binds_its_bearer_to_its_channels_and_id() {
    let tokens = Tokens::parse(b"alice-t id=alice channels=dm.alice,public\nany-t\n").unwrap();
    let server = TestServer::start(Config::default().with(|c| {
        c.tokens = Some(tokens);
    }));
    let addr = server.addr;
    assert_eq!(status(addr, "/?token=alice-t&channel=news"), 403);
    assert_eq!(status(addr, "/?token=alice-t&id=bob"), 403);
    assert_eq!(status(addr, "/?token=nope&channel=public"), 401);
    let mut alice = connect(addr, "/?token=alice-t&channel=dm.alice");
    let mut anyone = connect(addr, "/?token=any-t&id=bob&channel=news");
    server
        .handle
        .send(id("alice"), MessageKind::Text, "by the token's id")
        .unwrap();
    server
        .handle
        .send(channels(&["dm.alice"]), MessageKind::Text, "dm")
        .unwrap();
    server
        .handle
        .send(channels(&["news"]), MessageKind::Text, "news")
        .unwrap();
    assert_eq!(texts(&mut alice, 2), ["by the token's id", "dm"]);
    assert_eq!(texts(&mut anyone, 1), ["news"]);
    nothing_more(&server, &mut [&mut alice, &mut anyone]);
}

#[test]
fn messages_for_a_channel_taken_together_go_out_as_one_batch() {
    let mut server = Server::bind(Config::default()).unwrap();
    let addr = server.local_addr();
    let connecting: Vec<_> = ["/?channel=news", "/?channel=news", "/"]
        .into_iter()
        .map(|path| thread::spawn(move || connect(addr, path)))
        .collect();
    poll_until(&mut server, "the upgrades", |s| {
        s.connections().count() == 3
    });
    let mut clients: Vec<Client> = connecting.into_iter().map(|c| c.join().unwrap()).collect();
    let handle = server.handle();
    let before = server.metrics();
    for i in 0..50 {
        handle
            .send(channels(&["news"]), MessageKind::Text, format!("n{i}"))
            .unwrap();
    }
    poll_until(&mut server, "the deliveries", |s| {
        s.metrics().broadcast_deliveries - before.broadcast_deliveries == 100
    });
    let after = server.metrics();
    assert_eq!(after.broadcasts - before.broadcasts, 50);
    assert_eq!(
        after.broadcast_batches - before.broadcast_batches,
        1,
        "framed once, together: one write per subscriber"
    );
    let batch: usize = (0..50).map(|i| 2 + format!("n{i}").len()).sum();
    assert_eq!(after.bytes_written - before.bytes_written, 2 * batch as u64);
    let want: Vec<String> = (0..50).map(|i| format!("n{i}")).collect();
    for client in &mut clients[..2] {
        assert_eq!(texts(client, 50), want);
    }
    handle.broadcast_text("END").unwrap();
    poll_until(&mut server, "the end", |s| {
        s.metrics().broadcasts == after.broadcasts + 1
    });
    assert_eq!(texts(&mut clients[2], 1), ["END"], "nothing before it");
}

#[test]
fn a_message_for_a_channel_list_over_64_kib_is_refused() {
    let server = TestServer::start(Config::default());
    let name = "c".repeat(64);
    let names: Vec<wspush::ChannelName> = (0..1009)
        .map(|_| wspush::ChannelName::new(&name).unwrap())
        .collect();
    let to = Recipients::Channels(names.into());
    let refused = server.handle.send(to, MessageKind::Text, "x");
    assert!(
        matches!(refused, Err(wspush::BroadcastError::ChannelListTooLong)),
        "{refused:?}"
    );
    let names: Vec<wspush::ChannelName> = (0..1008)
        .map(|_| wspush::ChannelName::new(&name).unwrap())
        .collect();
    let to = Recipients::Channels(names.into());
    server.handle.send(to, MessageKind::Text, "x").unwrap();
}

/// The loop's answer to `query`, through the library's handle.
fn ask(server: &TestServer, query: Query) -> Answer {
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    server
        .handle
        .ask(query, move |answer| {
            tx.lock().unwrap().send(answer).unwrap()
        })
        .unwrap();
    rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap()
}

#[test]
fn presence_answers_after_the_commands_queued_before_it() {
    let server = TestServer::start(Config::default());
    let _alice = connect(server.addr, "/?id=alice&channel=a");
    let _bob = connect(server.addr, "/?id=bob");
    let _anonymous = connect(server.addr, "/?channel=a");
    let in_a = || Query::Channel {
        channel: channel("a"),
        after: None,
        limit: 10,
    };
    let ids = |answer: Answer| match answer {
        Answer::Channel {
            connections, ids, ..
        } => (connections, ids),
        other => panic!("{other:?}"),
    };
    assert_eq!(ids(ask(&server, in_a())), (2, vec![client_id("alice")]));
    // Queued before the question: answered in it, no waiting.
    server
        .handle
        .subscribe(client_id("bob"), vec![channel("a")])
        .unwrap();
    assert_eq!(
        ids(ask(&server, in_a())),
        (3, vec![client_id("alice"), client_id("bob")])
    );
    server
        .handle
        .unsubscribe(client_id("alice"), vec![channel("a")])
        .unwrap();
    match ask(
        &server,
        Query::Client {
            id: client_id("alice"),
            after: None,
            limit: 10,
        },
    ) {
        Answer::Client { conns, more: false } => {
            assert_eq!(conns.len(), 1);
            assert_eq!(conns[0].transport, Transport::WebSocket);
            assert!(conns[0].channels.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        ask(
            &server,
            Query::Channels {
                after: None,
                limit: 10
            }
        ),
        Answer::Channels {
            channels: vec![(channel("a"), 2)],
            more: false
        }
    );
}

//! Handing live connections to a successor: one server hands its open
//! connections, over a Unix socket, to another that takes them before it
//! runs. Each client, an independent tungstenite one, sees no close and
//! no gap: what the first server sent, then what the second sends, in
//! order and once, on the same socket; a connection's key and channels
//! stay what they were, and what it had sent half of arrives whole.

mod util;

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use tungstenite::Message;
use util::{connect, texts};
use wspush::{introduce_successor, Config, MessageKind, Recipients, Server};

/// The recipients of channel `news`.
fn news() -> Recipients {
    Recipients::Channels([wspush::ChannelName::new("news").unwrap()].into())
}

/// A server on a port of its own whose first message takes `first`.
fn server(first: u64) -> Server {
    let mut config = Config::default();
    config.first_position = first;
    Server::bind(config).unwrap()
}

#[test]
fn open_connections_move_to_the_successor_and_carry_on() {
    let old = Predecessor::start(Config::default());
    let (addr, old_handle) = (old.addr, old.handle.clone());
    let take = introduce_successor(old.supervisor.as_fd()).unwrap();

    let mut plain = connect(addr, "/");
    let mut positions = connect(addr, "/?positions=1");
    let mut alice = connect(addr, "/?id=alice&channel=news");
    assert!(
        texts(&mut positions, 1)[0].contains("\"position\""),
        "its status"
    );
    old_handle.broadcast_text("one").unwrap();
    old_handle
        .send(news(), MessageKind::Text, "news one")
        .unwrap();
    assert_eq!(texts(&mut plain, 1), ["one"]);
    assert_eq!(texts(&mut alice, 2), ["one", "news one"]);
    let first_positioned = texts(&mut positions, 1).remove(0);
    assert!(first_positioned.ends_with(".1 one"), "{first_positioned}");

    // Half a frame from alice before the handover, the rest after.
    let frame = masked_text(b"hello");
    let raw = alice.get_mut();
    raw.write_all(&frame[..4]).unwrap();
    raw.flush().unwrap();
    std::thread::sleep(Duration::from_millis(100));

    // The successor frames from position 3 on (two were sent).
    let mut config = Config::default();
    config.first_position = 3;
    config.upstream = Some(wspush::UpstreamConfig {
        max_bytes: 1 << 20,
        overflow: wspush::Overflow::Pause,
        events: false,
    });
    let mut new = Server::bind(config).unwrap();
    let upstream = new.upstream().unwrap();
    assert_eq!(new.take_over(take).unwrap(), 3);
    let keys: Vec<_> = new
        .connections()
        .map(|c| (c.key, c.target.to_string()))
        .collect();
    assert_eq!(keys.len(), 3, "{keys:?}");
    let old_metrics = old.thread.join().unwrap();
    assert_eq!(old_metrics.handover_given, 3);
    assert_eq!(old_metrics.connections_open, 0);
    let alice_key = keys.iter().find(|(_, t)| t.contains("alice")).unwrap().0;

    let handle = new.handle();
    let new_thread = std::thread::spawn(move || new.run().map(|()| new.metrics()));
    handle.broadcast_text("two").unwrap();
    handle.send(news(), MessageKind::Text, "news two").unwrap();
    handle
        .send(Recipients::Conn(alice_key), MessageKind::Text, "to alice")
        .unwrap();
    assert_eq!(texts(&mut plain, 1), ["two"]);
    assert_eq!(texts(&mut alice, 3), ["two", "news two", "to alice"]);
    let second = texts(&mut positions, 1).remove(0);
    assert!(second.ends_with(".3 two"), "{second}");

    // The rest of alice's frame: the successor reads the whole message.
    let raw = alice.get_mut();
    raw.write_all(&frame[4..]).unwrap();
    raw.flush().unwrap();
    let mut lines = Vec::new();
    while !String::from_utf8_lossy(&lines).contains("hello") {
        assert!(upstream.read(&mut lines), "the server is gone");
    }
    assert!(
        String::from_utf8_lossy(&lines).contains("msg "),
        "{lines:?}"
    );

    let metrics = handle.metrics();
    assert_eq!(metrics.handover_taken, 3);
    assert_eq!(metrics.connections_open, 3);
    drop(upstream);
    handle.shutdown().unwrap();
    for client in [&mut plain, &mut positions, &mut alice] {
        loop {
            match client.read() {
                Ok(Message::Close(Some(frame))) => {
                    assert_eq!(u16::from(frame.code), 1001);
                    // The close's answer goes out.
                    let _ = client.flush();
                    break;
                }
                Ok(Message::Text(t)) => panic!("nothing more was sent: {t}"),
                Ok(_) => {}
                Err(e) => panic!("a close, then the end: {e}"),
            }
        }
    }
    drop((plain, positions, alice));
    new_thread.join().unwrap().unwrap();
}

/// A successor that reads another version is refused, and one that goes
/// away before it asks changes nothing: the server serves on, and the
/// next successor takes its connections over.
#[test]
fn refused_or_vanished_successors_leave_the_server_serving_for_the_next() {
    let Predecessor {
        handle,
        addr,
        supervisor,
        thread,
    } = Predecessor::start(Config::default());
    let mut client = connect(addr, "/");
    // An ask of version 99.
    let mut take = UnixStream::from(introduce_successor(supervisor.as_fd()).unwrap());
    assert_eq!(ask(&mut take, 99), 0, "refused");
    handle.broadcast_text("still here").unwrap();
    assert_eq!(texts(&mut client, 1), ["still here"]);
    // One that goes away without asking.
    drop(introduce_successor(supervisor.as_fd()).unwrap());
    handle.broadcast_text("and here").unwrap();
    assert_eq!(texts(&mut client, 1), ["and here"]);

    // The next takes the connection over.
    let mut new = server(3);
    assert_eq!(
        new.take_over(introduce_successor(supervisor.as_fd()).unwrap())
            .unwrap(),
        1
    );
    let old_metrics = thread.join().unwrap();
    assert_eq!(old_metrics.handover_given, 1);
    let new_handle = new.handle();
    let new_thread = std::thread::spawn(move || new.run());
    new_handle.broadcast_text("moved").unwrap();
    assert_eq!(texts(&mut client, 1), ["moved"]);
    drop(client);
    new_handle.shutdown().unwrap();
    new_thread.join().unwrap().unwrap();
}

/// A successor whose predecessor is gone takes nothing, says why, and
/// counts the fallback to a drain.
#[test]
fn a_successor_whose_predecessor_is_gone_counts_the_fallback() {
    let (gone, take) = UnixStream::pair().unwrap();
    drop(gone);
    let mut new = server(1);
    let refused = new.take_over(take.into()).unwrap_err();
    assert!(matches!(refused, wspush::TakeOverError::Io(_)), "{refused}");
    assert_eq!(new.metrics().handover_fallbacks, 1);
    assert_eq!(new.metrics().handover_taken, 0);
}

/// Asks on `take` as a successor reading state format `version` does,
/// framing from position 1; the version the answer names (0: refused).
/// Written from the format's layout: the magic, a version (u16 LE) and a
/// position (u64 LE), 18 bytes each way.
fn ask(take: &mut UnixStream, version: u16) -> u16 {
    let mut ask = b"wspushHO".to_vec();
    ask.extend_from_slice(&version.to_le_bytes());
    ask.extend_from_slice(&1u64.to_le_bytes());
    take.write_all(&ask).unwrap();
    let mut answer = [0u8; 18];
    std::io::Read::read_exact(take, &mut answer).unwrap();
    u16::from_le_bytes([answer[8], answer[9]])
}

/// A masked text frame, as a client sends it.
fn masked_text(payload: &[u8]) -> Vec<u8> {
    let key = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&key);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    frame
}

/// A server running on its thread, watching a control socket for a
/// successor.
struct Predecessor {
    handle: wspush::Handle,
    addr: std::net::SocketAddr,
    supervisor: UnixStream,
    thread: std::thread::JoinHandle<wspush::MetricsSnapshot>,
}

impl Predecessor {
    fn start(config: Config) -> Predecessor {
        let mut server = Server::bind(config).unwrap();
        let (control, supervisor) = UnixStream::pair().unwrap();
        server.hand_over_on(control.into()).unwrap();
        Predecessor {
            handle: server.handle(),
            addr: server.local_addr(),
            supervisor,
            thread: std::thread::spawn(move || {
                server.run().unwrap();
                server.metrics()
            }),
        }
    }

    /// Hands every connection to a server of `config` (which frames from
    /// `first` on), which runs on its thread once it took them; its
    /// handle, and this one's last metrics.
    fn hand_over(
        self,
        mut config: Config,
        first: u64,
    ) -> (util::TestServer, wspush::MetricsSnapshot) {
        config.first_position = first;
        let mut new = Server::bind(config).unwrap();
        let socket = introduce_successor(self.supervisor.as_fd()).unwrap();
        let taken = new.take_over(socket).unwrap();
        let old = self.thread.join().unwrap();
        assert_eq!(old.handover_given as usize, taken);
        (util::TestServer::from_server(new), old)
    }
}

/// An event stream moves: its events go on, on the same response, with
/// rising ids.
#[test]
fn an_event_stream_moves_and_its_events_go_on() {
    let old = Predecessor::start(Config::default());
    let (status, _, stream) = util::sse::Stream::open(old.addr, "/?id=alice", "");
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    assert_eq!(util::sse::status_of(&stream.event()), "position");
    old.handle.broadcast_text("before").unwrap();
    let before = stream.event();
    assert_eq!(before.data, "before");
    let (new, _) = old.hand_over(Config::default(), 2);
    new.handle.broadcast_text("after").unwrap();
    new.handle
        .send(
            Recipients::Id(wspush::ClientId::new("alice").unwrap()),
            MessageKind::Text,
            "to alice",
        )
        .unwrap();
    let after = [stream.event(), stream.event()];
    assert_eq!([&after[0].data, &after[1].data], ["after", "to alice"]);
    // Two servers alone, each of its own epoch: the positions go on.
    let seq = |id: &str| id.rsplit('.').next().unwrap().parse::<u64>().unwrap();
    assert_eq!((seq(&before.id), seq(&after[0].id)), (1, 2));
    let m = new.handle.metrics();
    assert_eq!((m.connections_open, m.handover_taken), (1, 1));
    drop(stream);
}

/// A client that does not read while its output queue fills to its
/// bound (further broadcasts skipped for it, and counted): what the first
/// server had not written yet (a frame cut by the kernel included) moves,
/// and the client reads it whole and in order, then what the second
/// sends.
#[test]
fn a_full_output_queue_moves_and_is_written_whole_and_in_order() {
    let config = || {
        Config::default().with(|c| {
            c.max_queued_bytes = 256 * 1024;
            c.slow_consumer = wspush::SlowConsumerPolicy::Drop;
        })
    };
    let old = Predecessor::start(config());
    let mut client = util::stalling_client(old.addr);
    let body = |n: usize| format!("{n:05} {}", "x".repeat(16 * 1024));
    let sent = 1024;
    for n in 0..sent {
        old.handle.broadcast_text(body(n)).unwrap();
    }
    let full = |m: &wspush::MetricsSnapshot| m.slow_consumer_drops > 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !full(&old.handle.metrics()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the queue never filled"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (new, old_metrics) = old.hand_over(config(), sent as u64 + 1);
    assert!(old_metrics.write_would_block > 0, "{old_metrics:?}");
    new.handle.broadcast_text("after").unwrap();
    let mut last = None;
    loop {
        let frame = util::read_frame(&mut client).expect("a frame");
        let text = String::from_utf8(frame.payload).unwrap();
        if text == "after" {
            break;
        }
        let n: usize = text[..5].parse().unwrap();
        assert_eq!(text, body(n), "whole");
        assert!(last < Some(n), "in order: {last:?} then {n}");
        last = Some(n);
    }
    assert!(last.is_some(), "what was queued came first");
    drop(client);
}

/// A token signed with HS256 and `secret` over `claims` (JSON).
fn hs256(secret: &[u8], claims: &str) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let signature = ring::hmac::sign(&key, input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()))
}

/// A connection whose token expires after the handover is still closed
/// with 4001, by the successor, before its `exp`.
#[test]
fn a_token_that_expires_after_the_handover_closes_on_time() {
    const SECRET: &[u8] = b"a-shared-secret-of-at-least-32-bytes";
    let config = || {
        let mut jwt = wspush::Verifier::new(wspush::Algorithm::HS256, 0);
        jwt.add_key(SECRET).unwrap();
        Config::default().with(|c| c.jwt = Some(jwt))
    };
    let since_epoch = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
    };
    let exp = since_epoch().as_secs() + 3;
    let token = hs256(SECRET, &format!(r#"{{"sub":"alice","exp":{exp}}}"#));
    let old = Predecessor::start(config());
    let mut client = connect(old.addr, &format!("/?token={token}"));
    let (new, _) = old.hand_over(config(), 1);
    let moved_at = since_epoch();
    match client.read().expect("a close") {
        Message::Close(Some(frame)) => assert_eq!(u16::from(frame.code), 4001),
        other => panic!("not a close: {other:?}"),
    }
    let closed_at = since_epoch();
    assert!(
        closed_at < Duration::from_secs(exp),
        "{closed_at:?}, exp {exp}"
    );
    assert!(closed_at > moved_at);
    drop(client);
    new.wait_for("the expiry counted", |m| m.closed_token_expired == 1);
}

/// A connection with permessage-deflate moves with it in use both ways:
/// a compressed message sent half before and half after the move is
/// inflated and echoed compressed by the successor, as is one sent after
/// (each over the 256 bytes under which echoes go back plain).
#[test]
fn a_deflate_connection_moves_with_compression_both_ways() {
    use util::deflate::{deflated, inflated, upgrade, BROWSER_OFFER, RSV1};
    let config = || {
        Config::default().with(|c| {
            c.echo = true;
            c.deflate = true;
        })
    };
    let old = Predecessor::start(config());
    let (mut client, answer) = upgrade(old.addr, Some(BROWSER_OFFER));
    assert!(answer.unwrap().starts_with("permessage-deflate"));
    let message = |when: &str| format!("{when} the move; ").repeat(40);
    let echoed = |client: &mut std::net::TcpStream| {
        let frame = util::read_frame(client).expect("an echo");
        assert_eq!(frame.rsv, 0b100, "compressed");
        String::from_utf8(inflated(&frame.payload)).unwrap()
    };
    let text = |message: &str| util::client_frame(util::TEXT | RSV1, &deflated(message.as_bytes()));
    client.write_all(&text(&message("before"))).unwrap();
    assert_eq!(echoed(&mut client), message("before"));
    let across = text(&message("across"));
    client.write_all(&across[..across.len() / 2]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let (new, _) = old.hand_over(config(), 1);
    assert_eq!(new.handle.metrics().connections_deflate, 1);
    client.write_all(&across[across.len() / 2..]).unwrap();
    assert_eq!(echoed(&mut client), message("across"));
    client.write_all(&text(&message("after"))).unwrap();
    assert_eq!(echoed(&mut client), message("after"));
    drop(client);
}

/// A successor that goes away half way through: every connection is then
/// either still served by the first server or ended (its socket went with
/// the successor), never kept by neither without a close.
#[test]
fn a_handover_cut_off_half_way_leaves_each_connection_served_or_ended() {
    let old = Predecessor::start(Config::default());
    let mut clients: Vec<_> = (0..400).map(|_| util::raw_upgraded(old.addr)).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while old.handle.metrics().connections_open < 400 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut take = UnixStream::from(introduce_successor(old.supervisor.as_fd()).unwrap());
    assert_eq!(ask(&mut take, 1), 1, "given");
    // One read of the records (and the descriptors with them), then gone.
    let mut some = [0u8; 512];
    let _ = std::io::Read::read(&mut take, &mut some).unwrap();
    drop(take);
    std::thread::sleep(Duration::from_millis(200));
    // Unless everything was sent before the successor went (the server
    // then ended, having nothing left), some are still served here.
    let serving = old.handle.broadcast_text("still here").is_ok();
    let (mut served, mut ended) = (0, 0);
    for client in &mut clients {
        match util::read_frame(client) {
            Some(frame) => {
                assert_eq!(frame.payload, b"still here");
                served += 1;
            }
            None => ended += 1,
        }
    }
    assert_eq!(served + ended, 400);
    assert!(ended > 0, "the connections sent went with the successor");
    assert!(serving || served == 0);
    let m = old.handle.metrics();
    assert_eq!(m.connections_open as usize, served, "{m:?}");
    let _ = old.handle.shutdown();
    drop(clients);
    old.thread.join().unwrap();
}

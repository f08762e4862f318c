//! A server suspended for its next image and resumed from the state it
//! saved (in one process here: the binary's re-exec is tested in
//! `cli/tests/reexec.rs`). Each client, an independent tungstenite one,
//! sees no close and no gap; keys, channels and the history carry on,
//! and what a client had sent half of arrives whole.

mod util;

use std::io::Write;
use std::time::Duration;

use tungstenite::Message;
use util::{client_frame, connect, texts};
use wspush::{Config, MessageKind, Recipients, Server, Suspended, UpstreamReader};

/// The recipients of channel `news`.
fn news() -> Recipients {
    Recipients::Channels([wspush::ChannelName::new("news").unwrap()].into())
}

/// A configuration with upstream lines and their `open`/`close` events.
fn with_events() -> Config {
    let mut config = Config::default();
    config.upstream = Some(wspush::UpstreamConfig {
        max_bytes: 1 << 20,
        overflow: wspush::Overflow::Pause,
        events: true,
    });
    config
}

/// Reads upstream lines until one contains `needle`; returns them all.
fn lines_until(upstream: &UpstreamReader, needle: &str) -> String {
    let mut lines = Vec::new();
    while !String::from_utf8_lossy(&lines).contains(needle) {
        assert!(upstream.read(&mut lines), "the server is gone");
    }
    String::from_utf8(lines).unwrap()
}

#[test]
fn a_suspended_server_resumes_with_its_clients_keys_channels_and_history() {
    let mut old = Server::bind(with_events()).unwrap();
    let (addr, handle) = (old.local_addr(), old.handle());
    let old_upstream = old.upstream().unwrap();
    let old_thread = std::thread::spawn(move || {
        old.run().unwrap();
        old
    });
    let mut plain = connect(addr, "/");
    let mut positions = connect(addr, "/?positions=1");
    let mut alice = connect(addr, "/?id=alice&channel=news");
    let opened = lines_until(&old_upstream, "alice");
    let alice_key = opened
        .lines()
        .find(|line| line.contains("alice"))
        .and_then(|line| line.split(' ').nth(1))
        .unwrap()
        .to_string();
    assert!(texts(&mut positions, 1)[0].contains("\"position\""));
    handle.broadcast_text("one").unwrap();
    handle.send(news(), MessageKind::Text, "news one").unwrap();
    assert_eq!(texts(&mut plain, 1), ["one"]);
    assert_eq!(texts(&mut alice, 2), ["one", "news one"]);
    let first = texts(&mut positions, 1).remove(0);
    assert!(first.ends_with(".1 one"), "{first}");
    let epoch = first.split(' ').next().unwrap().split('.').next().unwrap();

    // Half a frame from alice before, the rest after.
    let frame = client_frame(0x81, b"hello");
    alice.get_mut().write_all(&frame[..4]).unwrap();
    std::thread::sleep(Duration::from_millis(100));

    handle.suspend().unwrap();
    let mut old = old_thread.join().unwrap();
    let mut suspended = old.take_suspended().expect("suspended");
    assert_eq!(suspended.connections(), 3);
    assert_eq!(suspended.next_position(), 3);
    assert_eq!(old.metrics().handover_given, 3);
    drop(old);
    // The upstream lines end with the old loop, and say no close.
    let mut rest = Vec::new();
    while old_upstream.read(&mut rest) {}
    assert!(
        !String::from_utf8_lossy(&rest).contains("close"),
        "{rest:?}"
    );

    // Saved and loaded as across an exec (within this process).
    suspended.set_extra(b"half a li".to_vec());
    let loaded = Suspended::load(suspended.save().unwrap()).unwrap();
    assert_eq!(loaded.extra(), b"half a li");
    let (mut new, taken) = Server::resume(with_events(), loaded).unwrap();
    assert_eq!(taken, 3);
    assert_eq!(new.local_addr(), addr);
    let keys: Vec<String> = new.connections().map(|c| c.key.to_string()).collect();
    assert!(keys.contains(&alice_key), "{keys:?} {alice_key}");
    let alice_ref = new
        .connections()
        .find(|c| c.key.to_string() == alice_key)
        .unwrap()
        .key;
    let upstream = new.upstream().unwrap();
    let handle = new.handle();
    let new_thread = std::thread::spawn(move || new.run().map(|()| new.metrics()));

    handle.broadcast_text("two").unwrap();
    handle.send(news(), MessageKind::Text, "news two").unwrap();
    handle
        .send(Recipients::Conn(alice_ref), MessageKind::Text, "to alice")
        .unwrap();
    assert_eq!(texts(&mut plain, 1), ["two"]);
    assert_eq!(texts(&mut alice, 3), ["two", "news two", "to alice"]);
    let second = texts(&mut positions, 1).remove(0);
    assert_eq!(second, format!("{epoch}.3 two"));

    alice.get_mut().write_all(&frame[4..]).unwrap();
    let lines = lines_until(&upstream, "hello");
    assert!(
        lines.contains(&format!("msg {alice_key} ")),
        "the same key: {lines}"
    );
    assert!(!lines.contains("open "), "no open for a moved one: {lines}");

    // The history carried on: a client from before the suspension is
    // given what it missed, across it.
    let mut back = connect(addr, &format!("/?since={epoch}.1"));
    let replayed = texts(&mut back, 2);
    assert!(replayed[0].contains("recovered"), "{replayed:?}");
    assert_eq!(replayed[1], format!("{epoch}.3 two"));
    // And a new connection is accepted on the listener kept.
    let mut late = connect(addr, "/");
    handle.broadcast_text("three").unwrap();
    assert_eq!(texts(&mut late, 1), ["three"]);
    assert_eq!(texts(&mut plain, 1), ["three"]);

    let metrics = handle.metrics();
    assert_eq!(metrics.handover_taken, 3);
    drop(upstream);
    handle.shutdown().unwrap();
    for client in [&mut plain, &mut positions, &mut alice, &mut back, &mut late] {
        loop {
            match client.read() {
                Ok(Message::Close(Some(frame))) => {
                    assert_eq!(u16::from(frame.code), 1001);
                    let _ = client.flush();
                    break;
                }
                Ok(Message::Text(t)) if t.as_str().ends_with("three") => {}
                Ok(Message::Text(t)) => panic!("nothing more was sent: {t}"),
                Ok(_) => {}
                Err(e) => panic!("a close, then the end: {e}"),
            }
        }
    }
    drop((plain, positions, alice, back, late));
    new_thread.join().unwrap().unwrap();
}

/// A state of another format version, or a memory file that holds no
/// state, is an error, not a panic; nothing it names is taken.
#[test]
fn a_state_that_is_not_one_is_an_error() {
    use std::os::fd::IntoRawFd;
    let file = tempfile_with(b"wspushRX\xff\xff");
    let e = Suspended::load(file).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    assert!(e.to_string().contains("version"), "{e}");
    let file = tempfile_with(b"not a state at all");
    assert!(Suspended::load(file).is_err());
    assert!(Suspended::load(i32::MAX).is_err(), "not open");

    fn tempfile_with(bytes: &[u8]) -> i32 {
        let path = std::env::temp_dir().join(format!("wspush-state-{}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file.into_raw_fd()
    }
}

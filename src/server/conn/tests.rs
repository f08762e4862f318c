//! The connection's state machine driven through its handlers, on a
//! socket pair (see `rig`).

use super::rig::{Rig, REQUEST};
use super::*;
use std::io::{Read, Write};

#[test]
fn only_a_connection_still_waiting_for_its_request_gets_a_deadline() {
    let mut rig = Rig::accepted();
    rig.client.write_all(&REQUEST[..20]).unwrap();
    let verdict = rig.drive(|conn, scratch, ctx| conn.on_accepted(ConnKey(0), scratch, ctx));
    assert_eq!(verdict, Verdict::Keep);
    assert!(!rig.conn.is_open());
    assert!(rig.timers.next_at().is_some());

    let mut rig = Rig::accepted();
    rig.client.write_all(REQUEST).unwrap();
    let give_up = Instant::now() + Duration::from_secs(5);
    while rig.conn.stream.peek(&mut [0]).is_err() {
        // Until the request is there, as at accept.
        assert!(Instant::now() < give_up, "the request never arrived");
        std::thread::yield_now();
    }
    let verdict = rig.drive(|conn, scratch, ctx| conn.on_accepted(ConnKey(0), scratch, ctx));
    assert_eq!(verdict, Verdict::Keep);
    assert!(rig.conn.is_open());
    assert_eq!(rig.timers.next_at(), None);
}

#[test]
fn a_pong_the_loop_has_not_read_yet_keeps_the_connection() {
    let mut rig = Rig::upgraded();
    assert_eq!(rig.visit(), Verdict::Keep, "first visit: skipped");
    assert_eq!(rig.visit(), Verdict::Keep, "second: pinged");
    assert_eq!(rig.client_frame_start(), [0x89, 0x00]);
    // The client answers, but the loop is behind and has not read it
    // when the third visit comes.
    rig.client.write_all(&[0x8A, 0x80, 1, 2, 3, 4]).unwrap();
    rig.wait_until_readable(6);
    assert_eq!(rig.visit(), Verdict::Keep);
    assert!(rig.conn.is_open(), "closed although its pong had arrived");
    assert_eq!(
        rig.client_frame_start(),
        [0x89, 0x00],
        "pinged again instead"
    );
}

#[test]
fn a_client_silent_for_the_idle_timeout_is_closed_with_1001() {
    let mut rig = Rig::upgraded();
    for _ in 0..2 {
        assert_eq!(rig.visit(), Verdict::Keep);
    }
    assert_eq!(rig.client_frame_start(), [0x89, 0x00]);
    rig.visit();
    assert!(!rig.conn.is_open());
    assert_eq!(rig.client_frame_start(), [0x88, 2 + 12]);
    let mut payload = [0u8; 14];
    rig.client.read_exact(&mut payload).unwrap();
    assert_eq!(&payload, b"\x03\xe9idle timeout");
}

/// The per-connection budget: a slab slot is at most 104 bytes, all
/// an idle connection costs in user space (its serial included; an
/// id or a channel adds a record in the routes). mio's `TcpStream` is
/// 4 bytes in a release build; a debug build's carries a selector id
/// besides (16 bytes with padding), which the budget allows for.
#[test]
fn connection_state_is_small() {
    use std::mem::size_of;
    let socket_extra = size_of::<TcpStream>() - 4;
    let budget = (104 + socket_extra).next_multiple_of(8);
    assert!(
        size_of::<Conn>() <= budget,
        "a slot of {} bytes, over {budget}",
        size_of::<Conn>()
    );
    assert!(size_of::<Phase>() <= 28 && size_of::<OutQueue>() <= 24);
}

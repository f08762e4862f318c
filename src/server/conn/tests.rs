//! The connection's state machine driven through its handlers, on a
//! socket pair (see `rig`).

use super::rig::{Rig, REQUEST};
use super::*;
use crate::protocol::ws::OpCode;
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

/// The per-connection budget: a slab slot is 56 bytes, all an idle
/// connection costs in user space (its serial included; an id or a
/// channel adds a record in the routes), and the slab's own tag takes
/// nothing more. mio's `TcpStream` is 4 bytes in a release build; a
/// debug build's carries a selector id besides (16 bytes with padding),
/// which the budget allows for there.
#[test]
fn connection_state_is_small() {
    use std::mem::size_of;
    /// The slab's entry, as slab 0.4 declares it.
    #[allow(dead_code)]
    enum SlabEntry<T> {
        Vacant(usize),
        Occupied(T),
    }
    const SLOT: usize = 56;
    let socket_extra = size_of::<TcpStream>() - 4;
    if socket_extra == 0 {
        assert_eq!(size_of::<Conn>(), SLOT, "the slot's size changed");
    } else {
        let budget = (SLOT + socket_extra).next_multiple_of(8);
        assert!(
            size_of::<Conn>() <= budget,
            "a slot of {} bytes",
            size_of::<Conn>()
        );
    }
    assert_eq!(
        size_of::<SlabEntry<Conn>>(),
        size_of::<Conn>(),
        "the slab's tag takes room"
    );
    assert!(
        size_of::<Phase>() <= 20,
        "a phase of {} bytes",
        size_of::<Phase>()
    );
}

/// What a connection holds aside (input not consumed yet, a message being
/// assembled, output its socket has not taken) is found again when more
/// arrives, and given back when it closes: the connection that takes its
/// slot next holds nothing.
#[test]
fn what_a_connection_holds_aside_is_found_again_and_freed_with_it() {
    use super::rig::{client_frame, read_in_background};
    let mut rig = Rig::upgraded();
    rig.config.echo = true;
    let key = ConnKey(0);
    let read = |rig: &mut Rig| rig.drive(|conn, s, ctx| conn.on_readable(key, true, s, ctx));
    // A first fragment, then the start of the last one's header.
    let mut first = client_frame(0x1, b"he");
    first[0] &= 0x7f;
    let last = client_frame(0x0, b"llo");
    let send_held = |rig: &mut Rig| {
        rig.client.write_all(&first).unwrap();
        rig.client.write_all(&last[..3]).unwrap();
        rig.wait_until_readable(first.len() + 3);
    };
    send_held(&mut rig);
    assert_eq!(read(&mut rig), Verdict::Keep);
    assert_eq!(
        rig.aside.counts(),
        (1, 1),
        "a header's start held, a message assembled"
    );
    assert_eq!(rig.pool.lent(), 2);
    rig.client.write_all(&last[3..]).unwrap();
    rig.wait_until_readable(last.len() - 3);
    let echo = read_in_background(&rig.client, 7);
    assert_eq!(read(&mut rig), Verdict::Keep);
    assert_eq!(
        echo.join().unwrap(),
        b"\x81\x05hello",
        "the held bytes were found"
    );
    assert_eq!((rig.aside.counts(), rig.pool.lent()), ((0, 0), 0));

    send_held(&mut rig);
    read(&mut rig);
    assert_eq!(rig.aside.counts(), (1, 1));
    // More than the socket buffers take while the client reads nothing.
    rig.config.max_queued_bytes = 64 << 20;
    let big = SharedFrames::encode(OpCode::Binary, &vec![7u8; 16 << 20]);
    assert_eq!(rig.offer(&big), Verdict::Keep);
    assert!(rig.conn.has_queued());
    assert_eq!(rig.aside.queues(), 1);
    assert!(rig.tally.queued_bytes > 0);
    // The slot is taken by the next connection once this one closes.
    let closed = std::mem::replace(&mut rig.conn, Rig::upgraded().conn);
    rig.drive(|_, _, ctx| {
        closed.close(key, CloseReason::Abnormal, ctx);
        Verdict::Keep
    });
    assert_eq!((rig.aside.counts(), rig.pool.lent()), ((0, 0), 0));
    assert_eq!((rig.aside.queues(), rig.tally.queued_bytes), (0, 0));
    assert!(
        rig.tally.frames_discarded > 0,
        "what it had queued, discarded"
    );
    assert!(!rig.conn.flags.has(Flags::HOLDING) && !rig.conn.flags.has(Flags::ASSEMBLING));
    assert!(!rig.conn.has_queued());
    assert_eq!(rig.conn.walk_mark(), WalkMark::Unmarked);
}

/// The walk mark kept in the flags reads back as it was set, beside the
/// other flags.
#[test]
fn the_walk_mark_reads_back_as_set_beside_the_other_flags() {
    let mut rig = Rig::upgraded();
    rig.conn
        .flags
        .set(Flags::POSITIONS | Flags::READ_PAUSED, true);
    for mark in [
        WalkMark::Walk(true),
        WalkMark::Walk(false),
        WalkMark::Unmarked,
    ] {
        rig.conn.mark_walk(mark);
        assert_eq!(rig.conn.walk_mark(), mark);
        assert!(rig.conn.flags.has(Flags::POSITIONS) && rig.conn.flags.has(Flags::READ_PAUSED));
    }
}

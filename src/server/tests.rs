//! The loop driven whole, on its private parts: when it sleeps, and how
//! the walk's steps carry targeted bursts and the closing sweep (see
//! `walk`).

mod loop_wait {
    use crate::server::*;

    #[test]
    fn accepts_left_over_while_accepting_is_paused_do_not_keep_the_loop_awake() {
        let mut server = Server::bind(Config::default()).unwrap();
        let now = Instant::now();
        // One listener hit its per-wake cap, then the other ran out of
        // file descriptors in the same turn.
        server.lifecycle.accept_again(Door::Main);
        let exhausted = io::Error::from_raw_os_error(24);
        let metrics = &server.report.shared.counters.metrics;
        server
            .lifecycle
            .pause_accepting(&exhausted, now, 0, metrics);
        assert_eq!(server.poll_timeout(None, now).unwrap(), None);
        server
            .lifecycle
            .resume_accepting(now + lifecycle::ACCEPT_PAUSE);
        assert_eq!(
            server.poll_timeout(None, now).unwrap(),
            Some(Duration::ZERO)
        );
    }
}

mod delivery {
    use std::io::{ErrorKind, Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    use crate::config::Config;
    use crate::protocol::commands::Recipients;
    use crate::protocol::ws::{CloseCode, MessageKind};
    use crate::server::lifecycle::Ending;
    use crate::server::Server;

    /// A server whose slices visit `budget` connections, and `count`
    /// clients upgraded as `/?id=u{i}`, with `&channel=hot` where `hot(i)`.
    fn server_and_clients(
        budget: usize,
        count: usize,
        hot: impl Fn(usize) -> bool,
    ) -> (Server, Vec<TcpStream>) {
        let mut server = Server::bind(Config {
            fanout_budget: budget,
            ..Config::default()
        })
        .unwrap();
        let addr = server.local_addr();
        let mut clients = Vec::new();
        for i in 0..count {
            let channel = if hot(i) { "&channel=hot" } else { "" };
            let mut client = TcpStream::connect(addr).unwrap();
            let request = format!(
                "GET /?id=u{i}{channel} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                 Sec-WebSocket-Version: 13\r\n\r\n"
            );
            client.write_all(request.as_bytes()).unwrap();
            clients.push(client);
        }
        for _ in 0..1000 {
            if server.connections().count() == count {
                break;
            }
            server.poll_once(Some(Duration::from_millis(10))).unwrap();
        }
        assert_eq!(server.connections().count(), count, "every client upgraded");
        for client in &mut clients {
            client
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8];
            while !head.ends_with(b"\r\n\r\n") {
                client.read_exact(&mut byte).unwrap();
                head.push(byte[0]);
            }
            assert!(head.starts_with(b"HTTP/1.1 101"));
        }
        (server, clients)
    }

    /// Takes what the handles queued and frames it, as an iteration does.
    fn take_commands(server: &mut Server) {
        server.intake.woken();
        server.intake.take_arrivals(&server.report.shared);
        server.frame_waiting();
    }

    /// One step of the walk; how many clients got their first bytes in it.
    fn slice(server: &mut Server, clients: &[TcpStream], reached: &mut [bool]) -> usize {
        server.walk_step(Instant::now());
        let mut newly = 0;
        for (client, reached) in clients.iter().zip(reached.iter_mut()) {
            client.set_nonblocking(true).unwrap();
            let got = match client.peek(&mut [0u8; 1]) {
                Ok(n) => n > 0,
                Err(e) if e.kind() == ErrorKind::WouldBlock => false,
                Err(e) => panic!("peek: {e}"),
            };
            client.set_nonblocking(false).unwrap();
            if got && !*reached {
                *reached = true;
                newly += 1;
            }
        }
        newly
    }

    /// The frames a client has been sent: (opcode, payload). The slices
    /// write from this thread, so once they are done every byte is in the
    /// client's socket: it is read until there is nothing more.
    fn frames(client: &mut TcpStream) -> Vec<(u8, Vec<u8>)> {
        client.set_nonblocking(true).unwrap();
        let mut bytes = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match client.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("read: {e}"),
            }
        }
        client.set_nonblocking(false).unwrap();
        let mut frames = Vec::new();
        let mut rest = &bytes[..];
        while let [first, second, after @ ..] = rest {
            let len = usize::from(second & 0x7F);
            assert!(len < 126, "short frames only here");
            assert!(after.len() >= len, "a frame cut short: {bytes:?}");
            frames.push((first & 0x0F, after[..len].to_vec()));
            rest = &after[len..];
        }
        assert!(rest.is_empty(), "a frame header cut short: {bytes:?}");
        frames
    }

    fn texts(frames: &[(u8, Vec<u8>)]) -> Vec<String> {
        frames
            .iter()
            .filter(|(opcode, _)| *opcode == 0x1)
            .map(|(_, payload)| String::from_utf8(payload.clone()).unwrap())
            .collect()
    }

    #[test]
    fn a_targeted_burst_goes_out_a_budget_at_a_time_in_order_with_broadcasts_framed_meanwhile() {
        const BUDGET: usize = 4;
        let hot = |i: usize| !i.is_multiple_of(3);
        let (mut server, mut clients) = server_and_clients(BUDGET, 30, hot);
        let handle = server.handle();
        let to_hot = || Recipients::channels(&["hot"]);
        for text in ["p0", "p1", "p2"] {
            handle.send(to_hot(), MessageKind::Text, text).unwrap();
        }
        handle.broadcast_text("b0").unwrap();
        take_commands(&mut server);
        let mut reached = vec![false; clients.len()];
        let mut slices = 0;
        // Part of the way through, more is framed: another message for
        // the channel, then a broadcast.
        for _ in 0..3 {
            assert!(slice(&mut server, &clients, &mut reached) <= BUDGET);
            slices += 1;
        }
        let early = reached.iter().filter(|r| **r).count();
        assert!(
            (1..20).contains(&early),
            "{early} of 20 subscribers reached: under way, not done"
        );
        handle.send(to_hot(), MessageKind::Text, "p3").unwrap();
        handle.broadcast_text("b1").unwrap();
        take_commands(&mut server);
        while server.walk.delivering() {
            assert!(slice(&mut server, &clients, &mut reached) <= BUDGET);
            slices += 1;
            assert!(slices < 100, "the deliveries never ended");
        }
        assert!(slices > 30 / BUDGET, "{slices} slices");
        for (i, client) in clients.iter_mut().enumerate() {
            let expected: &[&str] = if hot(i) {
                &["p0", "p1", "p2", "b0", "p3", "b1"]
            } else {
                &["b0", "b1"]
            };
            assert_eq!(texts(&frames(client)), expected, "client {i}");
        }
        assert_eq!(server.walk.stream.next_seq(), crate::server::owed::Seq(2));
        let targeted = &server.walk.targeted;
        assert!(targeted.is_idle() && targeted.floor().is_none());
    }

    #[test]
    fn closes_of_many_ids_go_out_a_budget_at_a_time_after_what_was_sent_before() {
        const BUDGET: usize = 4;
        let (mut server, mut clients) = server_and_clients(BUDGET, 24, |_| false);
        let handle = server.handle();
        handle.broadcast_text("before").unwrap();
        for i in 0..24 {
            let whom = Recipients::id(&format!("u{i}"));
            handle.close(whom, CloseCode(4000), "bye").unwrap();
        }
        handle.broadcast_text("after").unwrap();
        take_commands(&mut server);
        let mut reached = vec![false; clients.len()];
        let mut slices = 0;
        while server.walk.delivering() {
            let newly = slice(&mut server, &clients, &mut reached);
            assert!(newly <= BUDGET, "{newly} reached in one step");
            slices += 1;
            assert!(slices < 100, "the deliveries never ended");
        }
        assert!(slices >= 24 / BUDGET, "{slices} slices");
        for (i, client) in clients.iter_mut().enumerate() {
            let frames = frames(client);
            assert_eq!(
                texts(&frames),
                ["before"],
                "client {i}: nothing after its close"
            );
            let (opcode, payload) = frames.last().unwrap();
            assert_eq!(*opcode, 0x8, "client {i} closed");
            assert_eq!(&payload[..2], &4000u16.to_be_bytes());
            assert_eq!(&payload[2..], b"bye");
        }
    }

    /// The clients that have bytes waiting (each counted once in `seen`).
    fn newly_reached(clients: &[TcpStream], seen: &mut [bool]) -> usize {
        let mut newly = 0;
        for (client, seen) in clients.iter().zip(seen.iter_mut()) {
            client.set_nonblocking(true).unwrap();
            let got = matches!(client.peek(&mut [0u8; 1]), Ok(n) if n > 0);
            client.set_nonblocking(false).unwrap();
            if got && !*seen {
                *seen = true;
                newly += 1;
            }
        }
        newly
    }

    #[test]
    fn a_shutdown_closes_the_connections_a_budget_at_a_time() {
        const BUDGET: usize = 4;
        let (mut server, mut clients) = server_and_clients(BUDGET, 10, |_| false);
        let now = Instant::now();
        let mut seen = vec![false; clients.len()];
        server.close_everything(now, Ending::Shutdown);
        assert!(server.walk.closing_pending());
        server.walk_step(now);
        assert_eq!(newly_reached(&clients, &mut seen), BUDGET, "the first step");
        assert!(server.walk.closing_pending());
        server.walk_step(now);
        assert_eq!(newly_reached(&clients, &mut seen), BUDGET, "the second");
        server.walk_step(now);
        assert_eq!(newly_reached(&clients, &mut seen), 2, "the rest");
        assert!(!server.walk.closing_pending());
        for (i, client) in clients.iter_mut().enumerate() {
            let frames = frames(client);
            assert_eq!(frames.len(), 1, "client {i}: one close");
            assert_eq!(frames[0].0, 0x8);
            assert_eq!(&frames[0].1[..2], &1001u16.to_be_bytes());
        }
        // Closing connections are left to their handshake: none was
        // dropped, and a sweep again sends nothing more.
        assert_eq!(server.connections().count(), 0, "none open");
        assert_eq!(server.conns.len(), clients.len(), "none dropped");
    }

    #[test]
    fn a_shutdown_asked_right_after_a_send_closes_once_the_send_is_out_with_no_wait() {
        let (mut server, mut clients) = server_and_clients(1024, 2, |_| false);
        // No periodic event to wake the loop by chance.
        server.config.stats_interval = None;
        let handle = server.handle();
        handle.broadcast_text("last").unwrap();
        handle.shutdown().unwrap();
        // The iteration that takes them: it frames the message, and its
        // step writes it to both.
        server.intake.woken();
        server.intake.take_arrivals(&server.report.shared);
        server.advance_broadcasts(Instant::now());
        server.walk_step(Instant::now());
        assert!(!server.walk.delivering(), "the pass is over");
        assert!(server.lifecycle.is_serving(), "the closes come after it");
        // Nothing else is due, yet the loop does not sleep: the closing
        // sweep begins in the next iteration.
        let now = Instant::now();
        assert_eq!(
            server.poll_timeout(None, now).unwrap(),
            Some(Duration::ZERO)
        );
        server.advance_broadcasts(now);
        assert!(!server.lifecycle.is_serving());
        server.walk_step(now);
        for client in &mut clients {
            let frames = frames(client);
            assert_eq!(texts(&frames[..1]), ["last"]);
            assert_eq!((frames.len(), frames[1].0), (2, 0x8), "then the close");
        }
    }
}

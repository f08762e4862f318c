//! A connection driven by hand over a loopback pair, for the stages'
//! unit tests.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use mio::net::TcpStream;

use super::{Aside, Conn, Ctx, DeflateScratch, Verdict};
use crate::config::Config;
use crate::ops::metrics::{Counters, Tally};
use crate::protocol::http::Endpoints;
use crate::protocol::position::Epoch;
use crate::protocol::ws::OpCode;
use crate::server::frames::SharedFrames;
use crate::server::history::{Bounds, History};
use crate::server::key::ConnKey;
use crate::server::net::pool::BufferPool;
use crate::server::owed::{Batches, Owed, Seq};
use crate::server::routes::Routes;
use crate::server::time::timer::TimerWheel;

/// One upgraded connection over a loopback pair, with the loop's parts
/// it needs, driven by hand (no poll): so a test decides when the loop
/// reads.
pub(super) struct Rig {
    pub(super) conn: Conn,
    pub(super) client: std::net::TcpStream,
    pub(super) config: Config,
    pub(super) pool: BufferPool,
    pub(super) timers: TimerWheel,
    pub(super) counters: Counters,
    pub(super) tally: Tally,
    pub(super) scratch: Vec<u8>,
    pub(super) replies: Vec<u8>,
    pub(super) routes: Routes,
    pub(super) deflate: DeflateScratch,
    pub(super) gathered: Vec<SharedFrames>,
    pub(super) aside: Aside,
    pub(super) history: History,
}

/// An upgrade request, whole.
pub(super) const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

impl Rig {
    /// A connection just accepted; nothing read yet.
    pub(super) fn accepted() -> Rig {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        accepted.set_nonblocking(true).unwrap();
        let config = Config::default();
        let pool = BufferPool::new(config.max_head_bytes, 0, 4);
        let timers = TimerWheel::new(Duration::from_millis(100), 16, Instant::now());
        let (counters, tally) = Default::default();
        let endpoints = Endpoints {
            websocket: true,
            metrics: false,
            demo: false,
        };
        let conn = Conn::accepted(TcpStream::from_std(accepted), endpoints, 1);
        Rig {
            conn,
            client,
            config,
            pool,
            timers,
            counters,
            tally,
            scratch: vec![0; 64 * 1024],
            replies: Vec::with_capacity(64 * 1024),
            routes: Routes::new(16),
            deflate: DeflateScratch::default(),
            gathered: Vec::new(),
            aside: Aside::default(),
            history: History::new(
                Epoch(1),
                1,
                Bounds {
                    messages: 0,
                    bytes: 0,
                    age: Duration::from_secs(1),
                },
            )
            .unwrap(),
        }
    }

    /// A connection that sent its request and got the 101.
    pub(super) fn upgraded() -> Rig {
        let mut rig = Rig::accepted();
        rig.client.write_all(REQUEST).unwrap();
        assert_eq!(
            rig.drive(|conn, scratch, ctx| conn.on_readable(ConnKey(0), false, scratch, ctx)),
            Verdict::Keep
        );
        assert!(rig.conn.is_open());
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(rig.client_byte());
        }
        assert!(head.starts_with(b"HTTP/1.1 101"));
        rig
    }

    /// Runs `handler` on the connection with a context over the rig's parts.
    pub(super) fn drive<V>(
        &mut self,
        handler: impl FnOnce(&mut Conn, &mut [u8], &mut Ctx<'_>) -> V,
    ) -> V {
        let mut ctx = Ctx {
            config: &self.config,
            pool: &mut self.pool,
            timers: &mut self.timers,
            counters: &self.counters,
            tally: &mut self.tally,
            replies: &mut self.replies,
            routes: &mut self.routes,
            upstream: None,
            deflate: &mut self.deflate,
            aside: &mut self.aside,
            gathered: &mut self.gathered,
            now: Instant::now(),
            next_batch: Seq(0),
            history: &self.history,
        };
        handler(&mut self.conn, &mut self.scratch, &mut ctx)
    }

    /// A delivery visit offering `frames` as the one batch the
    /// connection is owed.
    pub(super) fn offer(&mut self, frames: &SharedFrames) -> Verdict {
        let first = self.conn.next_batch;
        let log = [frames.clone()];
        let owed = Owed {
            batches: Batches { first, log: &log },
            items: &[],
            up_to: first.plus(1),
        };
        let visited = self.drive(|conn, _, ctx| conn.deliver(ConnKey(0), owed, ctx));
        visited.expect("no items to leave unfinished")
    }

    /// A heartbeat visit closing after 3 silent visits (ping interval
    /// 30 s, idle timeout 60 s).
    pub(super) fn visit(&mut self) -> Verdict {
        let ping = SharedFrames::encode(OpCode::Ping, b"");
        self.drive(|conn, scratch, ctx| conn.on_heartbeat(ConnKey(0), &ping, 3, scratch, ctx))
    }

    /// Waits (at most 5 s) until `len` bytes the client sent are
    /// readable on the connection's socket.
    pub(super) fn wait_until_readable(&mut self, len: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buf = vec![0u8; len];
        while !matches!(self.conn.stream.peek(&mut buf), Ok(n) if n >= len) {
            assert!(Instant::now() < deadline, "{len} bytes never arrived");
            std::thread::yield_now();
        }
    }

    /// The next byte the client gets.
    pub(super) fn client_byte(&mut self) -> u8 {
        let mut byte = [0u8];
        self.client.read_exact(&mut byte).unwrap();
        byte[0]
    }

    /// The first two bytes of the next frame the client gets.
    pub(super) fn client_frame_start(&mut self) -> [u8; 2] {
        [self.client_byte(), self.client_byte()]
    }
}

/// A masked client frame (mask 1 2 3 4) with a payload under 126 bytes.
pub(super) fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x80 | opcode, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
    frame
}

/// Reads what the client got until `len` bytes came, in another
/// thread (the test thread keeps driving the connection).
pub(super) fn read_in_background(
    client: &std::net::TcpStream,
    len: usize,
) -> std::thread::JoinHandle<Vec<u8>> {
    let mut client = client.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut got = vec![0u8; len];
        client.read_exact(&mut got).unwrap();
        got
    })
}

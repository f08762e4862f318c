//! The client side of a run: many [`Conn`]s driven by one epoll loop
//! (mio's `Poll`), reading through one shared scratch buffer.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use mio::{Events, Poll, Token};

use crate::conn::{Conn, Context, Failure, Transition};
use crate::stats::Tally;

/// Readiness events taken from the kernel per `epoll_wait`.
pub const EVENTS_PER_POLL: usize = 1024;

/// Size of the buffer every read goes through.
const SCRATCH_BYTES: usize = 64 * 1024;

/// A set of client connections to one server and what they observed.
pub struct Clients {
    poll: Poll,
    events: Events,
    conns: Vec<Conn>,
    scratch: Box<[u8]>,
    server: SocketAddr,
    sources: Vec<Ipv4Addr>,
    payload_len: usize,
    tally: Tally,
    pending: usize,
    open: usize,
}

impl Clients {
    /// An empty set that will connect to `server` from the `sources`
    /// addresses in turn and expect messages of `payload_len` bytes.
    pub fn new(server: SocketAddr, sources: Vec<Ipv4Addr>, payload_len: usize) -> io::Result<Self> {
        assert!(!sources.is_empty(), "at least one source address");
        Ok(Clients {
            poll: Poll::new()?,
            events: Events::with_capacity(EVENTS_PER_POLL),
            conns: Vec::new(),
            scratch: vec![0; SCRATCH_BYTES].into_boxed_slice(),
            server,
            sources,
            payload_len,
            tally: Tally::new(),
            pending: 0,
            open: 0,
        })
    }

    /// Starts `count` more connections.
    pub fn start(&mut self, count: usize) {
        for _ in 0..count {
            let id = self.conns.len();
            let source = self.sources[id % self.sources.len()];
            match Conn::connect(source, self.server, self.poll.registry(), Token(id)) {
                Ok(conn) => {
                    self.conns.push(conn);
                    self.pending += 1;
                }
                Err(failure) => {
                    self.conns.push(Conn::dead());
                    self.tally.failed(failure.label());
                }
            }
        }
    }

    /// Connections started so far.
    pub fn started(&self) -> usize {
        self.conns.len()
    }

    /// Connections still connecting or upgrading.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Upgraded connections that are still alive.
    pub fn open(&self) -> usize {
        self.open
    }

    /// What the connections observed.
    pub fn tally(&self) -> &Tally {
        &self.tally
    }

    /// What the connections observed, for registering sent messages.
    pub fn tally_mut(&mut self) -> &mut Tally {
        &mut self.tally
    }

    /// Waits up to `timeout` for readiness and handles whatever is ready;
    /// returns how many events that was (at most [`EVENTS_PER_POLL`]).
    pub fn step(&mut self, timeout: Duration) -> io::Result<usize> {
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(0),
            Err(e) => return Err(e),
        }
        let mut cx = Context {
            registry: self.poll.registry(),
            server: self.server,
            scratch: &mut self.scratch,
            payload_len: self.payload_len,
            tally: &mut self.tally,
        };
        let mut handled = 0;
        for event in self.events.iter() {
            handled += 1;
            let id = event.token().0;
            let conn = &mut self.conns[id];
            let was_open = conn.is_open();
            match conn.on_event(id, event, &mut cx) {
                Ok(Transition::Same) => {}
                Ok(Transition::Opened) => {
                    self.pending -= 1;
                    self.open += 1;
                }
                Err(failure) => {
                    // A connection that was pending may have opened and failed
                    // within this one event; it still leaves the pending count.
                    if was_open {
                        self.open -= 1;
                    } else {
                        self.pending -= 1;
                    }
                    conn.kill();
                    cx.tally.failed(failure.label());
                }
            }
        }
        Ok(handled)
    }

    /// Gives up every connection still connecting or upgrading.
    pub fn abandon_pending(&mut self) {
        for conn in self.conns.iter_mut().filter(|c| c.is_pending()) {
            conn.kill();
            self.tally.failed(Failure::Timeout.label());
        }
        self.pending = 0;
    }
}

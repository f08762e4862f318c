//! The client side of a push run in one process: many [`Conn`]s driven by
//! one epoll loop (mio's `Poll`), reading through one shared scratch buffer.

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token, Waker};

use crate::client::conn::{Conn, Context, Expect, InOrder, Query, Transition};
use crate::client::dial::{self, Failure};
use crate::observe::stats::Tally;
use crate::wire::compression::Inflating;
use crate::wire::message::Padding;

/// Readiness events taken from the kernel per `epoll_wait`.
pub const EVENTS_PER_POLL: usize = 1024;

/// Size of the buffer every read goes through.
pub const SCRATCH_BYTES: usize = 64 * 1024;

/// Token of the [`Waker`] that interrupts a loop's step.
pub const WAKER: Token = Token(usize::MAX);

/// Where and how a set of clients connects.
#[derive(Debug, Clone)]
pub struct ClientPlan {
    /// The server's addresses; connection `id` dials `servers[id % len]`.
    pub servers: Vec<SocketAddr>,
    /// Source addresses; connection `id` binds `sources[id % len]`.
    pub sources: Vec<Ipv4Addr>,
    /// Id of this set's first connection (ids name the connections in
    /// their upgrade request and pick their source address).
    pub first_id: u64,
    /// Size of every broadcast payload.
    pub payload_len: usize,
    /// What pads each broadcast after its stamp.
    pub padding: Padding,
    /// The connections offer permessage-deflate (and require it).
    pub deflate: bool,
    /// The channel the connections subscribe to in their URL, if any.
    pub channel: Option<String>,
    /// The connections ask for positions, and resume after the last one
    /// they had when they are dialed again.
    pub positions: bool,
    /// How long a connection may stay connecting or upgrading.
    pub connect_timeout: Duration,
}

/// A set of client connections to one server and what they observed.
pub struct Clients {
    poll: Poll,
    events: Events,
    conns: Vec<Conn>,
    scratch: Box<[u8]>,
    plan: ClientPlan,
    tally: Tally,
    /// Compressed broadcasts inflated (with `plan.deflate`).
    inflating: Inflating,
    /// Connections that were pending when last looked at, oldest first,
    /// with the time they started.
    pending_since: VecDeque<(usize, Instant)>,
    pending: usize,
    open: usize,
    opened: usize,
    /// What the connections' URLs ask for.
    query: Query,
    /// Connections dropped to be dialed again, each at its time.
    redials: VecDeque<(usize, Instant)>,
}

impl Clients {
    /// An empty set following `plan`.
    pub fn new(plan: ClientPlan) -> io::Result<Self> {
        assert!(!plan.sources.is_empty(), "at least one source address");
        let query = Query {
            channel: plan.channel.clone(),
            positions: plan.positions,
            epoch: None,
            offset: None,
        };
        Ok(Clients {
            query,
            redials: VecDeque::new(),
            poll: Poll::new()?,
            events: Events::with_capacity(EVENTS_PER_POLL),
            conns: Vec::new(),
            scratch: vec![0; SCRATCH_BYTES].into_boxed_slice(),
            plan,
            tally: Tally::new(),
            inflating: Inflating::default(),
            pending_since: VecDeque::new(),
            pending: 0,
            open: 0,
            opened: 0,
        })
    }

    /// A waker that makes a blocked [`Clients::step`] return.
    pub fn waker(&self) -> io::Result<Waker> {
        Waker::new(self.poll.registry(), WAKER)
    }

    /// Starts `count` more connections.
    pub fn start(&mut self, count: usize) {
        for _ in 0..count {
            let index = self.conns.len();
            self.conns.push(Conn::dead());
            self.dial(index);
        }
    }

    /// Dials connection `index` (again, keeping what it received).
    fn dial(&mut self, index: usize) {
        let id = self.plan.first_id + index as u64;
        let source = self.plan.sources[id as usize % self.plan.sources.len()];
        let last = self.query.last_before(self.conns[index].next_seq());
        let query = self.query.after_id(last);
        match dial::dial(
            source,
            self.plan.servers[id as usize % self.plan.servers.len()],
            id,
            self.plan.deflate,
            &query,
            self.poll.registry(),
            Token(index),
            Interest::READABLE,
        ) {
            Ok(dialed) => {
                self.conns[index].redialed(dialed);
                self.pending_since.push_back((index, Instant::now()));
                self.pending += 1;
            }
            Err(failure) => self.tally.failed(failure.label()),
        }
    }

    /// Drops every open connection at once and dials them again, spread
    /// evenly over `within` (each resumes after its last position, if it
    /// asks for positions).
    pub fn storm(&mut self, within: Duration) {
        let open: Vec<usize> = (0..self.conns.len())
            .filter(|&i| self.conns[i].is_open())
            .collect();
        let start = Instant::now();
        let step = within / (open.len().max(1) as u32);
        for (n, &index) in open.iter().enumerate() {
            self.conns[index].drop_socket();
            self.redials.push_back((index, start + step * n as u32));
        }
        self.open -= open.len();
    }

    /// Dials the dropped connections whose time has come.
    fn redial_due(&mut self) {
        let now = Instant::now();
        while let Some(&(index, at)) = self.redials.front() {
            if at > now {
                return;
            }
            self.redials.pop_front();
            self.dial(index);
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

    /// Connections that are open or will be again: upgraded, dialing or
    /// upgrading, or dropped and waiting to be dialed again.
    pub fn coming(&self) -> usize {
        self.open + self.pending + self.redials.len()
    }

    /// Connections that completed the upgrade, including those that failed since.
    pub fn opened(&self) -> usize {
        self.opened
    }

    /// What the connections observed.
    pub fn tally(&self) -> &Tally {
        &self.tally
    }

    /// What the connections observed, for announcing messages.
    pub fn tally_mut(&mut self) -> &mut Tally {
        &mut self.tally
    }

    /// Waits up to `timeout` for readiness (or the waker) and handles
    /// whatever is ready, then fails connections pending for longer than
    /// the connect timeout; returns how many events there were (at most
    /// [`EVENTS_PER_POLL`]).
    pub fn step(&mut self, timeout: Duration) -> io::Result<usize> {
        self.redial_due();
        let timeout = match self.redials.front() {
            Some(&(_, at)) => timeout.min(at.saturating_duration_since(Instant::now())),
            None => timeout,
        };
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(0),
            Err(e) => return Err(e),
        }
        let mut cx = Context {
            registry: self.poll.registry(),
            servers: &self.plan.servers,
            scratch: &mut self.scratch,
            check: InOrder {
                expect: Expect {
                    payload_len: self.plan.payload_len,
                    padding: self.plan.padding,
                    deflate: self.plan.deflate,
                },
                inflating: &mut self.inflating,
                tally: &mut self.tally,
                query: &mut self.query,
            },
        };
        let mut handled = 0;
        for event in self.events.iter() {
            handled += 1;
            let token = event.token();
            if token == WAKER {
                continue;
            }
            let conn = &mut self.conns[token.0];
            let was_open = conn.is_open();
            let id = self.plan.first_id + token.0 as u64;
            match conn.on_event(id, token, event, &mut cx) {
                Ok(Transition::Same) => {}
                Ok(Transition::Opened) => {
                    self.pending -= 1;
                    self.open += 1;
                    self.opened += 1;
                }
                Err(failure) => {
                    // A connection that was pending may have opened and failed
                    // within this one event; it still leaves the pending count.
                    if was_open {
                        self.open -= 1;
                    } else {
                        self.pending -= 1;
                    }
                    cx.check.tally.failed(failure.label());
                    if cx.check.query.positions && (was_open || conn.next_seq() > 1) {
                        // Dropped by the server, or refused coming back:
                        // dial again after 0 to 2 s, as a client would,
                        // and resume.
                        conn.drop_socket();
                        let wait = Duration::from_millis(id.wrapping_mul(7919) % 2000);
                        let at = Instant::now() + wait;
                        let place = self.redials.partition_point(|&(_, t)| t <= at);
                        self.redials.insert(place, (token.0, at));
                    } else {
                        conn.kill();
                    }
                }
            }
        }
        self.expire(Instant::now());
        Ok(handled)
    }

    /// Fails the connections that have been pending for longer than the
    /// connect timeout. They started in order, so only the front of the
    /// queue needs looking at.
    fn expire(&mut self, now: Instant) {
        while let Some(&(index, since)) = self.pending_since.front() {
            if self.conns[index].is_pending() {
                if now.duration_since(since) < self.plan.connect_timeout {
                    return;
                }
                self.pending -= 1;
                self.tally.failed(Failure::Timeout.label());
                if self.query.positions && self.conns[index].next_seq() > 1 {
                    // Coming back: try again, as a client would.
                    self.conns[index].drop_socket();
                    self.pending_since.pop_front();
                    self.dial(index);
                    continue;
                }
                self.conns[index].kill();
            }
            self.pending_since.pop_front();
        }
    }

    /// Gives up every connection still connecting or upgrading.
    pub fn abandon_pending(&mut self) {
        for (index, _) in self.pending_since.drain(..) {
            let conn = &mut self.conns[index];
            if conn.is_pending() {
                conn.kill();
                self.tally.failed(Failure::Timeout.label());
            }
        }
        self.pending = 0;
    }
}

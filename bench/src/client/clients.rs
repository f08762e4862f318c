//! The client side of a run in one process: many [`Conn`]s driven by one
//! epoll loop (mio's `Poll`), reading through one shared scratch buffer,
//! their messages judged by one [`Check`] (push, receipts or echo).

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};
use serde::{Deserialize, Serialize};

use crate::client::conn::{Assembly, Check, Conn, Context, Transition};
use crate::client::dial::{self, Failure};

/// Readiness events taken from the kernel per `epoll_wait`.
pub const EVENTS_PER_POLL: usize = 1024;

/// Token of the [`Waker`] that interrupts a loop's step.
pub const WAKER: Token = Token(usize::MAX);

/// Counters of a loop's connections (a worker's, or all workers' added up).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Connections started.
    pub started: usize,
    /// Connections connecting or upgrading now.
    pub pending: usize,
    /// Connections upgraded and alive now.
    pub open: usize,
    /// Connections that completed the upgrade, alive or not.
    pub opened: usize,
    /// Connections that failed, at any stage.
    pub failed: u64,
}

impl Counts {
    /// Adds another worker's counters.
    pub fn add(&mut self, other: &Counts) {
        self.started += other.started;
        self.pending += other.pending;
        self.open += other.open;
        self.opened += other.opened;
        self.failed += other.failed;
    }
}

/// An open connection's id, socket and what its check keeps, with the check.
pub type OpenConn<'a, C> = (
    u64,
    &'a mut TcpStream,
    &'a mut <C as Check>::State,
    &'a mut C,
);

/// Where a set of clients connects.
#[derive(Debug, Clone)]
pub struct ClientPlan {
    /// The server's addresses; connection `id` dials `servers[id % len]`,
    /// and after each storm ([`Clients::storm`]) the next one: with several
    /// hosts, every reconnect of a storm lands on another host.
    pub servers: Vec<SocketAddr>,
    /// Source addresses; connection `id` binds `sources[id % len]`.
    pub sources: Vec<Ipv4Addr>,
    /// Id of this set's first connection (ids name the connections in
    /// their upgrade request and pick their source address).
    pub first_id: u64,
    /// How long a connection may stay connecting or upgrading.
    pub connect_timeout: Duration,
}

/// A set of client connections to one server, and the check that judges
/// what they receive.
pub struct Clients<C: Check> {
    poll: Poll,
    events: Events,
    conns: Vec<Conn<C::State>>,
    scratch: Box<[u8]>,
    assembly: Assembly,
    plan: ClientPlan,
    check: C,
    /// Connections that were pending when last looked at, oldest first,
    /// with the time they started.
    pending_since: VecDeque<(usize, Instant)>,
    book: Book,
    /// Storms so far: connection `id` dials `servers[(id + storms) % len]`.
    storms: usize,
}

/// The loop's counts of its connections, and those waiting to be dialed
/// again.
#[derive(Default)]
struct Book {
    pending: usize,
    open: usize,
    opened: usize,
    /// Connections dropped to be dialed again, each at its time.
    redials: VecDeque<(usize, Instant)>,
}

impl Book {
    /// Settles connection `index` (`id`) after `failure`: dialed again
    /// after the delay the server asked for (a draining server's hint), or
    /// else 0 to 2 s, as a client would, if the check says so, else dead.
    fn failed<C: Check>(
        &mut self,
        conn: &mut Conn<C::State>,
        check: &mut C,
        (index, id): (usize, u64),
        failure: Failure,
        was_open: bool,
    ) {
        if was_open {
            self.open -= 1;
        } else {
            self.pending -= 1;
        }
        if check.failed(id, conn.state_mut(), failure, was_open) {
            conn.kill();
            let wait = check
                .redial_after(id)
                .unwrap_or_else(|| Duration::from_millis(id.wrapping_mul(7919) % 2000));
            let at = Instant::now() + wait;
            let place = self.redials.partition_point(|&(_, t)| t <= at);
            self.redials.insert(place, (index, at));
        } else {
            conn.kill();
        }
    }
}

impl<C: Check> Clients<C> {
    /// An empty set following `plan`, judged by `check`.
    pub fn new(plan: ClientPlan, check: C) -> io::Result<Self> {
        if plan.sources.is_empty() || plan.servers.is_empty() {
            return Err(io::Error::other(
                "a plan needs a server and a source address",
            ));
        }
        Ok(Clients {
            poll: Poll::new()?,
            events: Events::with_capacity(EVENTS_PER_POLL),
            conns: Vec::new(),
            scratch: vec![0; C::SCRATCH_BYTES].into_boxed_slice(),
            assembly: Assembly::default(),
            plan,
            check,
            pending_since: VecDeque::new(),
            book: Book::default(),
            storms: 0,
        })
    }

    /// A waker that makes a blocked [`Clients::step`] return.
    pub fn waker(&self) -> io::Result<Waker> {
        Waker::new(self.poll.registry(), WAKER)
    }

    /// Starts `count` more connections.
    pub fn start(&mut self, count: usize) {
        self.conns.reserve(count);
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
        let server = self.plan.servers[(id as usize + self.storms) % self.plan.servers.len()];
        let conn = &mut self.conns[index];
        let path = self.check.path(id, conn.state());
        let ask = dial::Ask {
            path: &path,
            transport: self.check.transport(id),
        };
        // A connection that queues requests keeps writable interest: a
        // request that did not fit waits for it.
        let interest = if C::WRITES {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        let registry = self.poll.registry();
        match dial::dial(source, server, id, ask, registry, Token(index), interest) {
            Ok(dialed) => {
                conn.redialed(dialed);
                self.pending_since.push_back((index, Instant::now()));
                self.book.pending += 1;
            }
            Err(failure) => {
                self.check.failed(id, conn.state_mut(), failure, false);
            }
        }
    }

    /// Drops every open connection at once and dials them again, spread
    /// evenly over `within`, each to the next of the servers (each resumes
    /// after its last position, if it asks for positions).
    pub fn storm(&mut self, within: Duration) {
        self.storms += 1;
        let open: Vec<usize> = (0..self.conns.len())
            .filter(|&i| self.conns[i].is_open())
            .collect();
        let start = Instant::now();
        let step = within / (open.len().max(1) as u32);
        for (n, &index) in open.iter().enumerate() {
            self.conns[index].kill();
            self.book
                .redials
                .push_back((index, start + step * n as u32));
        }
        self.book.open -= open.len();
    }

    /// Dials the dropped connections whose time has come.
    fn redial_due(&mut self) {
        let now = Instant::now();
        while let Some(&(index, at)) = self.book.redials.front() {
            if at > now {
                return;
            }
            self.book.redials.pop_front();
            self.check.redialing();
            self.dial(index);
        }
    }

    /// Connections started so far.
    pub fn started(&self) -> usize {
        self.conns.len()
    }

    /// Connections still connecting or upgrading.
    pub fn pending(&self) -> usize {
        self.book.pending
    }

    /// Upgraded connections that are still alive.
    pub fn open(&self) -> usize {
        self.book.open
    }

    /// Connections that are open or will be again: upgraded, dialing or
    /// upgrading, or dropped and waiting to be dialed again.
    pub fn coming(&self) -> usize {
        self.book.open + self.book.pending + self.book.redials.len()
    }

    /// Connections that completed the upgrade, including those that failed since.
    pub fn opened(&self) -> usize {
        self.book.opened
    }

    /// The loop's counters, with `failed` as the check counted them.
    pub fn counts(&self, failed: u64) -> Counts {
        Counts {
            started: self.started(),
            pending: self.pending(),
            open: self.open(),
            opened: self.opened(),
            failed,
        }
    }

    /// The check, and what it recorded.
    pub fn check(&self) -> &C {
        &self.check
    }

    /// The check, to tell it what is coming or to take what it recorded.
    pub fn check_mut(&mut self) -> &mut C {
        &mut self.check
    }

    /// Connection `index`'s id, socket and what the check keeps for it,
    /// with the check, while it is open; see [`Clients::fail_open`].
    pub fn open_conn(&mut self, index: usize) -> Option<OpenConn<'_, C>> {
        let id = self.plan.first_id + index as u64;
        let (stream, state) = self.conns.get_mut(index)?.open_parts()?;
        Some((id, stream, state, &mut self.check))
    }

    /// Settles open connection `index` after a failure outside the loop's
    /// events (a write of its own).
    pub fn fail_open(&mut self, index: usize, failure: Failure) {
        let id = self.plan.first_id + index as u64;
        let conn = &mut self.conns[index];
        self.book
            .failed(conn, &mut self.check, (index, id), failure, true);
    }

    /// Waits up to `timeout` for readiness (or the waker) and handles
    /// whatever is ready, then fails connections pending for longer than
    /// the connect timeout; returns how many events there were (at most
    /// [`EVENTS_PER_POLL`]).
    pub fn step(&mut self, timeout: Duration) -> io::Result<usize> {
        self.redial_due();
        let timeout = match self.book.redials.front() {
            Some(&(_, at)) => timeout.min(at.saturating_duration_since(Instant::now())),
            None => timeout,
        };
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(0),
            Err(e) => return Err(e),
        }
        let Clients {
            poll,
            events,
            conns,
            scratch,
            assembly,
            plan,
            check,
            book,
            ..
        } = self;
        let mut cx = Context {
            registry: poll.registry(),
            servers: &plan.servers,
            scratch,
            assembly,
            check,
        };
        let mut handled = 0;
        for event in events.iter() {
            handled += 1;
            let token = event.token();
            if token == WAKER {
                continue;
            }
            let conn = &mut conns[token.0];
            let was_open = conn.is_open();
            let id = plan.first_id + token.0 as u64;
            match conn.on_event(id, token, event, &mut cx) {
                Ok(Transition::Same) => {}
                Ok(Transition::Opened) => {
                    book.pending -= 1;
                    book.open += 1;
                    book.opened += 1;
                }
                // A connection that was pending may have opened and failed
                // within this one event; it still leaves the pending count.
                Err(failure) => book.failed(conn, cx.check, (token.0, id), failure, was_open),
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
                self.book.pending -= 1;
                let id = self.plan.first_id + index as u64;
                let conn = &mut self.conns[index];
                if self
                    .check
                    .failed(id, conn.state_mut(), Failure::Timeout, false)
                {
                    // Coming back: try again, as a client would.
                    conn.kill();
                    self.pending_since.pop_front();
                    self.dial(index);
                    continue;
                }
                conn.kill();
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
                let id = self.plan.first_id + index as u64;
                self.check
                    .failed(id, conn.state_mut(), Failure::Timeout, false);
            }
        }
        self.book.pending = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up() {
        let mut total = Counts::default();
        let one = Counts {
            started: 5,
            pending: 1,
            open: 3,
            opened: 4,
            failed: 1,
        };
        total.add(&one);
        total.add(&one);
        assert_eq!((total.started, total.open, total.failed), (10, 6, 2));
    }
}

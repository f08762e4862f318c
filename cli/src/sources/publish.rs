//! The publish listener (`--publish-listen`): `POST /publish` and
//! `GET /stats` over HTTP/1.1 with keep-alive (the protocol is
//! [`wspush::protocol::publish`]), on a thread of its own with its own
//! small poll loop, as one more source beside standard input and Redis
//! ([`crate::sources`]).
//!
//! A request's lines are taken whole into a queue of at most
//! `--max-pending-bytes`, marked as commands ([`Control::Commands`]), and
//! handed over from there in order whenever the reader has room. A 200
//! says they are taken: they reach the loop (or the supervisor's
//! instances) as standard input's lines do. While the queue is full the
//! answer is 503 with `Retry-After`, and nothing of that request is
//! taken: backpressure, never a silent drop.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, IntoRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;
use wspush::protocol::presence::{Answer, Query};
use wspush::protocol::publish::{self, Parsed, PublishLimits, Request};
use wspush::Tokens;

use super::questions::{Asking, Questions, ANSWER_TIMEOUT};
use super::source::{Outlet, Source};
use super::stop::{Carried, Halt, Stopper};
use crate::asks::Asks;
use crate::chunks::Control;

/// The listener's token; connections' tokens are their slots.
const LISTENER: Token = Token(usize::MAX);
/// The token of the waker a stop, or an answer to a presence question,
/// rings.
const WAKE: Token = Token(usize::MAX - 1);
/// Publish connections held at once; more are closed as they come.
const MAX_PUBLISHERS: usize = 1024;
/// A connection that sends nothing this long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a connection closed after a refusal is read past, at least.
const LINGER: Duration = Duration::from_secs(2);
/// How soon the queue is offered again to a reader that had no room.
const RETRY_HAND_OVER: Duration = Duration::from_millis(1);
/// Answers a connection may have unsent before its next requests wait.
const MAX_UNSENT: usize = 64 * 1024;
/// Bytes read at a time.
const READ_CHUNK: usize = 16 * 1024;

/// What the server holds, as `GET /stats` says it: the members of a JSON
/// object (`"connections":N,"channels":N,...`), from whoever knows them
/// (a lone server's loop, or a supervisor's instances).
pub type Stats = Box<dyn Fn() -> String + Send>;

/// A publish listener, bound where `--publish-listen` says, and what it
/// takes: a source served on a thread of its own ([`Source::run`]).
pub struct Listener {
    socket: TcpListener,
    poll: Poll,
    keys: Tokens,
    limits: PublishLimits,
    max_pending: usize,
    stats: Stats,
    questions: Questions,
    stop: Arc<PublishStop>,
}

/// Stops a publish listener for a re-exec (see [`Stopper`]): it stops
/// accepting, sends the answers made (a request not read whole was not
/// taken: its publisher sends it again), hands over what it took, and
/// leaves its listening socket to the next image.
#[derive(Debug)]
pub struct PublishStop {
    waker: Arc<Waker>,
    halt: Arc<Halt<OwnedFd>>,
}

impl Stopper for PublishStop {
    fn stop(&self) -> io::Result<()> {
        self.halt.ask();
        self.waker.wake()
    }

    fn carry(&self, carried: &mut Carried) {
        let Some(socket) = self.halt.take() else {
            return;
        };
        match wspush::sys::keep_across_exec(socket.as_fd(), true) {
            Ok(()) => carried.publish_listener = Some(socket.into_raw_fd()),
            Err(e) => log::warn!(
                "cannot keep the publish listener for the next image ({e}): it listens again there"
            ),
        }
    }
}

impl Listener {
    /// Binds `addr`; `GET /stats` says `stats`, and presence questions
    /// are opened in `asks`.
    pub fn bind(
        addr: SocketAddr,
        keys: Tokens,
        limits: PublishLimits,
        max_pending: usize,
        (stats, asks): (Stats, Arc<Asks>),
    ) -> io::Result<Listener> {
        let socket = std::net::TcpListener::bind(addr)?;
        Listener::on(socket, keys, limits, max_pending, (stats, asks))
    }

    /// Listens on `socket`, the listening socket an earlier image of this
    /// process left (see [`PublishStop`]).
    pub fn adopt(
        socket: OwnedFd,
        keys: Tokens,
        limits: PublishLimits,
        max_pending: usize,
        answers: (Stats, Arc<Asks>),
    ) -> io::Result<Listener> {
        Listener::on(socket.into(), keys, limits, max_pending, answers)
    }

    fn on(
        socket: std::net::TcpListener,
        keys: Tokens,
        limits: PublishLimits,
        max_pending: usize,
        (stats, asks): (Stats, Arc<Asks>),
    ) -> io::Result<Listener> {
        socket.set_nonblocking(true)?;
        let mut socket = TcpListener::from_std(socket);
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut socket, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        let stop = Arc::new(PublishStop {
            waker: Arc::clone(&waker),
            halt: Halt::shared(),
        });
        Ok(Listener {
            socket,
            poll,
            keys,
            limits,
            max_pending,
            stats,
            questions: Questions::new(asks, waker),
            stop,
        })
    }

    /// How it stops for a re-exec.
    pub fn stopper(&self) -> Arc<dyn Stopper> {
        Arc::clone(&self.stop) as Arc<dyn Stopper>
    }
}

/// One publisher's connection.
struct Conn {
    stream: TcpStream,
    /// Bytes received and not yet taken by a request.
    input: Vec<u8>,
    /// Where the search for the head's end goes on.
    seen: usize,
    /// Answers not yet sent.
    output: Vec<u8>,
    /// Registered for writability too (answers wait for room).
    writable_interest: bool,
    /// Close once the answers are sent.
    closing: bool,
    /// A presence question waiting for its answer.
    asking: Option<Asking>,
    /// Since when its answers are sent and its sending side shut: what it
    /// still sends is read and dropped until it closes (or [`LINGER`]
    /// passed), so that it reads the last answer rather than a reset.
    lingering: Option<Instant>,
    last_heard: Instant,
}

/// What was taken and refused, for `/stats` and the logs.
#[derive(Debug, Default)]
struct Tally {
    requests: u64,
    lines: u64,
    /// Refused requests by status.
    refused: Vec<(u16, u64)>,
    /// 503s since the last warning.
    busy_since_warned: u64,
    warned_at: Option<Instant>,
}

impl Tally {
    fn refused(&mut self, status: u16) {
        match self.refused.iter_mut().find(|(s, _)| *s == status) {
            Some((_, n)) => *n += 1,
            None => {
                self.refused.push((status, 1));
                self.refused.sort_unstable();
            }
        }
    }

    fn json(&self) -> String {
        let refused: Vec<String> = self
            .refused
            .iter()
            .map(|(status, n)| format!("\"{status}\":{n}"))
            .collect();
        format!(
            "{{\"requests\":{},\"lines\":{},\"refused\":{{{}}}}}",
            self.requests,
            self.lines,
            refused.join(",")
        )
    }
}

/// The listener's loop and what it holds.
struct Publisher {
    listener: TcpListener,
    keys: Tokens,
    limits: PublishLimits,
    max_pending: usize,
    stats: Stats,
    questions: Questions,
    poll: Poll,
    conns: Slab<Conn>,
    /// Lines taken, not yet handed over.
    pending: Vec<u8>,
    out: Outlet,
    tally: Tally,
    /// Where a stop is asked, and the socket is left.
    halt: Arc<Halt<OwnedFd>>,
}

impl Source for Listener {
    fn name(&self) -> &'static str {
        "publish"
    }

    /// Serves the listener, handing the lines taken to `out`; it ends
    /// when `out` is gone.
    fn run(self: Box<Self>, out: Outlet) {
        let Listener {
            socket,
            poll,
            keys,
            limits,
            max_pending,
            stats,
            questions,
            stop,
        } = *self;
        if let Ok(addr) = socket.local_addr() {
            log::info!("publish on http://{addr}/publish");
        }
        let publisher = Publisher {
            listener: socket,
            keys,
            limits,
            max_pending,
            stats,
            questions,
            poll,
            conns: Slab::new(),
            pending: Vec::new(),
            out,
            tally: Tally::default(),
            halt: Arc::clone(&stop.halt),
        };
        publisher.serve_all();
    }
}

impl Publisher {
    fn serve_all(mut self) {
        let mut events = Events::with_capacity(256);
        let mut swept = Instant::now();
        loop {
            let timeout = match self.pending.is_empty() && !self.questions.waiting() {
                true => LINGER,
                false => RETRY_HAND_OVER,
            };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    log::error!("the publish listener's poll failed: {e}; it stops");
                    return;
                }
            }
            for event in &events {
                match event.token() {
                    LISTENER => self.accept(),
                    WAKE => self.deliver_answers(),
                    Token(key) => self.serve(key),
                }
            }
            if self.halt.asked() {
                return self.leave();
            }
            if (!self.pending.is_empty() || self.questions.waiting()) && !self.hand_over() {
                return;
            }
            if swept.elapsed() >= LINGER {
                swept = Instant::now();
                self.sweep();
            }
        }
    }

    fn accept(&mut self) {
        loop {
            let (mut stream, _) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::warn!("publish listener: accept failed: {e}");
                    return;
                }
            };
            if self.conns.len() >= MAX_PUBLISHERS {
                log::warn!("publish listener: {MAX_PUBLISHERS} connections open; one more closed");
                continue;
            }
            let _ = stream.set_nodelay(true);
            let entry = self.conns.vacant_entry();
            if self
                .poll
                .registry()
                .register(&mut stream, Token(entry.key()), Interest::READABLE)
                .is_ok()
            {
                entry.insert(Conn {
                    stream,
                    input: Vec::new(),
                    seen: 0,
                    output: Vec::new(),
                    writable_interest: false,
                    closing: false,
                    asking: None,
                    lingering: None,
                    last_heard: Instant::now(),
                });
            }
        }
    }

    /// Reads what the connection sent, answers each whole request, and
    /// writes the answers (edge-triggered: until the socket would block,
    /// or its answers wait to be sent).
    fn serve(&mut self, key: usize) {
        let limit = self.limits.max_body + publish::MAX_HEAD_BYTES;
        loop {
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            if conn.lingering.is_some() {
                conn.input.clear();
                if read(conn, limit) == Reading::Ended {
                    self.close(key);
                }
                return;
            }
            let read = read(conn, limit);
            self.answer(key);
            let conn = &mut self.conns[key];
            let flushed = flush(conn);
            if read == Reading::Ended || flushed.is_err() {
                self.close(key);
                return;
            }
            if conn.closing && conn.output.is_empty() {
                let _ = conn.stream.shutdown(std::net::Shutdown::Write);
                conn.lingering = Some(Instant::now());
                continue;
            }
            // Writability is asked for only while answers wait for room.
            let waiting = !conn.output.is_empty();
            if waiting != conn.writable_interest {
                let interest = match waiting {
                    true => Interest::READABLE | Interest::WRITABLE,
                    false => Interest::READABLE,
                };
                let registry = self.poll.registry();
                if registry
                    .reregister(&mut conn.stream, Token(key), interest)
                    .is_err()
                {
                    self.close(key);
                    return;
                }
                conn.writable_interest = waiting;
            }
            if read != Reading::Full || conn.closing || conn.output.len() >= MAX_UNSENT {
                return;
            }
        }
    }

    /// Answers the whole requests the connection has sent, in order,
    /// while its unsent answers are few.
    fn answer(&mut self, key: usize) {
        let Publisher {
            keys,
            limits,
            max_pending,
            stats,
            questions,
            conns,
            pending,
            tally,
            ..
        } = self;
        let Some(conn) = conns.get_mut(key) else {
            return;
        };
        while !conn.closing && conn.asking.is_none() && conn.output.len() < MAX_UNSENT {
            let parsed = publish::parse(&conn.input, conn.seen, keys, limits);
            let (status, body, used, close) = match parsed {
                Parsed::Partial { seen } => {
                    conn.seen = seen;
                    return;
                }
                Parsed::Request {
                    request,
                    used,
                    close,
                } => {
                    let (status, body) = match request {
                        Request::Stats => {
                            (200, format!("{{{},\"publish\":{}}}", stats(), tally.json()))
                        }
                        Request::Publish { text, lines } => {
                            take(pending, *max_pending, tally, text, lines)
                        }
                        Request::Presence(query) => {
                            // Answered when the answer comes.
                            tally.requests += 1;
                            conn.asking = Some(questions.ask(query, close));
                            conn.seen = 0;
                            conn.input.drain(..used);
                            continue;
                        }
                    };
                    (status, body, Some(used), close)
                }
                Parsed::Refused { refusal, used } => {
                    log::debug!(
                        "publish request refused ({}): {}",
                        refusal.status,
                        refusal.why
                    );
                    tally.refused(refusal.status);
                    (refusal.status, refusal.why, used, used.is_none())
                }
            };
            tally.requests += 1;
            if status == 503 {
                warn_busy(tally, *max_pending);
            }
            publish::respond(&mut conn.output, status, &body, close);
            conn.closing = close;
            conn.seen = 0;
            if let Some(used) = used {
                conn.input.drain(..used);
            }
        }
    }

    /// Offers the lines taken to the reader, then the questions asked,
    /// each on its own (they stay if it has no room); false once it is
    /// gone.
    fn hand_over(&mut self) -> bool {
        if !self.pending.is_empty() {
            match self.out.offer(std::mem::take(&mut self.pending)) {
                Ok(()) => {}
                Err(Some(back)) => {
                    self.pending = back;
                    return true;
                }
                Err(None) => return false,
            }
        }
        while let Some(line) = self.questions.next_line() {
            match self.out.offer(line) {
                Ok(()) => {}
                Err(Some(back)) => {
                    self.questions.put_back(back);
                    return true;
                }
                Err(None) => return false,
            }
        }
        true
    }

    /// Answers the questions whose answers came, and goes on with their
    /// connections' next requests.
    fn deliver_answers(&mut self) {
        let answers: Vec<(u64, Answer)> = self.questions.answered().collect();
        for (id, answer) in answers {
            let found = self
                .conns
                .iter()
                .find(|(_, c)| c.asking.as_ref().is_some_and(|a| a.id == id));
            if let Some((key, _)) = found {
                self.reply(key, |query| (200, query.json(&answer)));
            }
        }
    }

    /// Answers connection `key`'s question with what `answer` makes of
    /// it, and goes on with its next requests.
    fn reply(&mut self, key: usize, answer: impl FnOnce(&Query) -> (u16, String)) {
        let Some(asking) = self.conns.get_mut(key).and_then(|c| c.asking.take()) else {
            return;
        };
        let (status, body) = answer(&asking.query);
        let conn = &mut self.conns[key];
        publish::respond(&mut conn.output, status, &body, asking.close);
        conn.closing = asking.close;
        self.serve(key);
    }

    /// Closes connections silent for the idle timeout, and those read past
    /// for [`LINGER`] after their last answer; answers 504 to questions
    /// not answered in time.
    fn sweep(&mut self) {
        let late: Vec<(usize, u64)> = self
            .conns
            .iter()
            .filter_map(|(key, c)| Some((key, c.asking.as_ref()?)))
            .filter(|(_, a)| a.since.elapsed() >= ANSWER_TIMEOUT)
            .map(|(key, a)| (key, a.id))
            .collect();
        for (key, id) in late {
            self.questions.forget(id);
            self.tally.refused(504);
            log::warn!("a presence question had no answer in {ANSWER_TIMEOUT:?}: answered 504");
            self.reply(key, |_| {
                let why = format!("no answer within {} s", ANSWER_TIMEOUT.as_secs());
                (504, why)
            });
        }
        let idle: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, conn)| match conn.lingering {
                Some(since) => since.elapsed() >= LINGER,
                None => conn.last_heard.elapsed() >= IDLE_TIMEOUT,
            })
            .map(|(key, _)| key)
            .collect();
        for key in idle {
            self.close(key);
        }
    }

    fn close(&mut self, key: usize) {
        let mut conn = self.conns.remove(key);
        let _ = self.poll.registry().deregister(&mut conn.stream);
    }

    /// Stops for the next image (see [`PublishStop`]): no new publisher
    /// (those that connect meanwhile wait in the socket's queue for the
    /// next image), the answers made sent for at most [`LINGER`], every
    /// connection closed, what was taken handed over, and the socket
    /// left.
    fn leave(mut self) {
        let _ = self.poll.registry().deregister(&mut self.listener);
        let deadline = Instant::now() + LINGER;
        for (_, conn) in &mut self.conns {
            while !conn.output.is_empty() && Instant::now() < deadline {
                match flush(conn) {
                    Ok(()) if conn.output.is_empty() => break,
                    Ok(()) => std::thread::sleep(RETRY_HAND_OVER),
                    Err(_) => break,
                }
            }
        }
        let open = self.conns.len();
        for key in self.conns.iter().map(|(key, _)| key).collect::<Vec<_>>() {
            self.close(key);
        }
        if !self.pending.is_empty() {
            self.out.send(std::mem::take(&mut self.pending));
        }
        log::info!("publish listener stopped for the next image ({open} publisher connections closed; requests not read whole are sent again)");
        let socket = std::net::TcpListener::from(OwnedFd::from(self.listener));
        self.halt.leave(OwnedFd::from(socket));
    }
}

/// Takes a request's `lines` into `pending`, marked as commands, if they
/// fit within `max_pending`: the status and body to answer.
fn take(
    pending: &mut Vec<u8>,
    max_pending: usize,
    tally: &mut Tally,
    text: Vec<u8>,
    lines: usize,
) -> (u16, String) {
    if lines == 0 {
        return (200, "{\"lines\":0}".into());
    }
    let control = Control::Commands {
        lines: lines as u32,
    }
    .line();
    if pending.len() + control.len() + text.len() > max_pending {
        tally.refused(503);
        tally.busy_since_warned += 1;
        let why = format!("{max_pending} bytes of lines wait to be handed on: retry");
        return (503, why);
    }
    pending.extend_from_slice(&control);
    pending.extend_from_slice(&text);
    tally.lines += lines as u64;
    (200, format!("{{\"lines\":{lines}}}"))
}

/// Warns of 503s, at most once a second.
fn warn_busy(tally: &mut Tally, max_pending: usize) {
    if tally
        .warned_at
        .is_some_and(|at| at.elapsed() < Duration::from_secs(1))
    {
        return;
    }
    log::warn!(
        "publish: {} request(s) answered 503: {max_pending} bytes of lines wait for the loop",
        tally.busy_since_warned
    );
    tally.busy_since_warned = 0;
    tally.warned_at = Some(Instant::now());
}

/// How a read ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// The socket has nothing more now.
    Drained,
    /// The input holds its limit: more may wait in the socket.
    Full,
    /// The peer closed, or the socket failed.
    Ended,
}

/// Reads what the socket has into the connection's input, up to `limit`
/// bytes held. A read shorter than asked for emptied the socket: what
/// comes next raises a new event, so it is not read again for the
/// `WouldBlock` (one system call a request, not two).
fn read(conn: &mut Conn, limit: usize) -> Reading {
    let mut buf = [0u8; READ_CHUNK];
    while conn.input.len() <= limit {
        match conn.stream.read(&mut buf) {
            Ok(0) => return Reading::Ended,
            Ok(n) => {
                conn.input.extend_from_slice(&buf[..n]);
                conn.last_heard = Instant::now();
                if n < buf.len() {
                    return Reading::Drained;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Reading::Drained,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Reading::Ended,
        }
    }
    Reading::Full
}

/// Writes the connection's answers until the socket would block.
fn flush(conn: &mut Conn) -> io::Result<()> {
    while !conn.output.is_empty() {
        match conn.stream.write(&conn.output) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                conn.output.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

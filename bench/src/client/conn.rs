//! One client connection: a raw non-blocking socket that connects,
//! upgrades (or opens an event stream), then reads frames (or events) and
//! hands each message to a [`Check`]:
//! [`InOrder`] (push: exactly once, in order, into a tally), the receipts
//! a `channels` worker reports ([`crate::client::receipts`]), or echoes
//! checked against the requests sent ([`crate::client::echoer`]).
//!
//! The state is deliberately small (a socket, a phase, a [`FrameReader`]
//! and what the check keeps per connection; for push the next expected
//! sequence number: 80 bytes) so that a million fit in a few worker
//! processes without the client costing more than the server it measures.

use std::net::SocketAddr;

use mio::event::Event;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};

use crate::client::dial::{self, Failure, Phase, Transport, Transports};
use crate::observe::stats::{Order, Tally};
use crate::observe::sys;
use crate::wire::compression::Inflating;
use crate::wire::events::{self, EventReader};
use crate::wire::frame::{self, opcode, Frame, FrameError, FrameReader, MASK};
use crate::wire::message::{self, Padding};

/// What a readiness event did to a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// It stayed in its phase.
    Same,
    /// It completed the upgrade.
    Opened,
}

/// Shared, per-step context for handling a connection's events.
pub struct Context<'a, C> {
    /// The poll registry the sockets are registered with.
    pub registry: &'a Registry,
    /// The server's addresses (connection `id` dialed `servers[id %
    /// len]`), for the `Host` header.
    pub servers: &'a [SocketAddr],
    /// Buffer every read goes through.
    pub scratch: &'a mut [u8],
    /// Where events are made into messages.
    pub assembly: &'a mut Assembly,
    /// How the messages are checked.
    pub check: &'a mut C,
}

/// How a connection's messages are checked, what it asks for, and what
/// becomes of it when it fails.
pub trait Check {
    /// What each connection keeps for the check beside its socket.
    type State: Default + std::fmt::Debug;

    /// Size of the buffer every read goes through.
    const SCRATCH_BYTES: usize = 64 * 1024;

    /// Whether connections queue output of their own (requests): they
    /// keep writable interest, flush their queue when writable, and leave
    /// pings unanswered (a pong could cut into a queued request).
    const WRITES: bool = false;

    /// What connection `id` speaks.
    fn transport(&self, id: u64) -> Transport;

    /// The path and query connection `id` asks for, in `state`.
    fn path(&self, id: u64, state: &Self::State) -> String;

    /// Checks a whole data message received at `now` by connection `id`.
    fn message(
        &mut self,
        id: u64,
        frame: &Frame<'_>,
        state: &mut Self::State,
        now: u64,
    ) -> Result<(), Failure>;

    /// Checks the message of an event (an event stream's), with its
    /// position beside it (its id) rather than before its payload; by
    /// default as [`Check::message`], the position unread.
    fn event(
        &mut self,
        id: u64,
        frame: &Frame<'_>,
        _position: Option<&[u8]>,
        state: &mut Self::State,
        now: u64,
    ) -> Result<(), Failure> {
        self.message(id, frame, state, now)
    }

    /// Counts `bytes` read by an upgraded connection.
    fn received(&mut self, _bytes: usize) {}

    /// Writes what the connection has queued, as far as the socket takes
    /// it (with [`Check::WRITES`]).
    fn flush(&mut self, _stream: &mut TcpStream, _state: &mut Self::State) -> Result<(), Failure> {
        Ok(())
    }

    /// Records that connection `id` failed (`was_open`: after its
    /// upgrade); returns whether to dial it again. The answer is taken for
    /// a connection that failed once its socket was up; one whose dial
    /// failed, or that was abandoned still pending, is counted only.
    fn failed(
        &mut self,
        id: u64,
        state: &mut Self::State,
        failure: Failure,
        was_open: bool,
    ) -> bool;

    /// How long connection `id`, failed and to be dialed again, waits
    /// first, if the server said (a draining server's hint); taken once.
    /// `None`: a client's own wait.
    fn redial_after(&mut self, _id: u64) -> Option<std::time::Duration> {
        None
    }

    /// A dropped connection is being dialed again.
    fn redialing(&mut self) {}
}

/// What a push connection keeps: the sequence number of the next message
/// in order (with positions, the position to resume after follows from
/// it: see [`Query::positions_seen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextSeq(pub u32);

impl Default for NextSeq {
    fn default() -> Self {
        NextSeq(1)
    }
}

/// The push check: every message once, in order, counted in a [`Tally`].
pub struct InOrder {
    /// What the messages are expected to be.
    pub expect: Expect,
    /// Where compressed messages are inflated.
    pub inflating: Inflating,
    /// Where deliveries (and failures) are recorded.
    pub tally: Tally,
    /// What the connections ask for besides their id (see [`Query`]).
    pub query: Query,
    /// What the connections speak.
    pub transports: Transports,
    /// The reconnect delays (ms) draining servers asked of connections,
    /// by id, until they are dialed again (few at a time: kept here, not
    /// in every connection's state).
    pub hints: std::collections::HashMap<u64, u16>,
}

/// What a connection's URL asks for besides its id: a channel, and
/// positions (or, once it has had one, to resume after it).
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// The channel to subscribe to, if any.
    pub channel: Option<String>,
    /// Ask for positions.
    pub positions: bool,
    /// Only connections of even ids ask for positions.
    pub mixed: bool,
    /// The token to present, if any.
    pub token: Option<String>,
    /// The epoch of the positions, once a connection was told it.
    pub epoch: Option<String>,
    /// The position of each message, by its stamp's sequence number (0:
    /// not seen yet), as the first connection to receive it was told: so
    /// a connection's position is known from the next message it expects,
    /// and takes no room in its state. Every other connection must be
    /// told the same position for the same message, whichever server
    /// (host or instance) it came through.
    pub positions_seen: Vec<u64>,
}

impl Query {
    /// Whether connection `id` asks for positions.
    pub fn positions_for(&self, id: u64) -> bool {
        self.positions && (!self.mixed || id.is_multiple_of(2))
    }

    /// The position of the last message before `next_seq` (0: none yet).
    pub fn last_before(&self, next_seq: u32) -> u64 {
        let last = next_seq.saturating_sub(1) as usize;
        self.positions_seen.get(last).copied().unwrap_or(0)
    }

    /// Takes message `seq`'s position as a connection was told it: false
    /// when another connection was told another one.
    fn agrees(&mut self, seq: u32, position: u64) -> bool {
        let seq = seq as usize;
        if self.positions_seen.len() <= seq {
            self.positions_seen.resize(seq + 1, 0);
        }
        let seen = &mut self.positions_seen[seq];
        if *seen == 0 {
            *seen = position;
        }
        *seen == position
    }

    /// The query after `id=ID` for connection `id`, whose last position
    /// was `last` (0: none).
    pub fn after_id(&self, id: u64, last: u64) -> String {
        let mut query = String::new();
        if let Some(channel) = &self.channel {
            query.push_str("&channel=");
            query.push_str(channel);
        }
        if let Some(token) = &self.token {
            query.push_str("&token=");
            query.push_str(token);
        }
        match (&self.epoch, self.positions_for(id), last) {
            (Some(epoch), true, 1..) => query.push_str(&format!("&since={epoch}.{last}")),
            (_, true, _) => query.push_str("&positions=1"),
            _ => {}
        }
        query
    }

    /// Splits a positioned message into its position's number and its
    /// payload; takes a status message (`{...}`) in, learning the epoch
    /// from it, and returns its status instead.
    fn split<'p>(&mut self, payload: &'p [u8]) -> Result<(u64, &'p [u8]), Option<String>> {
        if payload.first() == Some(&b'{') {
            let text = std::str::from_utf8(payload).map_err(|_| None)?;
            let field = |name: &str| {
                let key = format!("\"{name}\":\"");
                let start = text.find(&key)? + key.len();
                Some(text[start..start + text[start..].find('"')?].to_string())
            };
            if let Some((epoch, _)) = field("position").as_deref().and_then(|p| p.split_once('.')) {
                self.epoch = Some(epoch.to_string());
            }
            return Err(field("status"));
        }
        let space = payload.iter().position(|&b| b == b' ').ok_or(None)?;
        let seq = seq_of(&payload[..space]).ok_or(None)?;
        Ok((seq, &payload[space + 1..]))
    }
}

/// The number of a position, `EPOCH.SEQ`, or of a bare number (another
/// server's event ids).
fn seq_of(position: &[u8]) -> Option<u64> {
    let digits = match position.iter().rposition(|&b| b == b'.') {
        Some(dot) => &position[dot + 1..],
        None => position,
    };
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0'))
    })
}

/// What every message a push connection receives must be.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    /// The size of each message payload (plain).
    pub payload_len: usize,
    /// What pads each message after its stamp.
    pub padding: Padding,
    /// The connection offered permessage-deflate and requires it: the
    /// messages may arrive compressed.
    pub deflate: bool,
    /// Only connections of ids 0 and 1 modulo 4 offer it.
    pub mixed: bool,
}

impl Expect {
    /// Whether connection `id` offers (and requires) permessage-deflate.
    pub fn deflate_for(&self, id: u64) -> bool {
        self.deflate && (!self.mixed || id % 4 < 2)
    }
}

/// One client connection, with what its check keeps in `S`; see the
/// module documentation.
#[derive(Debug)]
pub struct Conn<S> {
    /// `None` once the connection failed.
    stream: Option<TcpStream>,
    phase: Phase,
    reader: Reader,
    /// What the check keeps for it.
    state: S,
}

/// How an open connection's bytes are read: as frames, or as events.
#[derive(Debug)]
enum Reader {
    Frames(FrameReader),
    Events(EventReader),
}

/// Where an event stream's events are made into the messages a [`Check`]
/// takes: one for all connections.
#[derive(Debug, Default)]
pub struct Assembly {
    /// Data of several lines, joined.
    joined: Vec<u8>,
    /// A binary message, decoded.
    decoded: Vec<u8>,
}

impl Assembly {
    /// The message event `e` carries, as a WebSocket would have had it
    /// (a binary one decoded, into `decoded`), and its position (its id;
    /// `None` for a status); `None` for an event that is no message.
    fn message<'m>(
        decoded: &'m mut Vec<u8>,
        e: events::Event<'m>,
    ) -> Option<(Frame<'m>, Option<&'m [u8]>)> {
        use base64::Engine as _;
        let (opcode, payload, position) = match e.name {
            None | Some(b"message") => (opcode::TEXT, e.data, e.id),
            Some(b"status") => (opcode::TEXT, e.data, None),
            Some(b"binary") => {
                decoded.clear();
                base64::engine::general_purpose::STANDARD
                    .decode_vec(e.data, decoded)
                    .ok()?;
                (opcode::BINARY, &decoded[..], e.id)
            }
            Some(_) => return None,
        };
        let frame = Frame {
            fin: true,
            opcode,
            compressed: false,
            payload,
        };
        Some((frame, position))
    }
}

impl<S: Default> Conn<S> {
    /// The same connection dialed again (after [`Conn::kill`]): it keeps
    /// what the check keeps for it (for push, its last position).
    pub fn redialed(&mut self, dialed: dial::Dialed) {
        self.stream = Some(dialed.stream);
        self.phase = Phase::dialed(dialed.requested);
        self.reader = Reader::Frames(FrameReader::new());
    }

    /// What the check keeps for it.
    pub fn state(&self) -> &S {
        &self.state
    }

    /// What the check keeps for it, to change.
    pub fn state_mut(&mut self) -> &mut S {
        &mut self.state
    }

    /// A connection without a socket yet (or that failed before it had
    /// one); [`Conn::redialed`] gives it one.
    pub fn dead() -> Conn<S> {
        Conn {
            stream: None,
            phase: Phase::Dead,
            reader: Reader::Frames(FrameReader::new()),
            state: S::default(),
        }
    }

    /// Its socket and what the check keeps for it, while it is upgraded
    /// and alive.
    pub fn open_parts(&mut self) -> Option<(&mut TcpStream, &mut S)> {
        match (&mut self.stream, &self.phase) {
            (Some(stream), Phase::Open) => Some((stream, &mut self.state)),
            _ => None,
        }
    }

    /// Whether it is still connecting or upgrading.
    pub fn is_pending(&self) -> bool {
        self.phase.is_pending()
    }

    /// Whether it is upgraded and alive.
    pub fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open)
    }

    /// Closes the socket (after a failure, or as a client that drops its
    /// connection does); events for it are ignored from now on, until it
    /// is dialed again with [`Conn::redialed`].
    pub fn kill(&mut self) {
        self.stream = None;
        self.phase = Phase::Dead;
    }

    /// Handles a readiness event for connection `id`, registered as `token`.
    ///
    /// On `Err` the caller counts the failure and calls [`Conn::kill`].
    pub fn on_event<C: Check<State = S>>(
        &mut self,
        id: u64,
        token: Token,
        event: &Event,
        cx: &mut Context<'_, C>,
    ) -> Result<Transition, Failure> {
        // After a hang-up or error, read to the end: the short-read shortcut
        // below could otherwise leave the EOF unseen.
        let drain = event.is_read_closed() || event.is_error();
        match self.phase {
            Phase::Connecting => {
                if !dial::connected(self.stream())? {
                    return Ok(Transition::Same);
                }
                let server = cx.servers[id as usize % cx.servers.len()];
                let path = cx.check.path(id, &self.state);
                let ask = dial::Ask {
                    path: &path,
                    transport: cx.check.transport(id),
                };
                dial::send_request(self.stream(), id, ask, server)?;
                // From here on only reads matter (pongs are written whole),
                // unless the connection queues requests of its own.
                if !C::WRITES {
                    cx.registry
                        .reregister(self.stream(), token, Interest::READABLE)
                        .map_err(|e| Failure::Io(e.kind()))?;
                }
                self.phase = Phase::Upgrading(Vec::new());
                if event.is_readable() {
                    self.read_upgrade(id, cx, drain)
                } else {
                    Ok(Transition::Same)
                }
            }
            Phase::Upgrading(_) => self.read_upgrade(id, cx, drain),
            Phase::Open => {
                if C::WRITES {
                    if event.is_writable() {
                        let Conn { stream, state, .. } = self;
                        let stream = stream.as_mut().expect("live connection has a socket");
                        cx.check.flush(stream, state)?;
                    }
                    if !event.is_readable() && !drain {
                        return Ok(Transition::Same);
                    }
                }
                self.read_frames(id, cx, drain).map(|()| Transition::Same)
            }
            Phase::Dead => Ok(Transition::Same),
        }
    }

    fn stream(&mut self) -> &mut TcpStream {
        self.stream.as_mut().expect("live connection has a socket")
    }

    fn read_upgrade<C: Check<State = S>>(
        &mut self,
        id: u64,
        cx: &mut Context<'_, C>,
        drain: bool,
    ) -> Result<Transition, Failure> {
        let Conn { stream, phase, .. } = self;
        let (Some(stream), Phase::Upgrading(head)) = (stream, phase) else {
            unreachable!("read_upgrade outside the upgrading phase");
        };
        let transport = cx.check.transport(id);
        let Some(upgraded) = dial::read_upgrade(stream, head, cx.scratch, id, transport)? else {
            return Ok(Transition::Same);
        };
        self.phase = Phase::Open;
        if transport == Transport::EventStream {
            self.reader = Reader::Events(EventReader::default());
        }
        if !upgraded.early.is_empty() {
            self.on_bytes(id, &upgraded.early, sys::now_ns(), cx)?;
        }
        // The socket was registered before the request went out, so data
        // after this read raises a new edge (see `read_frames`).
        if drain || !upgraded.emptied {
            self.read_frames(id, cx, drain)?;
        }
        Ok(Transition::Opened)
    }

    fn read_frames<C: Check<State = S>>(
        &mut self,
        id: u64,
        cx: &mut Context<'_, C>,
        drain: bool,
    ) -> Result<(), Failure> {
        loop {
            let Some(n) = dial::read_some(self.stream(), cx.scratch)? else {
                return Ok(());
            };
            if n == 0 {
                return Err(Failure::Closed { upgrading: false });
            }
            cx.check.received(n);
            let now = sys::now_ns();
            let Context {
                scratch,
                check,
                assembly,
                ..
            } = cx;
            self.on_bytes_with(id, &scratch[..n], now, &mut **check, assembly)?;
            // A read that did not fill the buffer emptied the socket, and new
            // data will raise a new edge (epoll(7)): skip the EAGAIN read.
            if n < cx.scratch.len() && !drain {
                return Ok(());
            }
        }
    }

    /// [`Conn::on_bytes_with`] the context's check and assembly.
    fn on_bytes<C: Check<State = S>>(
        &mut self,
        id: u64,
        bytes: &[u8],
        now: u64,
        cx: &mut Context<'_, C>,
    ) -> Result<(), Failure> {
        self.on_bytes_with(id, bytes, now, cx.check, cx.assembly)
    }

    /// Feeds received bytes through the reader: whole data messages (or
    /// the messages of events) go to the check, other frames to
    /// [`not_a_message`], other events nowhere.
    fn on_bytes_with<C: Check<State = S>>(
        &mut self,
        id: u64,
        bytes: &[u8],
        now: u64,
        check: &mut C,
        assembly: &mut Assembly,
    ) -> Result<(), Failure> {
        let Conn {
            stream,
            reader,
            state,
            ..
        } = self;
        let stream = stream.as_mut().expect("live connection has a socket");
        match reader {
            Reader::Frames(reader) => reader.feed(bytes, |f| match f.opcode {
                opcode::TEXT | opcode::BINARY if f.fin => check.message(id, &f, state, now),
                other => not_a_message(stream, other, f.payload, !C::WRITES),
            }),
            Reader::Events(reader) => {
                let Assembly { joined, decoded } = assembly;
                reader.feed(bytes, joined, |e| match Assembly::message(decoded, e) {
                    Some((f, position)) => check.event(id, &f, position, state, now),
                    None => Ok(()),
                })
            }
        }
    }
}

impl Check for InOrder {
    type State = NextSeq;

    fn transport(&self, id: u64) -> Transport {
        self.transports.of(id, self.expect.deflate_for(id))
    }

    fn path(&self, id: u64, state: &NextSeq) -> String {
        let query = self.query.after_id(id, self.query.last_before(state.0));
        dial::default_path(id, &query)
    }

    /// Counts the failure; with positions, a connection dropped by the
    /// server or refused coming back is dialed again, and resumes.
    fn failed(&mut self, id: u64, state: &mut NextSeq, failure: Failure, was_open: bool) -> bool {
        self.tally.failed(failure.label());
        self.query.positions_for(id) && (was_open || state.0 > 1)
    }

    /// The delay of a `reconnect` hint it was told, once.
    fn redial_after(&mut self, id: u64) -> Option<std::time::Duration> {
        self.hints
            .remove(&id)
            .map(|ms| std::time::Duration::from_millis(u64::from(ms)))
    }

    fn redialing(&mut self) {
        self.tally.redialed(crate::observe::sys::now_ns());
    }

    /// Inflates the message if compressed, takes its position off, and
    /// counts it as next, skipped ahead, duplicate or corrupt.
    fn message(
        &mut self,
        id: u64,
        f: &Frame<'_>,
        next_seq: &mut NextSeq,
        now: u64,
    ) -> Result<(), Failure> {
        self.take(id, f, None, next_seq, now)
    }

    /// As a message, its position the event's id (every event stream has
    /// positions).
    fn event(
        &mut self,
        id: u64,
        f: &Frame<'_>,
        position: Option<&[u8]>,
        next_seq: &mut NextSeq,
        now: u64,
    ) -> Result<(), Failure> {
        self.take(id, f, Some(position), next_seq, now)
    }
}

impl InOrder {
    /// Checks message `f` of connection `id` (see [`Check::message`]);
    /// `carried`: an event's id, carried beside the payload (`Some(None)`:
    /// an event without one), rather than before it.
    fn take(
        &mut self,
        id: u64,
        f: &Frame<'_>,
        carried: Option<Option<&[u8]>>,
        NextSeq(next_seq): &mut NextSeq,
        now: u64,
    ) -> Result<(), Failure> {
        let InOrder {
            expect,
            inflating,
            tally,
            query,
            hints,
            ..
        } = self;
        // A position comes with each message where asked for, and always
        // on an event stream (its events' ids).
        let positioned = query.positions_for(id) || carried.is_some();
        let room = expect.payload_len + if positioned { 64 } else { 0 };
        if f.compressed && !expect.deflate_for(id) {
            return Err(FrameError::ReservedBits.into());
        }
        let mut plain = if f.compressed {
            inflating.plain(f.payload, room)
        } else {
            Some(f.payload)
        };
        let mut position = None;
        if let (true, Some(whole)) = (positioned, plain) {
            let split = match carried {
                Some(Some(position)) => seq_of(position).map(|seq| (seq, whole)).ok_or(None),
                _ => query.split(whole),
            };
            match split {
                Ok((seq, payload)) => {
                    position = Some(seq);
                    plain = Some(payload);
                }
                Err(Some(status)) => {
                    if let Some(ms) = (status == "reconnect")
                        .then(|| reconnect_delay_ms(whole))
                        .flatten()
                    {
                        hints.insert(id, ms);
                    }
                    tally.status(&status);
                    return Ok(());
                }
                Err(None) => plain = None,
            }
        }
        let plain_len = plain.map_or(0, <[u8]>::len);
        tally.payload(f.payload.len(), plain_len, f.compressed);
        let stamp =
            plain.and_then(|p| message::decode_padded(p, expect.payload_len, expect.padding));
        // Every connection is told the same position for a message.
        let misplaced = match (stamp, position) {
            (Some(stamp), Some(position)) => !query.agrees(stamp.seq, position),
            _ => false,
        };
        match stamp {
            None => tally.corrupt(),
            Some(_) if misplaced => tally.corrupt(),
            Some(stamp) => {
                let order = match stamp.seq.cmp(next_seq) {
                    std::cmp::Ordering::Equal => Order::Next,
                    std::cmp::Ordering::Greater => Order::Skipped,
                    std::cmp::Ordering::Less => Order::Duplicate,
                };
                if tally.delivered(stamp.seq, stamp.sent_ns, order, now)
                    && order != Order::Duplicate
                {
                    *next_seq = stamp.seq + 1;
                }
            }
        }
        Ok(())
    }
}

/// The `delay_ms` of a `reconnect` status (`{"status":"reconnect","delay_ms":N}`).
fn reconnect_delay_ms(status: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(status).ok()?;
    let start = text.find("\"delay_ms\":")? + "\"delay_ms\":".len();
    let digits: String = text[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse::<u64>()
        .ok()
        .map(|ms| ms.min(u64::from(u16::MAX)) as u16)
}

/// A frame other than a whole data message, on a client that expects only
/// those: a ping is answered with a pong if `pong`, a pong ignored; a
/// fragment, a close or an unknown opcode fails the connection.
fn not_a_message(
    stream: &mut TcpStream,
    op: u8,
    payload: &[u8],
    pong: bool,
) -> Result<(), Failure> {
    match op {
        opcode::TEXT | opcode::BINARY | opcode::CONTINUATION => Err(Failure::Fragmented),
        opcode::PING if !pong => Ok(()),
        opcode::PING => {
            let mut pong = Vec::with_capacity(payload.len() + 6);
            frame::encode(&mut pong, opcode::PONG, payload, Some(MASK));
            dial::write_whole(stream, &pong)
        }
        opcode::PONG => Ok(()),
        opcode::CLOSE => Err(Failure::CloseFrame),
        other => Err(Failure::UnknownOpcode(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_has_one_position_for_every_connection() {
        let mut query = Query::default();
        assert_eq!(query.last_before(1), 0, "nothing had yet");
        assert_eq!(query.last_before(8), 0, "not seen yet");
        // Positions of a stream: far apart, not one more than the last.
        assert!(query.agrees(7, 1 << 40));
        assert!(query.agrees(8, (1 << 40) + (1 << 7)));
        assert!(query.agrees(7, 1 << 40), "the same again");
        assert!(!query.agrees(7, (1 << 40) + 1), "another position");
        assert_eq!(query.last_before(8), 1 << 40);
        assert_eq!(query.last_before(9), (1 << 40) + (1 << 7));
    }

    #[test]
    fn a_reconnect_hint_gives_its_delay() {
        let hint = br#"{"status":"reconnect","delay_ms":731}"#;
        assert_eq!(reconnect_delay_ms(hint), Some(731));
        assert_eq!(reconnect_delay_ms(br#"{"status":"recovered"}"#), None);
        let long = br#"{"status":"reconnect","delay_ms":99999999}"#;
        assert_eq!(reconnect_delay_ms(long), Some(u16::MAX));
    }

    #[test]
    fn connection_state_stays_small() {
        // A million live in the worker processes next to the server under
        // test. (Debug builds of mio add a selector id to every socket.)
        let limit = if cfg!(debug_assertions) { 96 } else { 80 };
        assert!(
            std::mem::size_of::<Conn<NextSeq>>() <= limit,
            "{}",
            std::mem::size_of::<Conn<NextSeq>>()
        );
    }
}

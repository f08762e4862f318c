//! Handing live connections to a successor process, and taking them from
//! the process this one replaces: nothing is closed, no client notices.
//!
//! The successor asks on a Unix stream socket the two share
//! ([`Server::hand_over_on`] on the giving side, [`Server::take_over`] on
//! the taking one), saying the first input position it frames itself.
//! The giving loop frames its input up to the position before that (so
//! no line is between the two), stops framing, and, in one pause of its
//! loop (at raised priority: [`Urgent`]), finishes delivering what it
//! framed and sends every open connection: its state in the versioned format of
//! `protocol::handover`, its socket beside it (SCM_RIGHTS). The
//! successor puts each one in the same slot (its key stays valid), owed
//! everything after the last position given: the live messages up to it
//! are skipped, so each message reaches each client exactly once. What
//! could not move (closing, or waiting for a replay) is closed by the
//! giving process as a drain closes it, and it exits.
//!
//! A send that fails leaves the connections not sent yet with the giving
//! process, which goes on serving them; the taking side refuses a state
//! it cannot read before it takes anything, and its caller falls back to
//! a drain.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use crate::ops::metrics::Metrics;
use crate::ops::sys::Urgent;
use crate::protocol::handover::{Answer, Ask, Record, VERSION};
use crate::protocol::names::ChannelName;
use crate::server::conn::{Conn, Verdict};
use crate::server::history::{Filter, Replay};
use crate::server::key::ConnKey;
use crate::server::lifecycle::handover::{
    Giving, TakeOverError, Taker, ANSWER_TIMEOUT, CATCH_UP, FINISH_FAN_OUT, HANDOVER_TIMEOUT,
};
use crate::server::lifecycle::Ending;
use crate::server::net::channel::{arrived, Channel, FDS_PER_CHUNK};
use crate::server::net::sockets::{ASKING, SUCCESSOR};
use crate::server::Server;

impl Server {
    /// Hands this server's connections to a successor, whose socket
    /// arrives on `control` (a Unix stream socket; see
    /// [`introduce_successor`](crate::introduce_successor) and
    /// [`Server::take_over`]). The loop watches `control`, then the
    /// successor's socket; once its ask comes, it hands over at once, and
    /// ends as a drain does for whatever could not move. A successor that
    /// goes away before it asks leaves `control` watched, for the next.
    pub fn hand_over_on(&mut self, control: OwnedFd) -> io::Result<()> {
        crate::server::net::channel::set_nonblocking(&control)?;
        self.sockets.watch_handover(&control, SUCCESSOR)?;
        self.handover.control = Some(control);
        Ok(())
    }

    /// The control socket is readable: successors' sockets (or its end).
    /// The first is watched for its ask; others, while one is under way,
    /// are closed (their successors fall back to a drain).
    pub(super) fn on_control(&mut self) {
        let Some(control) = &self.handover.control else {
            return;
        };
        let sockets = match arrived(control.as_fd()) {
            Ok(Some(sockets)) => sockets,
            Ok(None) | Err(_) => {
                log::warn!("the handover's control socket closed: no successor can take the connections over");
                let control = self.handover.control.take().expect("control");
                self.sockets.unwatch_handover(&control);
                return;
            }
        };
        for socket in sockets {
            if self.handover.busy() || !self.lifecycle.is_serving() {
                log::warn!("a second successor while one is under way (or this server ends): it is refused");
                continue;
            }
            match self.sockets.watch_handover(&socket, ASKING) {
                Ok(()) => self.handover.asking = Some(socket),
                Err(e) => log::warn!("cannot watch a successor's socket: {e}"),
            }
        }
    }

    /// The successor's socket is readable: its ask (or its end).
    pub(super) fn on_successor(&mut self, now: Instant) {
        let Some(socket) = self.handover.asking.take() else {
            return;
        };
        self.sockets.unwatch_handover(&socket);
        let asked = Channel::new(socket, HANDOVER_TIMEOUT).and_then(|mut channel| {
            let head = channel.read_head()?;
            let ask = Ask::decode(&head).map_err(crate::server::net::channel::invalid)?;
            Ok((channel, ask))
        });
        match asked {
            Ok((channel, ask)) if ask.version == VERSION => {
                log::info!(
                    "a successor asks for the connections (it frames from position {})",
                    ask.first
                );
                self.handover.giving = Some(Giving {
                    taker: Taker::Successor(channel),
                    first: ask.first,
                    since: now,
                    _urgent: Urgent::raise(),
                });
            }
            Ok((mut channel, ask)) => {
                log::warn!(
                    "a successor reads the state format version {} (this build writes {VERSION}): refused; it drains us instead",
                    ask.version
                );
                say_no(&mut channel);
            }
            Err(e) => log::warn!("no handover: the successor's ask failed: {e}"),
        }
    }

    /// Carries a handover on, once per loop iteration: once the loop
    /// framed up to its successor's first position and delivered what it
    /// framed, moves the connections.
    pub(super) fn carry_handover(&mut self, now: Instant) {
        self.begin_suspending(now);
        let Some(giving) = &self.handover.giving else {
            return;
        };
        let current = self.records.history.current().seq;
        if !self.handover.holds_input(current) {
            if now.duration_since(giving.since) > CATCH_UP {
                log::warn!(
                    "no handover: this loop did not reach position {} within {CATCH_UP:?}",
                    giving.first - 1
                );
                refuse(self.handover.giving.take());
            }
            return;
        }
        // What was framed reaches every connection before it moves (each
        // is given everything through `current`): the fan-out under way
        // is finished now, at the loop's raised priority, or a successor
        // is refused (nothing may move short of it). This process's next
        // image is not refused: it waits.
        let successor = matches!(giving.taker, Taker::Successor(_));
        let walking = Instant::now();
        while self.walk.stream.is_busy() {
            if successor && walking.elapsed() > FINISH_FAN_OUT {
                log::warn!(
                    "no handover: the fan-out under way did not finish within {FINISH_FAN_OUT:?}"
                );
                refuse(self.handover.giving.take());
                return;
            }
            self.walk_step(Instant::now());
        }
        let giving = self.handover.giving.take().expect("giving");
        match giving.taker {
            Taker::Successor(_) if giving.since.elapsed() > ANSWER_TIMEOUT / 2 => {
                // The successor may be giving up on its answer.
                log::warn!("no handover: too late to answer the successor");
                refuse(Some(giving));
            }
            Taker::Successor(channel) => self.give(channel, current, now),
            Taker::NextImage => self.suspend(current, now),
        }
    }

    /// Moves every open connection to the successor on `channel`, each
    /// given every message up to `through`: one pause of the loop.
    fn give(&mut self, mut channel: Channel, through: u64, now: Instant) {
        let started = Instant::now();
        let answer = Answer::Give {
            version: VERSION,
            through,
        };
        if let Err(e) = channel.write_all(&answer.encode()) {
            log::warn!("no handover: the successor is gone ({e}); serving on");
            return;
        }
        let moving = self.move_out_all(through, now, |bytes, streams| {
            let fds: Vec<_> = streams.iter().map(|s| s.as_fd()).collect();
            channel.send(bytes, &fds)
        });
        let metrics = &self.report.shared.counters.metrics;
        Metrics::add(&metrics.handover_given, u64::from(moving.given));
        if let Some(e) = moving.failed {
            // The chunk that failed is gone with the successor (its
            // sockets close as they drop here); the rest stay.
            let lost = moving.sent.len() - moving.given as usize;
            log::error!(
                "the handover broke off after {} connections: {e}; {lost} lost, the {} not sent yet are served on here",
                moving.given,
                self.conns.len()
            );
            Metrics::add(&metrics.handover_lost, lost as u64);
            self.unwatch_sent(moving.sent);
            return;
        }
        let given = moving.given;
        let mut bytes = Vec::new();
        Record::End { count: given }.encode(&mut bytes);
        let ended = channel.send(&bytes, &[]);
        let paused = started.elapsed();
        self.unwatch_sent(moving.sent);
        let metrics = &self.report.shared.counters.metrics;
        Metrics::set(&metrics.handover_pause_us, paused.as_micros() as u64);
        match ended {
            Ok(()) => log::info!(
                "handed {given} connections over (given through position {through}) in {:.1} ms; {} could not move and close here",
                paused.as_secs_f64() * 1e3,
                self.conns.len()
            ),
            Err(e) => log::warn!("the handover's end was not sent ({e}); the successor has the {given} connections"),
        }
        self.close_everything(now, Ending::Drain);
    }

    /// Takes every open connection apart, each given every message up to
    /// `through`, and hands `put` their records and sockets a chunk of
    /// [`FDS_PER_CHUNK`] at a time, until one fails (its connections
    /// are lost; the rest stay here).
    pub(super) fn move_out_all(
        &mut self,
        through: u64,
        now: Instant,
        mut put: impl FnMut(&[u8], &[mio::net::TcpStream]) -> io::Result<()>,
    ) -> MovedOut {
        let keys: Vec<usize> = (self.conns.slab.iter())
            .filter(|(_, conn)| conn.movable())
            .map(|(key, _)| key)
            .collect();
        let mut given = 0u32;
        let mut bytes = Vec::new();
        let mut sent = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(FDS_PER_CHUNK) {
            bytes.clear();
            let first = sent.len();
            for &key in chunk {
                let key = ConnKey(key);
                let Some(conn) = self.conns.remove(key) else {
                    continue;
                };
                self.walk.targeted.forget(key.slot());
                let mut ctx = self.handling(now).ctx;
                let (moved, stream) = conn.move_out(key, through, &mut ctx);
                Record::Conn(Box::new(moved)).encode(&mut bytes);
                sent.push(stream);
            }
            if let Err(e) = put(&bytes, &sent[first..]) {
                return MovedOut {
                    sent,
                    given,
                    failed: Some(e),
                };
            }
            given += (sent.len() - first) as u32;
        }
        MovedOut {
            sent,
            given,
            failed: None,
        }
    }

    /// Takes the sockets sent to a successor out of this poll (the
    /// successor's copies keep them open), and closes this process's.
    fn unwatch_sent(&self, sent: Vec<mio::net::TcpStream>) {
        for mut stream in sent {
            let _ = self.sockets.registry().deregister(&mut stream);
        }
    }

    /// Takes the connections of the process this one replaces, over
    /// `socket` (a Unix stream socket it watches with
    /// [`Server::hand_over_on`]), before this loop runs: each in the slot
    /// it had, owed what the other process had not given it. Returns how
    /// many were taken. Refused (nothing taken) when the other process
    /// cannot write this build's state format, or this server already
    /// holds connections; the caller then falls back to a drain. One the
    /// other process broke off is [`TakeOverError::BrokeOff`]: what came
    /// is served here, and the rest is drained there.
    pub fn take_over(&mut self, socket: OwnedFd) -> Result<usize, TakeOverError> {
        let urgent = Urgent::raise();
        let taken = self.ask_and_take(socket);
        drop(urgent);
        if let Err(e) = &taken {
            Metrics::incr(&self.report.shared.counters.metrics.handover_fallbacks);
            log::warn!("{e}: the process this one replaces drains what it still holds");
        }
        taken
    }

    /// Asks on `socket`, then takes what comes (see [`Server::take_over`]).
    fn ask_and_take(&mut self, socket: OwnedFd) -> Result<usize, TakeOverError> {
        if !self.conns.is_empty() {
            return Err(TakeOverError::Refused(
                "this server holds connections already".into(),
            ));
        }
        let started = Instant::now();
        let mut channel = Channel::new(socket, HANDOVER_TIMEOUT).map_err(TakeOverError::Io)?;
        let first = self.records.history.current().seq + 1;
        let ask = Ask {
            version: VERSION,
            first,
        };
        channel
            .write_all(&ask.encode())
            .map_err(TakeOverError::Io)?;
        // The other loop may first frame up to this one's first position
        // and finish its fan-out.
        channel
            .set_read_timeout(ANSWER_TIMEOUT)
            .map_err(TakeOverError::Io)?;
        let head = channel.read_head().map_err(TakeOverError::Io)?;
        channel
            .set_read_timeout(HANDOVER_TIMEOUT)
            .map_err(TakeOverError::Io)?;
        match Answer::decode(&head) {
            Ok(Answer::Give { .. }) => {}
            Ok(Answer::Refuse) => {
                return Err(TakeOverError::Refused("the other process said no".into()))
            }
            Err(e) => return Err(TakeOverError::Refused(e.to_string())),
        }
        let answered = Instant::now();
        let (taken, whole) = self.take_records(&mut channel);
        let metrics = &self.report.shared.counters.metrics;
        Metrics::add(&metrics.handover_taken, taken as u64);
        // The pause the clients see: from the other loop's stop to this
        // one's start.
        let paused = answered.elapsed();
        Metrics::set(&metrics.handover_pause_us, paused.as_micros() as u64);
        log::info!(
            "took {taken} connections over in {:.1} ms ({:.1} ms after asking, while the other process framed up to this one's first position and let its fan-out finish)",
            paused.as_secs_f64() * 1e3,
            (answered - started).as_secs_f64() * 1e3
        );
        match whole {
            true => Ok(taken),
            false => Err(TakeOverError::BrokeOff { taken }),
        }
    }

    /// Reads connection records until the end (or until the other side
    /// broke off: what came is kept), puts each together in its slot,
    /// and addresses each its wait for the positions it was given.
    pub(super) fn take_records(&mut self, channel: &mut impl RecordSource) -> (usize, bool) {
        let mut whole = false;
        let now = Instant::now();
        let current = self.records.history.current().seq;
        let mut entries = Vec::new();
        let mut slots = std::collections::HashSet::new();
        let mut verdicts = Vec::new();
        let mut failed = 0;
        loop {
            let record = match channel.read_record() {
                Ok(record) => record,
                Err(e) => {
                    log::error!(
                        "the handover broke off after {} connections: {e}",
                        entries.len()
                    );
                    break;
                }
            };
            let moved = match record {
                Record::Conn(moved) => moved,
                Record::End { count } => {
                    whole = count as usize == entries.len() + failed;
                    if !whole {
                        log::warn!(
                            "the handover sent {count} connections; {} came",
                            entries.len() + failed
                        );
                    }
                    break;
                }
            };
            let Some(fd) = channel.take_fd() else {
                log::error!("a connection came without its socket: the handover stops here");
                break;
            };
            // Non-blocking already: the flag is the open socket's, which
            // the other process's poll had it in (a syscall each saved).
            let stream = mio::net::TcpStream::from_std(std::net::TcpStream::from(fd));
            let key = ConnKey(moved.slot as usize);
            let out_of_bounds = key.0 >= self.config.max_connections;
            let taken_already = out_of_bounds || !slots.insert(key.0);
            let mut ctx = self.handling(now).ctx;
            let conn = match taken_already {
                true if out_of_bounds => Err("a slot past this server's bound"),
                true => Err("a second connection for its slot"),
                false => Conn::move_in(&moved, stream, key, &mut ctx),
            };
            let conn = conn.map(|(mut conn, verdict)| {
                self.conns.welcome(key, &mut conn, self.sockets.registry());
                (conn, verdict)
            });
            match conn {
                Ok((conn, Verdict::Keep)) => {
                    // Owed what comes after the position it was given: a
                    // replay (from the history, or a wait for this loop
                    // to frame as far, its live messages skipped) unless
                    // that is where this loop stands.
                    let verdict = match moved.given == current {
                        true => Verdict::ReadAgain,
                        false => Verdict::Replay(Box::new(Replay {
                            from: moved.given,
                            through: moved.given.max(current),
                            filter: Arc::new(Filter {
                                id: conn.id().map(|id| id.owned()),
                                channels: (moved.channels.iter())
                                    .filter_map(|c| ChannelName::new(c).ok())
                                    .collect(),
                            }),
                        })),
                    };
                    verdicts.push((key, verdict));
                    entries.push((key.0, conn));
                }
                Ok((conn, verdict)) => {
                    verdicts.push((key, verdict));
                    entries.push((key.0, conn));
                }
                Err(why) => {
                    failed += 1;
                    Metrics::incr(&self.report.shared.counters.metrics.handover_lost);
                    log::warn!("a connection could not be taken ({why}): it is closed");
                }
            }
        }
        let taken = entries.len();
        self.conns.adopt(entries);
        for (key, verdict) in verdicts {
            self.settle(key, verdict);
        }
        (taken, whole)
    }
}

/// Tells a successor no: it keeps what it has, and the caller of its
/// [`Server::take_over`] falls back to a drain (and counts it, in the
/// process that lives on).
fn refuse(giving: Option<Giving>) {
    if let Some(Giving {
        taker: Taker::Successor(mut channel),
        ..
    }) = giving
    {
        say_no(&mut channel);
    }
}

/// Writes a refusal to a successor.
fn say_no(channel: &mut Channel) {
    let _ = channel.write_all(&Answer::Refuse.encode());
}

/// What [`Server::move_out_all`] moved: the sockets put (and the
/// connections' counts of them given whole), and the failure that ended
/// it early, if one did.
pub(super) struct MovedOut {
    /// The sockets of the connections moved out, in order.
    pub(super) sent: Vec<mio::net::TcpStream>,
    /// How many of them were put without a failure.
    pub(super) given: u32,
    /// The failure that stopped it.
    pub(super) failed: Option<io::Error>,
}

/// Where connection records come from: a predecessor's socket, or what
/// an earlier image of this process kept.
pub(super) trait RecordSource {
    /// The next record.
    fn read_record(&mut self) -> io::Result<Record>;
    /// The next descriptor, in order: one per connection record.
    fn take_fd(&mut self) -> Option<OwnedFd>;
}

impl RecordSource for Channel {
    fn read_record(&mut self) -> io::Result<Record> {
        Channel::read_record(self)
    }

    fn take_fd(&mut self) -> Option<OwnedFd> {
        Channel::take_fd(self)
    }
}

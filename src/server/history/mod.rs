//! Positions and history: every message the loop frames gets the next
//! position of its source, and what was framed (with positions, and
//! compressed too) is kept in a ring in shared memory within bounds of
//! count, bytes and age (see `ring`), so that a client coming back with
//! `?since=` is given what it missed, as framed, and told honestly
//! whether that is everything.
//!
//! A lone server writes its own ring. The instances of a supervisor read
//! the supervisor's, which it writes before it hands them each line: a
//! host holds its history once, and a client of an instance that died
//! resumes on any other. Each message is a record, found by its position
//! with a binary search.
//!
//! Whatever a client is not given of what it asked for is told, exactly:
//! a `gap` status names the first and last positions missing, where they
//! would have been (see [`Status::Gap`]). So are a `since` the history no
//! longer reaches, a replay the history outruns, and a message the
//! history refused for being larger than its byte bound alone.

mod layout;
pub(crate) mod ring;

use std::cell::Cell;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::protocol::commands::{self, Recipients};
use crate::protocol::names::{ChannelName, ClientId};
use crate::protocol::position::{Epoch, Position, Status};
use crate::server::frames::SharedFrames;
use crate::server::history::layout::AudienceKind;
pub use crate::server::history::ring::Bounds;
use crate::server::history::ring::{Appended, Content, Ring};

/// What a resuming connection was addressed as at its upgrade: the
/// messages of the history it is given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Filter {
    /// Its client id.
    pub id: Option<ClientId>,
    /// Its channels.
    pub channels: Box<[ChannelName]>,
}

impl Filter {
    /// Whether messages for `kind` `names` (as a record holds them) were for it.
    fn wants(&self, kind: AudienceKind, names: &[u8]) -> bool {
        match kind {
            AudienceKind::All => true,
            AudienceKind::Channels => names
                .split(|&b| b == b',')
                .any(|n| self.channels.iter().any(|c| c.as_str().as_bytes() == n)),
            AudienceKind::Id => self.id.as_ref().map(|id| id.as_str().as_bytes()) == Some(names),
            // A connection of its own, which is gone: a resume is another.
            AudienceKind::Conn => false,
        }
    }
}

/// How `to` is kept in a record.
fn audience(to: &Recipients) -> (AudienceKind, Vec<u8>) {
    match to {
        Recipients::All => (AudienceKind::All, Vec::new()),
        Recipients::Channels(names) => {
            let mut joined = Vec::with_capacity(commands::names_len(names) + names.len());
            for (i, name) in names.iter().enumerate() {
                if i > 0 {
                    joined.push(b',');
                }
                joined.extend_from_slice(name.as_str().as_bytes());
            }
            (AudienceKind::Channels, joined)
        }
        Recipients::Id(id) => (AudienceKind::Id, id.as_str().as_bytes().to_vec()),
        Recipients::Conn(_) => (AudienceKind::Conn, Vec::new()),
    }
}

/// A connection's replay: the messages after `from` up to `through`
/// (positions in the current epoch) that its filter wants. When
/// `through` is past what this loop has framed (the client came from an
/// instance further on), the replay waits until it has, and the
/// connection's live messages up to `through` are skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Given up to here.
    pub from: u64,
    /// To be given up to here.
    pub through: u64,
    /// Which messages it is given.
    pub filter: Arc<Filter>,
}

impl Replay {
    /// Whether it reaches past what this loop has framed into `history`:
    /// the client is ahead of this loop (another instance or host gave it
    /// later positions). It then waits until the loop has framed as far,
    /// so that what the loop frames up to there is skipped, not given
    /// twice.
    pub fn ahead_of(&self, history: &History) -> bool {
        self.through > history.current().seq
    }
}

/// A new epoch, unlike any other with overwhelming odds: 64 bits the OS
/// seeds for the standard library's hasher, over the wall clock's time.
pub(super) fn fresh_epoch() -> Epoch {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    Epoch(hasher.finish())
}

/// How far one visit of a replay got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayProgress {
    /// Given up to this position, with more left (`None`: done).
    pub more: Option<u64>,
    /// The history no longer held all that was left: the connection was
    /// told of the gap (a status message) and given what it holds.
    pub overrun: bool,
}

/// The positions given out and the history kept.
#[derive(Debug)]
pub struct History {
    ring: Ring,
    /// The ring of an earlier layout `ring` was carried from, written
    /// alike while processes started before read it (see
    /// [`SharedHistory::retire_former`]).
    former: Option<Ring>,
    /// The last position this loop gave out.
    last: u64,
    /// Whether positions of its epoch are given out elsewhere too (other
    /// hosts read the same stream, see [`History::given_elsewhere`]).
    elsewhere: bool,
    /// Resumes that met a gap, logged a line a minute at most.
    gaps: Throttle,
    /// Messages refused, logged likewise (by the history's writer).
    refusals: Throttle,
}

/// Records one visit of a replay looks at, at most.
pub const SCAN_PER_VISIT: usize = 4096;

/// A warning that may come often: logged the first time, then at most
/// once per [`Throttle::EVERY`], with the count of those since.
#[derive(Debug, Default)]
struct Throttle {
    logged: Cell<Option<Instant>>,
    unlogged: Cell<u64>,
}

impl Throttle {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(60);

    /// Counts one at `now`; returns the count to log if a line is due.
    fn due(&self, now: Instant) -> Option<u64> {
        self.unlogged.set(self.unlogged.get() + 1);
        if self
            .logged
            .get()
            .is_some_and(|at| now.saturating_duration_since(at) < Self::EVERY)
        {
            return None;
        }
        self.logged.set(Some(now));
        Some(self.unlogged.replace(0))
    }
}

impl History {
    /// A history of its own, of `epoch`, whose first position will be `first`.
    pub fn new(epoch: Epoch, first: u64, bounds: Bounds) -> io::Result<History> {
        let before = first.saturating_sub(1);
        Ok(History::on(Ring::create(bounds, epoch, before)?, before))
    }

    /// The history another process writes (a supervisor's), from its
    /// descriptor; this loop's first position will be `first`.
    pub fn shared(fd: OwnedFd, first: u64) -> io::Result<History> {
        Ok(History::on(Ring::open(fd)?, first.saturating_sub(1)))
    }

    /// The history an earlier image of this process wrote (see
    /// [`History::suspend`]), whose last position given out was `last`,
    /// written on here (in this build's layout: see [`Ring::resume`]; no
    /// other process reads this one).
    pub fn resumed(
        fd: OwnedFd,
        bounds: Bounds,
        ages: &[Duration],
        last: u64,
    ) -> io::Result<History> {
        let (ring, _former) = Ring::resume(fd, bounds, ages, Instant::now())?;
        Ok(History::on(ring, last))
    }

    /// What this process's next image needs to go on with the history
    /// (see [`History::resumed`]): its memory, and the ages of its
    /// records if this process writes it.
    pub fn suspend(&self, now: Instant) -> io::Result<(OwnedFd, Option<Vec<Duration>>)> {
        let fd = self.ring.memory().fd().try_clone_to_owned()?;
        Ok((fd, self.ring.ages(now)))
    }

    fn on(ring: Ring, last: u64) -> History {
        History {
            ring,
            former: None,
            last,
            elsewhere: false,
            gaps: Throttle::default(),
            refusals: Throttle::default(),
        }
    }

    /// Positions of its epoch are given out elsewhere too: servers that
    /// share an epoch number their messages alike (other hosts reading
    /// one stream, see [`Config::epoch`](crate::config::Config::epoch)), so a
    /// client may come with a position this loop has not reached yet. It
    /// is told `recovered` and waits until this loop reaches it (its
    /// messages up to there are skipped), for the handshake timeout at
    /// most (then it is closed with 1013, to try again).
    pub fn given_elsewhere(mut self) -> History {
        self.elsewhere = true;
        self
    }

    /// The position for a message numbered `asked` by its source (`None`:
    /// the next one), never one given out before.
    pub fn assign(&mut self, asked: Option<u64>) -> Position {
        let next = self.last.saturating_add(1);
        self.last = asked.map_or(next, |asked| asked.max(next));
        self.current()
    }

    /// Positions up to `seq` were given out by the source without this
    /// loop framing them (kept in the history only, or lost): the next
    /// message is positioned after it.
    pub fn advance(&mut self, seq: u64) {
        self.last = self.last.max(seq);
    }

    /// The last position this loop gave out.
    pub fn current(&self) -> Position {
        self.at(self.last)
    }

    fn at(&self, seq: u64) -> Position {
        Position {
            epoch: self.ring.epoch(),
            seq,
        }
    }

    /// Keeps the messages of a batch just framed (at their positions), each
    /// its own record (so the bounds count messages), if this loop writes
    /// the history; the oldest leave as the bounds ask. A message larger
    /// than the byte bound alone is refused, counted and logged; only a
    /// mark of its position stays.
    pub fn keep(&mut self, to: &Recipients, batch: &SharedFrames, now: Instant) {
        let Some(frames) = batch.positioned().filter(|_| self.ring.is_writer()) else {
            return;
        };
        // The compressed frames, if the batch has some (else `frames` itself).
        let compressed = frames.for_connection(true, false);
        let mut compressed = (!std::ptr::eq(compressed, frames)).then(|| compressed.messages());
        let (kind, names) = audience(to);
        for (frame, position, status) in frames.messages() {
            let zipped = compressed.as_mut().and_then(Iterator::next);
            let zipped = zipped.map_or(&[][..], |(frame, ..)| frame);
            let Some(Position { seq, .. }) = position else {
                debug_assert!(false, "bug: a positioned frame without its position");
                continue;
            };
            let appended = self
                .ring
                .append(seq, (kind, &names), frame, zipped, status, now);
            if let Some(former) = &mut self.former {
                former.append(seq, (kind, &names), frame, zipped, status, now);
            }
            if appended == Appended::Refused {
                if let Some(count) = self.refusals.due(now) {
                    log::warn!(
                        "{count} message(s) refused by the history, each larger than \
                         --history-bytes alone (the last: {}, {} bytes); a resume across \
                         one is told the gap",
                        self.at(seq),
                        frame.len()
                    );
                }
            }
        }
    }

    /// Drops the messages older than the age bound (if this loop writes
    /// the history).
    pub fn evict(&mut self, now: Instant) {
        self.ring.evict(now, 0, 0);
        if let Some(former) = &mut self.former {
            former.evict(now, 0, 0);
        }
    }

    /// What a client resuming after `since` (as given) is told, and the
    /// replay it gets (from, through), if any: everything after `since`
    /// up to the newest position, this loop's or the history's writer's,
    /// comes from the history (the replay waits for this loop to have
    /// framed it, and its live messages up to there are skipped), so a
    /// message kept in the history only is replayed too, and only what
    /// the history forgot is lost. A `since` past the newest position
    /// is `unknown`, unless positions are [given
    /// elsewhere](History::given_elsewhere) too: then the replay waits for
    /// this loop to reach it.
    pub fn resume(&self, since: Option<Position>, now: Instant) -> (Status, Option<(u64, u64)>) {
        let current = self.current();
        let newest = self.ring.last().max(self.last);
        let since = match since {
            Some(since)
                if since.epoch == current.epoch && (since.seq <= newest || self.elsewhere) =>
            {
                since.seq
            }
            _ => return (Status::Unknown { current }, None),
        };
        let lost = self.ring.forgotten().min(newest);
        if since >= lost {
            let through = newest.max(since);
            let replay = (since != self.last || since != through).then_some((since, through));
            return (Status::Recovered { current }, replay);
        }
        let gap = self.gap(since + 1, lost);
        if let Some(count) = self.gaps.due(now) {
            log::warn!(
                "{count} resume(s) asked for more than the history holds (the last lost {} \
                 to {}; see --history-messages, --history-bytes, --history-age)",
                self.at(since + 1),
                self.at(lost)
            );
        }
        let replay = (lost < newest).then_some((lost, newest));
        (gap, replay)
    }

    /// The frames that tell every connection with positions, in the
    /// stream, that its source lost positions `from` to `to` (both
    /// included): a gap status (the others get an empty pong, see
    /// [`SharedFrames::positioned_only`]).
    pub fn gap_frames(&self, from: u64, to: u64) -> SharedFrames {
        let status = self.gap(from, to).message();
        SharedFrames::positioned_only(status.as_bytes(), self.at(to))
    }

    /// The status of a gap from position `from` to `to`, both included.
    fn gap(&self, from: u64, to: u64) -> Status {
        Status::Gap {
            from: self.at(from),
            to: self.at(to),
            current: self.current(),
        }
    }

    /// Gathers into `out` the frames of `replay` a connection gets
    /// (compressed if `deflate`), up to about `room` bytes and
    /// [`SCAN_PER_VISIT`] records looked at: copied back to back into one
    /// buffer, so the visit writes them with one `writev`. Where messages
    /// are missing, a gap status naming them stands in their place: those
    /// the history dropped before the replay got to them (it outran the
    /// connection), and those it refused.
    pub fn gather(
        &self,
        replay: &Replay,
        deflate: bool,
        room: usize,
        out: &mut Vec<SharedFrames>,
    ) -> ReplayProgress {
        let mut from = replay.from;
        let mut overrun = false;
        let mut scanned = 0;
        // The frames copied, and each one's position and status mark.
        let mut copied = Copied::default();
        let flush = |copied: &mut Copied, out: &mut Vec<SharedFrames>| {
            if !copied.0.is_empty() {
                out.push(SharedFrames::from_encoded(
                    std::mem::take(&mut copied.0),
                    &copied.1,
                ));
                copied.1.clear();
            }
        };
        let tell_gap = |copied: &mut Copied, out: &mut Vec<SharedFrames>, first, last| {
            flush(copied, out);
            let status = self.gap(first, last).message();
            out.push(SharedFrames::status(status.as_bytes(), None));
        };
        // A copy that raced the writer means the history moved on past it:
        // the next round starts with the gap.
        for _round in 0..3 {
            let (start, records) = loop {
                let forgotten = self.ring.forgotten().min(replay.through);
                if from < forgotten {
                    overrun = true;
                    tell_gap(&mut copied, out, from + 1, forgotten);
                    from = forgotten;
                }
                let found = self.ring.find(from);
                // The writer (another process) stores `forgotten` before it
                // moves `oldest` on: read after the search, it covers every
                // record the search passed over.
                if self.ring.forgotten().min(replay.through) <= from {
                    break found;
                }
            };
            let mut raced = false;
            for n in start..records {
                if from >= replay.through {
                    break;
                }
                if copied.0.len() >= room || scanned == SCAN_PER_VISIT {
                    flush(&mut copied, out);
                    return ReplayProgress {
                        more: Some(from),
                        overrun,
                    };
                }
                scanned += 1;
                let wanted = |kind, names: &[u8]| replay.filter.wants(kind, names);
                let Ok(record) = self.ring.read(n, deflate, wanted) else {
                    raced = true;
                    break;
                };
                if record.first > replay.through {
                    break;
                }
                match record.content {
                    // A record holds one message, positioned `first`.
                    Content::Frames(_) | Content::Status(_) if from >= record.first => {}
                    Content::Frames(bytes) => copied.add(&bytes, self.at(record.first), false),
                    Content::Status(bytes) => copied.add(&bytes, self.at(record.first), true),
                    Content::Refused => {
                        tell_gap(&mut copied, out, record.first.max(from + 1), record.last)
                    }
                    Content::Unwanted => {}
                }
                from = record.last;
            }
            if !raced {
                flush(&mut copied, out);
                return ReplayProgress {
                    more: None,
                    overrun,
                };
            }
        }
        // Raced every round: the next visit goes on from here.
        flush(&mut copied, out);
        ReplayProgress {
            more: Some(from),
            overrun,
        }
    }

    /// Messages and bytes held now.
    pub fn held(&self) -> (u64, u64) {
        self.ring.held()
    }

    /// Messages the history refused so far, for every instance of the host.
    pub fn refused(&self) -> u64 {
        self.ring.refused()
    }
}

/// Frames a replay copied out of the history, back to back, with each
/// one's position and whether it is a status.
#[derive(Debug, Default)]
struct Copied(Vec<u8>, Vec<(Position, bool)>);

impl Copied {
    fn add(&mut self, frame: &[u8], position: Position, status: bool) {
        self.0.extend_from_slice(frame);
        self.1.push((position, status));
    }
}

/// The history a supervisor keeps for its instances: each message of its
/// input, framed with its position (and compressed, as the instances
/// would), in a ring in shared memory that the instances read (see
/// [`Config::history_fd`](crate::config::Config::history_fd)). The host holds it
/// once, and it outlives any instance.
#[derive(Debug)]
pub struct SharedHistory {
    history: History,
    /// Which messages are compressed too (for the `internals` writers).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    compression: crate::config::Compression,
}

impl SharedHistory {
    /// A history within `config`'s bounds, of a new epoch (or its
    /// `epoch`), for positions numbered from 1.
    pub fn create(config: &crate::config::Config) -> io::Result<SharedHistory> {
        let bounds = Bounds {
            messages: config.history_messages,
            bytes: config.history_bytes,
            age: config.history_age,
        };
        let epoch = config.epoch.unwrap_or_else(fresh_epoch);
        Ok(SharedHistory {
            history: History::new(epoch, 1, bounds)?,
            compression: config.compression(),
        })
    }

    /// Its epoch.
    pub fn epoch(&self) -> Epoch {
        self.history.ring.epoch()
    }

    /// The descriptor of its memory, made inheritable: the number to name
    /// to the processes this one starts.
    #[cfg(feature = "internals")]
    pub fn inheritable_fd(&self) -> io::Result<i32> {
        use std::os::fd::AsRawFd;
        Ok(self.history.ring.memory().inheritable()?.as_raw_fd())
    }

    /// A descriptor of its memory for a loop of this process to read it
    /// by, as [`Config::history_fd`](crate::config::Config::history_fd).
    pub fn reader_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        self.history
            .ring
            .memory()
            .inheritable()?
            .try_clone_to_owned()
    }

    #[cfg(feature = "internals")]
    /// Keeps message `seq` (its position) for `to`.
    pub fn append(
        &mut self,
        seq: u64,
        to: &Recipients,
        kind: crate::protocol::ws::MessageKind,
        payload: &[u8],
    ) {
        let position = self.history.assign(Some(seq));
        let deflated = self
            .compression
            .worth(payload.len())
            .then(|| crate::protocol::ws::compress::deflate_message(payload));
        let frames = SharedFrames::encode_batch([crate::server::frames::ToFrame {
            opcode: kind.opcode(),
            payload,
            deflated: deflated.as_deref(),
            position: Some(position),
        }]);
        self.history.keep(to, &frames, Instant::now());
    }

    #[cfg(feature = "internals")]
    /// Notes that messages `from..=to`, for everyone, are missing (the
    /// source lost them): a replay across them is told the gap.
    pub fn mark_missing(&mut self, from: u64, to: u64) {
        let now = Instant::now();
        self.history.ring.mark_missing(from, to, now);
        if let Some(former) = &mut self.history.former {
            former.mark_missing(from, to, now);
        }
        self.history.advance(to);
    }

    #[cfg(feature = "internals")]
    /// Notes that nothing up to `seq` is held: a resume from before it is
    /// told the gap (a history filled from a source's tail begins so).
    pub fn forget_through(&mut self, seq: u64) {
        self.history.ring.forget_through(seq);
        if let Some(former) = &mut self.history.former {
            former.forget_through(seq);
        }
        self.history.advance(seq);
    }

    #[cfg(feature = "internals")]
    /// Drops what is older than the age bound.
    pub fn evict(&mut self) {
        self.history.evict(Instant::now());
    }

    #[cfg(feature = "internals")]
    /// What this process's next image needs, beside its memory (see
    /// [`SharedHistory::reader_fd`]), to go on writing it (see
    /// [`SharedHistory::resumed`]): the ages of its records, and the last
    /// position given out.
    pub fn writer_state(&self) -> (Vec<Duration>, u64) {
        let ages = self.history.ring.ages(Instant::now()).unwrap_or_default();
        (ages, self.history.current().seq)
    }

    #[cfg(feature = "internals")]
    /// The history an earlier image of this process wrote (its memory,
    /// and [`SharedHistory::writer_state`]), written on here within
    /// `config`'s bounds.
    pub fn resumed(
        config: &crate::config::Config,
        fd: OwnedFd,
        ages: &[Duration],
        last: u64,
    ) -> io::Result<SharedHistory> {
        let bounds = Bounds {
            messages: config.history_messages,
            bytes: config.history_bytes,
            age: config.history_age,
        };
        let (ring, former) = Ring::resume(fd, bounds, ages, Instant::now())?;
        let mut history = History::on(ring, last);
        history.former = former;
        Ok(SharedHistory {
            history,
            compression: config.compression(),
        })
    }

    #[cfg(feature = "internals")]
    /// Whether it writes a ring of an earlier layout alike, for the
    /// processes started before it was carried into this build's (see
    /// [`SharedHistory::resumed`]).
    pub fn has_former(&self) -> bool {
        self.history.former.is_some()
    }

    #[cfg(feature = "internals")]
    /// Stops writing the ring of an earlier layout: no process reads it
    /// any more.
    pub fn retire_former(&mut self) {
        if self.history.former.take().is_some() {
            log::info!("the history's earlier layout is no longer written: no process reads it");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::frames::ToFrame;
    use std::time::Duration;

    #[test]
    fn fresh_epochs_differ_and_print_as_they_parse() {
        assert_ne!(fresh_epoch(), fresh_epoch());
        let epoch = fresh_epoch();
        assert_eq!(Epoch::parse(epoch.to_string().as_bytes()), Some(epoch));
    }

    const EPOCH: Epoch = Epoch(0xabc);

    fn bounds(messages: usize, bytes: usize, age_secs: u64) -> Bounds {
        Bounds {
            messages,
            bytes,
            age: Duration::from_secs(age_secs),
        }
    }

    fn history(bounds: Bounds) -> History {
        History::new(EPOCH, 1, bounds).unwrap()
    }

    #[test]
    fn a_gap_in_the_source_is_told_to_connections_with_positions_only() {
        let mut h = history(bounds(10, 1 << 20, 60));
        h.advance(9);
        let frames = h.gap_frames(4, 9);
        for deflate in [false, true] {
            let plain = frames.for_connection(deflate, false);
            assert_eq!((plain.count(), plain.bytes()), (0, &[0x8A, 0][..]));
        }
        let told = frames.for_connection(false, true);
        let payloads: Vec<_> = told.payloads().collect();
        let status = r#"{"status":"gap","from":"0000000000000abc.4","to":"0000000000000abc.9","position":"0000000000000abc.9"}"#;
        assert_eq!(payloads, [(status.as_bytes(), false)]);
        assert_eq!(frames.for_connection(true, true).bytes(), told.bytes());
        // Its place in the stream is the last position it names.
        assert_eq!(frames.seqs().collect::<Vec<_>>(), [9]);
        assert!(frames.after(8).is_some_and(|rest| rest.is(&frames)));
        assert_eq!(frames.after(9), None);
    }

    /// Frames `texts` into one batch, as the feed does, and keeps it.
    fn keep(history: &mut History, texts: &[&str], to: Recipients, at: Instant) {
        let positions: Vec<Position> = texts.iter().map(|_| history.assign(None)).collect();
        let frames =
            SharedFrames::encode_batch(texts.iter().zip(&positions).map(|(t, p)| ToFrame {
                opcode: crate::protocol::ws::OpCode::Text,
                payload: t.as_bytes(),
                deflated: None,
                position: Some(*p),
            }));
        history.keep(&to, &frames, at);
    }

    /// The payloads a replay of everything after `from` gives, for `filter`.
    fn replay(history: &History, from: u64, filter: Filter) -> Vec<String> {
        let replay = Replay {
            from,
            through: history.current().seq,
            filter: Arc::new(filter),
        };
        let mut out = Vec::new();
        let progress = history.gather(&replay, false, usize::MAX, &mut out);
        assert_eq!(progress.more, None);
        out.iter()
            .flat_map(|f| {
                f.payloads()
                    .map(|(p, _)| String::from_utf8(p.to_vec()).unwrap())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The payloads of gathered frames, in order.
    fn payloads(out: &[SharedFrames]) -> Vec<Vec<u8>> {
        out.iter()
            .flat_map(|f| f.payloads().map(|(p, _)| p.to_vec()).collect::<Vec<_>>())
            .collect()
    }

    /// The filter of a client subscribed to `channel` alone.
    fn subscriber_of(channel: &str) -> Filter {
        Filter {
            id: None,
            channels: vec![ChannelName::new(channel).unwrap()].into(),
        }
    }

    fn since(seq: u64) -> Option<Position> {
        Some(Position { epoch: EPOCH, seq })
    }

    fn at(seq: u64) -> Position {
        Position { epoch: EPOCH, seq }
    }

    #[test]
    fn a_since_past_the_newest_position_waits_only_where_positions_are_given_elsewhere() {
        let now = Instant::now();
        let mut own = history(bounds(8, 1 << 20, 60));
        keep(&mut own, &["a", "b"], Recipients::All, now);
        let (status, replayed) = own.resume(since(5), now);
        assert_eq!(
            (status, replayed),
            (Status::Unknown { current: at(2) }, None),
            "never given out: this loop alone gives its epoch's positions"
        );
        let mut shared = history(bounds(8, 1 << 20, 60)).given_elsewhere();
        keep(&mut shared, &["a", "b"], Recipients::All, now);
        let (status, replayed) = shared.resume(since(5), now);
        assert_eq!(status, Status::Recovered { current: at(2) });
        assert_eq!(
            replayed,
            Some((5, 5)),
            "nothing to give: it waits for this loop to frame 5"
        );
        let other = Position {
            epoch: Epoch(EPOCH.0 + 1),
            seq: 1,
        };
        let (status, _) = shared.resume(Some(other), now);
        assert_eq!(status, Status::Unknown { current: at(2) }, "another epoch");
    }

    #[test]
    fn the_count_bound_drops_the_oldest_messages_even_of_a_batch() {
        let now = Instant::now();
        let mut history = history(bounds(3, 1 << 20, 60));
        keep(&mut history, &["a", "b"], Recipients::All, now);
        keep(&mut history, &["c"], Recipients::All, now);
        assert_eq!(history.held().0, 3);
        keep(&mut history, &["d"], Recipients::All, now);
        assert_eq!(history.held().0, 3, "a left, b stays");
        let held = [
            "0000000000000abc.2 b",
            "0000000000000abc.3 c",
            "0000000000000abc.4 d",
        ];
        assert_eq!(replay(&history, 1, Filter::default()), held);
        let (status, replayed) = history.resume(since(0), now);
        assert_eq!(
            status,
            Status::Gap {
                from: at(1),
                to: at(1),
                current: at(4)
            },
            "a left: only it is lost"
        );
        assert_eq!(replayed, Some((1, 4)), "from what the history holds");
        let (status, replayed) = history.resume(since(1), now);
        assert_eq!(status, Status::Recovered { current: at(4) });
        assert_eq!(replayed, Some((1, 4)));
        let (status, replayed) = history.resume(since(4), now);
        assert_eq!(
            (status, replayed),
            (Status::Recovered { current: at(4) }, None)
        );
        keep(&mut history, &["e", "f", "g", "h"], Recipients::All, now);
        assert_eq!(
            history.held().0,
            3,
            "a batch larger than the bound keeps its last"
        );
        let (status, _) = history.resume(since(4), now);
        assert_eq!(
            status,
            Status::Gap {
                from: at(5),
                to: at(5),
                current: at(8)
            }
        );
        let held = [
            "0000000000000abc.6 f",
            "0000000000000abc.7 g",
            "0000000000000abc.8 h",
        ];
        assert_eq!(replay(&history, 5, Filter::default()), held);
    }

    #[test]
    fn the_byte_and_age_bounds_drop_the_oldest_batches() {
        let now = Instant::now();
        // A record: 16 bytes of head, then the frame "0000000000000abc.N x" (22).
        let record = (16 + 22usize).next_multiple_of(8);
        let mut history = history(bounds(100, 2 * record, 60));
        for text in ["x", "y", "z"] {
            keep(&mut history, &[text], Recipients::All, now);
        }
        assert_eq!(history.held(), (2, 2 * record as u64));
        assert_eq!(
            replay(&history, 1, Filter::default()),
            ["0000000000000abc.2 y", "0000000000000abc.3 z"]
        );

        let mut history = self::history(bounds(100, 1 << 20, 10));
        keep(&mut history, &["old"], Recipients::All, now);
        keep(
            &mut history,
            &["new"],
            Recipients::All,
            now + Duration::from_secs(6),
        );
        history.evict(now + Duration::from_secs(11));
        assert_eq!(
            replay(&history, 1, Filter::default()),
            ["0000000000000abc.2 new"]
        );
        history.evict(now + Duration::from_secs(17));
        assert_eq!(history.held().0, 0);
        let (status, replayed) = history.resume(since(1), now);
        assert_eq!(
            status,
            Status::Gap {
                from: at(2),
                to: at(2),
                current: at(2)
            },
            "nothing held: all after since is lost"
        );
        assert_eq!(replayed, None, "nothing to replay");
    }

    #[test]
    fn a_replay_follows_the_filter_and_starts_inside_a_batch() {
        let now = Instant::now();
        let mut history = history(bounds(100, 1 << 20, 60));
        keep(
            &mut history,
            &["1", "2", "3"],
            Recipients::channels(&["a"]),
            now,
        );
        keep(&mut history, &["4"], Recipients::channels(&["b", "a"]), now);
        keep(&mut history, &["5"], Recipients::id("ann"), now);
        keep(&mut history, &["6"], Recipients::id("bob"), now);
        keep(&mut history, &["7"], Recipients::channels(&["c"]), now);
        keep(&mut history, &["8"], Recipients::All, now);
        let ann = Filter {
            id: Some(ClientId::new("ann").unwrap()),
            channels: vec![ChannelName::new("a").unwrap()].into(),
        };
        assert_eq!(
            replay(&history, 1, ann),
            [
                "0000000000000abc.2 2",
                "0000000000000abc.3 3",
                "0000000000000abc.4 4",
                "0000000000000abc.5 5",
                "0000000000000abc.8 8"
            ]
        );
        assert_eq!(
            replay(&history, 0, subscriber_of("c")),
            ["0000000000000abc.7 7", "0000000000000abc.8 8"]
        );
    }

    #[test]
    fn a_replay_goes_a_room_at_a_time_and_a_gap_is_told_if_it_falls_behind() {
        let now = Instant::now();
        let mut history = history(bounds(4, 1 << 20, 60));
        for text in ["a", "b", "c", "d"] {
            keep(&mut history, &[text], Recipients::All, now);
        }
        let mut replay = Replay {
            from: 0,
            through: 4,
            filter: Arc::new(Filter::default()),
        };
        let mut out = Vec::new();
        let progress = history.gather(&replay, false, 1, &mut out);
        assert_eq!(
            progress,
            ReplayProgress {
                more: Some(1),
                overrun: false
            }
        );
        assert_eq!(out.len(), 1);
        replay.from = 1;
        keep(&mut history, &["e", "f"], Recipients::All, now);
        out.clear();
        let progress = history.gather(&replay, false, usize::MAX, &mut out);
        assert_eq!(
            progress,
            ReplayProgress {
                more: None,
                overrun: true
            }
        );
        assert_eq!(out.len(), 2, "the status, then what is held in one buffer");
        let texts = payloads(&out);
        assert_eq!(
            texts,
            [
                &br#"{"status":"gap","from":"0000000000000abc.2","to":"0000000000000abc.2","position":"0000000000000abc.6"}"#
                    [..],
                b"0000000000000abc.3 c",
                b"0000000000000abc.4 d",
            ],
            "the gap, exactly what was lost, then from what is held, up to where it was to end"
        );
        // Outrun past its end: only what it was to give is lost, and the
        // live messages after it (e, f) are the connection's stream's.
        let replay = Replay {
            from: 3,
            through: 4,
            filter: Arc::new(Filter::default()),
        };
        keep(&mut history, &["g", "h", "i", "j"], Recipients::All, now);
        out.clear();
        let progress = history.gather(&replay, false, usize::MAX, &mut out);
        assert_eq!((progress.more, progress.overrun), (None, true));
        let texts = payloads(&out);
        assert_eq!(
            texts,
            [&br#"{"status":"gap","from":"0000000000000abc.4","to":"0000000000000abc.4","position":"0000000000000abc.10"}"#[..]],
            "d alone, not what the history holds from now on"
        );
    }

    #[test]
    fn a_message_the_history_refused_is_told_where_it_stood_to_those_it_was_for() {
        let now = Instant::now();
        let record = |text: &str| (16 + 19 + text.len()).next_multiple_of(8);
        let mut history = history(bounds(100, 4 * record("x"), 60));
        keep(&mut history, &["a"], Recipients::All, now);
        let huge = "h".repeat(1000);
        keep(&mut history, &[&huge], Recipients::channels(&["news"]), now);
        keep(&mut history, &["b"], Recipients::All, now);
        assert_eq!(
            (history.held().0, history.refused()),
            (3, 1),
            "a, its mark, b"
        );
        assert_eq!(
            replay(&history, 0, subscriber_of("news")),
            [
                "0000000000000abc.1 a",
                r#"{"status":"gap","from":"0000000000000abc.2","to":"0000000000000abc.2","position":"0000000000000abc.3"}"#,
                "0000000000000abc.3 b"
            ]
        );
        assert_eq!(
            replay(&history, 0, Filter::default()),
            ["0000000000000abc.1 a", "0000000000000abc.3 b"],
            "nothing missing for a client not in news"
        );
        let (status, replayed) = history.resume(since(0), now);
        assert_eq!(
            (status, replayed),
            (Status::Recovered { current: at(3) }, Some((0, 3))),
            "the gap is told where it stands, in the replay"
        );
    }

    #[test]
    fn messages_the_source_lost_are_told_to_everyone_and_a_filled_history_begins_after_them() {
        let now = Instant::now();
        let mut history = history(bounds(100, 1 << 20, 60));
        // Filled from a source's tail: nothing up to 10 is held.
        history.ring.forget_through(10);
        history.advance(10);
        let (status, replayed) = history.resume(since(4), now);
        assert_eq!(
            (status, replayed),
            (
                Status::Gap {
                    from: at(5),
                    to: at(10),
                    current: at(10)
                },
                None
            )
        );
        keep(&mut history, &["a"], Recipients::All, now);
        history.ring.mark_missing(12, 20, now);
        history.advance(20);
        keep(&mut history, &["b"], Recipients::channels(&["news"]), now);
        assert_eq!(history.refused(), 0, "a loss is not a refusal");
        assert_eq!(
            replay(&history, 10, Filter::default()),
            [
                "0000000000000abc.11 a",
                r#"{"status":"gap","from":"0000000000000abc.12","to":"0000000000000abc.20","position":"0000000000000abc.21"}"#,
            ],
            "told to a client of no channel too"
        );
        assert_eq!(
            replay(&history, 15, subscriber_of("news")),
            [
                r#"{"status":"gap","from":"0000000000000abc.16","to":"0000000000000abc.20","position":"0000000000000abc.21"}"#,
                "0000000000000abc.21 b",
            ],
            "from within the loss: only what is left of it"
        );
    }

    #[test]
    fn positions_follow_their_source_and_a_reader_shares_the_writers_history() {
        let now = Instant::now();
        let mut writer = history(bounds(10, 1 << 20, 60));
        keep(&mut writer, &["a"], Recipients::All, now);
        assert_eq!(writer.assign(Some(15)).seq, 15);
        assert_eq!(
            writer.assign(Some(12)).seq,
            16,
            "never one given out before"
        );
        let fd = writer
            .ring
            .memory()
            .inheritable()
            .unwrap()
            .try_clone_to_owned()
            .unwrap();
        let mut reader = History::shared(fd, 1).unwrap();
        assert_eq!(reader.current(), at(0), "the reader has framed nothing yet");
        let (status, replayed) = reader.resume(since(0), now);
        assert_eq!(status, Status::Recovered { current: at(0) });
        assert_eq!(
            replayed,
            Some((0, 1)),
            "what the writer kept, once this loop has framed it"
        );
        reader.assign(Some(1));
        assert_eq!(
            replay(&reader, 0, Filter::default()),
            ["0000000000000abc.1 a"]
        );
        let (status, _) = reader.resume(since(17), now);
        assert_eq!(
            status,
            Status::Unknown { current: at(1) },
            "never given out anywhere"
        );
        keep(&mut writer, &["b"], Recipients::All, now);
        let (status, replayed) = reader.resume(since(17), now);
        assert_eq!(
            status,
            Status::Recovered { current: at(1) },
            "given out by the writer"
        );
        assert_eq!(replayed, Some((17, 17)), "waits for this loop to frame it");
    }

    #[test]
    fn a_replay_to_a_connection_with_deflate_gets_the_compressed_frames_kept() {
        use crate::protocol::ws::{compress, inflate::Inflater};
        let now = Instant::now();
        let mut history = history(bounds(10, 1 << 20, 60));
        let text = "bid 1.0842 ask 1.0843 ".repeat(40);
        let deflated = compress::deflate_message(text.as_bytes());
        let position = history.assign(None);
        let frames = SharedFrames::encode_batch([ToFrame {
            opcode: crate::protocol::ws::OpCode::Text,
            payload: text.as_bytes(),
            deflated: Some(&deflated),
            position: Some(position),
        }]);
        history.keep(&Recipients::All, &frames, now);
        let replay = Replay {
            from: 0,
            through: 1,
            filter: Arc::new(Filter::default()),
        };
        for deflate in [false, true] {
            let mut out = Vec::new();
            history.gather(&replay, deflate, usize::MAX, &mut out);
            let (payload, compressed) = out[0].payloads().next().unwrap();
            assert_eq!(compressed, deflate);
            let mut plain = payload.to_vec();
            if compressed {
                Inflater::default()
                    .inflate(payload, 1 << 20, &mut plain)
                    .unwrap();
            }
            assert_eq!(plain, format!("0000000000000abc.1 {text}").as_bytes());
        }
    }
}

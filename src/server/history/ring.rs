//! The history's storage: records in a ring in shared memory, which one
//! process writes (a lone server's loop, or the supervisor of several) and
//! any process on the host maps and reads (every instance), so a host
//! holds its history once, and an instance that dies loses none of it.
//!
//! The memory holds a header of 64-bit words (the writer's page, then a
//! page kept free), an index of slots (a
//! record's first and last positions and where it is) and the data: each
//! record is its recipients and its frames as framed (with positions,
//! and compressed ones beside them), or, for a message the history
//! refused (larger than its byte bound alone), its recipients only: a
//! mark that says the position is missing. The writer keeps the history within
//! its bounds by moving `oldest` on (what readers may use); the ring has
//! twice that room, so a record dropped from the history stays intact a
//! while longer. Readers copy a record out, then check that the writer
//! has not written over it meanwhile (`reserve`, then `records`): a copy
//! that fails the check is discarded.

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use crate::ops::sys::{SharedMemory, SharedView};
use crate::protocol::position::Epoch;

const MAGIC: u64 = u64::from_le_bytes(*b"wspushH3");
/// The header's words, by index.
const MAGIC_AT: usize = 0;
const EPOCH: usize = 1;
const DATA: usize = 2;
const SLOTS: usize = 3;
/// The data the writer may be writing, up to (absolute bytes).
const RESERVE: usize = 4;
/// The records written so far.
const RECORDS: usize = 5;
/// The oldest record in the history.
const OLDEST: usize = 6;
/// Every message up to this position has left the history.
const FORGOTTEN: usize = 7;
/// The last position written.
const LAST: usize = 8;
/// Messages and bytes in the history.
const MESSAGES: usize = 9;
const BYTES: usize = 10;
/// Messages refused so far (each larger than the byte bound alone).
const REFUSED: usize = 11;
/// The writer's words are in the first page; the second is kept free
/// (the host's words once were there; they have a memory of their own
/// now, see `time::host`), so that a ring reads alike to every build of
/// the program, as during an upgrade.
const HEADER_LEN: usize = 2 * 4096;
/// A slot: first and last positions, and where the record is.
const SLOT_LEN: usize = 24;
/// A record's head: total length, frames' length, compressed frames'
/// length, recipients' length, kind and flags.
const RECORD_HEAD: usize = 16;
/// In a record head's flags: the message was refused (no frames).
const REFUSED_FLAG: u8 = 1;
/// In a record head's flags: the message is a status about the stream
/// (a gap), not one of its messages. A bit a writer of the layout before
/// it left clear, so the layout (and its magic) stays.
const STATUS_FLAG: u8 = 2;

/// Who a record's messages were for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AudienceKind {
    /// Everyone.
    All = 0,
    /// The subscribers of the channels named (comma-separated).
    Channels = 1,
    /// The connections of the client id named.
    Id = 2,
    /// One connection (never replayed: a resume is another connection).
    Conn = 3,
}

impl AudienceKind {
    fn of(byte: u8) -> AudienceKind {
        match byte {
            0 => AudienceKind::All,
            1 => AudienceKind::Channels,
            2 => AudienceKind::Id,
            _ => AudienceKind::Conn,
        }
    }
}

/// What the history may hold at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Messages (0: no history).
    pub messages: usize,
    /// Bytes of records.
    pub bytes: usize,
    /// How long a message is kept.
    pub age: Duration,
}

/// A record copied out: its positions and what it holds for the reader.
#[derive(Debug, PartialEq, Eq)]
pub struct Record {
    /// The first message's position.
    pub first: u64,
    /// The last message's position.
    pub last: u64,
    /// What it holds for the reader.
    pub content: Content,
}

/// What a record holds for a reader.
#[derive(Debug, PartialEq, Eq)]
pub enum Content {
    /// Messages for others.
    Unwanted,
    /// The frames of messages it wants (the compressed ones if asked for
    /// and there are).
    Frames(Vec<u8>),
    /// The frame of a status about the stream (a gap) it wants.
    Status(Vec<u8>),
    /// Messages it wants, which the history refused: they are missing.
    Refused,
}

/// What became of a message offered to the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Kept.
    Kept,
    /// Larger than the byte bound alone: only a mark that it is missing
    /// was kept.
    Refused,
    /// Not kept, nor anything before it: the history is off (or too small
    /// for even the mark).
    Forgotten,
}

/// A record the writer keeps track of.
#[derive(Debug)]
struct Kept {
    last: u64,
    end: u64,
    len: usize,
    messages: usize,
    at: Instant,
}

/// The writer's side.
#[derive(Debug)]
struct Writer {
    bounds: Bounds,
    kept: VecDeque<Kept>,
}

/// The ring's memory as this process maps it.
#[derive(Debug)]
enum Mapped {
    /// Read-write: this process writes the ring.
    Writer(SharedMemory),
    /// Read-only: another process writes it.
    Reader(SharedView),
}

impl Mapped {
    fn view(&self) -> &SharedView {
        match self {
            Mapped::Writer(mem) => mem,
            Mapped::Reader(view) => view,
        }
    }

    /// The writable mapping, for the writer's methods.
    fn writable(&self) -> &SharedMemory {
        match self {
            Mapped::Writer(mem) => mem,
            Mapped::Reader(_) => panic!("bug: writing a history read-only here"),
        }
    }
}

/// The ring, mapped; with the writer's bookkeeping if this process writes.
#[derive(Debug)]
pub struct Ring {
    mem: Mapped,
    data: u64,
    slots: u64,
    data_at: usize,
    writer: Option<Writer>,
}

/// The copy raced the writer: the record was written over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overrun;

impl Ring {
    /// A new ring for `bounds`, written by this process, of `epoch`
    /// positions; the last position before its first is `before`.
    pub fn create(bounds: Bounds, epoch: Epoch, before: u64) -> io::Result<Ring> {
        let slots = (2 * bounds.messages.max(1) + 1) as u64;
        let data = (2 * bounds.bytes.max(1)).next_multiple_of(8) as u64;
        let data_at = (HEADER_LEN + slots as usize * SLOT_LEN).next_multiple_of(4096);
        let mem = SharedMemory::create("wspush-history", data_at + data as usize)?;
        for (word, value) in [
            (EPOCH, epoch.0),
            (DATA, data),
            (SLOTS, slots),
            (FORGOTTEN, before),
            (LAST, before),
            (MAGIC_AT, MAGIC),
        ] {
            mem.word(word * 8).store(value, Ordering::Release);
        }
        Ok(Ring {
            mem: Mapped::Writer(mem),
            data,
            slots,
            data_at,
            writer: Some(Writer {
                bounds,
                kept: VecDeque::new(),
            }),
        })
    }

    /// The ring another process writes, from its descriptor.
    pub fn open(fd: OwnedFd) -> io::Result<Ring> {
        Ring::on(Mapped::Reader(SharedView::open(fd)?))
    }

    /// A ring this process goes on writing where an earlier image of it
    /// left off (see [`Ring::ages`]): its records' ages, oldest first, as
    /// they were then. Bounds past the ring's room are cut to it.
    pub fn resume(
        fd: OwnedFd,
        bounds: Bounds,
        ages: &[Duration],
        now: Instant,
    ) -> io::Result<Ring> {
        let mut ring = Ring::on(Mapped::Writer(SharedMemory::open(fd)?))?;
        let (oldest, records) = (ring.load(OLDEST), ring.load(RECORDS));
        if records - oldest != ages.len() as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a history whose records and ages disagree",
            ));
        }
        let kept = (oldest..records)
            .zip(ages)
            .map(|(n, age)| {
                let (_, last, start) = ring.slot(n);
                let at = ring.data_at + (start % ring.data) as usize;
                let mut len = [0u8; 4];
                ring.mem.view().read(at, &mut len);
                let len = u32::from_le_bytes(len) as usize;
                Kept {
                    last,
                    end: start + len as u64,
                    len,
                    messages: 1,
                    at: now.checked_sub(*age).unwrap_or(now),
                }
            })
            .collect();
        let bounds = Bounds {
            messages: bounds.messages.min((ring.slots as usize - 1) / 2),
            bytes: bounds.bytes.min(ring.data as usize / 2),
            age: bounds.age,
        };
        ring.writer = Some(Writer { bounds, kept });
        Ok(ring)
    }

    /// The ring mapped as `mem`, checked; no writer's bookkeeping yet.
    fn on(mem: Mapped) -> io::Result<Ring> {
        let view = mem.view();
        let invalid = |what| io::Error::new(io::ErrorKind::InvalidData, what);
        if view.size() < HEADER_LEN || view.load(MAGIC_AT * 8, Ordering::Acquire) != MAGIC {
            return Err(invalid("not a wspush history"));
        }
        let data = view.load(DATA * 8, Ordering::Relaxed);
        let slots = view.load(SLOTS * 8, Ordering::Relaxed);
        let data_at = (HEADER_LEN + slots as usize * SLOT_LEN).next_multiple_of(4096);
        if data_at as u64 + data != view.size() as u64 {
            return Err(invalid("a history of the wrong size"));
        }
        Ok(Ring {
            mem,
            data,
            slots,
            data_at,
            writer: None,
        })
    }

    /// The ages of the records this process writes, oldest first (none if
    /// it only reads): what [`Ring::resume`] needs beside the memory.
    pub fn ages(&self, now: Instant) -> Option<Vec<Duration>> {
        let writer = self.writer.as_ref()?;
        Some(
            (writer.kept.iter())
                .map(|kept| now.saturating_duration_since(kept.at))
                .collect(),
        )
    }

    /// The shared memory (to hand its descriptor on).
    pub fn memory(&self) -> &SharedView {
        self.mem.view()
    }

    /// Whether this process writes it.
    pub fn is_writer(&self) -> bool {
        self.writer.is_some()
    }

    fn load(&self, word: usize) -> u64 {
        self.mem.view().load(word * 8, Ordering::Acquire)
    }

    fn store(&self, word: usize, value: u64) {
        let mem = self.mem.writable();
        mem.word(word * 8).store(value, Ordering::Release);
    }

    /// The epoch of its positions.
    pub fn epoch(&self) -> Epoch {
        Epoch(self.load(EPOCH))
    }

    /// The last position written.
    pub fn last(&self) -> u64 {
        self.load(LAST)
    }

    /// Every message up to this position has left the history.
    pub fn forgotten(&self) -> u64 {
        self.load(FORGOTTEN)
    }

    /// Messages and bytes in the history now.
    pub fn held(&self) -> (u64, u64) {
        (self.load(MESSAGES), self.load(BYTES))
    }

    /// Messages refused so far.
    pub fn refused(&self) -> u64 {
        self.load(REFUSED)
    }

    /// The slot of record `n`: first, last, where.
    fn slot(&self, n: u64) -> (u64, u64, u64) {
        let at = HEADER_LEN / 8 + (n % self.slots) as usize * SLOT_LEN / 8;
        (self.load(at), self.load(at + 1), self.load(at + 2))
    }

    /// The first record in the history whose last position is after
    /// `after`, and the records written (so `n..records` are to read).
    pub fn find(&self, after: u64) -> (u64, u64) {
        let records = self.load(RECORDS);
        let (mut low, mut high) = (self.load(OLDEST), records);
        while low < high {
            let mid = low + (high - low) / 2;
            if self.slot(mid).1 <= after {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        (low, records)
    }

    /// Copies record `n` out, with its frames (the compressed ones if
    /// `deflated` and it has some) if `wanted` wants its recipients;
    /// checks it was not written over meanwhile.
    pub fn read(
        &self,
        n: u64,
        deflated: bool,
        wanted: impl Fn(AudienceKind, &[u8]) -> bool,
    ) -> Result<Record, Overrun> {
        let (first, last, start) = self.slot(n);
        let at = self.data_at + (start % self.data) as usize;
        let mut head = [0u8; RECORD_HEAD];
        self.mem.view().read(at, &mut head);
        let word =
            |i: usize| u32::from_le_bytes(head[i * 4..i * 4 + 4].try_into().unwrap()) as usize;
        let (len, plain, compressed) = (word(0), word(1), word(2));
        let (names_len, kind, refused) = (
            usize::from(head[12]) | usize::from(head[13]) << 8,
            AudienceKind::of(head[14]),
            head[15] & REFUSED_FLAG != 0,
        );
        let status = head[15] & STATUS_FLAG != 0;
        let fits = RECORD_HEAD + names_len + plain + compressed <= len
            && (start % self.data) + len as u64 <= self.data;
        let mut record = None;
        if fits {
            let mut names = vec![0u8; names_len];
            self.mem.view().read(at + RECORD_HEAD, &mut names);
            let content = match wanted(kind, &names) {
                false => Content::Unwanted,
                true if refused => Content::Refused,
                true => {
                    let (skip, take) = match deflated && compressed > 0 {
                        true => (plain, compressed),
                        false => (0, plain),
                    };
                    let mut frames = vec![0u8; take];
                    let from = at + RECORD_HEAD + names_len + skip;
                    self.mem.view().read(from, &mut frames);
                    match status {
                        true => Content::Status(frames),
                        false => Content::Frames(frames),
                    }
                }
            };
            record = Some(Record {
                first,
                last,
                content,
            });
        }
        fence(Ordering::Acquire);
        let intact = self.load(RESERVE) <= start + self.data && self.load(RECORDS) < n + self.slots;
        match record {
            Some(record) if intact => Ok(record),
            _ => Err(Overrun),
        }
    }

    /// Appends the record of the message positioned `seq`, for `kind`
    /// `names`: its frame and compressed frame, and whether it is a
    /// `status` about the stream rather than a message (a record holds one
    /// message, so its position is the record's own), dropping the
    /// oldest records as the bounds ask. A record over the byte bound by
    /// itself is refused: a mark with its recipients (or, if even they are
    /// over it, for everyone) takes its place, and the rest stays. With
    /// more messages than the count bound (0: no history), it and all
    /// before it are forgotten.
    pub fn append(
        &mut self,
        seq: u64,
        (kind, names): (AudienceKind, &[u8]),
        frames: &[u8],
        compressed: &[u8],
        status: bool,
        now: Instant,
    ) -> Appended {
        let writer = self
            .writer
            .as_ref()
            .expect("bug: appending to a history read-only here");
        let bounds = writer.bounds;
        // Commands and handles refuse longer lists; were one to come, its
        // record would be refused for everyone (a gap told), never cut.
        debug_assert!(
            names.len() <= u16::MAX as usize,
            "bug: a channel list too long"
        );
        let names_fit = names.len() <= u16::MAX as usize;
        let record_len = |names: &[u8], frames: &[u8], compressed: &[u8]| {
            (RECORD_HEAD + names.len() + frames.len() + compressed.len()).next_multiple_of(8)
        };
        let (kind, names, frames, compressed, appended) = if !names_fit {
            (
                AudienceKind::All,
                &[][..],
                &[][..],
                &[][..],
                Appended::Refused,
            )
        } else if record_len(names, frames, compressed) <= bounds.bytes {
            (kind, names, frames, compressed, Appended::Kept)
        } else if record_len(names, &[], &[]) <= bounds.bytes {
            (kind, names, &[][..], &[][..], Appended::Refused)
        } else {
            (
                AudienceKind::All,
                &[][..],
                &[][..],
                &[][..],
                Appended::Refused,
            )
        };
        let len = record_len(names, frames, compressed);
        if bounds.messages == 0 || len > bounds.bytes {
            self.forget_through(seq);
            return Appended::Forgotten;
        }
        if appended == Appended::Refused {
            self.store(REFUSED, self.load(REFUSED) + 1);
        }
        let flags = match appended {
            Appended::Refused => REFUSED_FLAG,
            _ if status => STATUS_FLAG,
            _ => 0,
        };
        self.put(
            (seq, seq, 1),
            (kind, names),
            (frames, compressed),
            flags,
            now,
        );
        appended
    }

    /// Appends a mark that messages `first..=last`, for everyone, are
    /// missing (the source lost them): a replay across it is told the gap.
    /// Not counted as refused. (Only the `internals` writers mark.)
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn mark_missing(&mut self, first: u64, last: u64, now: Instant) {
        if self.writer.as_ref().is_some_and(|w| w.bounds.messages == 0) {
            self.forget_through(last);
            return;
        }
        self.put(
            (first, last, 1),
            (AudienceKind::All, &[]),
            (&[], &[]),
            REFUSED_FLAG,
            now,
        );
    }

    /// Drops every record up to position `seq` from the history, and
    /// notes that every message up to it is gone: a resume from before it
    /// is told the gap.
    pub fn forget_through(&mut self, seq: u64) {
        while self
            .writer_kept_front()
            .is_some_and(|kept| kept.last <= seq)
        {
            self.drop_oldest();
        }
        self.store(FORGOTTEN, self.load(FORGOTTEN).max(seq));
        self.store(LAST, self.load(LAST).max(seq));
    }

    /// Writes a record that fits the byte bound, with `flags` in its head
    /// (`REFUSED_FLAG`: messages missing, with no frames; `STATUS_FLAG`).
    fn put(
        &mut self,
        (first, last, count): (u64, u64, usize),
        (kind, names): (AudienceKind, &[u8]),
        (frames, compressed): (&[u8], &[u8]),
        flags: u8,
        now: Instant,
    ) {
        let len = (RECORD_HEAD + names.len() + frames.len() + compressed.len()).next_multiple_of(8);
        self.evict(now, count, len);
        let records = self.load(RECORDS);
        let reserve = self.load(RESERVE);
        let mut start = reserve;
        if start % self.data + len as u64 > self.data {
            start = start.next_multiple_of(self.data);
        }
        let end = start + len as u64;
        // What it writes over, and the slot it takes, leave the history first.
        while self
            .writer_kept_front()
            .is_some_and(|k| k.end + self.data - (k.len as u64) < end)
            || records - self.load(OLDEST) + 1 > self.slots
        {
            self.drop_oldest();
        }
        self.store(RESERVE, end);
        fence(Ordering::Release);
        let mut head = [0u8; RECORD_HEAD];
        head[0..4].copy_from_slice(&(len as u32).to_le_bytes());
        head[4..8].copy_from_slice(&(frames.len() as u32).to_le_bytes());
        head[8..12].copy_from_slice(&(compressed.len() as u32).to_le_bytes());
        head[12..14].copy_from_slice(&(names.len() as u16).to_le_bytes());
        head[14] = kind as u8;
        head[15] = flags;
        let at = self.data_at + (start % self.data) as usize;
        let mem = self.mem.writable();
        mem.write(at, &head);
        mem.write(at + RECORD_HEAD, names);
        mem.write(at + RECORD_HEAD + names.len(), frames);
        mem.write(at + RECORD_HEAD + names.len() + frames.len(), compressed);
        let slot = HEADER_LEN / 8 + (records % self.slots) as usize * SLOT_LEN / 8;
        self.store(slot, first);
        self.store(slot + 1, last);
        self.store(slot + 2, start);
        self.store(RECORDS, records + 1);
        self.store(LAST, last);
        let writer = self.writer.as_mut().expect("the writer");
        writer.kept.push_back(Kept {
            last,
            end,
            len,
            messages: count,
            at: now,
        });
        let (messages, bytes) = self.held();
        self.store(MESSAGES, messages + count as u64);
        self.store(BYTES, bytes + len as u64);
    }

    fn writer_kept_front(&self) -> Option<&Kept> {
        self.writer.as_ref()?.kept.front()
    }

    /// Drops the oldest records while, with `messages` and `bytes` more,
    /// the history would be over a bound, or they are too old.
    pub fn evict(&mut self, now: Instant, messages: usize, bytes: usize) {
        let Some(writer) = &self.writer else {
            return;
        };
        let bounds = writer.bounds;
        while let Some(oldest) = self.writer_kept_front() {
            let (held_messages, held_bytes) = self.held();
            let over = held_messages as usize + messages.min(bounds.messages + 1) > bounds.messages
                || held_bytes as usize + bytes > bounds.bytes
                || now.saturating_duration_since(oldest.at) > bounds.age;
            if !over {
                break;
            }
            self.drop_oldest();
        }
    }

    /// Moves the oldest record out of the history.
    fn drop_oldest(&mut self) {
        let Some(kept) = self.writer.as_mut().and_then(|w| w.kept.pop_front()) else {
            return;
        };
        // `forgotten` first: a reader that sees `oldest` moved on sees it.
        self.store(FORGOTTEN, kept.last);
        self.store(OLDEST, self.load(OLDEST) + 1);
        let (messages, bytes) = self.held();
        self.store(MESSAGES, messages - kept.messages as u64);
        self.store(BYTES, bytes - kept.len as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(messages: usize, bytes: usize) -> Bounds {
        Bounds {
            messages,
            bytes,
            age: Duration::from_secs(60),
        }
    }

    fn everything(_: AudienceKind, _: &[u8]) -> bool {
        true
    }

    #[test]
    fn records_written_are_read_back_through_another_mapping() {
        let now = Instant::now();
        let mut ring = Ring::create(bounds(10, 4096), Epoch(7), 0).unwrap();
        ring.append(
            2,
            (AudienceKind::Channels, b"a,b"),
            b"frames",
            b"zipped",
            false,
            now,
        );
        ring.append(3, (AudienceKind::All, b""), b"more", b"", false, now);
        let fd = ring
            .memory()
            .inheritable()
            .unwrap()
            .try_clone_to_owned()
            .unwrap();
        let reader = Ring::open(fd).unwrap();
        assert!(!reader.is_writer());
        assert_eq!(
            (reader.epoch(), reader.last(), reader.forgotten()),
            (Epoch(7), 3, 0)
        );
        assert_eq!(reader.find(0), (0, 2));
        assert_eq!(reader.find(2), (1, 2));
        assert_eq!(reader.find(3), (2, 2));
        let first = reader.read(0, true, everything).unwrap();
        assert_eq!(
            first,
            Record {
                first: 2,
                last: 2,
                content: Content::Frames(b"zipped".to_vec()),
            }
        );
        let channels = |kind, names: &[u8]| kind == AudienceKind::Channels && names == b"a,b";
        assert_eq!(
            reader.read(0, false, channels).unwrap().content,
            Content::Frames(b"frames".to_vec())
        );
        let second = reader.read(1, true, everything).unwrap();
        assert_eq!(
            second.content,
            Content::Frames(b"more".to_vec()),
            "no compressed frames: the plain ones"
        );
        let unwanted = reader
            .read(1, false, |kind, _| kind == AudienceKind::Id)
            .unwrap();
        assert_eq!((unwanted.last, unwanted.content), (3, Content::Unwanted));
    }

    #[test]
    fn the_oldest_records_leave_as_the_bounds_ask_and_a_copy_written_over_is_refused() {
        let now = Instant::now();
        let mut ring = Ring::create(bounds(3, 1024), Epoch(1), 0).unwrap();
        for seq in 1..=5 {
            ring.append(
                seq,
                (AudienceKind::All, b""),
                &[seq as u8; 100],
                b"",
                false,
                now,
            );
        }
        assert_eq!(ring.held().0, 3);
        assert_eq!(ring.forgotten(), 2);
        assert_eq!(ring.find(0).0, 2, "the oldest held");
        // The ring has twice the bound's room: record 0 is out of the
        // history but still intact until written over.
        assert!(ring.read(0, false, everything).is_ok());
        for seq in 6..=40 {
            ring.append(
                seq,
                (AudienceKind::All, b""),
                &[seq as u8; 100],
                b"",
                false,
                now,
            );
        }
        assert_eq!(ring.read(0, false, everything), Err(Overrun));
        let (n, records) = ring.find(37);
        assert_eq!((n, records), (37, 40));
        assert_eq!(
            ring.read(n, false, everything).unwrap().content,
            Content::Frames(vec![38u8; 100])
        );
        ring.evict(now + Duration::from_secs(61), 0, 0);
        assert_eq!((ring.held(), ring.forgotten()), ((0, 0), 40));
        assert_eq!(ring.find(0).0, 40, "none held");
    }

    #[test]
    fn a_message_over_the_byte_bound_leaves_a_mark_and_the_rest_stays() {
        let now = Instant::now();
        let mut ring = Ring::create(bounds(10, 1024), Epoch(1), 0).unwrap();
        let append = |ring: &mut Ring, seq, names: &[u8], len| {
            let kind = if names.is_empty() {
                AudienceKind::All
            } else {
                AudienceKind::Channels
            };
            ring.append(seq, (kind, names), &vec![seq as u8; len], b"", false, now)
        };
        assert_eq!(append(&mut ring, 1, b"", 100), Appended::Kept);
        assert_eq!(append(&mut ring, 2, b"news", 2000), Appended::Refused);
        assert_eq!(append(&mut ring, 3, b"", 100), Appended::Kept);
        assert_eq!((ring.held().0, ring.forgotten(), ring.refused()), (3, 0, 1));
        let news = |kind, names: &[u8]| kind == AudienceKind::All || names == b"news";
        let contents: Vec<Content> = (0..3)
            .map(|n| ring.read(n, false, news).unwrap().content)
            .collect();
        assert_eq!(
            contents,
            [
                Content::Frames(vec![1; 100]),
                Content::Refused,
                Content::Frames(vec![3; 100])
            ]
        );
        let others = |kind, _: &[u8]| kind == AudienceKind::All;
        assert_eq!(
            ring.read(1, false, others).unwrap().content,
            Content::Unwanted,
            "a mark is for its recipients only"
        );
        // Recipients over the bound too: a mark for everyone.
        assert_eq!(append(&mut ring, 4, &[b'c'; 1500], 10), Appended::Refused);
        assert_eq!(
            ring.read(3, false, others).unwrap().content,
            Content::Refused
        );
        // No history at all: forgotten, with everything before it.
        let mut off = Ring::create(bounds(0, 1024), Epoch(1), 0).unwrap();
        assert_eq!(append(&mut off, 1, b"", 10), Appended::Forgotten);
        assert_eq!((off.held().0, off.forgotten(), off.last()), (0, 1, 1));
    }
}

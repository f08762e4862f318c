//! The history's storage: records in a ring in shared memory, which one
//! process writes (a lone server's loop, or the supervisor of several) and
//! any process on the host maps and reads (every instance), so a host
//! holds its history once, and an instance that dies loses none of it.
//!
//! The memory holds a header of 64-bit words, an index of slots (a
//! record's first and last positions and where it is) and the data, laid
//! out as the header says (see `layout`): each
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
use crate::server::history::layout::{
    AudienceKind, Head, Layout, BYTES, DATA, EPOCH, FORGOTTEN, HEADER_LEN_AT, HEADER_WORDS, LAST,
    MAGIC_AT, MAX_RECORD_HEAD, MESSAGES, OLDEST, RECORDS, RECORD_FIELDS, RECORD_HEAD_AT, REFUSED,
    REFUSED_FLAG, RESERVE, SLOTS, SLOT_LEN_AT, STATUS_FLAG,
};

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
    layout: Layout,
    data: u64,
    slots: u64,
    data_at: usize,
    writer: Option<Writer>,
}

/// A record copied out whole, to be written into another ring.
#[derive(Debug)]
struct Whole {
    first: u64,
    last: u64,
    kind: AudienceKind,
    names: Vec<u8>,
    frames: Vec<u8>,
    compressed: Vec<u8>,
    flags: u8,
}

/// The copy raced the writer: the record was written over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overrun;

impl Ring {
    /// A new ring for `bounds`, written by this process, of `epoch`
    /// positions; the last position before its first is `before`.
    pub fn create(bounds: Bounds, epoch: Epoch, before: u64) -> io::Result<Ring> {
        Ring::create_in(Layout::OWN, bounds, epoch, before)
    }

    /// A new ring of `layout` (see [`Ring::create`]).
    fn create_in(layout: Layout, bounds: Bounds, epoch: Epoch, before: u64) -> io::Result<Ring> {
        let slots = (2 * bounds.messages.max(1) + 1) as u64;
        let data = (2 * bounds.bytes.max(1)).next_multiple_of(8) as u64;
        let data_at = layout.data_at(slots);
        let mem = SharedMemory::create("wspush-history", data_at + data as usize)?;
        for (word, value) in [
            (EPOCH, epoch.0),
            (DATA, data),
            (SLOTS, slots),
            (FORGOTTEN, before),
            (LAST, before),
            (HEADER_LEN_AT, layout.header as u64),
            (SLOT_LEN_AT, layout.slot as u64),
            (RECORD_HEAD_AT, layout.head as u64),
            (MAGIC_AT, layout.magic()),
        ] {
            mem.word(word * 8).store(value, Ordering::Release);
        }
        Ok(Ring {
            mem: Mapped::Writer(mem),
            layout,
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
    ///
    /// A ring of another layout than this build's is carried into a new
    /// one of this build's layout, of the same epoch, with its positions,
    /// records and ages; that one comes first, and the earlier one beside
    /// it, for processes that map it: the caller writes both alike while
    /// such processes run, then drops the earlier one.
    pub fn resume(
        fd: OwnedFd,
        bounds: Bounds,
        ages: &[Duration],
        now: Instant,
    ) -> io::Result<(Ring, Option<Ring>)> {
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
                let (head, _) = ring.head(start);
                Kept {
                    last,
                    end: start + head.len as u64,
                    len: head.len,
                    messages: 1,
                    at: now.checked_sub(*age).unwrap_or(now),
                }
            })
            .collect();
        let cut = Bounds {
            messages: bounds.messages.min((ring.slots as usize - 1) / 2),
            bytes: bounds.bytes.min(ring.data as usize / 2),
            age: bounds.age,
        };
        ring.writer = Some(Writer { bounds: cut, kept });
        if ring.layout == Layout::OWN {
            return Ok((ring, None));
        }
        let own = ring.carried(bounds)?;
        log::info!(
            "the history ({} messages) was carried into this build's layout ({:?}, from \
             {:?}), in the same epoch",
            own.held().0,
            own.layout(),
            ring.layout()
        );
        Ok((own, Some(ring)))
    }

    /// A ring of this build's layout within `bounds`, of this one's epoch,
    /// positions and records (with their ages), which this process
    /// writes.
    fn carried(&self, bounds: Bounds) -> io::Result<Ring> {
        let writer = self
            .writer
            .as_ref()
            .expect("bug: carrying a ring read-only here");
        let mut own = Ring::create(bounds, self.epoch(), self.forgotten())?;
        for (n, kept) in (self.load(OLDEST)..).zip(&writer.kept) {
            // This process writes it: no record changes as it is copied.
            let whole = self.whole(n).map_err(|Overrun| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a history record that does not fit",
                )
            })?;
            own.put(
                (whole.first, whole.last, kept.messages),
                (whole.kind, &whole.names),
                (&whole.frames, &whole.compressed),
                whole.flags,
                kept.at,
            );
        }
        own.store(FORGOTTEN, own.forgotten().max(self.forgotten()));
        own.store(LAST, self.last());
        own.store(REFUSED, self.refused());
        Ok(own)
    }

    /// Its layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The ring mapped as `mem`, checked; no writer's bookkeeping yet.
    fn on(mem: Mapped) -> io::Result<Ring> {
        let view = mem.view();
        let invalid = |what| io::Error::new(io::ErrorKind::InvalidData, what);
        if view.size() < HEADER_WORDS * 8 {
            return Err(invalid("not a wspush history"));
        }
        let magic = view.load(MAGIC_AT * 8, Ordering::Acquire);
        let layout = Layout::read(magic, |word| view.load(word * 8, Ordering::Relaxed))
            .ok_or_else(|| {
                invalid("not a wspush history, or one of a layout this build does not read")
            })?;
        let data = view.load(DATA * 8, Ordering::Relaxed);
        let slots = view.load(SLOTS * 8, Ordering::Relaxed);
        let end = (slots.checked_mul(layout.slot as u64))
            .and_then(|index| index.checked_add(layout.header as u64))
            .and_then(|index| index.checked_next_multiple_of(4096))
            .and_then(|data_at| data_at.checked_add(data));
        if slots == 0 || data == 0 || end != Some(view.size() as u64) {
            return Err(invalid("a history of the wrong size"));
        }
        Ok(Ring {
            mem,
            layout,
            data,
            slots,
            data_at: layout.data_at(slots),
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
        let at = self.slot_word(n);
        (self.load(at), self.load(at + 1), self.load(at + 2))
    }

    /// The word slot `n`'s first word is at.
    fn slot_word(&self, n: u64) -> usize {
        (self.layout.header + (n % self.slots) as usize * self.layout.slot) / 8
    }

    /// The head of the record at `start` (a slot's), and where it is.
    fn head(&self, start: u64) -> (Head, usize) {
        let at = self.data_at + (start % self.data) as usize;
        let mut head = [0u8; RECORD_FIELDS];
        self.mem.view().read(at, &mut head);
        (Head::decode(&head), at)
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
        let (head, at) = self.head(start);
        let Head {
            plain,
            compressed,
            kind,
            ..
        } = head;
        let (refused, status) = (
            head.flags & REFUSED_FLAG != 0,
            head.flags & STATUS_FLAG != 0,
        );
        let mut record = None;
        if self.fits(start, head) {
            let names_at = at + self.layout.head;
            let mut names = vec![0u8; head.names];
            self.mem.view().read(names_at, &mut names);
            let content = match wanted(kind, &names) {
                false => Content::Unwanted,
                true if refused => Content::Refused,
                true => {
                    let (skip, take) = match deflated && compressed > 0 {
                        true => (plain, compressed),
                        false => (0, plain),
                    };
                    let mut frames = vec![0u8; take];
                    let from = names_at + head.names + skip;
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
        match record {
            Some(record) if self.intact(n, start) => Ok(record),
            _ => Err(Overrun),
        }
    }

    /// Whether a record at `start` with `head` lies whole in the data (a
    /// head written over meanwhile may not).
    fn fits(&self, start: u64, head: Head) -> bool {
        self.layout.head + head.names + head.plain + head.compressed <= head.len
            && (start % self.data) + head.len as u64 <= self.data
    }

    /// Whether record `n`, at `start`, was not written over while it was
    /// copied out.
    fn intact(&self, n: u64, start: u64) -> bool {
        fence(Ordering::Acquire);
        self.load(RESERVE) <= start + self.data && self.load(RECORDS) < n + self.slots
    }

    /// Copies record `n` out whole.
    fn whole(&self, n: u64) -> Result<Whole, Overrun> {
        let (first, last, start) = self.slot(n);
        let (head, at) = self.head(start);
        if !self.fits(start, head) {
            return Err(Overrun);
        }
        let mut parts = vec![0u8; head.names + head.plain + head.compressed];
        self.mem.view().read(at + self.layout.head, &mut parts);
        let compressed = parts.split_off(head.names + head.plain);
        let frames = parts.split_off(head.names);
        let whole = Whole {
            first,
            last,
            kind: head.kind,
            names: parts,
            frames,
            compressed,
            flags: head.flags,
        };
        match self.intact(n, start) {
            true => Ok(whole),
            false => Err(Overrun),
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
        let layout = self.layout;
        let record_len = |names: &[u8], frames: &[u8], compressed: &[u8]| {
            layout.record_len(names.len() + frames.len() + compressed.len())
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
        let len = (self.layout).record_len(names.len() + frames.len() + compressed.len());
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
        let mut head = [0u8; MAX_RECORD_HEAD];
        head[..RECORD_FIELDS].copy_from_slice(
            &Head {
                len,
                plain: frames.len(),
                compressed: compressed.len(),
                names: names.len(),
                kind,
                flags,
            }
            .encode(),
        );
        let at = self.data_at + (start % self.data) as usize;
        let parts_at = at + self.layout.head;
        let mem = self.mem.writable();
        mem.write(at, &head[..self.layout.head]);
        mem.write(parts_at, names);
        mem.write(parts_at + names.len(), frames);
        mem.write(parts_at + names.len() + frames.len(), compressed);
        let slot = self.slot_word(records);
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

    /// A layout other than this build's own.
    fn other_layout() -> Layout {
        match Layout::OWN == Layout::FIRST {
            true => Layout {
                header: 3 * 4096,
                slot: 40,
                head: 32,
            },
            false => Layout::FIRST,
        }
    }

    fn reader_of(ring: &Ring) -> Ring {
        let fd = ring.memory().inheritable().unwrap();
        Ring::open(fd.try_clone_to_owned().unwrap()).unwrap()
    }

    fn contents(ring: &Ring) -> Vec<(u64, u64, Content)> {
        let (oldest, records) = ring.find(0);
        (oldest..records)
            .map(|n| {
                let record = ring.read(n, true, everything).unwrap();
                (record.first, record.last, record.content)
            })
            .collect()
    }

    #[test]
    fn a_ring_of_another_layout_is_carried_into_this_builds_with_its_positions_and_ages() {
        let start = Instant::now();
        let mut earlier = Ring::create_in(other_layout(), bounds(4, 4096), Epoch(9), 0).unwrap();
        assert_eq!(
            reader_of(&earlier).layout(),
            other_layout(),
            "read by its header"
        );
        for seq in 1..=6 {
            let names: &[u8] = if seq % 2 == 0 { b"news" } else { b"" };
            let kind = match names.is_empty() {
                true => AudienceKind::All,
                false => AudienceKind::Channels,
            };
            let at = start + Duration::from_secs(seq);
            let frames = format!("message {seq}");
            earlier.append(seq, (kind, names), frames.as_bytes(), b"zip", seq == 5, at);
        }
        earlier.append(7, (AudienceKind::All, b""), &[7; 5000], b"", false, start);
        earlier.mark_missing(8, 9, start + Duration::from_secs(8));
        let before = contents(&earlier);
        assert_eq!(before.len(), 4, "{before:?}");
        assert_eq!((earlier.forgotten(), earlier.refused()), (4, 1));
        let now = start + Duration::from_secs(20);
        let ages = earlier.ages(now).unwrap();
        let fd = earlier.memory().inheritable().unwrap();
        let fd = fd.try_clone_to_owned().unwrap();
        let old_reader = reader_of(&earlier);
        drop(earlier);

        let (mut own, former) = Ring::resume(fd, bounds(4, 4096), &ages, now).unwrap();
        let mut former = former.expect("another layout: carried");
        assert_eq!(
            (own.layout(), former.layout()),
            (Layout::OWN, other_layout())
        );
        assert_eq!(own.epoch(), Epoch(9), "the same epoch");
        assert_eq!(
            (own.last(), own.forgotten(), own.refused(), own.held().0),
            (
                former.last(),
                former.forgotten(),
                former.refused(),
                former.held().0
            ),
            "(the bytes differ with the heads)"
        );
        assert_eq!(contents(&own), before, "the same records");
        assert_eq!(own.ages(now).unwrap(), ages, "of the same ages");
        // Written alike from here; a reader of either sees the same.
        for ring in [&mut own, &mut former] {
            ring.append(11, (AudienceKind::All, b""), b"after", b"", false, now);
        }
        assert_eq!(contents(&reader_of(&own)), contents(&old_reader));
        assert_eq!(contents(&old_reader).last().unwrap().0, 11);
        // The ages go on: the oldest leave the new ring on time.
        own.evict(start + Duration::from_secs(65), 0, 0);
        assert_eq!(own.forgotten(), 5, "message 5 left at 60 s of age");

        // A ring of this build's own layout goes on as it is.
        let mine = Ring::create(bounds(4, 4096), Epoch(3), 0).unwrap();
        let fd = mine.memory().inheritable().unwrap();
        let (same, none) =
            Ring::resume(fd.try_clone_to_owned().unwrap(), bounds(4, 4096), &[], now).unwrap();
        assert!(none.is_none());
        assert_eq!(same.memory().size(), mine.memory().size());
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

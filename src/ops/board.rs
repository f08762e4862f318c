//! The host's metrics board: a memory file a supervisor makes, with a
//! slot for each of its processes, where the process keeps its counters
//! (its `Counters`, in place: they change there as it counts) beside
//! the description of how they are exported; and a slot for each
//! instance, where the supervisor keeps what its processes that are gone
//! had counted, so that no sum goes backwards across restarts and
//! handovers. Any process of the host reads it whole to render the
//! host's `/metrics`: the sums, and each instance's.
//!
//! The memory holds a header page (magic, slots, and a generation the
//! supervisor makes odd while it moves a gone process's counts, so that a
//! reader never counts them twice or not at all), then the slots, each a
//! page of words (state, instance, pid, the description's fingerprint and
//! length), its counters, then its description (see `exposition`).
//!
//! The supervisor may keep counters of its own there too (its writer of
//! the host's upstream lines into Redis), in a slot of instance 0: in
//! the host's sums, with no `instance` rows.
//!
//! Only a supervisor makes a board: a library user without `internals`
//! keeps its counters in its own memory.
#![cfg_attr(not(feature = "internals"), allow(dead_code))]

use std::collections::HashMap;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};

use crate::ops::exposition::{self, Row, RowKind, Sample};
use crate::ops::metrics::{Counters, COUNTERS_WORDS};
use crate::ops::sys::{Placed, SharedMemory};

const MAGIC: u64 = u64::from_le_bytes(*b"wspushB1");
/// The header's words, by index.
const MAGIC_AT: usize = 0;
const SLOTS: usize = 1;
const GENERATION: usize = 2;
const HEADER_LEN: usize = 4096;
/// A slot's words, by index.
const STATE: usize = 0;
const INSTANCE: usize = 1;
const PID: usize = 2;
const FINGERPRINT: usize = 3;
const DESCRIPTION_LEN: usize = 4;
/// Where a slot's counters and description start, and its length.
const COUNTERS_AT: usize = 4096;
const DESCRIPTION_AT: usize = 16 * 1024;
const SLOT_LEN: usize = 64 * 1024;
/// A slot's states.
const FREE: u64 = 0;
/// Given to a process starting, which has not written it yet.
const CLAIMED: u64 = 1;
/// A process's, written.
const LIVE: u64 = 2;
/// An instance's, of what its processes that are gone counted.
const RETIRED: u64 = 3;

// A slot holds this build's counters and description.
const _: () = assert!(COUNTERS_AT + COUNTERS_WORDS * 8 <= DESCRIPTION_AT);

/// A process's place on its host's metrics board, as
/// [`Config::metrics_board`](crate::config::Config::metrics_board) names it.
#[derive(Debug, Clone)]
pub struct MetricsBoard {
    /// The board's descriptor (a supervisor's, inherited).
    pub fd: std::sync::Arc<OwnedFd>,
    /// The slot its supervisor claimed for this process.
    pub slot: usize,
    /// `/metrics` on the main listener gives each instance's rows too,
    /// labelled `instance`, beside the host's sums.
    pub per_instance: bool,
}

/// Where a server's counters are: in its own memory, or in its slot of
/// the host's metrics board.
#[derive(Debug)]
pub enum CountersHome {
    /// Its own.
    Own(Box<Counters>),
    /// On the board.
    Board(Placed<Counters>),
}

impl CountersHome {
    /// The counters `board` says where to keep (its own, with none).
    pub fn new(board: Option<&MetricsBoard>) -> io::Result<CountersHome> {
        match board {
            None => Ok(CountersHome::Own(Box::default())),
            Some(board) => Ok(CountersHome::Board(Board::place(
                board.fd.try_clone()?,
                board.slot,
                std::process::id(),
            )?)),
        }
    }
}

impl std::ops::Deref for CountersHome {
    type Target = Counters;

    fn deref(&self) -> &Counters {
        match self {
            CountersHome::Own(counters) => counters,
            CountersHome::Board(placed) => placed,
        }
    }
}

/// The host's metrics board, mapped.
#[derive(Debug)]
pub struct Board {
    mem: SharedMemory,
    slots: usize,
}

/// The rows of a slot, as its description says.
enum Described {
    /// This build's own.
    Own,
    /// Another build's.
    Other(Vec<Row>),
    /// None readable: left out.
    Unread,
}

impl Board {
    /// A new board of `slots` slots (for a supervisor to make, with three
    /// a instance: its process, a successor's during a handover, and its
    /// counts of processes gone).
    pub fn create(slots: usize) -> io::Result<Board> {
        let mem = SharedMemory::create("wspush-metrics", HEADER_LEN + slots * SLOT_LEN)?;
        mem.word(SLOTS * 8).store(slots as u64, Ordering::Relaxed);
        mem.word(MAGIC_AT * 8).store(MAGIC, Ordering::Release);
        Ok(Board { mem, slots })
    }

    /// The board another process made, from its descriptor, checked.
    pub fn open(fd: OwnedFd) -> io::Result<Board> {
        let mem = SharedMemory::open(fd)?;
        let invalid = |what| io::Error::new(io::ErrorKind::InvalidData, what);
        if mem.size() < HEADER_LEN || mem.load(MAGIC_AT * 8, Ordering::Acquire) != MAGIC {
            return Err(invalid("not a wspush metrics board"));
        }
        let slots = mem.load(SLOTS * 8, Ordering::Relaxed) as usize;
        if slots
            .checked_mul(SLOT_LEN)
            .and_then(|len| len.checked_add(HEADER_LEN))
            != Some(mem.size())
        {
            return Err(invalid("a metrics board of the wrong size"));
        }
        Ok(Board { mem, slots })
    }

    /// Lets processes this one starts inherit its descriptor, and returns
    /// it.
    pub fn inheritable(&self) -> io::Result<BorrowedFd<'_>> {
        self.mem.inheritable()
    }

    /// Its descriptor, as it is.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.mem.fd()
    }

    fn word(&self, slot: usize, word: usize) -> &std::sync::atomic::AtomicU64 {
        self.mem.word(HEADER_LEN + slot * SLOT_LEN + word * 8)
    }

    fn load(&self, slot: usize, word: usize) -> u64 {
        self.word(slot, word).load(Ordering::Acquire)
    }

    /// A free slot for a process of `instance` about to start, if one is
    /// left (none: its counts are not on the board).
    pub fn claim(&self, instance: usize) -> Option<usize> {
        let slot = (0..self.slots).find(|&slot| self.load(slot, STATE) == FREE)?;
        self.word(slot, INSTANCE)
            .store(instance as u64, Ordering::Relaxed);
        self.word(slot, STATE).store(CLAIMED, Ordering::Release);
        Some(slot)
    }

    /// Puts this process's counters in `slot` (claimed for it by its
    /// supervisor), with their description: they count there from now
    /// on. `fd` is the board's (mapped again for them).
    pub fn place(fd: OwnedFd, slot: usize, pid: u32) -> io::Result<Placed<Counters>> {
        let board = Board::open(fd)?;
        if slot >= board.slots || board.load(slot, STATE) != CLAIMED {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a metrics board slot not claimed for this process",
            ));
        }
        board.describe(slot, pid);
        board.word(slot, STATE).store(LIVE, Ordering::Release);
        Placed::new(board.mem, HEADER_LEN + slot * SLOT_LEN + COUNTERS_AT)
    }

    /// The counters of the supervisor itself, process `pid` (what it
    /// counts of its own: its writer of the host's upstream lines into
    /// Redis), in a slot of instance 0: in the host's sums, not among
    /// the instances' rows. A slot an earlier image of it left is retired
    /// first, so that its counts stay in the sums.
    pub fn place_own(&self, pid: u32) -> io::Result<Placed<Counters>> {
        for slot in 0..self.slots {
            if self.load(slot, INSTANCE) == 0 && matches!(self.load(slot, STATE), CLAIMED | LIVE) {
                self.retire(slot);
            }
        }
        let slot = self.claim(0).ok_or_else(|| {
            io::Error::new(io::ErrorKind::OutOfMemory, "the metrics board is full")
        })?;
        Board::place(self.mem.fd().try_clone_to_owned()?, slot, pid)
    }

    /// Writes this build's description into `slot`, of process `pid`.
    fn describe(&self, slot: usize, pid: u32) {
        let text = exposition::description().as_bytes();
        let len = text.len().min(SLOT_LEN - DESCRIPTION_AT);
        self.mem
            .write(HEADER_LEN + slot * SLOT_LEN + DESCRIPTION_AT, &text[..len]);
        self.word(slot, DESCRIPTION_LEN)
            .store(len as u64, Ordering::Relaxed);
        self.word(slot, FINGERPRINT)
            .store(fingerprint(text), Ordering::Relaxed);
        self.word(slot, PID)
            .store(u64::from(pid), Ordering::Relaxed);
    }

    /// The rows `slot` is described by.
    fn described(&self, slot: usize) -> Described {
        if self.load(slot, FINGERPRINT) == fingerprint(exposition::description().as_bytes()) {
            return Described::Own;
        }
        let len = (self.load(slot, DESCRIPTION_LEN) as usize).min(SLOT_LEN - DESCRIPTION_AT);
        let mut text = vec![0u8; len];
        self.mem
            .read(HEADER_LEN + slot * SLOT_LEN + DESCRIPTION_AT, &mut text);
        let rows = String::from_utf8(text)
            .ok()
            .and_then(|text| exposition::parse(&text));
        match rows {
            Some(rows) => Described::Other(rows),
            None => Described::Unread,
        }
    }

    /// The rows `slot` is described by (another build's kept in
    /// `parsed`), if they can be read.
    fn rows_in<'a>(&self, slot: usize, parsed: &'a mut Option<Vec<Row>>) -> Option<&'a [Row]> {
        match self.described(slot) {
            Described::Own => Some(exposition::rows()),
            Described::Other(rows) => Some(parsed.insert(rows)),
            Described::Unread => None,
        }
    }

    /// Moves what the process gone from `slot` counted into its
    /// instance's slot of processes gone, and frees `slot`. Readers see
    /// the counts in one place or the other, never both or neither.
    pub fn retire(&self, slot: usize) {
        if slot >= self.slots || !matches!(self.load(slot, STATE), CLAIMED | LIVE) {
            return;
        }
        let state = self.load(slot, STATE);
        let instance = self.load(slot, INSTANCE);
        let generation = self.mem.word(GENERATION * 8);
        generation.fetch_add(1, Ordering::AcqRel);
        fence(Ordering::SeqCst);
        if state == LIVE {
            self.fold(slot, instance);
        }
        for word in 0..(SLOT_LEN - COUNTERS_AT) / 8 {
            self.word(slot, COUNTERS_AT / 8 + word)
                .store(0, Ordering::Relaxed);
        }
        for word in [INSTANCE, PID, FINGERPRINT, DESCRIPTION_LEN] {
            self.word(slot, word).store(0, Ordering::Relaxed);
        }
        self.word(slot, STATE).store(FREE, Ordering::Release);
        fence(Ordering::SeqCst);
        generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Adds the growing counts of `slot` to `instance`'s slot of
    /// processes gone (made on its first), by row: a row this build does
    /// not have is left out.
    fn fold(&self, slot: usize, instance: u64) {
        let retired = (0..self.slots)
            .find(|&s| self.load(s, STATE) == RETIRED && self.load(s, INSTANCE) == instance);
        let retired = match retired {
            Some(retired) => retired,
            None => {
                let Some(free) = (0..self.slots).find(|&s| self.load(s, STATE) == FREE) else {
                    log::warn!("the metrics board is full: the counts of a process of instance {instance} that is gone are lost");
                    return;
                };
                self.word(free, INSTANCE).store(instance, Ordering::Relaxed);
                self.describe(free, 0);
                self.word(free, STATE).store(RETIRED, Ordering::Release);
                free
            }
        };
        // By the rows each slot is described by: the slot of processes
        // gone may be of an earlier build (the supervisor re-executed).
        let (mut gone_rows, mut kept_rows) = (None, None);
        let (Some(gone), Some(kept)) = (
            self.rows_in(slot, &mut gone_rows),
            self.rows_in(retired, &mut kept_rows),
        ) else {
            return;
        };
        let owned = kept
            .iter()
            .map(|row| {
                (
                    (row.family.as_str(), row.labels.as_str(), row.kind),
                    row.word,
                )
            })
            .collect::<HashMap<_, _>>();
        let counter = |slot: usize, word: usize| self.word(slot, COUNTERS_AT / 8 + word);
        for row in gone.iter().filter(|row| row.kind.grows()) {
            let key = (row.family.as_str(), row.labels.as_str(), row.kind);
            if let Some(&word) = owned.get(&key) {
                let value = counter(slot, row.word).load(Ordering::Relaxed);
                counter(retired, word).fetch_add(value, Ordering::Relaxed);
            }
        }
    }

    /// Renders the host's counters: each row's sum over the instances
    /// (the largest instance's, for what every instance sees alike and
    /// for a maximum), an instance's being the sum over its processes
    /// running and gone (a gauge's, the running ones'); then,
    /// `per_instance`, each instance's with an `instance` label.
    pub fn render(&self, per_instance: bool, out: &mut Vec<u8>) {
        let read = self.read();
        let mut samples: Vec<Sample<'_>> = Vec::new();
        let mut at = 0;
        while at < read.order.len() {
            let family = &read.rows[read.order[at]].family;
            let end = (at..read.order.len())
                .find(|&i| read.rows[read.order[i]].family != *family)
                .unwrap_or(read.order.len());
            for &key in &read.order[at..end] {
                samples.push(Sample {
                    row: &read.rows[key],
                    instance: None,
                    value: read.total[key],
                });
            }
            if per_instance {
                // Instance 0 is the supervisor's own: in the sums only.
                for (&instance, values) in read.instances.range(1..) {
                    for &key in &read.order[at..end] {
                        samples.push(Sample {
                            row: &read.rows[key],
                            instance: Some(instance),
                            value: values[key],
                        });
                    }
                }
            }
            at = end;
        }
        exposition::render(samples, out);
    }

    /// Every slot's counts, summed by row, as of one moment between the
    /// supervisor's moves.
    fn read(&self) -> Read {
        let generation = || self.mem.load(GENERATION * 8, Ordering::Acquire);
        let mut tries = 0;
        loop {
            let before = generation();
            if before % 2 == 1 && tries < 1000 {
                tries += 1;
                std::thread::yield_now();
                continue;
            }
            let read = self.read_once();
            fence(Ordering::Acquire);
            if generation() == before || tries >= 1000 {
                return read;
            }
            tries += 1;
        }
    }

    fn read_once(&self) -> Read {
        let mut read = Read {
            rows: exposition::rows().to_vec(),
            ..Read::default()
        };
        // A histogram's count and sum share their labels: the kind is in
        // the key.
        let mut keys: HashMap<(String, String, RowKind), usize> = (read.rows.iter().enumerate())
            .map(|(key, row)| ((row.family.clone(), row.labels.clone(), row.kind), key))
            .collect();
        read.order = (0..read.rows.len()).collect();
        read.total = vec![0; read.rows.len()];
        for slot in 0..self.slots {
            let state = self.load(slot, STATE);
            if !matches!(state, LIVE | RETIRED) {
                continue;
            }
            let instance = self.load(slot, INSTANCE) as usize;
            let mut parsed = None;
            let Some(rows) = self.rows_in(slot, &mut parsed) else {
                continue;
            };
            let own = std::ptr::eq(rows, exposition::rows());
            for (index, row) in rows.iter().enumerate() {
                // This build's rows are the first keys, in order: no lookup.
                let key = match own {
                    true => index,
                    false => *keys
                        .entry((row.family.clone(), row.labels.clone(), row.kind))
                        .or_insert_with(|| {
                            read.rows.push(Row {
                                word: 0,
                                ..row.clone()
                            });
                            read.total.push(0);
                            read.order.push(read.rows.len() - 1);
                            read.rows.len() - 1
                        }),
                };
                let value = self
                    .word(slot, COUNTERS_AT / 8 + row.word)
                    .load(Ordering::Relaxed);
                let values = read.instances.entry(instance).or_default();
                if values.len() < read.rows.len() {
                    values.resize(read.rows.len(), 0);
                }
                // An instance's: its processes' sum (running, and gone).
                match row.kind {
                    RowKind::Max => values[key] = values[key].max(value),
                    _ => values[key] += value,
                }
            }
        }
        // The host's: the instances' sum, or the largest instance's.
        for values in read.instances.values_mut() {
            values.resize(read.rows.len(), 0);
            for (key, &value) in values.iter().enumerate() {
                match read.rows[key].kind.largest_on_host() {
                    true => read.total[key] = read.total[key].max(value),
                    false => read.total[key] += value,
                }
            }
        }
        // A family another build added is rendered whole, after this build's.
        let first: HashMap<&str, usize> = read
            .order
            .iter()
            .rev()
            .map(|&key| (read.rows[key].family.as_str(), key))
            .collect();
        let mut order = read.order.clone();
        order.sort_by_key(|&key| (first[read.rows[key].family.as_str()], key));
        read.order = order;
        read
    }
}

/// The board read: every row met, its total and each instance's.
#[derive(Debug, Default)]
struct Read {
    rows: Vec<Row>,
    order: Vec<usize>,
    total: Vec<u64>,
    instances: std::collections::BTreeMap<usize, Vec<u64>>,
}

/// FNV-1a of a description, to know one's own without reading it.
fn fingerprint(text: &[u8]) -> u64 {
    text.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::metrics::Metrics;

    fn sample(page: &str, series: &str) -> u64 {
        page.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{page}"))
    }

    fn page(board: &Board, per_instance: bool) -> String {
        let mut out = Vec::new();
        board.render(per_instance, &mut out);
        String::from_utf8(out).unwrap()
    }

    fn placed(board: &Board, instance: usize, pid: u32) -> (usize, Placed<Counters>) {
        let slot = board.claim(instance).unwrap();
        let fd = board.fd().try_clone_to_owned().unwrap();
        (slot, Board::place(fd, slot, pid).unwrap())
    }

    #[test]
    fn the_host_sums_its_instances_and_keeps_what_a_gone_process_counted() {
        let board = Board::create(6).unwrap();
        let (a, one) = placed(&board, 1, 101);
        let (_, two) = placed(&board, 2, 102);
        for (counters, n) in [(&one, 3), (&two, 4)] {
            Metrics::add(&counters.metrics.upgrades, n);
            Metrics::set(&counters.metrics.connections_open, n);
            Metrics::add(&counters.metrics.broadcasts, 5);
        }
        let p = page(&board, true);
        assert_eq!(sample(&p, "wspush_upgrades_total"), 7);
        assert_eq!(sample(&p, "wspush_upgrades_total{instance=\"2\"}"), 4);
        assert_eq!(
            sample(&p, "wspush_broadcasts_total"),
            5,
            "the host's input: the largest instance's"
        );
        // Instance 1's process is gone; its successor counts anew.
        drop(one);
        board.retire(a);
        let (_, three) = placed(&board, 1, 103);
        Metrics::add(&three.metrics.upgrades, 1);
        let p = page(&board, true);
        assert_eq!(
            sample(&p, "wspush_upgrades_total{instance=\"1\"}"),
            4,
            "3 gone, 1 running"
        );
        assert_eq!(sample(&p, "wspush_upgrades_total"), 8);
        assert_eq!(
            sample(&p, "wspush_connections_open"),
            4,
            "a gauge: the running processes'"
        );
        assert_eq!(sample(&p, "wspush_broadcasts_total{instance=\"1\"}"), 5);
        assert!(!page(&board, false).contains("instance=\""));
    }

    #[test]
    fn the_supervisors_own_counts_are_in_the_sums_only_and_outlive_its_images() {
        let board = Board::create(6).unwrap();
        let (_, instance) = placed(&board, 1, 101);
        Metrics::add(&instance.metrics.upstream_dropped, 2);
        let own = board.place_own(100).unwrap();
        Metrics::add(&own.metrics.upstream_stream_entries, 5);
        Metrics::add(&own.metrics.upstream_dropped, 1);
        let p = page(&board, true);
        assert_eq!(sample(&p, "wspush_upstream_stream_entries_total"), 5);
        assert_eq!(sample(&p, "wspush_upstream_dropped_total"), 3);
        assert_eq!(
            sample(&p, "wspush_upstream_dropped_total{instance=\"1\"}"),
            2
        );
        assert!(!p.contains("instance=\"0\""), "no rows of its own");
        // A next image of the supervisor counts on from there.
        drop(own);
        let own = board.place_own(100).unwrap();
        Metrics::add(&own.metrics.upstream_stream_entries, 1);
        let p = page(&board, false);
        assert_eq!(sample(&p, "wspush_upstream_stream_entries_total"), 6);
    }

    #[test]
    fn a_process_of_another_build_is_summed_by_name_and_its_new_rows_rendered() {
        let board = Board::create(4).unwrap();
        let (_, mine) = placed(&board, 1, 1);
        Metrics::add(&mine.metrics.upgrades, 2);
        // Another build: its upgrades at another word, and a row this one
        // does not have.
        let b = board.claim(2).unwrap();
        let other = "0\tc\twspush_upgrades_total\t\tWebSocket handshakes completed.\n\
                     1\tc\twspush_new_total\t\tA row of a later build.\n";
        let at = HEADER_LEN + b * SLOT_LEN;
        board.mem.write(at + DESCRIPTION_AT, other.as_bytes());
        let words = [
            (DESCRIPTION_LEN, other.len() as u64),
            (FINGERPRINT, fingerprint(other.as_bytes())),
            (COUNTERS_AT / 8, 5),
            (COUNTERS_AT / 8 + 1, 9),
            (STATE, LIVE),
        ];
        for (word, value) in words {
            board.word(b, word).store(value, Ordering::Release);
        }
        let p = page(&board, true);
        assert_eq!(sample(&p, "wspush_upgrades_total"), 7);
        assert_eq!(sample(&p, "wspush_new_total"), 9);
        assert_eq!(p.matches("# TYPE wspush_new_total counter").count(), 1);
        // Gone: what this build knows of its rows stays with instance 2.
        board.retire(b);
        let p = page(&board, true);
        assert_eq!(sample(&p, "wspush_upgrades_total{instance=\"2\"}"), 5);
        assert_eq!(sample(&p, "wspush_upgrades_total"), 7);
    }
}

//! What each instance of a supervisor holds, as it says every second on
//! its status pipe (a [`STATS`] record: connections and channels), kept
//! for `GET /stats`: the one view of the whole server under
//! `--processes`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::asks::ANSWER;

/// The first byte of a stats record on a status pipe; two little-endian
/// `u64`s follow, connections then channels.
pub const STATS: u8 = b'S';
/// A stats record's length.
pub const RECORD_LEN: usize = 17;

/// The record an instance writes: one write, shorter than what a pipe
/// writes at once, so records and the one-byte words never interleave.
pub fn record(connections: u64, channels: u64) -> [u8; RECORD_LEN] {
    let mut record = [0u8; RECORD_LEN];
    record[0] = STATS;
    record[1..9].copy_from_slice(&connections.to_le_bytes());
    record[9..].copy_from_slice(&channels.to_le_bytes());
    record
}

/// What one process holds.
#[derive(Debug, Clone, Copy)]
struct Held {
    instance: usize,
    connections: u64,
    channels: u64,
}

/// The last counts of every live process, by its key; shared by the
/// supervisor (which writes it) and the publish listener (which reads it).
#[derive(Debug, Clone, Default)]
pub struct Board(Arc<Mutex<BTreeMap<usize, Held>>>);

impl Board {
    /// Process `key` of `instance` holds these.
    pub fn set(&self, key: usize, instance: usize, (connections, channels): (u64, u64)) {
        let held = Held {
            instance,
            connections,
            channels,
        };
        self.lock().insert(key, held);
    }

    /// Process `key` is gone.
    pub fn remove(&self, key: usize) {
        self.lock().remove(&key);
    }

    /// The members of `/stats`'s object: connections over all processes,
    /// channels counted once per instance that has a subscriber to them,
    /// and each process's counts.
    pub fn json(&self) -> String {
        let board = self.lock();
        let connections: u64 = board.values().map(|h| h.connections).sum();
        let channels: u64 = board.values().map(|h| h.channels).sum();
        let each: Vec<String> = board
            .values()
            .map(|h| {
                format!(
                    "{{\"instance\":{},\"connections\":{},\"channels\":{}}}",
                    h.instance, h.connections, h.channels
                )
            })
            .collect();
        format!(
            "\"connections\":{connections},\"channels\":{channels},\"instances\":[{}]",
            each.join(",")
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Held>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A status pipe's bytes as they come: the one-byte words, the stats
/// records and the answer records ([`crate::asks::record`]), whole,
/// however the reads cut them.
#[derive(Debug, Default)]
pub struct Heard {
    /// A record begun: its bytes so far.
    record: Option<Vec<u8>>,
}

/// What a byte of a status pipe completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Word {
    /// A one-byte word.
    Byte(u8),
    /// A stats record's counts.
    Counts(u64, u64),
    /// An answer record: the question's number and the answer's text.
    Answer(u64, Vec<u8>),
    /// Nothing yet (inside a record).
    Nothing,
}

/// An answer record's head: its first byte, the number and the length.
const ANSWER_HEAD: usize = 13;

impl Heard {
    /// The bytes of a record begun and not whole yet (for the
    /// supervisor's next image to take in first).
    pub fn begun(&self) -> Vec<u8> {
        self.record.clone().unwrap_or_default()
    }

    /// Takes in the next byte.
    pub fn byte(&mut self, byte: u8) -> Word {
        let Some(record) = &mut self.record else {
            if byte == STATS || byte == ANSWER {
                self.record = Some(vec![byte]);
                return Word::Nothing;
            }
            return Word::Byte(byte);
        };
        record.push(byte);
        let word = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().expect("8 bytes"));
        let word = match record[0] {
            STATS if record.len() == RECORD_LEN => Word::Counts(word(1), word(9)),
            ANSWER if record.len() >= ANSWER_HEAD => {
                let len = u32::from_le_bytes(record[9..13].try_into().expect("4 bytes"));
                if record.len() < ANSWER_HEAD + len as usize {
                    return Word::Nothing;
                }
                Word::Answer(word(1), record.split_off(ANSWER_HEAD))
            }
            _ => return Word::Nothing,
        };
        self.record = None;
        word
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_whole_between_words_however_they_are_cut() {
        let mut stream = vec![b'L'];
        stream.extend(record(19_000, 3));
        stream.push(b'F');
        stream.extend(record(1 << 40, 0));
        let answer = wspush::protocol::presence::Answer::Channel {
            connections: 2,
            ids: Vec::new(),
            more: false,
        };
        stream.extend(crate::asks::record(7, &answer));
        stream.push(b'R');
        let mut heard = Heard::default();
        let words: Vec<Word> = stream
            .iter()
            .map(|&b| heard.byte(b))
            .filter(|w| *w != Word::Nothing)
            .collect();
        assert_eq!(
            words,
            [
                Word::Byte(b'L'),
                Word::Counts(19_000, 3),
                Word::Byte(b'F'),
                Word::Counts(1 << 40, 0),
                Word::Answer(7, answer.lines().into_bytes()),
                Word::Byte(b'R'),
            ]
        );
    }

    #[test]
    fn the_board_sums_what_every_live_process_holds() {
        let board = Board::default();
        board.set(0, 1, (10, 2));
        board.set(3, 2, (5, 2));
        board.set(0, 1, (12, 3));
        assert_eq!(
            board.json(),
            r#""connections":17,"channels":5,"instances":[{"instance":1,"connections":12,"channels":3},{"instance":2,"connections":5,"channels":2}]"#
        );
        board.remove(0);
        assert!(board.json().starts_with(r#""connections":5,"#));
    }
}

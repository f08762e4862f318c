//! Presence questions on their way through the input, and their answers'
//! way back.
//!
//! Whoever asks (the publish listener's `/presence` and `/clients`, the
//! Redis presence writer) opens a question here, gets its number, and
//! puts a control line `ask ID QUERY` into the input, among its other
//! lines ([`Control::Ask`](crate::chunks::Control::Ask)): so the answer
//! holds every command taken before it. The loop that reads it answers
//! through its handle. Alone, the pump hands the answer back here; under
//! a supervisor, each instance writes its answer on its status pipe
//! ([`record`]) and the supervisor, once every instance that got the
//! question answered, hands back their merge.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use wspush::protocol::presence::Answer;

/// Where a loop's answer to question `id` goes (on the loop's thread: it
/// must not wait).
pub type AnswerTo = Arc<dyn Fn(u64, Answer) + Send + Sync>;

/// The first byte of an answer record on a status pipe; the question's
/// number (a little-endian `u64`), the answer's length (`u32`) and the
/// answer's lines ([`Answer::lines`]) follow.
pub const ANSWER: u8 = b'A';

/// An answer record for question `id`.
pub fn record(id: u64, answer: &Answer) -> Vec<u8> {
    let lines = answer.lines();
    let mut record = Vec::with_capacity(13 + lines.len());
    record.push(ANSWER);
    record.extend_from_slice(&id.to_le_bytes());
    record.extend_from_slice(&(lines.len() as u32).to_le_bytes());
    record.extend_from_slice(lines.as_bytes());
    record
}

/// A reply waiting for its answer.
type Waiting = Box<dyn FnOnce(u64, Answer) + Send>;

/// The questions open, by number.
pub struct Asks {
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, Waiting>>,
}

impl std::fmt::Debug for Asks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Asks")
            .field("open", &self.lock().len())
            .finish()
    }
}

impl Asks {
    /// None open. Numbers start from the clock, so that an answer an
    /// instance gives late to an earlier image's question is not taken
    /// for one of this image's.
    pub fn new() -> Arc<Asks> {
        let start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Arc::new(Asks {
            next: AtomicU64::new(start),
            waiting: Mutex::new(HashMap::new()),
        })
    }

    /// Opens a question whose answer goes to `reply` (with its number):
    /// its number.
    pub fn open(&self, reply: impl FnOnce(u64, Answer) + Send + 'static) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, Box::new(reply));
        id
    }

    /// Question `id` is answered (a question no longer open is not).
    pub fn answer(&self, id: u64, answer: Answer) {
        let reply = self.lock().remove(&id);
        if let Some(reply) = reply {
            reply(id, answer);
        }
    }

    /// Question `id` is no longer waited for.
    pub fn forget(&self, id: u64) {
        self.lock().remove(&id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiting>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn an_answer_reaches_its_question_once_and_a_forgotten_one_none() {
        let asks = Asks::new();
        let (tx, rx) = mpsc::channel();
        let reply = |tx: mpsc::Sender<(u8, Answer)>, n| move |_, a| tx.send((n, a)).unwrap();
        let one = asks.open(reply(tx.clone(), 1));
        let two = asks.open(reply(tx.clone(), 2));
        assert_ne!(one, two);
        let answer = Answer::Channel {
            connections: 1,
            ids: Vec::new(),
            more: false,
        };
        asks.forget(one);
        asks.answer(one, answer.clone());
        asks.answer(two, answer.clone());
        asks.answer(two, answer.clone());
        drop(tx);
        assert_eq!(rx.iter().collect::<Vec<_>>(), [(2, answer)]);
    }
}

//! Presence questions across the instances: a question comes in the
//! input as a control line (see [`crate::asks`]) and goes to every
//! process that takes input, like any line; each answers on its status
//! pipe, and once all have (or are gone), their answers merged go to
//! who asked.

use std::collections::HashMap;

use wspush::protocol::presence::{Answer, Query};

use super::*;
use crate::asks::Asks;
use crate::sources::ANSWER_TIMEOUT;

/// A question the processes were given, and what they answered so far.
#[derive(Debug)]
struct Collecting {
    query: Query,
    /// The processes (keys) yet to answer.
    waiting: Vec<usize>,
    answers: Vec<Answer>,
    since: Instant,
}

/// The questions open across the processes.
#[derive(Debug, Default)]
pub(super) struct Asking {
    asks: Option<Arc<Asks>>,
    open: HashMap<u64, Collecting>,
}

impl Supervisor {
    /// Presence questions are opened in `asks`: their merged answers go
    /// there.
    pub fn answer_to(&mut self, asks: Arc<Asks>) {
        self.asking.asks = Some(asks);
    }

    /// Question `id` (`query`) was given to processes `keys`.
    pub(super) fn asked(&mut self, id: u64, query: Query, keys: &[usize]) {
        let asking = &mut self.asking;
        // Those no one waits for any more: a process that never answered
        // (its question had a 504).
        asking
            .open
            .retain(|_, c| c.since.elapsed() < 2 * ANSWER_TIMEOUT);
        let collecting = Collecting {
            query,
            waiting: keys.to_vec(),
            answers: Vec::new(),
            since: Instant::now(),
        };
        asking.open.insert(id, collecting);
        self.answer_ready();
    }

    /// Process `key` answered question `id` (the answer's lines).
    pub(super) fn heard_answer(&mut self, key: usize, id: u64, text: &[u8]) {
        let Some(collecting) = self.asking.open.get_mut(&id) else {
            return;
        };
        match std::str::from_utf8(text).ok().and_then(Answer::parse) {
            Some(answer) => collecting.answers.push(answer),
            None => log::warn!("process {key} gave an answer that does not read; left out"),
        }
        collecting.waiting.retain(|&k| k != key);
        self.answer_ready();
    }

    /// Process `key` is gone: no question waits for it.
    pub(super) fn no_answer_from(&mut self, key: usize) {
        for collecting in self.asking.open.values_mut() {
            collecting.waiting.retain(|&k| k != key);
        }
        self.answer_ready();
    }

    /// Hands over the merged answers of the questions every process
    /// answered.
    fn answer_ready(&mut self) {
        let asking = &mut self.asking;
        let ready: Vec<u64> = (asking.open.iter())
            .filter(|(_, c)| c.waiting.is_empty())
            .map(|(&id, _)| id)
            .collect();
        for id in ready {
            let Some(c) = asking.open.remove(&id) else {
                continue;
            };
            let merged = c.query.merge(c.answers);
            if let Some(asks) = &asking.asks {
                asks.answer(id, merged);
            }
        }
    }
}

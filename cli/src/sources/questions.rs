//! The presence questions of the publish listener's connections
//! (`GET /presence`, `GET /clients`): each asked through the input as a
//! control line after the lines taken before it (see [`crate::asks`]),
//! its answer brought back to the listener's poll.

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Waker;
use wspush::protocol::presence::{Answer, Query};

use crate::asks::Asks;
use crate::chunks::Control;

/// How long a question waits for its answer before a 504.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection's question waiting for its answer (it reads no further
/// request meanwhile, so answers go out in order).
#[derive(Debug)]
pub struct Asking {
    /// The question's number.
    pub id: u64,
    /// What it asks.
    pub query: Query,
    /// Close the connection after the answer.
    pub close: bool,
    /// When it was asked.
    pub since: Instant,
}

/// An answer and its question's number.
type Numbered = (u64, Answer);

/// The listener's questions on their way.
pub struct Questions {
    asks: Arc<Asks>,
    /// Where answers are sent (each with its question's number).
    send: Sender<Numbered>,
    /// Where they come.
    answers: Receiver<Numbered>,
    /// The poll's waker an answer rings.
    waker: Arc<Waker>,
    /// Control lines of questions asked, each handed over on its own.
    lines: VecDeque<Vec<u8>>,
}

impl Questions {
    /// Questions opened in `asks`, their answers ringing `waker`.
    pub fn new(asks: Arc<Asks>, waker: Arc<Waker>) -> Questions {
        let (send, answers) = mpsc::channel();
        Questions {
            asks,
            send,
            answers,
            waker,
            lines: VecDeque::new(),
        }
    }

    /// Asks `query`: the question, waiting.
    pub fn ask(&mut self, query: Query, close: bool) -> Asking {
        let (answers, waker) = (self.send.clone(), Arc::clone(&self.waker));
        let id = self.asks.open(move |id, answer| {
            let _ = answers.send((id, answer));
            let _ = waker.wake();
        });
        let control = Control::Ask {
            id,
            query: query.clone(),
        };
        self.lines.push_back(control.line());
        Asking {
            id,
            query,
            close,
            since: Instant::now(),
        }
    }

    /// Question lines wait to be handed over.
    pub fn waiting(&self) -> bool {
        !self.lines.is_empty()
    }

    /// The next question line to hand over, if any.
    pub fn next_line(&mut self) -> Option<Vec<u8>> {
        self.lines.pop_front()
    }

    /// A question line the reader had no room for: it goes first next time.
    pub fn put_back(&mut self, line: Vec<u8>) {
        self.lines.push_front(line);
    }

    /// The answers come.
    pub fn answered(&self) -> impl Iterator<Item = (u64, Answer)> + '_ {
        self.answers.try_iter()
    }

    /// Question `id` is no longer waited for.
    pub fn forget(&self, id: u64) {
        self.asks.forget(id);
    }
}

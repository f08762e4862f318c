//! Stopping the sources for a re-exec: each at a boundary of what it
//! hands over (a line's end, a request's, an entry's), once what it took
//! is handed over, leaving what the process's next image needs to go on
//! where it stopped ([`Carried`]).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::input::KeptHistory;

/// What the sources leave the next image.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Carried {
    /// What standard input had read of a line not ended.
    pub unfinished: Vec<u8>,
    /// The publish listener's socket, open across the exec.
    pub publish_listener: Option<i32>,
    /// Where the stream's reader was: the last entry read (its id's
    /// milliseconds and sequence), and the stream's count of entries
    /// added then, if known.
    pub stream_at: Option<(u64, u64, Option<u64>)>,
    /// A lone server's history kept apart from its loop (when it reads a
    /// stream), with the input's numbering.
    pub history: Option<KeptHistory>,
}

/// What the encoding of a [`Carried`] begins with.
const MAGIC: &[u8] = b"wspushC1";

impl Carried {
    /// Its bytes: [`MAGIC`], then JSON.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        serde_json::to_writer(&mut out, self).expect("plain data");
        out
    }

    /// What `bytes` say; without [`MAGIC`], standard input's line begun
    /// alone, as the first builds that re-executed a lone server left it.
    pub fn decode(bytes: &[u8]) -> Result<Carried, String> {
        let Some(json) = bytes.strip_prefix(MAGIC) else {
            return Ok(Carried {
                unfinished: bytes.to_vec(),
                ..Carried::default()
            });
        };
        serde_json::from_slice(json).map_err(|e| format!("what the sources left: {e}"))
    }
}

/// How a source stops for a re-exec.
pub trait Stopper: Send + Sync + std::fmt::Debug {
    /// Asks it to stop: it hands over what it took, then ends (its
    /// outlet dropped). Never blocks.
    fn stop(&self) -> io::Result<()>;

    /// Once it ended: puts what it leaves the next image in `carried`.
    fn carry(&self, carried: &mut Carried);
}

/// What a reader that checks between reads shares with its stopper:
/// whether a stop is asked, and what it left once it stopped.
#[derive(Debug)]
pub struct Halt<T> {
    asked: AtomicBool,
    left: Mutex<Option<T>>,
}

impl<T> Default for Halt<T> {
    fn default() -> Halt<T> {
        Halt {
            asked: AtomicBool::new(false),
            left: Mutex::new(None),
        }
    }
}

impl<T> Halt<T> {
    /// A new one, shared.
    pub fn shared() -> Arc<Halt<T>> {
        Arc::new(Halt::default())
    }

    /// Asks the reader to stop.
    pub fn ask(&self) {
        self.asked.store(true, Ordering::Release);
    }

    /// Whether a stop is asked.
    pub fn asked(&self) -> bool {
        self.asked.load(Ordering::Acquire)
    }

    /// The reader stopped, leaving `left`.
    pub fn leave(&self, left: T) {
        *self.left.lock().unwrap_or_else(PoisonError::into_inner) = Some(left);
    }

    /// What the reader left, once (none if it ended before a stop).
    pub fn take(&self) -> Option<T> {
        self.left
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_carried_reads_back_and_nothing_is_nothing() {
        let carried = Carried {
            unfinished: b"half".to_vec(),
            publish_listener: Some(7),
            stream_at: Some((1_700_000_000_000, 3, Some(41))),
            history: None,
        };
        assert_eq!(Carried::decode(&carried.encode()), Ok(carried));
        assert_eq!(Carried::decode(b""), Ok(Carried::default()));
        let raw = Carried::decode(b"{\"half a li").unwrap();
        assert_eq!(raw.unfinished, b"{\"half a li");
        assert!(Carried::decode(b"wspushC1{nope").is_err());
    }
}

//! What every source shares: the [`Source`] trait, what a reader reports
//! ([`FeedEvent`]) and where it hands its chunks ([`Outlet`]).

use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use mio::Waker;

use crate::chunks::Control;

/// A source of input lines, read on a thread of its own.
pub trait Source: Send {
    /// Its reader thread's name.
    fn name(&self) -> &'static str;

    /// Reads until its input ends or `out` is gone, handing over chunks
    /// of whole lines of at most [`Outlet::max_line`] bytes (and control
    /// lines).
    fn run(self: Box<Self>, out: Outlet);
}

/// What a reader reports.
#[derive(Debug, PartialEq, Eq)]
pub enum FeedEvent {
    /// Whole lines read (and control lines).
    Chunk(Vec<u8>),
    /// The connection is lost (or could not be made at the start).
    Lost,
    /// It is back after this outage.
    Restored(Duration),
}

/// Where a source hands its chunks: the one channel every source shares,
/// and the waker of whoever reads it.
#[derive(Debug, Clone)]
pub struct Outlet {
    tx: SyncSender<Vec<u8>>,
    waker: Option<Arc<Waker>>,
    max_line: usize,
}

impl Outlet {
    /// Hands chunks of lines of at most `max_line` bytes to `tx`, waking
    /// `waker` (if any) for each.
    pub fn new(tx: SyncSender<Vec<u8>>, waker: Option<Arc<Waker>>, max_line: usize) -> Outlet {
        Outlet {
            tx,
            waker,
            max_line,
        }
    }

    /// The longest line a source may hand over.
    pub fn max_line(&self) -> usize {
        self.max_line
    }

    /// Sends `chunk`, waiting while the reader has no room, and wakes the
    /// reader; false once it is gone.
    pub fn send(&self, chunk: Vec<u8>) -> bool {
        if self.tx.send(chunk).is_err() {
            return false;
        }
        self.wake();
        true
    }

    /// Sends `chunk` if the reader has room now: `Err(Some(chunk))` back
    /// if not, `Err(None)` once it is gone.
    pub fn offer(&self, chunk: Vec<u8>) -> Result<(), Option<Vec<u8>>> {
        match self.tx.try_send(chunk) {
            Ok(()) => {
                self.wake();
                Ok(())
            }
            Err(TrySendError::Full(back)) => Err(Some(back)),
            Err(TrySendError::Disconnected(_)) => Err(None),
        }
    }

    /// Hands over what a reader reports: its chunk, or a control line
    /// for an outage and its end; false once the reader is gone.
    pub fn event(&self, event: FeedEvent) -> bool {
        let chunk = match event {
            FeedEvent::Chunk(chunk) => chunk,
            FeedEvent::Lost => Control::FeedLost.line(),
            FeedEvent::Restored(outage) => Control::FeedRestored(outage).line(),
        };
        self.send(chunk)
    }

    /// Wakes the reader (as a source ends, too).
    pub fn wake(&self) {
        if let Some(waker) = &self.waker {
            let _ = waker.wake();
        }
    }
}

//! The giving side of a handover's state (see `server::handover`): the
//! control socket successors' sockets arrive on, the one whose ask is
//! awaited, and the successor that asked.

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use crate::ops::sys::Urgent;
use crate::server::net::channel::Channel;

/// How long either side waits for the other on the socket.
pub const HANDOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the giving loop frames on to reach its successor's first
/// position before it refuses.
pub(crate) const CATCH_UP: Duration = Duration::from_secs(5);

/// How long the giving loop may take to finish the fan-out under way
/// before it moves the connections (it refuses past that).
pub(crate) const FINISH_FAN_OUT: Duration = Duration::from_secs(5);

/// How long a successor waits for the answer to its ask: the other loop
/// may first catch up and finish its fan-out (which it gives up on, and
/// refuses, well within this).
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

/// Why [`Server::take_over`](crate::Server::take_over) took nothing.
#[derive(Debug)]
pub enum TakeOverError {
    /// The other process refused (or could not write our version): it
    /// keeps its connections.
    Refused(String),
    /// The socket failed before anything was taken.
    Io(io::Error),
    /// The other process broke off after `taken` connections, which this
    /// server serves; it drains the rest.
    BrokeOff {
        /// The connections taken.
        taken: usize,
    },
}

impl std::fmt::Display for TakeOverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TakeOverError::Refused(why) => write!(f, "the handover was refused: {why}"),
            TakeOverError::Io(e) => write!(f, "the handover failed: {e}"),
            TakeOverError::BrokeOff { taken } => {
                write!(f, "the handover broke off after {taken} connections")
            }
        }
    }
}

impl std::error::Error for TakeOverError {}

/// Who takes the connections.
#[derive(Debug)]
pub(crate) enum Taker {
    /// A successor process, on its socket.
    Successor(Channel),
    /// This process's next image (a re-exec, see `server::reexec`): the
    /// state is kept in memory for it.
    NextImage,
}

/// A successor that asked: it frames from `first` on.
#[derive(Debug)]
pub(crate) struct Giving {
    /// Who it is.
    pub(crate) taker: Taker,
    /// The first position it frames.
    pub(crate) first: u64,
    /// When it asked.
    pub(crate) since: Instant,
    /// The loop's priority, raised until the connections are given.
    pub(crate) _urgent: Urgent,
}

/// The giving side's state: where successors' sockets arrive, one whose
/// ask is awaited, and one that asked.
#[derive(Debug, Default)]
pub(crate) struct Handover {
    /// The control socket successors' sockets arrive on.
    pub(crate) control: Option<OwnedFd>,
    /// A successor's socket, its ask not read yet.
    pub(crate) asking: Option<OwnedFd>,
    /// A successor asked.
    pub(crate) giving: Option<Giving>,
    /// What this process's next image takes, once given.
    pub(crate) suspended: Option<Suspended>,
}

impl Handover {
    /// Whether a successor is under way (its ask awaited, or asked).
    pub(crate) fn busy(&self) -> bool {
        self.asking.is_some() || self.giving.is_some()
    }

    /// Whether the loop stops framing input: a successor asked, and the
    /// loop framed up to the position before its first (`current`).
    pub(crate) fn holds_input(&self, current: u64) -> bool {
        self.giving
            .as_ref()
            .is_some_and(|g| current.saturating_add(1) >= g.first)
    }
}

/// A server's state as it stopped for its next image: its connections
/// (each record with its socket), its listener, and its history.
#[derive(Debug)]
pub struct Suspended {
    /// The last position delivered.
    pub(crate) through: u64,
    /// When the loop stopped (see [`monotonic_nanos`](crate::ops::sys::monotonic_nanos)).
    pub(crate) stopped_ns: u64,
    /// The connection records, then the end.
    pub(crate) records: Vec<u8>,
    /// One socket per connection record, in order.
    pub(crate) sockets: VecDeque<OwnedFd>,
    /// The listener, open.
    pub(crate) listener: OwnedFd,
    /// The history's memory.
    pub(crate) history: OwnedFd,
    /// The ages of the history's records, if the loop wrote it.
    pub(crate) ages: Option<Vec<Duration>>,
    /// What the embedding program keeps beside.
    pub(crate) extra: Vec<u8>,
}

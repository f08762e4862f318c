//! Whether the server has room for another connection, and who is told
//! when that changes: a full server refuses new connections with 503, so
//! in an `SO_REUSEPORT` group it should get none while others have room.
//! A server that bound its own listener leaves the group while it is full
//! (it closes the listener, and binds again once it has room); one serving
//! a listener made elsewhere ([`Server::from_listener`](crate::server::Server::from_listener))
//! tells its watcher, whose supervisor steers connections away.

use std::fmt;
use std::time::{Duration, Instant};

/// A watcher of the room: called with `false` when the server becomes
/// full, `true` when it has room again.
pub(crate) type Watch = Box<dyn FnMut(bool) + Send>;

/// How long after a failed try to join the group again the next one waits.
const REJOIN_RETRY: Duration = Duration::from_secs(1);

/// The room and its watcher.
pub(crate) struct Room {
    full: bool,
    watch: Option<Watch>,
    /// Joining the group again failed; not tried again before then.
    retry_at: Option<Instant>,
}

impl fmt::Debug for Room {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Room")
            .field("full", &self.full)
            .field("watched", &self.watch.is_some())
            .field("retry_at", &self.retry_at)
            .finish()
    }
}

impl Room {
    /// Room, not watched.
    pub(crate) fn new() -> Room {
        Room {
            full: false,
            watch: None,
            retry_at: None,
        }
    }

    /// Tells `watch` of every change from now on.
    pub(crate) fn watch(&mut self, watch: Watch) {
        self.watch = Some(watch);
    }

    /// Takes the count of connections `open` against `max`: full 1% short
    /// of `max` (at `max` below 100), so that connections already on their
    /// way when it leaves its group (or its supervisor steers new ones
    /// away) still find room rather than a 503; room again once another
    /// 1% (at least one) is free, so that a server near its limit does not
    /// flap. Returns the change, if any (the watcher was told it):
    /// `Some(false)` full, `Some(true)` room again.
    pub(crate) fn update(&mut self, open: usize, max: usize) -> Option<bool> {
        let headroom = max / 100;
        let margin = headroom.max(1);
        let full = match self.full {
            false => open + headroom >= max,
            true => open + headroom + margin > max,
        };
        if full == self.full {
            return None;
        }
        self.full = full;
        if let Some(watch) = &mut self.watch {
            watch(!full);
        }
        Some(!full)
    }

    /// Whether the server is full (see [`Room::update`]).
    pub(crate) fn is_full(&self) -> bool {
        self.full
    }

    /// Whether a server out of its group may try to join it again at
    /// `now`: it has room, and no failed try is under a second old.
    pub(crate) fn may_rejoin(&self, now: Instant) -> bool {
        !self.full && self.retry_at.is_none_or(|at| now >= at)
    }

    /// Joining the group again failed with `error` at `now`: logged, and
    /// tried again in a second.
    pub(crate) fn rejoin_failed(&mut self, error: &std::io::Error, now: Instant) {
        log::warn!(
            "cannot listen again after being full: {error}; trying again in {REJOIN_RETRY:?}"
        );
        self.retry_at = Some(now + REJOIN_RETRY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn full_one_percent_short_of_the_limit_and_room_again_one_percent_below() {
        let told = Arc::new(Mutex::new(Vec::new()));
        let mut room = Room::new();
        let log = Arc::clone(&told);
        room.watch(Box::new(move |room| log.lock().unwrap().push(room)));
        assert_eq!(room.update(989, 1000), None);
        assert_eq!(room.update(990, 1000), Some(false));
        assert!(room.is_full());
        assert_eq!(room.update(1000, 1000), None, "told once");
        assert_eq!(room.update(981, 1000), None, "not 1% below yet");
        assert_eq!(room.update(980, 1000), Some(true));
        assert_eq!(room.update(989, 1000), None);
        assert_eq!(*told.lock().unwrap(), [false, true]);
        // A small limit: room again as soon as one is free.
        let mut small = Room::new();
        assert_eq!(small.update(3, 3), Some(false));
        assert_eq!(small.update(2, 3), Some(true));
    }

    #[test]
    fn a_failed_rejoin_waits_a_second() {
        let mut room = Room::new();
        let now = Instant::now();
        assert!(room.may_rejoin(now));
        room.rejoin_failed(&std::io::Error::other("address in use"), now);
        assert!(!room.may_rejoin(now + REJOIN_RETRY / 2));
        assert!(room.may_rejoin(now + REJOIN_RETRY));
        room.update(5, 5);
        assert!(!room.may_rejoin(now + 2 * REJOIN_RETRY), "full");
    }
}

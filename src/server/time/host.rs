//! The host-wide word a heartbeat yields to: when an instance of the host
//! last had a broadcast under way. Every instance's heartbeat sweep waits
//! while one is (see `heartbeat`), so that pings never compete with a
//! fan-out for the host's CPUs. The word is in a memory file of its own
//! that every process of the host maps read-write
//! ([`Config::host_fd`](crate::config::Config::host_fd): a supervisor
//! makes it, its instances inherit it), in nanoseconds of the host's
//! monotonic clock, which every process reads alike. It shares no memory
//! with the history, which its readers map read-only.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::ops::sys::{monotonic_nanos, SharedMemory};

/// Where in the host's memory the word is.
const DELIVERING: usize = 0;
/// The size of the host's memory: a page.
const HOST_MEMORY_LEN: usize = 4096;

/// A new memory of the host's words, for every server of the host to map
/// (see [`Config::host_fd`](crate::config::Config::host_fd)): what a
/// supervisor makes for its instances.
pub fn host_memory() -> io::Result<SharedMemory> {
    SharedMemory::create("wspush-host", HOST_MEMORY_LEN)
}

/// The host's word of the last broadcast under way.
#[derive(Debug)]
pub(crate) struct HostDelivery {
    page: SharedMemory,
}

impl HostDelivery {
    /// The host's memory, through `shared` (a duplicate of it is mapped),
    /// or, with none, a page of this process's own.
    pub(crate) fn memory(shared: Option<&OwnedFd>) -> io::Result<SharedMemory> {
        match shared {
            Some(fd) => SharedMemory::open(fd.try_clone()?),
            None => host_memory(),
        }
    }

    /// The word in `page` (the host's memory).
    pub(crate) fn new(page: SharedMemory) -> HostDelivery {
        HostDelivery { page }
    }

    /// Notes that a broadcast of this process is under way at `now`.
    pub(crate) fn mark(&self, now: Instant) {
        let word = self.page.word(DELIVERING * 8);
        word.fetch_max(host_nanos(now), Ordering::Relaxed);
    }

    /// When an instance of the host last noted a broadcast under way.
    pub(crate) fn last(&self) -> Option<Instant> {
        match self.page.load(DELIVERING * 8, Ordering::Relaxed) {
            0 => None,
            nanos => Some(host_instant(nanos)),
        }
    }
}

/// An `Instant` and the host's monotonic clock read together: `Instant`
/// is that clock, but says so in no number another process can compare.
fn clock_base() -> (Instant, u64) {
    static BASE: OnceLock<(Instant, u64)> = OnceLock::new();
    *BASE.get_or_init(|| (Instant::now(), monotonic_nanos()))
}

/// `at` in nanoseconds of the host's monotonic clock (at least 1).
fn host_nanos(at: Instant) -> u64 {
    let (base, nanos) = clock_base();
    let nanos = match at.checked_duration_since(base) {
        Some(after) => nanos.saturating_add(after.as_nanos() as u64),
        None => nanos.saturating_sub(base.duration_since(at).as_nanos() as u64),
    };
    nanos.max(1)
}

/// The `Instant` of `nanos` of the host's monotonic clock.
fn host_instant(nanos: u64) -> Instant {
    let (base, base_nanos) = clock_base();
    if nanos >= base_nanos {
        base + Duration::from_nanos(nanos - base_nanos)
    } else {
        base.checked_sub(Duration::from_nanos(base_nanos - nanos))
            .unwrap_or(base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_noted_by_one_instance_is_seen_by_every_mapping() {
        let made = host_memory().unwrap();
        let fd = made.inheritable().unwrap().try_clone_to_owned().unwrap();
        let mine = HostDelivery::new(HostDelivery::memory(Some(&fd)).unwrap());
        let other = HostDelivery::new(HostDelivery::memory(Some(&fd)).unwrap());
        assert_eq!(other.last(), None, "none yet");
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(5);
        other.mark(later);
        mine.mark(t0);
        let seen = mine.last().unwrap();
        let off = seen.max(later) - seen.min(later);
        assert!(off < Duration::from_micros(1), "the later one, {off:?} off");
        assert_eq!(other.last(), Some(seen));
    }
}

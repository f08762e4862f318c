//! The loop's alarm clock: one timer file descriptor in the poll, set for
//! the next time event (a deadline, the heartbeat sweep, a pool trim, the
//! stats line), the way Redis's `ae` keeps its time events apart from its
//! file events.
//!
//! Passing the time left to `epoll_wait` instead would make the kernel
//! start and cancel a high-resolution timer on every wait: `perf` put that
//! at about 1 µs of server CPU per connection during a setup, where the
//! loop waits once per connection. The alarm is set only when the next
//! time event comes earlier than the one it is set for; a later one
//! waits until the alarm rings (early, at worst: the loop then finds
//! nothing due and sets it again).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};

/// A `CLOCK_MONOTONIC` timerfd registered for readability.
#[derive(Debug)]
pub struct Alarm {
    fd: OwnedFd,
    /// When it rings, while set.
    set_for: Option<Instant>,
}

impl Alarm {
    /// A new alarm, not set, registered under `token`.
    pub fn new(registry: &Registry, token: Token) -> io::Result<Alarm> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        registry.register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)?;
        Ok(Alarm { fd, set_for: None })
    }

    /// Makes the alarm ring at `at` or earlier (`now` is the current
    /// time): sets it unless it is set for `at` or before already.
    pub fn ring_by(&mut self, at: Instant, now: Instant) -> io::Result<()> {
        if self.set_for.is_some_and(|set_for| set_for <= at) {
            return Ok(());
        }
        // A zero value would disarm the timer: an event already due rings
        // after a nanosecond. Counted from before this call, the timer
        // never rings before `at`.
        let after = at
            .saturating_duration_since(now)
            .max(Duration::from_nanos(1));
        let value = Timespec::try_from(after).map_err(|_| io::Error::other("alarm too far"))?;
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        timerfd_settime(
            &self.fd,
            TimerfdTimerFlags::empty(),
            &Itimerspec {
                it_interval: zero,
                it_value: value,
            },
        )?;
        self.set_for = Some(at);
        Ok(())
    }

    /// The alarm's event: it rang (or the fd reports an error). Clears its
    /// readiness; the next [`Alarm::ring_by`] sets it again.
    pub fn rang(&mut self) {
        let mut expirations = [0u8; 8];
        // WouldBlock (already read) and errors leave nothing to clear.
        let _ = rustix::io::read(&self.fd, &mut expirations);
        self.set_for = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Poll};

    const ALARM: Token = Token(7);

    fn rings_within(poll: &mut Poll, limit: Duration) -> bool {
        let mut events = Events::with_capacity(4);
        poll.poll(&mut events, Some(limit)).unwrap();
        events.iter().any(|e| e.token() == ALARM)
    }

    #[test]
    fn rings_once_at_the_earliest_time_asked() {
        let mut poll = Poll::new().unwrap();
        let mut alarm = Alarm::new(poll.registry(), ALARM).unwrap();
        assert!(
            !rings_within(&mut poll, Duration::from_millis(20)),
            "not set"
        );

        let now = Instant::now();
        alarm.ring_by(now + Duration::from_secs(60), now).unwrap();
        alarm.ring_by(now + Duration::from_millis(30), now).unwrap();
        alarm.ring_by(now + Duration::from_secs(30), now).unwrap();
        assert!(rings_within(&mut poll, Duration::from_secs(5)));
        assert!(now.elapsed() >= Duration::from_millis(30), "never early");
        alarm.rang();
        assert!(
            !rings_within(&mut poll, Duration::from_millis(50)),
            "a later time did not move it, and it rang once"
        );

        let now = Instant::now();
        alarm.ring_by(now, now).unwrap();
        assert!(
            rings_within(&mut poll, Duration::from_secs(5)),
            "rang, so set again"
        );
    }
}

//! Whether the loop takes connections: running (accepting, or pausing
//! when file descriptors run out), then draining once a shutdown begins.

use std::io;
use std::time::{Duration, Instant};

use crate::ops::metrics::Metrics;
use crate::server::sockets::Door;

/// How long accepting pauses when file descriptors run out.
pub(super) const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Shutdown progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Serving; `shutdown_seen` is when the loop saw a handle's shutdown
    /// request, if it did (what was queued before it goes out first).
    Running { shutdown_seen: Option<Instant> },
    /// Closing connections; give up on the rest at the deadline.
    Draining { deadline: Instant },
}

/// The loop's shutdown progress and the state of accepting.
#[derive(Debug)]
pub(super) struct Lifecycle {
    state: State,
    /// Accepting stopped at its cap with connections left in the backlog
    /// (per [`Door`]).
    accept_again: [bool; 2],
    /// Accepting is paused (file descriptors ran out) until then.
    accept_paused_until: Option<Instant>,
    last_accept_warning: Option<Instant>,
}

impl Lifecycle {
    /// Running, accepting.
    pub(super) fn new() -> Lifecycle {
        Lifecycle {
            state: State::Running {
                shutdown_seen: None,
            },
            accept_again: [false; 2],
            accept_paused_until: None,
            last_accept_warning: None,
        }
    }

    /// No shutdown has begun.
    pub(super) fn is_running(&self) -> bool {
        matches!(self.state, State::Running { .. })
    }

    /// Whether a shutdown finished: every connection is closed (`closed`),
    /// or the close timeout passed.
    pub(super) fn is_finished(&self, closed: bool) -> bool {
        match self.state {
            State::Running { .. } => false,
            State::Draining { deadline } => closed || Instant::now() >= deadline,
        }
    }

    /// When the loop, still running, first saw the shutdown request (`now`
    /// if this is the first time). The loop asks only while running; once
    /// draining has begun the answer is just `now`.
    pub(super) fn shutdown_seen(&mut self, now: Instant) -> Instant {
        match &mut self.state {
            State::Running { shutdown_seen } => *shutdown_seen.get_or_insert(now),
            State::Draining { .. } => now,
        }
    }

    /// Begins draining, to give up `timeout` after the shutdown request
    /// was seen; `false` if it had begun.
    pub(super) fn begin_draining(&mut self, now: Instant, timeout: Duration) -> bool {
        let State::Running { shutdown_seen } = self.state else {
            return false;
        };
        self.state = State::Draining {
            deadline: shutdown_seen.unwrap_or(now) + timeout,
        };
        true
    }

    /// The time events this state waits for: the end of an accept pause,
    /// the end of draining.
    pub(super) fn next_at(&self) -> [Option<Instant>; 2] {
        let deadline = match self.state {
            State::Draining { deadline } => Some(deadline),
            State::Running { .. } => None,
        };
        [self.accept_paused_until, deadline]
    }

    /// Starts a turn at `door`'s listener: `false` if accepting is paused
    /// or over.
    pub(super) fn begin_accepting(&mut self, door: Door) -> bool {
        self.accept_again[door as usize] = false;
        self.accept_paused_until.is_none() && self.is_running()
    }

    /// Accepting at `door` stopped at its cap with connections left.
    pub(super) fn accept_again(&mut self, door: Door) {
        self.accept_again[door as usize] = true;
    }

    /// Some listener has connections left and accepting is not paused.
    pub(super) fn accepts_pending(&self) -> bool {
        self.accept_again.contains(&true) && self.accept_paused_until.is_none()
    }

    /// Pauses accepting for [`ACCEPT_PAUSE`] after `error`, with `open`
    /// connections.
    pub(super) fn pause_accepting(
        &mut self,
        error: &io::Error,
        now: Instant,
        open: usize,
        metrics: &Metrics,
    ) {
        Metrics::incr(&metrics.accept_pauses);
        self.accept_paused_until = Some(now + ACCEPT_PAUSE);
        if self
            .last_accept_warning
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1))
        {
            self.last_accept_warning = Some(now);
            log::warn!(
                "accept paused for {ACCEPT_PAUSE:?}: {error} ({open} connections open; raise the open-file limit or --max-connections)"
            );
        }
    }

    /// Ends a pause that is over; returns the doors to accept at again
    /// (none while paused).
    pub(super) fn resume_accepting(&mut self, now: Instant) -> [bool; 2] {
        if self.accept_paused_until.is_some_and(|until| now >= until) {
            self.accept_paused_until = None;
            self.accept_again = [true; 2];
        }
        match self.accept_paused_until {
            None => self.accept_again,
            Some(_) => [false; 2],
        }
    }
}

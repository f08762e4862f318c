//! Whether the loop takes connections: running (accepting, or pausing
//! when file descriptors run out); draining once a drain is asked
//! (announcing it on `/healthz` while still accepting, then closing the
//! connections at a pace); closing once a shutdown begins or the pace is
//! done.

pub(crate) mod drain;
pub(crate) mod handover;

use std::io;
use std::time::{Duration, Instant};

use crate::ops::metrics::Metrics;
use crate::server::lifecycle::drain::Pace;
use crate::server::net::sockets::Door;

/// How the connections left are closed when closing begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// A shutdown: 1001.
    Shutdown,
    /// The end of a drain's pace: 1012 for the few left (those that
    /// upgraded after the pace had passed them).
    Drain,
}

/// How long accepting pauses when file descriptors run out.
pub(super) const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Shutdown progress.
#[derive(Debug)]
enum State {
    /// Serving.
    Running,
    /// A drain was asked: `/healthz` says so, and accepting goes on until
    /// `until` (the drain grace), while load balancers take note.
    Announcing { until: Instant },
    /// Accepting stopped; the connections are closed at the pace.
    Pacing(Pace),
    /// Every connection is asked to close (on a lap of the walk, as
    /// `ending` says); give up on the rest at the deadline.
    Closing { deadline: Instant },
}

/// The loop's shutdown progress and the state of accepting.
#[derive(Debug)]
pub(super) struct Lifecycle {
    state: State,
    /// When the loop saw a handle's shutdown request, if it did (what was
    /// queued before it goes out first, then the closing begins).
    shutdown_seen: Option<Instant>,
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
            state: State::Running,
            shutdown_seen: None,
            accept_again: [false; 2],
            accept_paused_until: None,
            last_accept_warning: None,
        }
    }

    /// The connections are served: broadcasts framed, heartbeats kept
    /// (running or draining; not closing).
    pub(super) fn is_serving(&self) -> bool {
        !matches!(self.state, State::Closing { .. })
    }

    /// Running: no drain or shutdown has begun.
    pub(super) fn is_running(&self) -> bool {
        matches!(self.state, State::Running)
    }

    /// Connections are accepted (running, or announcing a drain).
    fn is_accepting(&self) -> bool {
        matches!(self.state, State::Running | State::Announcing { .. })
    }

    /// Whether a shutdown finished: every connection is closed (`closed`),
    /// or the close timeout passed.
    pub(super) fn is_finished(&self, closed: bool) -> bool {
        match self.state {
            State::Closing { deadline, .. } => closed || Instant::now() >= deadline,
            _ => false,
        }
    }

    /// The loop saw a shutdown request (`now`, if this is the first time).
    pub(super) fn see_shutdown(&mut self, now: Instant) {
        self.shutdown_seen.get_or_insert(now);
    }

    /// While serving after a shutdown request: until when what was queued
    /// before it is still framed, half the shutdown `timeout` after the
    /// loop first saw it.
    pub(super) fn flush_deadline(&self, timeout: Duration) -> Option<Instant> {
        let seen = self.shutdown_seen.filter(|_| self.is_serving())?;
        Some(seen + timeout / 2)
    }

    /// Begins announcing a drain, accepting until `grace` from `now`;
    /// `false` unless running.
    pub(super) fn begin_announcing(&mut self, now: Instant, grace: Duration) -> bool {
        if !self.is_running() {
            return false;
        }
        self.state = State::Announcing { until: now + grace };
        true
    }

    /// Whether the announcement is over by `now`: accepting stops and the
    /// pace begins.
    pub(super) fn announced(&self, now: Instant) -> bool {
        matches!(self.state, State::Announcing { until } if now >= until)
    }

    /// Begins closing at `pace` (after the announcement).
    pub(super) fn begin_pacing(&mut self, pace: Pace) {
        self.state = State::Pacing(pace);
    }

    /// A drain's pace closes the connections.
    pub(super) fn is_pacing(&self) -> bool {
        matches!(self.state, State::Pacing(_))
    }

    /// The pace, while the connections are closed at one.
    pub(super) fn pace(&mut self) -> Option<&mut Pace> {
        match &mut self.state {
            State::Pacing(pace) => Some(pace),
            _ => None,
        }
    }

    /// Begins closing every connection left, to give up `timeout` after the
    /// shutdown request was seen (or after `now`, at the end of a drain);
    /// `false` if it had begun.
    pub(super) fn begin_closing(&mut self, now: Instant, timeout: Duration) -> bool {
        if matches!(self.state, State::Closing { .. }) {
            return false;
        }
        self.state = State::Closing {
            deadline: self.shutdown_seen.unwrap_or(now) + timeout,
        };
        true
    }

    /// The time events this state waits for: the end of an accept pause,
    /// and the end of the announcement, the next close of the pace, or the
    /// end of closing.
    pub(super) fn next_at(&self, now: Instant) -> [Option<Instant>; 2] {
        let state = match &self.state {
            State::Running => None,
            State::Announcing { until } => Some(*until),
            State::Pacing(pace) => pace.next_at(now),
            State::Closing { deadline, .. } => Some(*deadline),
        };
        [self.accept_paused_until, state]
    }

    /// Starts a turn at `door`'s listener: `false` if accepting is paused
    /// or over.
    pub(super) fn begin_accepting(&mut self, door: Door) -> bool {
        self.accept_again[door as usize] = false;
        self.accept_paused_until.is_none() && self.is_accepting()
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

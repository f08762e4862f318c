//! The connection setup of a `push` run: the connections opened at the
//! configured rate, with a live progress line on standard error.

use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

use super::run::{Run, CHECK_EVERY};
use crate::client::pacing::Schedule;
use crate::observe::ramp::Ramp;
use crate::Error;

/// How often the coordinator grants connection attempts during the setup.
const TICK: Duration = Duration::from_millis(2);

/// How often the live progress line is redrawn on a terminal (on other
/// standard errors, a line is written every [`PROGRESS_LOG_EVERY`]).
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
const PROGRESS_LOG_EVERY: Duration = Duration::from_secs(5);

impl Run<'_> {
    /// Opens the connections at the configured rate, at most
    /// `max_in_flight` at a time, until all are open or failed (or the
    /// setup timeout); returns the setup time and its ramp.
    pub(super) fn open_connections(&mut self) -> Result<(Duration, Ramp), Error> {
        let o = self.options;
        let schedule = Schedule::new(f64::from(o.rate), o.conns as u64);
        let mut ramp = Ramp::new();
        let mut progress = ProgressLine::new(self.label);
        let start = Instant::now();
        let deadline = start + o.setup_timeout();
        let stall = Duration::from_secs(o.stall_timeout);
        let (mut settled, mut last_change) = (0, start);
        let mut checked = start;
        loop {
            let now = Instant::now();
            if self.fleet.granted() >= o.conns && self.fleet.in_flight() == 0 {
                break;
            }
            let counts = self.fleet.counts();
            if counts.opened as u64 + counts.failed != settled {
                settled = counts.opened as u64 + counts.failed;
                last_change = now;
            }
            if now >= deadline || now >= last_change + stall {
                eprintln!(
                    "\n[{}] setup {}; {} still in flight",
                    self.label,
                    if now >= deadline {
                        "timed out"
                    } else {
                        "stalled"
                    },
                    self.fleet.in_flight()
                );
                self.fleet.abandon()?;
                self.pump(Duration::from_millis(500))?;
                break;
            }
            if now >= checked + CHECK_EVERY {
                self.check()?;
                checked = now;
            }
            let due = schedule.due(now - start) as usize;
            let room = o.max_in_flight.saturating_sub(self.fleet.in_flight());
            let want = due.saturating_sub(self.fleet.granted()).min(room);
            if want > 0 {
                self.fleet.open(want, o.active_workers)?;
            }
            let tick_end = now + TICK;
            loop {
                let left = tick_end.saturating_duration_since(Instant::now());
                if left.is_zero() || self.fleet.next_report(left)?.is_none() {
                    break;
                }
            }
            let counts = self.fleet.counts();
            ramp.record(start.elapsed(), counts.opened as u64);
            progress.update(|| {
                format!(
                    "{}/{} open, {} in flight, {} failed, {:.1} s",
                    counts.open,
                    o.conns,
                    self.fleet.in_flight(),
                    counts.failed,
                    start.elapsed().as_secs_f64()
                )
            });
        }
        let setup = start.elapsed();
        progress.finish();
        ramp.finish(setup, self.fleet.counts().opened as u64);
        Ok((setup, ramp))
    }
}

/// The live progress line on standard error: redrawn in place on a
/// terminal, written as a plain line every few seconds elsewhere.
struct ProgressLine<'a> {
    label: &'a str,
    terminal: bool,
    last: Option<Instant>,
    drawn: bool,
}

impl<'a> ProgressLine<'a> {
    fn new(label: &'a str) -> Self {
        ProgressLine {
            label,
            terminal: io::stderr().is_terminal(),
            last: None,
            drawn: false,
        }
    }

    /// Shows `text()` if it is time to.
    fn update(&mut self, text: impl FnOnce() -> String) {
        let every = if self.terminal {
            PROGRESS_EVERY
        } else {
            PROGRESS_LOG_EVERY
        };
        let now = Instant::now();
        if self.last.is_some_and(|t| now < t + every) {
            return;
        }
        self.last = Some(now);
        let mut err = io::stderr().lock();
        let _ = if self.terminal {
            self.drawn = true;
            write!(err, "\r[{}] {}\x1b[K", self.label, text())
        } else {
            writeln!(err, "[{}] {}", self.label, text())
        };
    }

    /// Ends the line on a terminal.
    fn finish(&mut self) {
        if self.drawn {
            eprintln!();
        }
    }
}

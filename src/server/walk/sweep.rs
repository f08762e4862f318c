//! The walk's one cursor over the slab's keys, and the laps it goes.
//!
//! Every duty toward the connections in key order rides on this cursor:
//!
//! - **paced duties**, due a few keys at a time: the heartbeat (its
//!   schedule reaches further into the keys as time passes, see
//!   `time::heartbeat`) and a drain (so many closes due by now, see
//!   `lifecycle::drain`). The cursor stands where they are: every key
//!   before it had them in this round. It moves as far as they are due,
//!   and starts the next round at key 0 when the heartbeat's round is
//!   over (or a drain wants more).
//! - **laps**, due on every key at once: a pass of the broadcast stream,
//!   the closing sweep of a shutdown. A lap is one circle from the
//!   cursor, at full speed: it visits the keys from the cursor to the
//!   bound, then from 0 back to where it began. While it visits keys
//!   from the cursor on that the paced duties are due on, they ride on
//!   it and the cursor goes along; from the first key they are not due
//!   on, the lap goes on alone and they wait for it to end. A duty that
//!   needs a lap while one is under way extends it to a full circle from
//!   where it is.
//!
//! While a drain paces the closes, the cursor moves only as the drain
//! does: the heartbeat's pings ride on it where they are due, and the
//! keys ahead wait (a drain closes them all within its time). So one
//! round of the cursor is one round of the drain.
//!
//! This module decides which key is visited next and for what; the walk
//! (`walk`) makes the visits. Keys are visited in order, each at most
//! once per lap and once per round.

use std::ops::Range;

/// The cursor, and the lap under way.
#[derive(Debug, Default)]
pub(crate) struct Sweep {
    /// The next key the paced duties are due on.
    cursor: usize,
    /// The lap under way, if one is.
    lap: Option<Lap>,
    /// Keys the cursor has passed since the loop began (a drain's round
    /// is measured by it).
    travelled: u64,
}

/// One circle of visits from where the cursor was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lap {
    /// The next key it visits.
    at: usize,
    /// It went past the key bound to 0.
    wrapped: bool,
    /// Once wrapped, it ends here.
    end: usize,
    /// The paced duties still ride on it: every key it visited was the
    /// cursor's and due.
    riding: bool,
}

/// What the paced duties have due at this step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Paced {
    /// The heartbeat's pings: the keys below this one in this round are
    /// due (none if the heartbeat is not due now).
    pub ping_below: usize,
    /// Whether the heartbeat's round is over: once the cursor reaches
    /// the bound, it starts the next round.
    pub round_over: bool,
    /// A drain paces the closes, until the cursor has travelled this far
    /// (one round from where the drain began, see [`Sweep::travelled`]):
    /// the cursor moves only for it.
    pub draining: Option<u64>,
    /// Closes of open connections a drain has due (the walk counts down
    /// as it makes them).
    pub closes: usize,
}

impl Paced {
    /// Whether the paced duties move the cursor, at `key`, having
    /// travelled `travelled`.
    fn due_at(&self, key: usize, travelled: u64) -> bool {
        match self.draining {
            Some(until) => self.closes > 0 && travelled < until,
            None => key < self.ping_below,
        }
    }

    /// Whether they move the cursor into the next round.
    fn next_round(&self, travelled: u64) -> bool {
        match self.draining {
            Some(until) => self.closes > 0 && travelled < until,
            None => self.round_over,
        }
    }
}

/// The sweep's next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Visit the connections at these keys for the lap's duties alone,
    /// in order, then say how far the visits went
    /// ([`Sweep::lap_reached`]).
    Lap(Range<usize>),
    /// Visit the connection at `key` for the paced duties, and for the
    /// lap's too if `lap` (they ride on it there).
    Paced {
        /// The slab key.
        key: usize,
        /// The lap's duties are due on it too.
        lap: bool,
    },
    /// The lap under way visited every key and ended.
    LapEnded,
    /// The cursor went from the bound to key 0: a round ended, and the
    /// paced duties are to be asked again what is due.
    Round,
    /// Nothing is due on the keys now.
    Idle,
}

impl Sweep {
    /// Begins a lap from the cursor, or, if one is under way, extends it
    /// to a full circle from where it is.
    pub(crate) fn begin_lap(&mut self) {
        match &mut self.lap {
            None => {
                self.lap = Some(Lap {
                    at: self.cursor,
                    wrapped: false,
                    end: self.cursor,
                    riding: true,
                })
            }
            Some(lap) => {
                lap.end = lap.at;
                lap.wrapped = false;
            }
        }
    }

    /// Whether a lap is under way.
    pub(crate) fn in_lap(&self) -> bool {
        self.lap.is_some()
    }

    /// The next key the paced duties are due on.
    pub(crate) fn cursor(&self) -> usize {
        self.cursor
    }

    /// Keys the cursor has passed since the loop began.
    pub(crate) fn travelled(&self) -> u64 {
        self.travelled
    }

    /// The next key to visit below `bound`, and for which duties, given
    /// what the paced duties have due.
    pub(crate) fn next(&mut self, bound: usize, paced: &Paced) -> Next {
        let cursor = self.cursor;
        if let Some(lap) = &mut self.lap {
            if !lap.wrapped && lap.at >= bound {
                lap.wrapped = true;
                lap.at = 0;
            }
            if lap.wrapped && lap.at >= lap.end.min(bound) {
                self.lap = None;
                return Next::LapEnded;
            }
            let key = lap.at;
            // The next round begins between laps.
            let rides = lap.riding && key == cursor && paced.due_at(key, self.travelled);
            lap.riding = rides;
            if !rides {
                let end = if lap.wrapped {
                    lap.end.min(bound)
                } else {
                    bound
                };
                return Next::Lap(key..end);
            }
            lap.at += 1;
            self.pass_cursor();
            return Next::Paced { key, lap: true };
        }
        if cursor >= bound {
            if !paced.next_round(self.travelled) {
                return Next::Idle;
            }
            self.cursor = 0;
            return Next::Round;
        }
        if !paced.due_at(cursor, self.travelled) {
            return Next::Idle;
        }
        self.pass_cursor();
        Next::Paced {
            key: cursor,
            lap: false,
        }
    }

    /// The lap's visits of a [`Next::Lap`] went up to (not including)
    /// `key`.
    pub(crate) fn lap_reached(&mut self, key: usize) {
        if let Some(lap) = &mut self.lap {
            lap.at = key;
        }
    }

    fn pass_cursor(&mut self) {
        self.cursor += 1;
        self.travelled += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The visits, at most `most`, until the sweep is idle, as (key, for
    /// the lap, for the paced duties), with `LapEnded` and `Round` shown
    /// as keys `usize::MAX` and `usize::MAX - 1`.
    fn run(
        sweep: &mut Sweep,
        bound: usize,
        paced: &Paced,
        most: usize,
    ) -> Vec<(usize, bool, bool)> {
        let mut seen = Vec::new();
        while seen.len() < most {
            match sweep.next(bound, paced) {
                Next::Lap(keys) => {
                    let mut key = keys.start;
                    while key < keys.end && seen.len() < most {
                        seen.push((key, true, false));
                        key += 1;
                    }
                    sweep.lap_reached(key);
                }
                Next::Paced { key, lap } => seen.push((key, lap, true)),
                Next::LapEnded => seen.push((usize::MAX, false, false)),
                Next::Round => seen.push((usize::MAX - 1, false, false)),
                Next::Idle => break,
            }
        }
        seen
    }

    fn keys(visits: &[(usize, bool, bool)]) -> Vec<usize> {
        visits.iter().map(|v| v.0).collect()
    }

    #[test]
    fn paced_duties_move_the_cursor_as_far_as_they_are_due() {
        let mut sweep = Sweep::default();
        assert_eq!(sweep.next(10, &Paced::default()), Next::Idle);
        let paced = Paced {
            ping_below: 4,
            ..Paced::default()
        };
        let seen = run(&mut sweep, 10, &paced, 100);
        assert_eq!(seen, [0, 1, 2, 3].map(|k| (k, false, true)));
        let paced = Paced {
            ping_below: 10,
            ..paced
        };
        assert_eq!(keys(&run(&mut sweep, 10, &paced, 100)), [4, 5, 6, 7, 8, 9]);
        assert_eq!(sweep.next(10, &paced), Next::Idle, "the round is not over");
        let over = Paced {
            round_over: true,
            ping_below: 0,
            ..paced
        };
        assert_eq!(sweep.next(10, &over), Next::Round);
        assert_eq!(
            sweep.next(10, &over),
            Next::Idle,
            "nothing due in the new round"
        );
        assert_eq!(sweep.travelled(), 10);
    }

    #[test]
    fn a_lap_is_one_circle_from_the_cursor() {
        let mut sweep = Sweep::default();
        let paced = Paced {
            ping_below: 3,
            ..Paced::default()
        };
        run(&mut sweep, 6, &paced, 100);
        sweep.begin_lap();
        assert!(sweep.in_lap());
        let seen = run(&mut sweep, 6, &Paced::default(), 100);
        assert_eq!(keys(&seen), [3, 4, 5, 0, 1, 2, usize::MAX]);
        assert!(seen[..6].iter().all(|v| v.1 && !v.2), "for the lap alone");
        assert!(!sweep.in_lap());
        assert_eq!(sweep.travelled(), 3, "the cursor stayed");
    }

    #[test]
    fn paced_duties_ride_on_a_lap_from_the_cursor_while_they_are_due() {
        let mut sweep = Sweep::default();
        sweep.begin_lap();
        let paced = Paced {
            ping_below: 2,
            ..Paced::default()
        };
        let seen = run(&mut sweep, 5, &paced, 100);
        assert_eq!(
            seen,
            [
                (0, true, true),
                (1, true, true),
                (2, true, false),
                (3, true, false),
                (4, true, false),
                (usize::MAX, false, false)
            ]
        );
        let more = Paced {
            ping_below: 4,
            ..paced
        };
        assert_eq!(
            keys(&run(&mut sweep, 5, &more, 100)),
            [2, 3],
            "after the lap"
        );
    }

    #[test]
    fn a_lap_asked_for_during_one_extends_it_to_a_full_circle() {
        let mut sweep = Sweep::default();
        sweep.begin_lap();
        let idle = Paced::default();
        assert_eq!(keys(&run(&mut sweep, 4, &idle, 2)), [0, 1]);
        sweep.begin_lap();
        let seen = run(&mut sweep, 4, &idle, 100);
        assert_eq!(keys(&seen), [2, 3, 0, 1, usize::MAX]);
    }

    #[test]
    fn a_lap_follows_a_changing_bound() {
        let mut sweep = Sweep::default();
        run(
            &mut sweep,
            8,
            &Paced {
                ping_below: 6,
                ..Paced::default()
            },
            100,
        );
        sweep.begin_lap();
        let idle = Paced::default();
        assert_eq!(keys(&run(&mut sweep, 8, &idle, 1)), [6]);
        // The slab shrank below where the lap began: it ends at the bound.
        assert_eq!(
            keys(&run(&mut sweep, 4, &idle, 100)),
            [0, 1, 2, 3, usize::MAX]
        );
        // It grew: the new keys are visited before wrapping.
        sweep.begin_lap();
        assert_eq!(
            keys(&run(&mut sweep, 9, &idle, 100)),
            [6, 7, 8, 0, 1, 2, 3, 4, 5, usize::MAX]
        );
    }

    #[test]
    fn a_drain_alone_moves_the_cursor_and_rounds_go_on_while_it_has_closes_due() {
        let mut sweep = Sweep::default();
        let mut paced = Paced {
            ping_below: 10,
            draining: Some(5),
            closes: 0,
            ..Paced::default()
        };
        assert_eq!(
            sweep.next(3, &paced),
            Next::Idle,
            "pings wait for the drain"
        );
        paced.closes = 1;
        assert_eq!(
            keys(&run(&mut sweep, 3, &paced, 4)),
            [0, 1, 2, usize::MAX - 1]
        );
        paced.closes = 0;
        assert_eq!(sweep.next(3, &paced), Next::Idle);
        paced.closes = 1;
        assert_eq!(
            keys(&run(&mut sweep, 3, &paced, 100)),
            [0, 1],
            "its round ends at 5"
        );
    }
}

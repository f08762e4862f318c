//! The connection ramp: how many connections were open at each moment of
//! the setup; from it come the setup rate (average and slowest whole
//! second) and the ramp curve of the plot.

use std::time::Duration;

use serde::Serialize;

/// Smallest time between two points of the ramp curve.
const RESOLUTION_SECS: f64 = 0.1;

/// Connections opened over time during a setup.
#[derive(Debug, Clone, Default)]
pub struct Ramp {
    /// `(seconds since the start, connections opened so far)`, at most one
    /// point per [`RESOLUTION_SECS`], starting at `(0, 0)`.
    points: Vec<(f64, u64)>,
    /// Connections opened by the end of each whole second: `marks[s]` at `s + 1` s.
    marks: Vec<u64>,
    /// The latest count recorded.
    last: u64,
}

/// What the ramp says about the setup rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RampSummary {
    /// Connections opened per second, over the whole setup.
    pub average: f64,
    /// Fewest connections opened in one whole second of the setup (none if
    /// the setup took less than a second).
    pub slowest_second: Option<u64>,
    /// Most connections opened in one whole second.
    pub fastest_second: Option<u64>,
    /// Connections opened in each whole second, in order.
    pub per_second: Vec<u64>,
}

impl Ramp {
    /// An empty ramp at time 0.
    pub fn new() -> Ramp {
        Ramp {
            points: vec![(0.0, 0)],
            marks: Vec::new(),
            last: 0,
        }
    }

    /// Records that `opened` connections had been opened `elapsed` after the
    /// start. Calls must come in time order, often (every few ms): a whole
    /// second that passed between two calls is credited with the earlier count.
    pub fn record(&mut self, elapsed: Duration, opened: u64) {
        let secs = elapsed.as_secs_f64();
        while (self.marks.len() + 1) as f64 <= secs {
            self.marks.push(self.last);
        }
        let (last_secs, last_opened) = *self.points.last().expect("starts with a point");
        if opened != last_opened && secs - last_secs >= RESOLUTION_SECS {
            self.points.push((secs, opened));
        }
        self.last = opened;
    }

    /// Ends the ramp: records the final count at `elapsed` as a point.
    pub fn finish(&mut self, elapsed: Duration, opened: u64) {
        self.record(elapsed, opened);
        let secs = elapsed.as_secs_f64();
        if self.points.last().map(|p| p.0) != Some(secs) {
            self.points.push((secs, opened));
        }
    }

    /// The curve: `(seconds, connections opened)`.
    pub fn points(&self) -> &[(f64, u64)] {
        &self.points
    }

    /// The rate over `duration` (the whole setup), and per whole second.
    pub fn summary(&self, duration: Duration) -> RampSummary {
        let per_second: Vec<u64> = self
            .marks
            .iter()
            .scan(0, |before, &mark| {
                let delta = mark.saturating_sub(*before);
                *before = mark;
                Some(delta)
            })
            .collect();
        RampSummary {
            average: self.last as f64 / duration.as_secs_f64().max(1e-9),
            slowest_second: per_second.iter().copied().min(),
            fastest_second: per_second.iter().copied().max(),
            per_second,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn per_second_rates_and_the_slowest_second() {
        let mut ramp = Ramp::new();
        // 10 per ms for 1.5 s, then 5 per ms until 2.6 s: two whole seconds.
        let mut opened = 0;
        for t in 1..=2600 {
            opened += if t <= 1500 { 10 } else { 5 };
            ramp.record(ms(t), opened);
        }
        ramp.finish(ms(2600), opened);
        let s = ramp.summary(ms(2600));
        // A boundary is credited with the count recorded just before it.
        assert_eq!(s.per_second, vec![9_990, 7_505]);
        assert_eq!(s.slowest_second, Some(7_505));
        assert_eq!(s.fastest_second, Some(9_990));
        assert!((s.average - 20_500.0 / 2.6).abs() < 1e-6);
    }

    #[test]
    fn points_are_thinned_and_end_with_the_final_count() {
        let mut ramp = Ramp::new();
        for t in 1..=1000 {
            ramp.record(ms(t), t);
        }
        ramp.finish(ms(1005), 1000);
        let points = ramp.points();
        assert_eq!(points[0], (0.0, 0));
        assert!(points.len() <= 12, "{}", points.len());
        assert_eq!(*points.last().unwrap(), (1.005, 1000));
        assert!(points.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn a_short_setup_has_no_whole_second() {
        let mut ramp = Ramp::new();
        ramp.finish(ms(400), 2000);
        let s = ramp.summary(ms(400));
        assert_eq!((s.slowest_second, s.average), (None, 5000.0));
    }

    #[test]
    fn a_stall_spanning_seconds_counts_as_zero() {
        let mut ramp = Ramp::new();
        ramp.record(ms(500), 100);
        ramp.record(ms(3200), 150);
        assert_eq!(ramp.summary(ms(3200)).per_second, vec![100, 0, 0]);
    }
}

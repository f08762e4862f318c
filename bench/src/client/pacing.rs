//! Pacing arithmetic: how many events of a steady rate are due after some
//! time, and how connection attempts are spread over worker processes.
//! Pure functions, shared by connection setup and the echo senders.

use std::time::Duration;

/// `total` events at `rate` per second; event `k` (from 0) is due at `k / rate`,
/// so the first one is due at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    rate: f64,
    total: u64,
}

impl Schedule {
    /// A schedule of `total` events at `rate` (> 0) per second.
    pub fn new(rate: f64, total: u64) -> Schedule {
        assert!(rate > 0.0, "rate must be positive");
        Schedule { rate, total }
    }

    /// Events due once `elapsed` has passed since the start (at most `total`).
    pub fn due(&self, elapsed: Duration) -> u64 {
        // Saturating float-to-int conversion: a huge elapsed time is just "all".
        let due = (elapsed.as_secs_f64() * self.rate).floor() as u64;
        due.saturating_add(1).min(self.total)
    }

    /// Time from the start at which event `index` is due.
    pub fn due_at(&self, index: u64) -> Duration {
        Duration::from_secs_f64(index as f64 / self.rate)
    }
}

/// `total` split into `parts` shares that differ by at most one, larger first.
pub fn split_evenly(total: usize, parts: usize) -> Vec<usize> {
    assert!(parts > 0, "at least one part");
    (0..parts)
        .map(|i| total / parts + usize::from(i < total % parts))
        .collect()
}

/// Splits `count` new connection attempts among workers.
///
/// Workers are filled in order, `active` of them at a time: the attempts go
/// evenly to the first `active` workers that still have room (`started[i] <
/// capacity[i]`). Few active workers keep the number of busy client
/// processes (and their context switches) low, while more than one lets the
/// client use more than one CPU. Returns the grant per worker; their sum is
/// `count` unless every worker is full.
pub fn grant(started: &[usize], capacity: &[usize], count: usize, active: usize) -> Vec<usize> {
    assert_eq!(started.len(), capacity.len());
    let mut grants = vec![0; started.len()];
    let mut left = count;
    // Each pass either places everything or fills at least one worker.
    while left > 0 {
        let room = |grants: &[usize], i: usize| capacity[i].saturating_sub(started[i] + grants[i]);
        let open: Vec<usize> = (0..started.len())
            .filter(|&i| room(&grants, i) > 0)
            .take(active.max(1))
            .collect();
        if open.is_empty() {
            break;
        }
        for (&i, share) in open.iter().zip(split_evenly(left, open.len())) {
            let take = share.min(room(&grants, i));
            grants[i] += take;
            left -= take;
        }
    }
    grants
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_event_is_due_at_once_then_one_per_period() {
        let s = Schedule::new(10_000.0, 1_000_000);
        assert_eq!(s.due(Duration::ZERO), 1);
        assert_eq!(s.due(Duration::from_micros(99)), 1);
        assert_eq!(s.due(Duration::from_micros(100)), 2);
        assert_eq!(s.due(Duration::from_secs(1)), 10_001);
        assert_eq!(s.due(Duration::from_secs(100)), 1_000_000);
        assert_eq!(s.due(Duration::MAX), 1_000_000);
        assert_eq!(s.due_at(10_000), Duration::from_secs(1));
    }

    #[test]
    fn fractional_rates() {
        let s = Schedule::new(0.5, 10);
        assert_eq!(s.due(Duration::from_millis(1999)), 1);
        assert_eq!(s.due(Duration::from_secs(2)), 2);
        assert_eq!(s.due_at(3), Duration::from_secs(6));
    }

    #[test]
    fn even_splits() {
        assert_eq!(split_evenly(10, 3), vec![4, 3, 3]);
        assert_eq!(split_evenly(2, 4), vec![1, 1, 0, 0]);
        assert_eq!(split_evenly(1_000_000, 52).iter().sum::<usize>(), 1_000_000);
        assert!(split_evenly(1_000_000, 52).iter().all(|&n| n < 20_000));
    }

    #[test]
    fn grants_fill_workers_in_order_two_at_a_time() {
        let capacity = [10, 10, 10, 10];
        assert_eq!(grant(&[0, 0, 0, 0], &capacity, 6, 2), vec![3, 3, 0, 0]);
        assert_eq!(grant(&[10, 4, 0, 0], &capacity, 8, 2), vec![0, 4, 4, 0]);
        assert_eq!(grant(&[10, 10, 9, 0], &capacity, 5, 2), vec![0, 0, 1, 4]);
        assert_eq!(grant(&[10, 10, 10, 8], &capacity, 5, 2), vec![0, 0, 0, 2]);
        assert_eq!(grant(&[0, 5], &[10, 10], 3, 2), vec![2, 1]);
        assert_eq!(grant(&[0, 0, 0], &[5, 5, 5], 15, 1), vec![5, 5, 5]);
        assert_eq!(grant(&[], &[], 5, 2), Vec::<usize>::new());
    }

    #[test]
    fn grants_are_exact_and_respect_capacity() {
        let capacity = vec![19_500; 52];
        let mut started = vec![0; 52];
        let mut total = 0;
        for count in [1, 7, 512, 3000, 150, 19_999] {
            let g = grant(&started, &capacity, count, 3);
            assert_eq!(g.iter().sum::<usize>(), count);
            for (s, g) in started.iter_mut().zip(&g) {
                *s += g;
            }
            total += count;
            assert!(started.iter().all(|&s| s <= 19_500));
            assert_eq!(started.iter().sum::<usize>(), total);
            // At most three workers are partly filled at any time.
            assert!(started.iter().filter(|&&s| s > 0 && s < 19_500).count() <= 3);
        }
    }
}

//! Reconnecting: a source that reads from a server over a connection
//! (a broker: Redis today) runs its sessions through [`keep_reading`],
//! which reports an outage once, reconnects with a jittered backoff and
//! reports the end of the outage.

use std::fmt::Display;
use std::time::{Duration, Instant, SystemTime};

use super::source::FeedEvent;

/// The first reconnection's delay.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// The longest delay between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Where a reader reads, for its logs.
#[derive(Debug, Clone, Copy)]
pub struct Where<'a> {
    /// The server (no password).
    pub server: &'a str,
    /// What it reads there: `feed` or `stream KEY`.
    pub what: &'a str,
    /// What it does once connected: `subscribed`, `reading`.
    pub ready: &'a str,
    /// What becomes of what is published during an outage.
    pub meanwhile: &'a str,
}

/// Runs `session` again and again until `on` returns false (or, between
/// attempts and chunks, `halted` says to stop): a session
/// connects, calls its argument with `None` once it reads, then with each
/// chunk, and returns the error that ended it (or `Ok` once its argument
/// returned false). An outage is reported once ([`FeedEvent::Lost`], one
/// warning), reconnected with a jittered backoff, and its end reported
/// ([`FeedEvent::Restored`], one line with the outage and the attempts).
pub fn keep_reading<E: Display>(
    source: Where<'_>,
    mut session: impl FnMut(&mut dyn FnMut(Option<Vec<u8>>) -> bool) -> Result<(), E>,
    mut on: impl FnMut(FeedEvent) -> bool,
    halted: &dyn Fn() -> bool,
) {
    let Where {
        server,
        what,
        ready,
        meanwhile,
    } = source;
    let mut backoff = MIN_BACKOFF;
    // When the outage began, and the attempts since.
    let mut lost: Option<(Instant, u32)> = None;
    while !halted() {
        let mut reading = false;
        let ended = session(&mut |chunk| {
            if halted() {
                return false;
            }
            if !reading {
                reading = true;
                backoff = MIN_BACKOFF;
                match lost.take() {
                    Some((since, attempts)) => {
                        let outage = since.elapsed();
                        let go_on = on(FeedEvent::Restored(outage));
                        log::info!(
                            "redis {what} restored on {server} after {:.1} s ({attempts} attempts)",
                            outage.as_secs_f64()
                        );
                        if !go_on {
                            return false;
                        }
                    }
                    None => log::info!("redis {what}: {ready} on {server}"),
                }
            }
            match chunk {
                Some(chunk) => on(FeedEvent::Chunk(chunk)),
                None => true,
            }
        });
        let error = match ended {
            Ok(()) => return, // `on` asked to stop.
            Err(e) => e,
        };
        match &mut lost {
            Some((_, attempts)) => {
                *attempts += 1;
                log::debug!("redis {what}: still unreachable on {server}: {error}");
            }
            None => {
                lost = Some((Instant::now(), 1));
                let go_on = on(FeedEvent::Lost);
                log::warn!("redis {what} lost on {server}: {error}; reconnecting ({meanwhile})");
                if !go_on {
                    return;
                }
            }
        }
        std::thread::sleep(jittered(backoff));
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// `delay` scaled by a factor in [0.5, 1): reconnections of many hosts
/// spread out.
fn jittered(delay: Duration) -> Duration {
    let noise = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos() % 1000);
    delay.mul_f64(0.5 + f64::from(noise) / 2000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_keeps_delays_between_half_and_whole() {
        for _ in 0..100 {
            let d = jittered(Duration::from_millis(1000));
            assert!(d >= Duration::from_millis(500) && d < Duration::from_millis(1000));
        }
    }
}

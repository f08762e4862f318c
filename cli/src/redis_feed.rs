//! The Redis input (`--redis URL --redis-channel NAME`): one pub/sub
//! subscription whose messages are read as input, beside standard input.
//!
//! The subscription runs on a thread of its own with the `redis` crate's
//! blocking client; nothing of it reaches the loop but lines, which take
//! the same path as standard input's. Names with `*`, `?` or `[` are
//! patterns (`PSUBSCRIBE`), others channels (`SUBSCRIBE`).
//!
//! When the connection is lost (an error, or no answer to a `PING` sent
//! after [`PING_AFTER`] of silence within as long again), the reader says
//! so once ([`FeedEvent::Lost`], one warning), then reconnects with a
//! backoff from [`MIN_BACKOFF`] doubling to [`MAX_BACKOFF`] (jittered, so
//! that many hosts do not reconnect in step), and says when it is back
//! ([`FeedEvent::Restored`], one line with the outage and the attempts).
//! Redis pub/sub is at-most-once: what is published meanwhile is lost.

use std::time::{Duration, Instant, SystemTime};

use redis::{Client, RedisError};

use crate::chunks::WholeLines;

/// Silence after which the reader pings Redis; the answer must come
/// within as long again.
pub const PING_AFTER: Duration = Duration::from_secs(1);
/// Time allowed to connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The first reconnection's delay.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// The longest delay between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What a reader reports.
#[derive(Debug, PartialEq, Eq)]
pub enum FeedEvent {
    /// Whole lines read (and control lines).
    Chunk(Vec<u8>),
    /// The connection is lost (or could not be made at the start).
    Lost,
    /// It is back after this outage.
    Restored(Duration),
}

/// Where a reader reads, for its logs.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The server (no password).
    pub server: &'a str,
    /// What it reads there: `feed` or `stream KEY`.
    pub what: &'a str,
    /// What it does once connected: `subscribed`, `reading`.
    pub ready: &'a str,
    /// What becomes of what is published during an outage.
    pub meanwhile: &'a str,
}

/// Runs `session` again and again until `on` returns false: a session
/// connects, calls its argument with `None` once it reads, then with each
/// chunk, and returns the error that ended it (or `Ok` once its argument
/// returned false). An outage is reported once ([`FeedEvent::Lost`], one
/// warning), reconnected with a jittered backoff, and its end reported
/// ([`FeedEvent::Restored`], one line with the outage and the attempts).
pub fn keep_reading(
    source: Source<'_>,
    mut session: impl FnMut(&mut dyn FnMut(Option<Vec<u8>>) -> bool) -> Result<(), RedisError>,
    mut on: impl FnMut(FeedEvent) -> bool,
) {
    let Source {
        server,
        what,
        ready,
        meanwhile,
    } = source;
    let mut backoff = MIN_BACKOFF;
    // When the outage began, and the attempts since.
    let mut lost: Option<(Instant, u32)> = None;
    loop {
        let mut reading = false;
        let ended = session(&mut |chunk| {
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

/// A Redis subscription to read.
#[derive(Debug)]
pub struct RedisFeed {
    client: Client,
    /// The server, for logs (no password).
    server: String,
    channels: Vec<String>,
    patterns: Vec<String>,
}

impl RedisFeed {
    /// A subscription to `names` on the server of `url`
    /// (`redis://[:PASSWORD@]HOST[:PORT][/DB]`); an error names what is
    /// wrong with them.
    pub fn new(url: &str, names: &[String]) -> Result<RedisFeed, String> {
        let client = client(url)?;
        if let Some(empty) = names.iter().find(|n| n.is_empty()) {
            return Err(format!("--redis-channel `{empty}`: a name cannot be empty"));
        }
        let is_pattern = |n: &&String| n.contains(['*', '?', '[']);
        Ok(RedisFeed {
            server: client.get_connection_info().addr().to_string(),
            client,
            channels: names.iter().filter(|n| !is_pattern(n)).cloned().collect(),
            patterns: names.iter().filter(is_pattern).cloned().collect(),
        })
    }

    /// Subscribes and hands every message to `on`, as whole lines of at
    /// most `max_line` bytes, reconnecting whenever the connection is
    /// lost, until `on` returns false.
    pub fn run(self, max_line: usize, on: impl FnMut(FeedEvent) -> bool) {
        let mut lines = WholeLines::new(max_line);
        let source = Source {
            server: &self.server,
            what: "feed",
            ready: "subscribed",
            meanwhile: "what is published meanwhile is lost",
        };
        keep_reading(
            source,
            |read| {
                self.session(&mut |message| {
                    read(message.map(|message| {
                        let mut chunk = Vec::with_capacity(message.len() + 1);
                        lines.push_message(message, &mut chunk);
                        chunk
                    }))
                })
            },
            on,
        );
    }

    /// One connection: subscribes (then calls `on(None)`), hands each
    /// message over as `on(Some(payload))`; returns `Ok` once `on` returns
    /// false, or the error that ended the connection.
    fn session(&self, on: &mut dyn FnMut(Option<&[u8]>) -> bool) -> Result<(), RedisError> {
        let mut connection = self.client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
        connection.set_write_timeout(Some(PING_AFTER))?;
        let mut pubsub = connection.as_pubsub();
        if !self.channels.is_empty() {
            pubsub.subscribe(&self.channels)?;
        }
        if !self.patterns.is_empty() {
            pubsub.psubscribe(&self.patterns)?;
        }
        pubsub.set_read_timeout(Some(PING_AFTER))?;
        if !on(None) {
            return Ok(());
        }
        loop {
            match pubsub.get_message() {
                Ok(message) => {
                    if !on(Some(message.get_payload_bytes())) {
                        return Ok(());
                    }
                }
                Err(e) if e.is_timeout() => {
                    // Silence: Redis must answer a ping (messages that
                    // arrive first are kept for `get_message`).
                    pubsub.ping::<redis::Value>()?;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The client of `url`, or what is wrong with it.
pub fn client(url: &str) -> Result<Client, String> {
    Client::open(url).map_err(|e| format!("--redis {url}: {e}"))
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
    fn names_with_wildcards_are_patterns() {
        let names: Vec<String> = ["news", "prices.*", "a?", "[ab]x", "plain.name"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let feed = RedisFeed::new("redis://127.0.0.1:6379", &names).unwrap();
        assert_eq!(feed.channels, ["news", "plain.name"]);
        assert_eq!(feed.patterns, ["prices.*", "a?", "[ab]x"]);
        assert_eq!(feed.server, "127.0.0.1:6379");
    }

    #[test]
    fn bad_settings_are_refused_with_what_is_wrong() {
        let news = vec!["news".to_string()];
        let e = RedisFeed::new("http://127.0.0.1", &news).unwrap_err();
        assert!(e.starts_with("--redis http://127.0.0.1: "), "{e}");
        let e = RedisFeed::new("redis://127.0.0.1", &[String::new()]).unwrap_err();
        assert!(e.contains("cannot be empty"), "{e}");
    }

    #[test]
    fn jitter_keeps_delays_between_half_and_whole() {
        for _ in 0..100 {
            let d = jittered(Duration::from_millis(1000));
            assert!(d >= Duration::from_millis(500) && d < Duration::from_millis(1000));
        }
    }
}

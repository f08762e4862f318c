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
//! so once ([`FeedEvent::Lost`](super::FeedEvent::Lost), one warning), then reconnects with a
//! backoff from [`MIN_BACKOFF`](super::reconnect::MIN_BACKOFF) doubling to [`MAX_BACKOFF`](super::reconnect::MAX_BACKOFF) (jittered, so
//! that many hosts do not reconnect in step), and says when it is back
//! ([`FeedEvent::Restored`](super::FeedEvent::Restored), one line with the outage and the attempts).
//! Redis pub/sub is at-most-once: what is published meanwhile is lost.

use std::sync::Arc;
use std::time::Duration;

use redis::{Client, RedisError};

use super::reconnect::{keep_reading, Where};
use super::source::{Outlet, Source};
use super::stop::{Carried, Halt, Stopper};
use crate::chunks::WholeLines;

/// Silence after which the reader pings Redis; the answer must come
/// within as long again.
pub const PING_AFTER: Duration = Duration::from_secs(1);
/// Time allowed to connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A Redis subscription to read.
#[derive(Debug)]
pub struct RedisFeed {
    client: Client,
    /// The server, for logs (no password).
    server: String,
    channels: Vec<String>,
    patterns: Vec<String>,
    /// Where a re-exec asks it to stop.
    halt: Arc<Halt<()>>,
}

/// A subscription stops for a re-exec between messages; it leaves
/// nothing (the next image subscribes again).
impl Stopper for Halt<()> {
    fn stop(&self) -> std::io::Result<()> {
        self.ask();
        Ok(())
    }

    fn carry(&self, _: &mut Carried) {}
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
            halt: Halt::shared(),
        })
    }

    /// How it stops for a re-exec.
    pub fn stopper(&self) -> Arc<dyn Stopper> {
        Arc::clone(&self.halt) as Arc<dyn Stopper>
    }

    /// Subscribes and hands every message to `out`, as whole lines,
    /// reconnecting whenever the connection is lost, until `out` is gone.
    fn read(self, out: &Outlet) {
        let mut lines = WholeLines::new(out.max_line());
        let source = Where {
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
            |event| out.event(event),
            &|| self.halt.asked(),
        );
        if self.halt.asked() {
            log::info!("redis feed stopped for the next image (it subscribes again there; what is published meanwhile is lost)");
        }
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
                    if !on(None) {
                        return Ok(());
                    }
                    // Silence: Redis must answer a ping (messages that
                    // arrive first are kept for `get_message`).
                    pubsub.ping::<redis::Value>()?;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Source for RedisFeed {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn run(self: Box<Self>, out: Outlet) {
        self.read(&out);
    }
}

/// The client of `url`, or what is wrong with it.
pub fn client(url: &str) -> Result<Client, String> {
    Client::open(url).map_err(|e| format!("--redis {url}: {e}"))
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
}

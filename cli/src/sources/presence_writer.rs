//! With `--redis` and `--presence-ttl`: the host's channel counts kept in
//! Redis, so that a fleet's presence is read in one place.
//!
//! Every third of the TTL, the writer asks the host's loops for every
//! channel's count (pages of [`MAX_LIMIT`], through the input like the
//! publish listener's questions: see [`crate::asks`]) and replaces, in
//! one transaction, the hash `wspush:presence:HOST` (field: channel,
//! value: open connections) with them, expiring after the TTL. The
//! sorted set `wspush:presence:hosts` scores each host by when its hash
//! expires (Unix ms): a reader takes the hosts scored after now, then
//! their hashes. A host that stops writing is gone from both after the
//! TTL. While Redis is away, a write fails: one warning per outage, and
//! the next write is the whole count again.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{Client, Connection, RedisError};
use wspush::protocol::names::ChannelName;
use wspush::protocol::presence::{Answer, Query, MAX_LIMIT};

use super::pubsub::{client, CONNECT_TIMEOUT};
use super::questions::ANSWER_TIMEOUT;
use super::source::{Outlet, Source};
use super::stop::{Halt, Stopper};
use crate::asks::Asks;
use crate::chunks::Control;

/// The hash of host HOST's counts is this followed by HOST.
pub const HASH_PREFIX: &str = "wspush:presence:";
/// The sorted set of hosts, scored by when their hash expires.
pub const HOSTS_KEY: &str = "wspush:presence:hosts";
/// Fields set by one command.
const FIELDS_PER_HSET: usize = 1000;
/// How often the writer looks whether a re-exec asks it to stop.
const HALT_CHECK: Duration = Duration::from_millis(200);

/// The host's channel counts, written to Redis.
#[derive(Debug)]
pub struct PresenceWriter {
    client: Client,
    /// The server, for logs (no password).
    server: String,
    host: String,
    ttl: Duration,
    asks: Arc<Asks>,
    halt: Arc<Halt<()>>,
}

impl PresenceWriter {
    /// Writes host `host`'s counts to the Redis of `url` for `ttl` (at
    /// least 3 s), asking through `asks`.
    pub fn new(
        url: &str,
        host: String,
        ttl: Duration,
        asks: Arc<Asks>,
    ) -> Result<PresenceWriter, String> {
        if ttl < Duration::from_secs(3) {
            return Err(format!("--presence-ttl {ttl:?}: at least 3s"));
        }
        let client = client(url)?;
        Ok(PresenceWriter {
            server: client.get_connection_info().addr().to_string(),
            client,
            host,
            ttl,
            asks,
            halt: Halt::shared(),
        })
    }

    /// How it stops for a re-exec (the next image writes again).
    pub fn stopper(&self) -> Arc<dyn Stopper> {
        Arc::clone(&self.halt) as Arc<dyn Stopper>
    }

    /// Every channel's count, page by page; `None` once the input is gone
    /// (or a re-exec stops it), `Some(Err)` if an answer did not come.
    fn counts(&self, out: &Outlet) -> Option<Result<Vec<(ChannelName, u64)>, String>> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let query = Query::Channels {
                after,
                limit: MAX_LIMIT,
            };
            let (tx, rx) = mpsc::channel();
            let id = self.asks.open(move |_, answer| {
                let _ = tx.send(answer);
            });
            if !out.send(Control::Ask { id, query }.line()) {
                return None;
            }
            let page = rx.recv_timeout(ANSWER_TIMEOUT);
            self.asks.forget(id);
            match page {
                Ok(Answer::Channels { channels, more }) => {
                    after = channels.last().map(|(name, _)| name.clone());
                    all.extend(channels);
                    if !more || after.is_none() {
                        return Some(Ok(all));
                    }
                }
                Ok(_) | Err(_) => return Some(Err(format!("no answer within {ANSWER_TIMEOUT:?}"))),
            }
            if self.halt.asked() {
                return None;
            }
        }
    }

    /// Replaces the host's hash with `counts`, in one transaction.
    fn write(
        &self,
        connection: &mut Connection,
        counts: &[(ChannelName, u64)],
    ) -> Result<(), RedisError> {
        let key = format!("{HASH_PREFIX}{}", self.host);
        let next = format!("{key}:next");
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let ttl_ms = self.ttl.as_millis() as u64;
        let mut pipe = redis::pipe();
        pipe.atomic().del(&next).ignore();
        for batch in counts.chunks(FIELDS_PER_HSET) {
            let fields: Vec<(&str, u64)> = batch.iter().map(|(c, n)| (c.as_str(), *n)).collect();
            pipe.hset_multiple(&next, &fields).ignore();
        }
        match counts.is_empty() {
            true => pipe.del(&key).ignore(),
            false => pipe
                .rename(&next, &key)
                .ignore()
                .pexpire(&key, ttl_ms as i64)
                .ignore(),
        };
        pipe.zadd(HOSTS_KEY, &self.host, now_ms + ttl_ms)
            .ignore()
            .zrembyscore(HOSTS_KEY, "-inf", now_ms)
            .ignore();
        pipe.query::<()>(connection)
    }

    /// Counts and writes every third of the TTL until the input is gone
    /// or a re-exec stops it.
    fn keep_writing(&self, out: &Outlet) {
        let every = self.ttl / 3;
        let mut connection: Option<Connection> = None;
        let mut failing_since: Option<Instant> = None;
        let mut next = Instant::now();
        loop {
            while Instant::now() < next {
                if self.halt.asked() {
                    return;
                }
                std::thread::sleep(HALT_CHECK.min(next.saturating_duration_since(Instant::now())));
            }
            next = Instant::now() + every;
            let counts = match self.counts(out) {
                None => return,
                Some(Ok(counts)) => counts,
                Some(Err(why)) => {
                    log::warn!("presence for Redis not counted: {why}; next in {every:?}");
                    continue;
                }
            };
            let written = match connection.as_mut() {
                Some(c) => self.write(c, &counts),
                None => self
                    .client
                    .get_connection_with_timeout(CONNECT_TIMEOUT)
                    .and_then(|mut c| self.write(&mut c, &counts).map(|()| c))
                    .map(|c| connection = Some(c)),
            };
            match (written, failing_since) {
                (Ok(()), Some(since)) => {
                    log::info!(
                        "presence written to redis {} again after {:?}",
                        self.server,
                        since.elapsed()
                    );
                    failing_since = None;
                }
                (Ok(()), None) => {}
                (Err(e), None) => {
                    log::warn!(
                        "cannot write presence to redis {} ({e}): tried again every {every:?}; readers see it expire after {:?}",
                        self.server,
                        self.ttl
                    );
                    connection = None;
                    failing_since = Some(Instant::now());
                }
                (Err(_), Some(_)) => connection = None,
            }
        }
    }
}

impl Source for PresenceWriter {
    fn name(&self) -> &'static str {
        "presence"
    }

    fn run(self: Box<Self>, out: Outlet) {
        self.keep_writing(&out);
    }
}

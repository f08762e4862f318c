//! Every limit and default of a server, validated once.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use crate::protocol::auth::{self, Tokens};
use crate::protocol::jwt::Verifier;
use crate::protocol::names::Pattern;
use crate::protocol::position::Epoch;

/// What to do with a broadcast for a connection whose output queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum SlowConsumerPolicy {
    /// Close the connection with 1008 (counted in `closed_slow_consumer`).
    Close,
    /// Skip this message for this connection (counted in `slow_consumer_drops`).
    Drop,
}

/// What happens to a client message when the reader is a bound behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Overflow {
    /// Stop reading clients until the reader catches up.
    Pause,
    /// Drop the message (counted in `upstream_dropped`).
    Drop,
}

/// How `/healthz` answers while a feed of the input (Redis) is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Degraded {
    /// `200 degraded`: the server still serves its clients, so a load
    /// balancer keeps it (every host loses the same feed at once).
    #[cfg_attr(feature = "cli", value(name = "200"))]
    Ok,
    /// `503 degraded`: a load balancer takes the server out.
    #[cfg_attr(feature = "cli", value(name = "503"))]
    Unavailable,
}

/// Upstream settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// Bytes of lines the reader may be behind.
    pub max_bytes: usize,
    /// What happens past that.
    pub overflow: Overflow,
    /// Also write `open` and `close` lines.
    pub events: bool,
}

/// Server configuration. [`Config::default`] listens on `127.0.0.1:0` with
/// the production defaults; [`Config::with`] changes some of them (more
/// settings may come, so a `Config` is not built field by field outside
/// this crate).
///
/// ```
/// use std::time::Duration;
/// use wspush::{Config, ConfigError};
///
/// let config = Config::default().with(|c| {
///     c.ping_interval = Duration::from_secs(15);
///     c.idle_timeout = Duration::from_secs(45);
///     c.max_connections = 10_000;
/// });
/// assert!(config.validate().is_ok());
///
/// // A setting out of its bounds is refused, by name, before anything binds.
/// let bad = config.clone().with(|c| c.ping_interval = Duration::ZERO);
/// match bad.validate() {
///     Err(ConfigError::OutOfRange { setting, .. }) => assert_eq!(setting, "ping interval"),
///     other => panic!("not refused: {other:?}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Bind with `SO_REUSEPORT`, so several processes can listen on one
    /// address and the kernel spreads connections among them.
    pub reuse_port: bool,
    /// Serve WebSocket upgrades only on this path (query ignored); other
    /// paths get 404. `None` serves every path.
    pub path: Option<String>,
    /// Serve a demo page on a plain `GET /` (an upgrade on `/` is still
    /// one): it opens a WebSocket back to the server on `/` and lists what
    /// arrives. Needs `path` unset or `/`.
    pub demo: bool,
    /// Echo every client message back with the same opcode (conformance
    /// testing); otherwise client data messages are counted and discarded.
    pub echo: bool,
    /// Largest message accepted from a client, and largest broadcast, in bytes.
    pub max_message_bytes: u64,
    /// Connections held at most; further ones get 503.
    pub max_connections: usize,
    /// Largest HTTP request head, in bytes; larger gets 431.
    pub max_head_bytes: usize,
    /// Output a connection may have pending before the slow-consumer policy applies.
    pub max_queued_bytes: usize,
    /// What happens to a broadcast a slow consumer has no room for.
    pub slow_consumer: SlowConsumerPolicy,
    /// Time allowed from accept to a complete upgrade request.
    pub handshake_timeout: Duration,
    /// Time allowed for the close handshake and final flush once closing began.
    pub close_timeout: Duration,
    /// Every open connection gets a ping this often (one shared frame).
    pub ping_interval: Duration,
    /// A connection that sends nothing (no pong, no data) this long is
    /// closed with 1001; checked once per ping interval, so it is closed
    /// at most one interval later, plus what broadcasts and accept storms
    /// held the checks back (docs/OPERATIONS.md). At least `ping_interval`.
    pub idle_timeout: Duration,
    /// On shutdown, how long to wait for close replies and flushes.
    pub shutdown_timeout: Duration,
    /// A drain (`Handle::drain`) closes the
    /// connections with 1012 spread evenly over this time. Zero: a drain
    /// is a shutdown (`Handle::shutdown`), every
    /// connection closed at once with 1001.
    pub drain_time: Duration,
    /// A drain first says so on `/healthz` (503 `draining`) and goes on
    /// accepting this long, so that load balancers stop sending new
    /// clients before it stops listening.
    pub drain_grace: Duration,
    /// Connections one client IP address may hold; more get 429. `None`: no limit.
    pub max_connections_per_ip: Option<usize>,
    /// Browsers' `Origin` values allowed to connect (exact, as
    /// `scheme://host[:port]`); others get 403. Empty allows any.
    pub allowed_origins: Vec<String>,
    /// Tokens a client must present (`Authorization: Bearer` or
    /// `?token=`); missing or wrong gets 401. `None`: no token needed.
    pub tokens: Option<Tokens>,
    /// Signed tokens (JWT) a client may present (`Authorization: Bearer`,
    /// `?token=`, or the `wspush_token` cookie where origins are
    /// checked), checked against these keys: one listed in `tokens` or a
    /// good signed one is needed when either is set (401 otherwise, the
    /// body saying why). A signed token's `sub` is the client's id, its
    /// `channels` the channels it may ask for, and its connection is
    /// closed with 4001 before its `exp`. `None`: not taken.
    pub jwt: Option<Verifier>,
    /// An `?id=` that no token binds is refused (403): the setting for
    /// production, where ids name users.
    pub require_token_id: bool,
    /// Serve `/metrics` (and `/healthz`) on this address instead of on the
    /// main listener, e.g. a localhost-only one.
    pub metrics_listen: Option<SocketAddr>,
    /// Log a line with the key counters this often (`None`: never).
    pub stats_interval: Option<Duration>,
    /// After a poll that found several events (they arrive faster than the
    /// loop sleeps and wakes for each), poll again no sooner than this
    /// after that poll returned (handling its events counts towards it),
    /// so that one poll collects what arrives meanwhile: fewer
    /// wake-ups and system calls per message under load, for at most this
    /// much added latency. Zero polls at once. At most [`MAX_BATCH_DELAY`].
    pub batch_delay: Duration,
    /// Bytes of broadcasts queued for the loop and not yet sent, at most
    /// (each message counts its payload and 64 bytes): a producer this far
    /// ahead waits in `Handle::broadcast_text`,
    /// and the binary stops reading its input meanwhile. Nothing is dropped.
    pub max_pending_bytes: usize,
    /// Connection visits per loop iteration, shared by every kind of
    /// delivery (the pass of broadcasts, the walk over the recipients of a
    /// channel's or an id's messages and closes) and, apart, by the
    /// heartbeat sweep, before the loop serves its other events again: a
    /// delivery to many connections goes on over several iterations, and
    /// accepts, reads, pongs and timers are served in between.
    pub fanout_budget: usize,
    /// Channels a client may ask for in its upgrade (`?channel=`) without
    /// a token granting its own; others get 403. Empty allows any.
    pub allowed_channels: Vec<Pattern>,
    /// Channels one connection may ask for in its upgrade; more get 400.
    pub max_channels_per_connection: usize,
    /// Channels the server holds at once (a channel exists while it has a
    /// subscriber); an upgrade that would make more gets 503.
    pub max_channels: usize,
    /// This server's number under a supervisor (1 to N), 0 when alone: the
    /// first part of the connection keys it gives out and acts on.
    #[cfg(feature = "internals")]
    pub instance: u32,
    #[cfg(not(feature = "internals"))]
    pub(crate) instance: u32,
    /// Write what clients send as lines for a reader
    /// (`Server::upstream`). `None`: client data
    /// messages are counted and discarded (or echoed).
    pub upstream: Option<UpstreamConfig>,
    /// Accept permessage-deflate (RFC 7692) from clients that offer it:
    /// broadcasts of `deflate_min_bytes` or more are compressed once for
    /// all of them, and their compressed messages inflated (at most
    /// `max_message_bytes`) by one inflater for all.
    pub deflate: bool,
    /// With `deflate`: broadcasts of at least this many bytes are
    /// compressed (once each, for every connection that negotiated it), and
    /// so are echoes (`echo`, per connection, at a faster level); smaller
    /// ones go plain, their compression worth less than its time.
    pub deflate_min_bytes: usize,
    /// How `/healthz` answers while a feed is lost (the binary's Redis
    /// feed, which tells its handle so under the `internals` feature).
    #[cfg(feature = "internals")]
    pub degraded: Degraded,
    #[cfg(not(feature = "internals"))]
    pub(crate) degraded: Degraded,
    /// Messages kept for clients that resume (`?since=`): at most this
    /// many (0 keeps none: every resume but one from the last position is
    /// a gap) ...
    pub history_messages: usize,
    /// ... at most this many bytes of frames (as framed: with positions,
    /// and compressed too) ...
    pub history_bytes: usize,
    /// ... and none older than this.
    pub history_age: Duration,
    /// The epoch of the positions given out (`None`: a new one). Servers
    /// that number their messages the same way (see
    /// `Handle::send_at`) and share an epoch
    /// give the same positions, as the instances of a supervisor do. A
    /// client may then resume from a position another server gave out
    /// and this one has not reached yet: it waits for this one to reach
    /// it, for the handshake timeout at most (then it is closed with
    /// 1013, Try Again Later, and counted as `ahead`).
    pub epoch: Option<Epoch>,
    /// The position the first message gets (unless its source numbers it).
    #[cfg(feature = "internals")]
    pub first_position: u64,
    #[cfg(not(feature = "internals"))]
    pub(crate) first_position: u64,
    /// Read the history another process writes (a supervisor's, whose
    /// instances inherit its descriptor; see
    /// [`SharedHistory::reader_fd`](crate::SharedHistory::reader_fd))
    /// instead of keeping one. The server reads it through a duplicate of
    /// the descriptor; the epoch is the history's.
    pub history_fd: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// The host's shared words: a memory file of at least a page (made
    /// with [`host_memory`](crate::host_memory)) that every server of the host maps read-write, so that each one's
    /// heartbeat yields to the others' broadcasts (a supervisor's instances
    /// inherit its descriptor). None: a page of this server's own.
    #[cfg(feature = "internals")]
    pub host_fd: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    #[cfg(not(feature = "internals"))]
    pub(crate) host_fd: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// The host's metrics board and this server's slot on it (a
    /// supervisor's, see `Board`): its counters are kept there, where
    /// the host's other processes read them, and `/metrics` on the main
    /// listener answers the host's sums. None: its own counters.
    #[cfg(feature = "internals")]
    pub metrics_board: Option<crate::ops::board::MetricsBoard>,
    #[cfg(not(feature = "internals"))]
    pub(crate) metrics_board: Option<crate::ops::board::MetricsBoard>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            reuse_port: false,
            path: None,
            demo: false,
            echo: false,
            max_message_bytes: 1 << 20,
            max_connections: 1_000_000,
            max_head_bytes: 8 * 1024,
            max_queued_bytes: 1 << 20,
            slow_consumer: SlowConsumerPolicy::Close,
            handshake_timeout: Duration::from_secs(10),
            close_timeout: Duration::from_secs(5),
            ping_interval: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(5),
            drain_time: Duration::from_secs(10),
            drain_grace: Duration::from_secs(2),
            max_connections_per_ip: None,
            allowed_origins: Vec::new(),
            tokens: None,
            jwt: None,
            require_token_id: false,
            metrics_listen: None,
            stats_interval: Some(Duration::from_secs(10)),
            batch_delay: DEFAULT_BATCH_DELAY,
            max_pending_bytes: 16 << 20,
            fanout_budget: 1024,
            allowed_channels: Vec::new(),
            max_channels_per_connection: 16,
            max_channels: 100_000,
            instance: 0,
            upstream: None,
            degraded: Degraded::Ok,
            deflate: true,
            deflate_min_bytes: 256,
            history_messages: 10_000,
            history_bytes: 16 << 20,
            history_age: Duration::from_secs(300),
            epoch: None,
            first_position: 1,
            history_fd: None,
            host_fd: None,
            metrics_board: None,
        }
    }
}

/// The default [`Config::batch_delay`].
pub const DEFAULT_BATCH_DELAY: Duration = Duration::from_micros(500);

/// The longest [`Config::batch_delay`].
pub const MAX_BATCH_DELAY: Duration = Duration::from_millis(10);

/// Longest timeout or interval a setting may have: one year. Deadlines are
/// instants this far ahead, which must not overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest idle timeout in ping intervals (connections count silent
/// intervals in 15 bits).
pub const MAX_SILENT_INTERVALS: u16 = 0x7FFE;

/// The largest `max_message_bytes`: frames are tracked with 32-bit offsets.
pub const MAX_MESSAGE_LIMIT: u64 = (u32::MAX - 16) as u64;

/// Why a [`Config`] is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting outside what it may be.
    OutOfRange {
        /// The setting, in words (`"max message bytes"`).
        setting: &'static str,
        /// What it must be (`"at least 1"`).
        must_be: String,
    },
    /// The upgrade path does not start with `/`, or has a query.
    Path(String),
    /// The demo page with an upgrade path other than `/`.
    DemoPath(String),
    /// An allowed origin that is not an origin: why.
    Origin(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::OutOfRange { setting, must_be } => {
                write!(f, "{setting} must be {must_be}")
            }
            ConfigError::Path(path) => {
                write!(f, "path must start with '/' and have no query: {path:?}")
            }
            ConfigError::DemoPath(path) => write!(
                f,
                "the demo page connects to /, so the demo needs path / or none, not {path:?}"
            ),
            ConfigError::Origin(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ConfigError {}

/// `setting` must be `must_be`.
fn out_of_range(setting: &'static str, must_be: impl Into<String>) -> Result<(), ConfigError> {
    Err(ConfigError::OutOfRange {
        setting,
        must_be: must_be.into(),
    })
}

/// Which messages are compressed for the connections that negotiated
/// permessage-deflate: one rule for broadcasts, the history's records and
/// echoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Compression {
    /// Messages at least this long (`None`: permessage-deflate is off).
    min_bytes: Option<usize>,
}

impl Compression {
    /// Whether a message of `len` bytes is compressed.
    pub(crate) fn worth(self, len: usize) -> bool {
        self.min_bytes.is_some_and(|min| len >= min)
    }
}

impl Config {
    /// Which messages are compressed (`deflate`, `deflate_min_bytes`).
    pub(crate) fn compression(&self) -> Compression {
        Compression {
            min_bytes: self.deflate.then_some(self.deflate_min_bytes),
        }
    }

    /// This configuration with `change` applied:
    /// `Config::default().with(|c| c.max_connections = 10_000)`.
    pub fn with(mut self, change: impl FnOnce(&mut Config)) -> Config {
        change(&mut self);
        self
    }

    /// Checks every setting; the server refuses to start otherwise.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(path) = &self.path {
            if !path.starts_with('/') || path.contains('?') {
                return Err(ConfigError::Path(path.clone()));
            }
        }
        if let (true, Some(path)) = (self.demo, &self.path) {
            if path != "/" {
                return Err(ConfigError::DemoPath(path.clone()));
            }
        }
        if self.max_message_bytes == 0 || self.max_message_bytes > MAX_MESSAGE_LIMIT {
            return out_of_range("max message bytes", format!("1..={MAX_MESSAGE_LIMIT}"));
        }
        if self.max_connections == 0 {
            return out_of_range("max connections", "at least 1");
        }
        if !(256..=1 << 20).contains(&self.max_head_bytes) {
            return out_of_range("max head bytes", "256..=1048576");
        }
        if self.max_queued_bytes == 0 {
            return out_of_range("max queued bytes", "at least 1");
        }
        if self.max_pending_bytes == 0 {
            return out_of_range("max pending bytes", "at least 1");
        }
        if self.upstream.is_some_and(|up| up.max_bytes == 0) {
            return out_of_range("upstream max bytes", "at least 1");
        }
        if self.max_channels_per_connection == 0 || self.max_channels == 0 {
            return out_of_range("max channels (per connection and in all)", "at least 1");
        }
        if self.fanout_budget == 0 {
            return out_of_range("fan-out budget", "at least 1 connection");
        }
        let durations = [
            ("handshake timeout", self.handshake_timeout),
            ("close timeout", self.close_timeout),
            ("shutdown timeout", self.shutdown_timeout),
            ("ping interval", self.ping_interval),
            ("idle timeout", self.idle_timeout),
            ("history age", self.history_age),
        ];
        if let Some((name, _)) = durations.iter().find(|(_, d)| d.is_zero()) {
            return out_of_range(name, "longer than zero");
        }
        let stats = ("stats interval", self.stats_interval.unwrap_or_default());
        let drain = [
            ("drain time", self.drain_time),
            ("drain grace", self.drain_grace),
        ];
        if let Some((name, _)) = durations
            .iter()
            .chain([&stats])
            .chain(&drain)
            .find(|(_, d)| *d > MAX_DURATION)
        {
            return out_of_range(name, "at most 365 days");
        }
        if self.idle_timeout < self.ping_interval {
            return out_of_range(
                "idle timeout",
                "at least the ping interval (a client that only answers pings would time out)",
            );
        }
        if self.idle_timeout.as_nanos() / self.ping_interval.as_nanos()
            >= u128::from(MAX_SILENT_INTERVALS)
        {
            return out_of_range(
                "idle timeout",
                format!("under {MAX_SILENT_INTERVALS} ping intervals"),
            );
        }
        if self.max_connections_per_ip == Some(0) {
            return out_of_range("max connections per IP", "at least 1");
        }
        for origin in &self.allowed_origins {
            auth::check_origin(origin).map_err(ConfigError::Origin)?;
        }
        if self.stats_interval.is_some_and(|d| d.is_zero()) {
            return out_of_range("stats interval", "longer than zero");
        }
        if self.batch_delay > MAX_BATCH_DELAY {
            return out_of_range(
                "batch delay",
                format!("at most {} ms", MAX_BATCH_DELAY.as_millis()),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        assert_eq!(Config::default().validate(), Ok(()));
        // Each with the setting it is out of range in (None: another error,
        // checked below).
        let bad: [(Config, Option<&str>); 13] = [
            (
                Config {
                    path: Some("ws".into()),
                    ..Config::default()
                },
                None,
            ),
            (
                Config {
                    demo: true,
                    path: Some("/ws".into()),
                    ..Config::default()
                },
                None,
            ),
            (
                Config {
                    max_message_bytes: 0,
                    ..Config::default()
                },
                Some("max message bytes"),
            ),
            (
                Config {
                    max_connections: 0,
                    ..Config::default()
                },
                Some("max connections"),
            ),
            (
                Config {
                    max_head_bytes: 10,
                    ..Config::default()
                },
                Some("max head bytes"),
            ),
            (
                Config {
                    close_timeout: Duration::ZERO,
                    ..Config::default()
                },
                Some("close timeout"),
            ),
            (
                Config {
                    ping_interval: Duration::from_secs(10),
                    idle_timeout: Duration::from_secs(5),
                    ..Config::default()
                },
                Some("idle timeout"),
            ),
            (
                Config {
                    ping_interval: Duration::from_millis(1),
                    idle_timeout: Duration::from_secs(3600),
                    ..Config::default()
                },
                Some("idle timeout"),
            ),
            (
                Config {
                    max_connections_per_ip: Some(0),
                    ..Config::default()
                },
                Some("max connections per IP"),
            ),
            (
                Config {
                    allowed_origins: vec!["https://example.com/".into()],
                    ..Config::default()
                },
                None,
            ),
            (
                Config {
                    batch_delay: MAX_BATCH_DELAY + Duration::from_nanos(1),
                    ..Config::default()
                },
                Some("batch delay"),
            ),
            (
                Config {
                    shutdown_timeout: MAX_DURATION + Duration::from_nanos(1),
                    ..Config::default()
                },
                Some("shutdown timeout"),
            ),
            (
                Config {
                    stats_interval: Some(MAX_DURATION + Duration::from_secs(1)),
                    ..Config::default()
                },
                Some("stats interval"),
            ),
        ];
        for (config, setting) in bad {
            let error = config.validate().expect_err(&format!("{config:?}"));
            match (&error, setting) {
                (ConfigError::OutOfRange { setting: named, .. }, Some(setting)) => {
                    assert_eq!(*named, setting, "{config:?}")
                }
                (ConfigError::OutOfRange { .. }, None) => panic!("{error} for {config:?}"),
                (_, None) => {}
                (_, Some(setting)) => panic!("{error}, not about {setting}, for {config:?}"),
            }
            assert!(!error.to_string().is_empty());
        }
        assert_eq!(
            Config {
                path: Some("ws".into()),
                ..Config::default()
            }
            .validate(),
            Err(ConfigError::Path("ws".into()))
        );
        assert_eq!(
            Config {
                demo: true,
                path: Some("/ws".into()),
                ..Config::default()
            }
            .validate(),
            Err(ConfigError::DemoPath("/ws".into()))
        );
        assert!(matches!(
            Config {
                allowed_origins: vec!["https://example.com/".into()],
                ..Config::default()
            }
            .validate(),
            Err(ConfigError::Origin(_))
        ));
        for path in [None, Some("/".to_string())] {
            let demo = Config {
                demo: true,
                path,
                ..Config::default()
            };
            assert_eq!(demo.validate(), Ok(()), "{demo:?}");
        }
    }
}

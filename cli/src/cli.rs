//! The command line: the flags, their defaults (the library's, checked
//! by a test against `Config::default()` and OPERATIONS' table), the
//! values they take, and the [`Config`] they make; the arguments an
//! instance is started with under `--processes`.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use clap::{CommandFactory, Parser, ValueEnum};
use wspush::{
    Algorithm, Config, Degraded, Overflow, Pattern, SlowConsumerPolicy, TokenError, Tokens,
    UpstreamConfig, Verifier, MAX_DURATION, MAX_MESSAGE_LIMIT,
};

use crate::asks::Asks;
use crate::input::{self, InputMode};
use crate::sources::presence_writer::PresenceWriter;
use crate::sources::stop::{Carried, Stopper};
use crate::sources::{publish, pubsub, stdin, stream, Source};
use crate::supervisor::{OnExit, EPOCH_ENV, FIRST_LINE_ENV, INSTANCE_ENV};
use crate::upstream::{self, Sink};
use std::os::fd::AsFd;
use std::sync::Arc;

/// A WebSocket push server: every line on standard input is broadcast as
/// one text message to every connected client.
#[derive(Debug, Parser)]
#[command(group(clap::ArgGroup::new("redis_writes").args(["presence_ttl", "upstream_stream"]).multiple(true)))]
#[command(group(clap::ArgGroup::new("redis_use").args(["redis_channel", "redis_stream", "presence_ttl", "upstream_stream"]).multiple(true)))]
#[command(
    name = "wspush",
    version = crate::binary::VERSION,
    args_override_self = true,
    allow_negative_numbers = true,
    after_help = "Examples:\n  tail -f feed | wspush --listen 0.0.0.0:8080 --path /ws\n  \
                  tail -f feed | wspush --listen 0.0.0.0:8080 --processes auto\n  \
                  tail -f feed | wspush --listen 0.0.0.0:8080 --processes auto --total-connections 1000000\n\n\
                  Standard input: each line (without its \\n or \\r\\n) is one text message; an empty\n\
                  line is an empty message; lines that are not UTF-8 or exceed --max-message-bytes are\n\
                  skipped with a warning. End of input does not stop the server. SIGTERM drains: /healthz\n\
                  answers 503 draining, accepting stops after --drain-grace, and the connections are closed\n\
                  with 1012 evenly over --drain-time; SIGINT (or --drain-time 0) closes every connection at\n\
                  once with 1001 after what is queued for it. A second signal exits at once. Under\n\
                  --processes, SIGHUP replaces the instances one at a time, SIGUSR2 with the binary on disk.\n\
                  Durations: 30s, 500ms, 2m, 1h (a bare number is seconds).\n\
                  Redis: --redis URL --redis-stream KEY reads each entry's field `line` as input too, from\n\
                  where the host is, positioned by entry ids (the same on every host); --redis-channel NAME\n\
                  reads each published message (at-most-once). Both beside standard input.\n\
                  HTTP: GET /healthz answers 200 ok (degraded while --redis is lost); GET /metrics the\n\
                  counters in Prometheus format.\n\
                  Logging: RUST_LOG=debug|info|warn (default info); a stats line every --stats-interval unless --quiet."
)]
pub(crate) struct Cli {
    /// Address to listen on, e.g. 127.0.0.1:8080 or 0.0.0.0:8080.
    #[arg(long, value_name = "ADDR")]
    pub(crate) listen: SocketAddr,
    /// Serve WebSocket upgrades only on this path (other paths get 404).
    #[arg(long, value_name = "PATH")]
    pub(crate) path: Option<String>,
    /// Serve a demo page on GET / (a WebSocket upgrade on / still is one)
    /// that connects back and shows what is broadcast.
    #[arg(long)]
    pub(crate) demo: bool,
    /// Echo every client message back (conformance testing) instead of discarding it.
    #[arg(long)]
    pub(crate) echo: bool,
    /// permessage-deflate (RFC 7692) for clients that offer it (every
    /// browser does): `on` compresses each broadcast of --deflate-min-bytes
    /// or more once, for all of them, and inflates what they send (one
    /// inflater for all: no client keeps a window); `off` declines it.
    #[arg(long, value_name = "on|off", value_enum, default_value_t = OnOff::from(library().deflate))]
    pub(crate) deflate: OnOff,
    /// Broadcasts (and, with --echo, echoes) smaller than this go plain to
    /// every client.
    #[arg(long, value_name = "N", default_value_t = library().deflate_min_bytes)]
    pub(crate) deflate_min_bytes: usize,
    /// Largest message accepted from a client or broadcast, in bytes.
    #[arg(long, value_name = "N", default_value_t = library().max_message_bytes, value_parser = clap::value_parser!(u64).range(1..=MAX_MESSAGE_LIMIT))]
    pub(crate) max_message_bytes: u64,
    /// Most connections one instance holds; more get HTTP 503. Default: as
    /// many as its open-file limit allows.
    #[arg(long, value_name = "N", value_parser = positive)]
    pub(crate) max_connections: Option<usize>,
    /// Output a connection may have queued before the slow-consumer policy applies, in bytes.
    #[arg(long, value_name = "N", default_value_t = library().max_queued_bytes, value_parser = positive)]
    pub(crate) max_queued_bytes: usize,
    /// Input read ahead of the broadcasts sent, in bytes (64 more per line): a
    /// feed this far ahead is not read until the fan-out catches up.
    #[arg(long, value_name = "N", default_value_t = library().max_pending_bytes, value_parser = positive)]
    pub(crate) max_pending_bytes: usize,
    /// Messages kept for clients that come back with ?since=POSITION (they
    /// get what they missed); 0 keeps none. A resume reaching back past
    /// what is kept is told of the gap.
    #[arg(long, value_name = "N", default_value_t = library().history_messages)]
    pub(crate) history_messages: usize,
    /// Bytes of frames the history keeps at most.
    #[arg(long, value_name = "N", default_value_t = library().history_bytes, value_parser = positive)]
    pub(crate) history_bytes: usize,
    /// How long the history keeps a message.
    #[arg(long, value_name = "DURATION", default_value = duration_text(library().history_age), value_parser = duration, allow_hyphen_values = true)]
    pub(crate) history_age: Duration,
    /// What a connection whose queue is full gets instead of a broadcast.
    #[arg(long, value_name = "POLICY", value_enum, default_value_t = library().slow_consumer)]
    pub(crate) slow_consumer: SlowConsumerPolicy,
    /// Send every connection a ping this often.
    #[arg(long, value_name = "DURATION", default_value = duration_text(library().ping_interval), value_parser = duration, allow_hyphen_values = true)]
    pub(crate) ping_interval: Duration,
    /// Close a connection that sent nothing (not even a pong) this long
    /// (with 1001), checked once per ping interval. Default: twice the ping interval.
    #[arg(long, value_name = "DURATION", value_parser = duration, allow_hyphen_values = true)]
    pub(crate) idle_timeout: Option<Duration>,
    /// Close a connection whose upgrade request is not complete this long after it connected.
    #[arg(long, value_name = "DURATION", default_value = duration_text(library().handshake_timeout), value_parser = duration, allow_hyphen_values = true)]
    pub(crate) handshake_timeout: Duration,
    /// Close a connection whose close handshake takes longer than this.
    #[arg(long, value_name = "DURATION", default_value = duration_text(library().close_timeout), value_parser = duration, allow_hyphen_values = true)]
    pub(crate) close_timeout: Duration,
    /// On SIGINT/SIGTERM, wait this long for close replies and flushes before exiting
    /// (after a drain's closes).
    #[arg(long, value_name = "DURATION", default_value = duration_text(library().shutdown_timeout), value_parser = duration, allow_hyphen_values = true)]
    pub(crate) shutdown_timeout: Duration,
    /// On SIGTERM, close the connections with 1012 evenly over this time, so that their
    /// clients come back spread over it; 0 closes them all at once with 1001, as SIGINT does.
    #[arg(long, value_name = "DURATION", default_value = duration_text(library().drain_time), value_parser = duration_or_zero, allow_hyphen_values = true)]
    pub(crate) drain_time: Duration,
    /// On SIGTERM, answer /healthz 503 draining and go on accepting this long before the
    /// drain's closes begin, so that load balancers stop sending new clients first.
    #[arg(long, value_name = "DURATION", default_value = duration_text(library().drain_grace), value_parser = duration_or_zero, allow_hyphen_values = true)]
    pub(crate) drain_grace: Duration,
    /// Most connections one client IP address may hold; more get HTTP 429.
    #[arg(long, value_name = "N", value_parser = positive)]
    pub(crate) max_connections_per_ip: Option<usize>,
    /// Allow browsers from this origin only, e.g. https://app.example.com
    /// (repeatable; exact). Other Origin values get HTTP 403.
    #[arg(long, value_name = "ORIGIN")]
    pub(crate) allow_origin: Vec<String>,
    /// Require one of the tokens in this file (one per line, # comments),
    /// as `Authorization: Bearer TOKEN` or `?token=TOKEN`; missing or wrong gets HTTP 401.
    /// A line may go on with channels=PATTERN,... (the channels it may ask
    /// for) and id=ID (the client id it must use).
    #[arg(long, value_name = "PATH")]
    pub(crate) token_file: Option<PathBuf>,
    /// Take signed tokens (JWT) checked with this key: the HS256 secret
    /// (at least 32 bytes) or a PEM public key (RS256, ES256); beside
    /// --token-file or instead of it. Repeatable: while keys roll, a token
    /// signed with either is good. Its sub is the client id, its channels
    /// claim the channels it may ask for; exp is required, and the
    /// connection is closed with 4001 before it.
    #[arg(long, value_name = "PATH", requires = "jwt_alg", help_heading = JWT_HEADING)]
    pub(crate) jwt_key_file: Vec<PathBuf>,
    /// The algorithm signed tokens must be signed with (never taken from
    /// the token).
    #[arg(long, value_name = "ALG", value_enum, requires = "jwt_key_file", help_heading = JWT_HEADING)]
    pub(crate) jwt_alg: Option<Algorithm>,
    /// Signed tokens must name this audience in aud. Without it, a token
    /// naming any audience is refused.
    #[arg(long, value_name = "AUD", requires = "jwt_key_file", help_heading = JWT_HEADING)]
    pub(crate) jwt_audience: Option<String>,
    /// Signed tokens must name this issuer in iss.
    #[arg(long, value_name = "ISS", requires = "jwt_key_file", help_heading = JWT_HEADING)]
    pub(crate) jwt_issuer: Option<String>,
    /// How far clocks may differ, for exp and nbf.
    #[arg(long, value_name = "DURATION", default_value = duration_text(Duration::from_secs(Verifier::DEFAULT_LEEWAY)), value_parser = duration_or_zero, allow_hyphen_values = true, help_heading = JWT_HEADING)]
    pub(crate) jwt_leeway: Duration,
    /// Serve POST /publish (command lines, or one message) and GET /stats
    /// on this address, e.g. 127.0.0.1:8081: beside standard input and
    /// Redis, in the order each request came. Needs --publish-key-file.
    #[arg(long, value_name = "ADDR", requires = "publish_key_file", help_heading = PUBLISH_HEADING)]
    pub(crate) publish_listen: Option<SocketAddr>,
    /// The keys a publisher presents as `Authorization: Bearer KEY` (one
    /// per line, # comments); others get HTTP 401.
    #[arg(long, value_name = "PATH", requires = "publish_listen", help_heading = PUBLISH_HEADING)]
    pub(crate) publish_key_file: Option<PathBuf>,
    /// Refuse (HTTP 403) an ?id= that no token binds (a token file's id=,
    /// a signed token's sub): the setting for production.
    #[arg(long)]
    pub(crate) require_token_id: bool,
    /// What a line of standard input is: `lines`, a text message to every
    /// connection; `commands`, a command (all, pub, id, conn, sub, unsub,
    /// close: see the README).
    #[arg(long, value_name = "MODE", value_enum, default_value = "lines")]
    pub(crate) input: InputMode,
    /// Redis (redis://[:PASSWORD@]HOST[:PORT][/DB]), for input: the
    /// messages published on each --redis-channel, and the entries of the
    /// --redis-stream, read as standard input would read them, beside it;
    /// and for the --upstream-stream. Reconnects with backoff; what is
    /// published on a channel while it is lost is lost, and counted as an
    /// outage.
    #[arg(long, value_name = "URL", requires = "redis_use", help_heading = REDIS_HEADING)]
    pub(crate) redis: Option<String>,
    /// A Redis channel to subscribe to (repeatable; a name with *, ? or [
    /// is a pattern, PSUBSCRIBE).
    #[arg(long, value_name = "NAME", requires = "redis", help_heading = REDIS_HEADING)]
    pub(crate) redis_channel: Vec<String>,
    /// A Redis stream to read (XREAD) from where this host is: its
    /// entries' field `line` is input, positioned by their ids, the same
    /// on every host and across restarts; after an outage, reading goes on
    /// where it was. One stream: positions are one sequence.
    #[arg(long, value_name = "KEY", requires = "redis", help_heading = REDIS_HEADING)]
    pub(crate) redis_stream: Option<String>,
    /// Keep this host's channel counts in Redis, in the hash
    /// wspush:presence:HOST (channel → open connections), replaced every
    /// third of DURATION and expiring after it (at least 3s); the sorted
    /// set wspush:presence:hosts scores each host by when its hash
    /// expires (Unix ms), so a fleet's presence is the hosts scored after
    /// now and their hashes.
    #[arg(long, value_name = "DURATION", value_parser = duration, requires = "redis", help_heading = REDIS_HEADING)]
    pub(crate) presence_ttl: Option<Duration>,
    /// This host's name in Redis: of its presence hash, and in its
    /// upstream entries and of their sequence
    /// (wspush:upstream:HOST:KEY:seq), one writer per name. Default: the
    /// system's host name.
    #[arg(long, value_name = "NAME", requires = "redis_writes", help_heading = REDIS_HEADING)]
    pub(crate) host_name: Option<String>,
    /// What GET /healthz answers while the Redis feed is lost: 200 or 503,
    /// with the body `degraded`.
    #[arg(long, value_name = "STATUS", value_enum, default_value_t = library().degraded)]
    pub(crate) healthz_degraded: Degraded,
    /// Write what clients send, a line per message: `msg KEY ID text
    /// PAYLOAD` (\\, \n and \r escaped) or `msg KEY ID binary BASE64`; to
    /// standard output (`stdout`), or into a Redis stream (`redis-stream`,
    /// with --redis and --upstream-stream).
    #[arg(long, value_name = "WHERE", value_enum)]
    pub(crate) upstream: Option<UpstreamTo>,
    /// Also write `open KEY ID CHANNELS` and `close KEY ID CODE` lines.
    #[arg(long, requires = "upstream")]
    pub(crate) upstream_events: bool,
    /// Bytes of upstream lines their writer (standard output, or Redis
    /// while it is away) may be behind.
    #[arg(long, value_name = "N", default_value = "16777216", value_parser = positive, requires = "upstream")]
    pub(crate) upstream_max_bytes: usize,
    /// Past that: stop reading clients until it catches up (`pause`), or
    /// drop their messages and count them (`drop`).
    #[arg(
        long,
        value_name = "POLICY",
        value_enum,
        default_value = "pause",
        requires = "upstream"
    )]
    pub(crate) upstream_overflow: Overflow,
    /// With --upstream redis-stream: the stream on --redis each line goes
    /// into, one entry `host HOST seq N line LINE` (LINE as standard
    /// output has it; N counts the host's lines from 1), exactly once and
    /// in order: each batch is one script call that adds its entries after
    /// the host's sequence in Redis and moves it, so a batch sent again
    /// after a lost reply is found written, not written twice. While
    /// Redis is away, lines wait within --upstream-max-bytes, then
    /// --upstream-overflow applies; at exit, those still waiting after
    /// --shutdown-timeout are dropped, counted.
    #[arg(long, value_name = "KEY", requires = "redis", help_heading = UPSTREAM_HEADING)]
    pub(crate) upstream_stream: Option<String>,
    /// The stream is trimmed to about N entries (XADD MAXLEN ~ N).
    #[arg(long, value_name = "N", default_value_t = 1_000_000, value_parser = positive, requires = "upstream_stream", help_heading = UPSTREAM_HEADING)]
    pub(crate) upstream_stream_maxlen: usize,
    /// Channels a client may ask for with ?channel= unless its token grants
    /// its own (repeatable; * stands for any run, e.g. news.*); others get
    /// HTTP 403. Unset: any channel.
    #[arg(long, value_name = "PATTERN", value_parser = channel_pattern)]
    pub(crate) allow_channel: Vec<Pattern>,
    /// Most channels one upgrade may ask for; more get HTTP 400.
    #[arg(long, value_name = "N", default_value_t = library().max_channels_per_connection, value_parser = positive)]
    pub(crate) max_channels_per_connection: usize,
    /// Most channels an instance holds (a channel lives while it has a
    /// subscriber); an upgrade that would make more gets HTTP 503.
    #[arg(long, value_name = "N", default_value_t = library().max_channels, value_parser = positive)]
    pub(crate) max_channels: usize,
    /// Serve /metrics and /healthz on this address (e.g. 127.0.0.1:9100)
    /// instead of on --listen. With --processes, the supervisor serves the
    /// host's metrics there, and instance K its own on PORT+K.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// With --processes, the host's /metrics gives its sums only, without
    /// each instance's series (labelled `instance`).
    #[arg(long)]
    pub(crate) metrics_sums_only: bool,
    /// Log a line with the key counters this often.
    #[arg(long, value_name = "DURATION", default_value = duration_text(library().stats_interval.unwrap_or_default()), value_parser = duration, allow_hyphen_values = true)]
    pub(crate) stats_interval: Duration,
    /// No periodic stats line.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Under load (a poll found several events at once), poll again no
    /// sooner than this after that poll returned (handling its events
    /// counts), so one wake-up handles what arrives meanwhile: less CPU per
    /// message, at most this much added latency. 0: never wait.
    #[arg(long, value_name = "DURATION", default_value = duration_text(library().batch_delay), value_parser = duration_or_zero, allow_hyphen_values = true)]
    pub(crate) batch_delay: Duration,
    /// Bind with SO_REUSEPORT so several processes can share the address.
    #[arg(long)]
    pub(crate) reuse_port: bool,
    /// Run N single-threaded instances behind SO_REUSEPORT under a small
    /// supervisor that hands each of them every input line. `auto`: one per
    /// core, or as many as --total-connections needs if that is more.
    #[arg(long, value_name = "N|auto", help_heading = SUPERVISOR_HEADING)]
    pub(crate) processes: Option<Processes>,
    /// Connections the whole server should hold, over all its instances.
    /// With --processes auto, enough instances start for N, each planned at
    /// 90% of what it may hold (its open-file limit, or --max-connections);
    /// with --processes N, a warning says if N instances hold fewer.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), requires = "processes", help_heading = SUPERVISOR_HEADING)]
    pub(crate) total_connections: Option<u64>,
    /// With --processes: what an instance that exits unasked gets. `restart`:
    /// started again with backoff (its clients reconnect, the others keep
    /// theirs; 5 deaths in a row within 5 s of starting stop the server);
    /// `stop`: every instance is stopped and the server exits 1.
    #[arg(
        long,
        value_name = "POLICY",
        default_value = "restart",
        requires = "processes",
        help_heading = SUPERVISOR_HEADING
    )]
    pub(crate) on_instance_exit: OnExit,
    /// With --processes: input an instance that does not take it (stopped,
    /// or far behind) may have waiting, in bytes; past it the instance is
    /// killed and started again. The others are never held back.
    #[arg(long, value_name = "N", default_value_t = 64 << 20, value_parser = positive, requires = "processes", help_heading = SUPERVISOR_HEADING)]
    pub(crate) instance_backlog: usize,
    /// With --processes: an instance that takes no input this long while
    /// some waits for it is killed and started again.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration, requires = "processes", help_heading = SUPERVISOR_HEADING)]
    pub(crate) instance_stall_timeout: Duration,
}

/// A switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

impl From<bool> for OnOff {
    fn from(on: bool) -> OnOff {
        if on {
            OnOff::On
        } else {
            OnOff::Off
        }
    }
}

/// `--processes` value.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Processes {
    /// This many instances.
    Count(usize),
    /// One per core, or as many as `--total-connections` needs.
    Auto,
}

impl FromStr for Processes {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        if value == "auto" {
            return Ok(Processes::Auto);
        }
        positive(value).map(Processes::Count)
    }
}

/// The library's settings by default. The flags for them take their
/// defaults from here, so each default has one home (`Config::default()`);
/// the token leeway's is the verifier's (`Verifier::DEFAULT_LEEWAY`); the
/// binary's own flags (the supervisor's, the input's, upstream's) keep
/// theirs in their attributes.
fn library() -> Config {
    Config::default()
}

/// A duration as the flags write it, in its largest whole unit (`5m`,
/// `30s`, `500us`): how `--help` shows a default taken from the library.
fn duration_text(duration: Duration) -> String {
    let micros = duration.as_micros();
    let units = [
        ("h", 3_600_000_000),
        ("m", 60_000_000),
        ("s", 1_000_000),
        ("ms", 1_000),
    ];
    match units
        .iter()
        .find(|(_, per)| micros > 0 && micros.is_multiple_of(*per))
    {
        Some((unit, per)) => format!("{}{unit}", micros / per),
        None => format!("{micros}us"),
    }
}

/// A duration: a number with `us`, `ms`, `s`, `m` or `h`, or a bare number of
/// seconds, at most [`MAX_DURATION`]; zero is refused.
pub(crate) fn duration(value: &str) -> Result<Duration, String> {
    match duration_or_zero(value)? {
        d if d.is_zero() => Err("must be longer than zero".into()),
        d => Ok(d),
    }
}

/// A duration as for [`duration`], zero allowed.
fn duration_or_zero(value: &str) -> Result<Duration, String> {
    if value.starts_with('-') {
        return Err("must not be negative".into());
    }
    let split = value
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{value:?} is not a duration like 30s or 500ms"))?;
    let seconds = match unit {
        "us" | "µs" => number / 1e6,
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(format!("unknown unit {unit:?} (use us, ms, s, m or h)")),
    };
    match Duration::try_from_secs_f64(seconds) {
        Ok(d) if d <= MAX_DURATION => Ok(d),
        _ => Err(format!("{value:?} is longer than 365 days")),
    }
}

pub(crate) fn positive(value: &str) -> Result<usize, String> {
    match value.parse::<i128>() {
        Ok(n) if n < 1 => Err("must be at least 1".into()),
        Ok(n) => usize::try_from(n).map_err(|_| format!("{value} is too large")),
        Err(e) => Err(e.to_string()),
    }
}

/// clap's error without its usage and hint paragraphs, on one line.
pub(crate) fn one_line(rendered: &str) -> String {
    let message = rendered.split("\n\n").next().unwrap_or(rendered);
    let message = message.trim_start_matches("error: ");
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The configuration the command line asks for (all but the connection
/// limit, which depends on the open-file limit), validated.
pub(crate) fn config(cli: &Cli) -> Result<Config, String> {
    let tokens = match &cli.token_file {
        Some(path) => Some(read_tokens(path, "token")?),
        None => None,
    };
    let jwt = jwt_verifier(cli)?;
    let config = Config::default().with(|c| {
        c.listen = cli.listen;
        c.reuse_port = cli.reuse_port;
        c.path = cli.path.clone();
        c.demo = cli.demo;
        c.echo = cli.echo;
        c.deflate = cli.deflate == OnOff::On;
        c.deflate_min_bytes = cli.deflate_min_bytes;
        c.max_message_bytes = cli.max_message_bytes;
        c.max_queued_bytes = cli.max_queued_bytes;
        c.max_pending_bytes = cli.max_pending_bytes;
        c.slow_consumer = cli.slow_consumer;
        c.handshake_timeout = cli.handshake_timeout;
        c.close_timeout = cli.close_timeout;
        c.shutdown_timeout = cli.shutdown_timeout;
        c.drain_time = cli.drain_time;
        c.drain_grace = cli.drain_grace;
        c.ping_interval = cli.ping_interval;
        c.idle_timeout = cli.idle_timeout.unwrap_or(2 * cli.ping_interval);
        c.max_connections_per_ip = cli.max_connections_per_ip;
        c.allowed_origins = cli.allow_origin.clone();
        c.tokens = tokens;
        c.jwt = jwt;
        c.require_token_id = cli.require_token_id;
        c.metrics_listen = cli.metrics_listen.map(instance_metrics_address);
        c.allowed_channels = cli.allow_channel.clone();
        c.max_channels_per_connection = cli.max_channels_per_connection;
        c.max_channels = cli.max_channels;
        c.instance = instance_number().map_or(0, u32::from);
        c.history_messages = cli.history_messages;
        c.history_bytes = cli.history_bytes;
        c.history_age = cli.history_age;
        c.first_position = std::env::var(FIRST_LINE_ENV)
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        c.upstream = cli.upstream.map(|_| UpstreamConfig {
            max_bytes: cli.upstream_max_bytes,
            overflow: cli.upstream_overflow,
            events: cli.upstream_events,
        });
        c.stats_interval = (!cli.quiet).then_some(cli.stats_interval);
        // A stream's positions are of its epoch, on every host (an
        // instance is told it by its supervisor, which reads the stream).
        c.epoch = cli.redis_stream.as_deref().map(stream::epoch).or_else(|| {
            std::env::var(EPOCH_ENV)
                .ok()
                .and_then(|hex| wspush::Epoch::parse(hex.as_bytes()))
        });
        c.batch_delay = cli.batch_delay;
        c.degraded = cli.healthz_degraded;
    });
    config
        .validate()
        .map_err(|e| format!("invalid setting: {e}"))?;
    Ok(config)
}

/// The tokens (or keys: `what` they are) of a file of one per line.
pub(crate) fn read_tokens(path: &Path, what: &str) -> Result<Tokens, String> {
    let text = std::fs::read(path)
        .map_err(|e| format!("cannot read {what} file {}: {e}", path.display()))?;
    Tokens::parse(&text).map_err(|e| match e {
        TokenError::Empty => format!("no {what}s in {}", path.display()),
        TokenError::Invalid { .. } => format!("{}: {e}", path.display()),
    })
}

/// The verifier of signed tokens the flags ask for, its key files read.
fn jwt_verifier(cli: &Cli) -> Result<Option<Verifier>, String> {
    let Some(algorithm) = cli.jwt_alg else {
        return Ok(None);
    };
    let mut verifier = Verifier::new(algorithm, cli.jwt_leeway.as_secs());
    for path in &cli.jwt_key_file {
        let key = std::fs::read(path)
            .map_err(|e| format!("cannot read key file {}: {e}", path.display()))?;
        verifier
            .add_key(&key)
            .map_err(|e| format!("{}: {e} ({algorithm})", path.display()))?;
    }
    if let Some(audience) = &cli.jwt_audience {
        verifier.require_audience(audience);
    }
    if let Some(issuer) = &cli.jwt_issuer {
        verifier.require_issuer(issuer);
    }
    Ok(Some(verifier))
}

/// Under a supervisor, which serves the host's metrics on PORT, instance
/// K (from 1) serves its own on PORT+K, so each instance can be scraped on
/// its own; port 0 stays 0.
fn instance_metrics_address(mut addr: SocketAddr) -> SocketAddr {
    if let (Some(k), true) = (instance_number(), addr.port() != 0) {
        addr.set_port(addr.port().saturating_add(k));
    }
    addr
}

/// Where upstream lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum UpstreamTo {
    /// Standard output.
    Stdout,
    /// A Redis stream (`--upstream-stream`).
    RedisStream,
}

/// Where the command line asks this process to write the upstream lines
/// (none without `--upstream`), or what is wrong with it. An instance
/// under a supervisor writes them to standard output whatever the flag:
/// its supervisor takes them on from there.
pub(crate) fn upstream_sink(cli: &Cli) -> Result<Option<Sink>, String> {
    match (cli.upstream, &cli.upstream_stream) {
        (None, None) => Ok(None),
        (Some(UpstreamTo::Stdout), None) => Ok(Some(Sink::Stdout)),
        (None | Some(UpstreamTo::Stdout), Some(_)) => {
            Err("--upstream-stream KEY goes with --upstream redis-stream".into())
        }
        (Some(UpstreamTo::RedisStream), _) if instance_number().is_some() => Ok(Some(Sink::Stdout)),
        (Some(UpstreamTo::RedisStream), Some(key)) => {
            let url = (cli.redis.as_deref())
                .ok_or("--upstream redis-stream needs --redis URL (and --upstream-stream KEY)")?;
            let maxlen = cli.upstream_stream_maxlen;
            let target = upstream::stream::Target::new(url, key, host_name(cli)?, maxlen)?
                .reporting_every((!cli.quiet).then_some(cli.stats_interval));
            Ok(Some(Sink::Stream(Box::new(target))))
        }
        (Some(UpstreamTo::RedisStream), None) => {
            Err("--upstream redis-stream needs --upstream-stream KEY (and --redis URL)".into())
        }
    }
}

/// This instance's number under a supervisor (from 1), if it runs under one.
pub(crate) fn instance_number() -> Option<u16> {
    std::env::var(INSTANCE_ENV).ok()?.parse().ok()
}

/// A channel pattern given as a flag.
fn channel_pattern(value: &str) -> Result<Pattern, String> {
    Pattern::parse(value).map_err(|e| format!("a channel pattern {e}"))
}

/// The help heading of the supervisor's own flags: an instance must not
/// supervise.
const SUPERVISOR_HEADING: &str = "Supervisor (--processes)";

/// The help heading of the Redis input's flags: under `--processes` the
/// supervisor holds the one Redis subscription, not its instances.
const PUBLISH_HEADING: &str = "HTTP publish (under --processes, the supervisor's)";

const JWT_HEADING: &str = "Signed tokens (JWT)";

const REDIS_HEADING: &str = "Redis input (under --processes, the supervisor's)";

/// The help heading of the Redis stream upstream's flags: under
/// `--processes` the supervisor writes the host's lines, its instances
/// write theirs to it.
const UPSTREAM_HEADING: &str = "Upstream into a Redis stream (under --processes, the supervisor's)";

/// The flags an instance is not given: those under the headings above,
/// as `--name`, each taking a value.
pub(crate) fn supervisor_flags() -> Vec<String> {
    Cli::command()
        .get_arguments()
        .filter(|arg| {
            matches!(
                arg.get_help_heading(),
                Some(SUPERVISOR_HEADING | REDIS_HEADING | PUBLISH_HEADING | UPSTREAM_HEADING)
            )
        })
        .filter_map(|arg| arg.get_long().map(|long| format!("--{long}")))
        .collect()
}

/// The command line without the supervisor's flags.
pub(crate) fn instance_args(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let flags = supervisor_flags();
    let mut out = Vec::new();
    let mut skip_value = false;
    for arg in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        let text = arg.to_string_lossy();
        if flags.iter().any(|flag| *flag == text) {
            skip_value = true;
        } else if !flags
            .iter()
            .any(|flag| text.starts_with(&format!("{flag}=")))
        {
            out.push(arg);
        }
    }
    out
}

/// The sources the command line asks for, checked: standard input, then
/// the Redis subscription and stream (with `--redis`) and the publish
/// listener (with `--publish-listen`), bound, its `GET /stats` answering
/// what `stats` says. The stream fills at most what `config`'s history
/// holds at its start. Each goes on from what an earlier image of this
/// process left it (`carried`), and comes with how it stops for a
/// re-exec. The same for a lone server and a supervisor.
pub fn sources_from(
    cli: &Cli,
    config: &Config,
    answers: (publish::Stats, Arc<Asks>),
    carried: &Carried,
) -> Result<Sources, String> {
    let cannot = |e: std::io::Error| format!("cannot read standard input: {e}");
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(cannot)?;
    let poll = fd.try_clone().map_err(cannot)?;
    let (stdin, stop) =
        stdin::Stdin::stoppable(std::fs::File::from(fd), poll, carried.unfinished.clone())
            .map_err(cannot)?;
    let mut sources = Sources {
        readers: vec![Box::new(stdin)],
        stoppers: vec![Arc::new(stop)],
    };
    if let Some(url) = cli.redis.as_deref() {
        if !cli.redis_channel.is_empty() {
            let feed = pubsub::RedisFeed::new(url, &cli.redis_channel)?;
            sources.stoppers.push(feed.stopper());
            sources.readers.push(Box::new(feed));
        }
        if let Some(key) = &cli.redis_stream {
            let preload = stream::Preload {
                messages: config.history_messages,
                age: config.history_age,
            };
            let mut feed = stream::StreamFeed::new(url, key, preload)?;
            if let Some(at) = carried.stream_at {
                feed = feed.resuming(at);
            }
            sources.stoppers.push(feed.stopper());
            sources.readers.push(Box::new(feed));
        }
        if let Some(ttl) = cli.presence_ttl {
            let asks = Arc::clone(&answers.1);
            let writer = PresenceWriter::new(url, host_name(cli)?, ttl, asks)?;
            sources.stoppers.push(writer.stopper());
            sources.readers.push(Box::new(writer));
        }
    }
    if let (Some(addr), Some(path)) = (cli.publish_listen, &cli.publish_key_file) {
        let keys = read_tokens(path, "publish key")?;
        let max_message = config.max_message_bytes as usize;
        let limits = wspush::protocol::publish::PublishLimits {
            max_body: config.max_pending_bytes,
            max_line: input::max_line_bytes(InputMode::Commands, max_message),
        };
        let max_pending = config.max_pending_bytes;
        let listener = match carried.publish_listener {
            Some(fd) => wspush::sys::adopt_fd(fd).and_then(|socket| {
                publish::Listener::adopt(socket, keys, limits, max_pending, answers)
            }),
            None => publish::Listener::bind(addr, keys, limits, max_pending, answers),
        }
        .map_err(|e| format!("cannot listen on {addr} for publishers: {e}"))?;
        sources.stoppers.push(listener.stopper());
        sources.readers.push(Box::new(listener));
    }
    Ok(sources)
}

/// This host's name in Redis: `--host-name`, or the system's; one word.
pub(crate) fn host_name(cli: &Cli) -> Result<String, String> {
    let host = cli.host_name.clone().unwrap_or_else(|| {
        rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned()
    });
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(format!(
            "--host-name {host:?}: a name without spaces, not empty"
        ));
    }
    Ok(host)
}

/// The sources, and how each stops for a re-exec.
pub struct Sources {
    /// One per source, each read on a thread of its own.
    pub readers: Vec<Box<dyn Source>>,
    /// How each stops, in the same order.
    pub stoppers: Vec<Arc<dyn Stopper>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_command_line_gives_the_librarys_defaults() {
        use clap::Parser;
        // The flags' defaults are the library's (taken from it): a setting
        // the binary defaults otherwise would show up here.
        let cli = Cli::parse_from(["wspush", "--listen", "127.0.0.1:9000"]);
        let from_flags = config(&cli).unwrap();
        let mut library = wspush::Config::default();
        library.listen = cli.listen;
        assert_eq!(format!("{from_flags:?}"), format!("{library:?}"));
    }

    #[test]
    fn every_flag_has_help_and_a_row_with_its_default_in_the_operations_table() {
        use clap::CommandFactory;
        use std::collections::BTreeSet;
        let operations = include_str!("../../docs/OPERATIONS.md");
        let table = operations
            .split("\n## Flags\n")
            .nth(1)
            .and_then(|rest| rest.split("\n## ").next())
            .expect("OPERATIONS has a Flags section");
        // The flags named in the first cell of each row, with the default
        // the second cell gives each (`A / B` for two flags).
        let mut listed = BTreeSet::new();
        let mut documented = Vec::new();
        for row in table.lines().filter(|l| l.starts_with("| `")) {
            let mut cells = row.split(" | ");
            let first = cells.next().unwrap_or_default();
            let defaults: Vec<&str> = cells.next().unwrap_or_default().split(" / ").collect();
            for (i, part) in first.split("`--").skip(1).enumerate() {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                documented.push((name.clone(), defaults.get(i).copied()));
                listed.insert(name);
            }
        }
        let command = Cli::command();
        // A documented default reads as the parser's: `16 MiB` is
        // 16777216, `10,000` is 10000.
        let value = |text: &str| -> String {
            let text = text.trim().trim_matches('`').replace(',', "");
            let scaled = |n: &str, shift: u32| n.trim().parse::<u64>().map(|n| n << shift);
            match (text.strip_suffix(" MiB"), text.strip_suffix(" KiB")) {
                (Some(n), _) => scaled(n, 20).map_or(text.clone(), |n| n.to_string()),
                (_, Some(n)) => scaled(n, 10).map_or(text.clone(), |n| n.to_string()),
                _ => text,
            }
        };
        for (name, doc) in &documented {
            let arg = command.get_arguments().find(|a| a.get_long() == Some(name));
            let Some(default) = arg.and_then(|a| a.get_default_values().first()) else {
                continue;
            };
            let default = default.to_string_lossy();
            assert_eq!(
                doc.map(value),
                Some(default.to_string()),
                "--{name}: OPERATIONS' default against the parser's"
            );
        }
        let mut flags = BTreeSet::new();
        for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
            let Some(long) = arg.get_long() else { continue };
            if matches!(long, "help" | "version") {
                continue;
            }
            assert!(arg.get_help().is_some(), "--{long} has no help");
            flags.insert(long.to_string());
        }
        let missing: Vec<_> = flags.difference(&listed).collect();
        assert!(missing.is_empty(), "not in OPERATIONS' flags: {missing:?}");
        let unknown: Vec<_> = listed.difference(&flags).collect();
        assert!(
            unknown.is_empty(),
            "OPERATIONS lists no such flags: {unknown:?}"
        );
    }

    #[test]
    fn quiet_turns_the_stats_line_off() {
        let parse = |extra: &[&str]| {
            let base = [
                "wspush",
                "--listen",
                "127.0.0.1:0",
                "--stats-interval",
                "200ms",
            ];
            config(&Cli::try_parse_from(base.iter().chain(extra)).unwrap()).unwrap()
        };
        assert_eq!(parse(&[]).stats_interval, Some(Duration::from_millis(200)));
        assert_eq!(parse(&["--quiet"]).stats_interval, None);
    }

    #[test]
    fn instances_get_the_command_line_without_processes() {
        let args = [
            "--listen",
            "0.0.0.0:1",
            "--processes",
            "4",
            "--echo",
            "--processes=auto",
            "--total-connections",
            "1000000",
            "--path",
            "/ws",
            "--total-connections=5",
        ];
        let got = instance_args(args.iter().map(OsString::from));
        let want: Vec<OsString> = ["--listen", "0.0.0.0:1", "--echo", "--path", "/ws"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn the_supervisor_flags_are_those_under_its_headings_and_each_takes_a_value() {
        let mut flags = supervisor_flags();
        flags.sort();
        assert_eq!(
            flags,
            [
                "--host-name",
                "--instance-backlog",
                "--instance-stall-timeout",
                "--on-instance-exit",
                "--presence-ttl",
                "--processes",
                "--publish-key-file",
                "--publish-listen",
                "--redis",
                "--redis-channel",
                "--redis-stream",
                "--total-connections",
                "--upstream-stream",
                "--upstream-stream-maxlen"
            ]
        );
        let command = Cli::command();
        for arg in command.get_arguments() {
            if flags.contains(&format!("--{}", arg.get_long().unwrap_or_default())) {
                assert!(arg.get_action().takes_values(), "{:?}", arg.get_long());
            }
        }
    }

    #[test]
    fn durations_take_units_and_refuse_zero() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("30s", ms(30_000)),
            ("30", ms(30_000)),
            ("500ms", ms(500)),
            ("1.5s", ms(1500)),
            ("2m", ms(120_000)),
            ("1h", ms(3_600_000)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
        ] {
            assert_eq!(duration(text), Ok(want), "{text}");
        }
        for bad in ["0", "0s", "-1s", "", "s", "10x", "1e999"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
        assert_eq!(duration_or_zero("0"), Ok(Duration::ZERO));
        assert_eq!(duration_or_zero("0us"), Ok(Duration::ZERO));
        assert!(duration_or_zero("-1us").is_err());
    }

    #[test]
    fn a_default_taken_from_the_library_is_shown_in_its_largest_whole_unit_and_reads_back() {
        for (span, text) in [
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_micros(500), "500us"),
        ] {
            assert_eq!(duration_text(span), text);
            assert_eq!(duration(text), Ok(span), "{text}");
        }
    }

    #[test]
    fn errors_fold_to_one_line() {
        let rendered = "error: the following required arguments were not provided:\n  --listen <ADDR>\n\nUsage: wspush";
        assert_eq!(
            one_line(rendered),
            "the following required arguments were not provided: --listen <ADDR>"
        );
    }
}

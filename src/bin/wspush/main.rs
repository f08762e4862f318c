//! The `wspush` binary: flags, logging, signals, standard input →
//! broadcasts, and `--processes` (a supervisor over single-threaded instances).

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use clap::{CommandFactory, Parser, ValueEnum};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;
use socket2::{Domain, Socket, Type};
use wspush::sys::raise_open_file_limit;
use wspush::Pattern;

use input::{InputMode, PumpEnd};
use rlimit::{connection_capacity, instances_for};
use supervisor::{
    OnExit, Policy, Supervisor, FIRST_LINE_ENV, HISTORY_FD_ENV, INSTANCE_ENV, LISTEN_FD_ENV,
    RESTARTS_ENV, STATUS_FD_ENV,
};

mod board;
mod chunks;
mod input;
mod merge;
mod publish;
mod redis_feed;
mod redis_stream;
mod rlimit;
mod sources;
mod supervisor;
use redis_feed::RedisFeed;
use redis_stream::StreamFeed;
use wspush::{
    Algorithm, Config, Degraded, Handle, Overflow, Server, SharedHistory, SlowConsumerPolicy,
    TokenError, Tokens, UpstreamConfig, UpstreamReader, Verifier, MAX_DURATION, MAX_MESSAGE_LIMIT,
};

/// A WebSocket push server: every line on standard input is broadcast as
/// one text message to every connected client.
#[derive(Debug, Parser)]
#[command(group(clap::ArgGroup::new("redis_input").args(["redis_channel", "redis_stream"]).multiple(true)))]
#[command(
    version,
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
struct Cli {
    /// Address to listen on, e.g. 127.0.0.1:8080 or 0.0.0.0:8080.
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// Serve WebSocket upgrades only on this path (other paths get 404).
    #[arg(long, value_name = "PATH")]
    path: Option<String>,
    /// Serve a demo page on GET / (a WebSocket upgrade on / still is one)
    /// that connects back and shows what is broadcast.
    #[arg(long)]
    demo: bool,
    /// Echo every client message back (conformance testing) instead of discarding it.
    #[arg(long)]
    echo: bool,
    /// permessage-deflate (RFC 7692) for clients that offer it (every
    /// browser does): `on` compresses each broadcast of --deflate-min-bytes
    /// or more once, for all of them, and inflates what they send (one
    /// inflater for all: no client keeps a window); `off` declines it.
    #[arg(long, value_name = "on|off", value_enum, default_value = "on")]
    deflate: OnOff,
    /// Broadcasts (and, with --echo, echoes) smaller than this go plain to
    /// every client.
    #[arg(long, value_name = "N", default_value_t = 256)]
    deflate_min_bytes: usize,
    /// Largest message accepted from a client or broadcast, in bytes.
    #[arg(long, value_name = "N", default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1..=MAX_MESSAGE_LIMIT))]
    max_message_bytes: u64,
    /// Most connections one instance holds; more get HTTP 503. Default: as
    /// many as its open-file limit allows.
    #[arg(long, value_name = "N", value_parser = positive)]
    max_connections: Option<usize>,
    /// Output a connection may have queued before the slow-consumer policy applies, in bytes.
    #[arg(long, value_name = "N", default_value_t = 1 << 20, value_parser = positive)]
    max_queued_bytes: usize,
    /// Input read ahead of the broadcasts sent, in bytes (64 more per line): a
    /// feed this far ahead is not read until the fan-out catches up.
    #[arg(long, value_name = "N", default_value_t = 16 << 20, value_parser = positive)]
    max_pending_bytes: usize,
    /// Messages kept for clients that come back with ?since=POSITION (they
    /// get what they missed); 0 keeps none. A resume reaching back past
    /// what is kept is told of the gap.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    history_messages: usize,
    /// Bytes of frames the history keeps at most.
    #[arg(long, value_name = "N", default_value_t = 16 << 20, value_parser = positive)]
    history_bytes: usize,
    /// How long the history keeps a message.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = duration, allow_hyphen_values = true)]
    history_age: Duration,
    /// What a connection whose queue is full gets instead of a broadcast.
    #[arg(long, value_name = "POLICY", default_value = "close")]
    slow_consumer: SlowConsumerPolicy,
    /// Send every connection a ping this often.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration, allow_hyphen_values = true)]
    ping_interval: Duration,
    /// Close a connection that sent nothing (not even a pong) this long
    /// (with 1001), checked once per ping interval. Default: twice the ping interval.
    #[arg(long, value_name = "DURATION", value_parser = duration, allow_hyphen_values = true)]
    idle_timeout: Option<Duration>,
    /// Close a connection whose upgrade request is not complete this long after it connected.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration, allow_hyphen_values = true)]
    handshake_timeout: Duration,
    /// Close a connection whose close handshake takes longer than this.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration, allow_hyphen_values = true)]
    close_timeout: Duration,
    /// On SIGINT/SIGTERM, wait this long for close replies and flushes before exiting
    /// (after a drain's closes).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration, allow_hyphen_values = true)]
    shutdown_timeout: Duration,
    /// On SIGTERM, close the connections with 1012 evenly over this time, so that their
    /// clients come back spread over it; 0 closes them all at once with 1001, as SIGINT does.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration_or_zero, allow_hyphen_values = true)]
    drain_time: Duration,
    /// On SIGTERM, answer /healthz 503 draining and go on accepting this long before the
    /// drain's closes begin, so that load balancers stop sending new clients first.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = duration_or_zero, allow_hyphen_values = true)]
    drain_grace: Duration,
    /// Most connections one client IP address may hold; more get HTTP 429.
    #[arg(long, value_name = "N", value_parser = positive)]
    max_connections_per_ip: Option<usize>,
    /// Allow browsers from this origin only, e.g. https://app.example.com
    /// (repeatable; exact). Other Origin values get HTTP 403.
    #[arg(long, value_name = "ORIGIN")]
    allow_origin: Vec<String>,
    /// Require one of the tokens in this file (one per line, # comments),
    /// as `Authorization: Bearer TOKEN` or `?token=TOKEN`; missing or wrong gets HTTP 401.
    /// A line may go on with channels=PATTERN,... (the channels it may ask
    /// for) and id=ID (the client id it must use).
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Take signed tokens (JWT) checked with this key: the HS256 secret
    /// (at least 32 bytes) or a PEM public key (RS256, ES256); beside
    /// --token-file or instead of it. Repeatable: while keys roll, a token
    /// signed with either is good. Its sub is the client id, its channels
    /// claim the channels it may ask for; exp is required, and the
    /// connection is closed with 4001 before it.
    #[arg(long, value_name = "PATH", requires = "jwt_alg", help_heading = JWT_HEADING)]
    jwt_key_file: Vec<PathBuf>,
    /// The algorithm signed tokens must be signed with (never taken from
    /// the token).
    #[arg(long, value_name = "ALG", value_enum, requires = "jwt_key_file", help_heading = JWT_HEADING)]
    jwt_alg: Option<Algorithm>,
    /// Signed tokens must name this audience in aud. Without it, a token
    /// naming any audience is refused.
    #[arg(long, value_name = "AUD", requires = "jwt_key_file", help_heading = JWT_HEADING)]
    jwt_audience: Option<String>,
    /// Signed tokens must name this issuer in iss.
    #[arg(long, value_name = "ISS", requires = "jwt_key_file", help_heading = JWT_HEADING)]
    jwt_issuer: Option<String>,
    /// How far clocks may differ, for exp and nbf.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration_or_zero, allow_hyphen_values = true, help_heading = JWT_HEADING)]
    jwt_leeway: Duration,
    /// Serve POST /publish (command lines, or one message) and GET /stats
    /// on this address, e.g. 127.0.0.1:8081: beside standard input and
    /// Redis, in the order each request came. Needs --publish-key-file.
    #[arg(long, value_name = "ADDR", requires = "publish_key_file", help_heading = PUBLISH_HEADING)]
    publish_listen: Option<SocketAddr>,
    /// The keys a publisher presents as `Authorization: Bearer KEY` (one
    /// per line, # comments); others get HTTP 401.
    #[arg(long, value_name = "PATH", requires = "publish_listen", help_heading = PUBLISH_HEADING)]
    publish_key_file: Option<PathBuf>,
    /// Refuse (HTTP 403) an ?id= that no token binds (a token file's id=,
    /// a signed token's sub): the setting for production.
    #[arg(long)]
    require_token_id: bool,
    /// What a line of standard input is: `lines`, a text message to every
    /// connection; `commands`, a command (all, pub, id, conn, sub, unsub,
    /// close: see the README).
    #[arg(long, value_name = "MODE", value_enum, default_value = "lines")]
    input: InputMode,
    /// Also read input from Redis (redis://[:PASSWORD@]HOST[:PORT][/DB]):
    /// the messages published on each --redis-channel, and the entries of
    /// the --redis-stream, read as standard input would read them, beside
    /// it. Reconnects with backoff; what is published on a channel while
    /// it is lost is lost, and counted as an outage.
    #[arg(long, value_name = "URL", requires = "redis_input", help_heading = REDIS_HEADING)]
    redis: Option<String>,
    /// A Redis channel to subscribe to (repeatable; a name with *, ? or [
    /// is a pattern, PSUBSCRIBE).
    #[arg(long, value_name = "NAME", requires = "redis", help_heading = REDIS_HEADING)]
    redis_channel: Vec<String>,
    /// A Redis stream to read (XREAD) from where this host is: its
    /// entries' field `line` is input, positioned by their ids, the same
    /// on every host and across restarts; after an outage, reading goes on
    /// where it was. One stream: positions are one sequence.
    #[arg(long, value_name = "KEY", requires = "redis", help_heading = REDIS_HEADING)]
    redis_stream: Option<String>,
    /// What GET /healthz answers while the Redis feed is lost: 200 or 503,
    /// with the body `degraded`.
    #[arg(long, value_name = "STATUS", value_enum, default_value = "200")]
    healthz_degraded: Degraded,
    /// Write what clients send to standard output, a line per message:
    /// `msg KEY ID text PAYLOAD` (\\, \n and \r escaped) or `msg KEY ID binary BASE64`.
    #[arg(long, value_name = "WHERE", value_enum)]
    upstream: Option<UpstreamTo>,
    /// Also write `open KEY ID CHANNELS` and `close KEY ID CODE` lines.
    #[arg(long, requires = "upstream")]
    upstream_events: bool,
    /// Bytes of upstream lines standard output may be behind.
    #[arg(long, value_name = "N", default_value = "16777216", value_parser = positive, requires = "upstream")]
    upstream_max_bytes: usize,
    /// Past that: stop reading clients until it catches up (`pause`), or
    /// drop their messages and count them (`drop`).
    #[arg(
        long,
        value_name = "POLICY",
        value_enum,
        default_value = "pause",
        requires = "upstream"
    )]
    upstream_overflow: Overflow,
    /// Channels a client may ask for with ?channel= unless its token grants
    /// its own (repeatable; * stands for any run, e.g. news.*); others get
    /// HTTP 403. Unset: any channel.
    #[arg(long, value_name = "PATTERN", value_parser = channel_pattern)]
    allow_channel: Vec<Pattern>,
    /// Most channels one upgrade may ask for; more get HTTP 400.
    #[arg(long, value_name = "N", default_value = "16", value_parser = positive)]
    max_channels_per_connection: usize,
    /// Most channels an instance holds (a channel lives while it has a
    /// subscriber); an upgrade that would make more gets HTTP 503.
    #[arg(long, value_name = "N", default_value = "100000", value_parser = positive)]
    max_channels: usize,
    /// Serve /metrics and /healthz on this address (e.g. 127.0.0.1:9100)
    /// instead of on --listen. With --processes, instance K listens on PORT+K-1.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Log a line with the key counters this often.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration, allow_hyphen_values = true)]
    stats_interval: Duration,
    /// No periodic stats line.
    #[arg(long)]
    quiet: bool,
    /// Under load (a poll found several events at once), poll again no
    /// sooner than this after that poll returned (handling its events
    /// counts), so one wake-up handles what arrives meanwhile: less CPU per
    /// message, at most this much added latency. 0: never wait.
    #[arg(long, value_name = "DURATION", default_value = "500us", value_parser = duration_or_zero, allow_hyphen_values = true)]
    batch_delay: Duration,
    /// Bind with SO_REUSEPORT so several processes can share the address.
    #[arg(long)]
    reuse_port: bool,
    /// Run N single-threaded instances behind SO_REUSEPORT under a small
    /// supervisor that hands each of them every input line. `auto`: one per
    /// core, or as many as --total-connections needs if that is more.
    #[arg(long, value_name = "N|auto", help_heading = SUPERVISOR_HEADING)]
    processes: Option<Processes>,
    /// Connections the whole server should hold, over all its instances.
    /// With --processes auto, enough instances start for N, each planned at
    /// 90% of what it may hold (its open-file limit, or --max-connections);
    /// with --processes N, a warning says if N instances hold fewer.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), requires = "processes", help_heading = SUPERVISOR_HEADING)]
    total_connections: Option<u64>,
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
    on_instance_exit: OnExit,
    /// With --processes: input an instance that does not take it (stopped,
    /// or far behind) may have waiting, in bytes; past it the instance is
    /// killed and started again. The others are never held back.
    #[arg(long, value_name = "N", default_value_t = 64 << 20, value_parser = positive, requires = "processes", help_heading = SUPERVISOR_HEADING)]
    instance_backlog: usize,
    /// With --processes: an instance that takes no input this long while
    /// some waits for it is killed and started again.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration, requires = "processes", help_heading = SUPERVISOR_HEADING)]
    instance_stall_timeout: Duration,
}

/// A switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

/// `--processes` value.
#[derive(Debug, Clone, Copy)]
enum Processes {
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

/// A duration: a number with `us`, `ms`, `s`, `m` or `h`, or a bare number of
/// seconds, at most [`MAX_DURATION`]; zero is refused.
fn duration(value: &str) -> Result<Duration, String> {
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

fn positive(value: &str) -> Result<usize, String> {
    match value.parse::<i128>() {
        Ok(n) if n < 1 => Err("must be at least 1".into()),
        Ok(n) => usize::try_from(n).map_err(|_| format!("{value} is too large")),
        Err(e) => Err(e.to_string()),
    }
}

/// clap's error without its usage and hint paragraphs, on one line.
fn one_line(rendered: &str) -> String {
    let message = rendered.split("\n\n").next().unwrap_or(rendered);
    let message = message.trim_start_matches("error: ");
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("wspush: {}", one_line(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    init_logging();
    let result = match cli.processes {
        Some(processes) => supervise(&cli, processes),
        None => serve(cli),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("wspush: {message}");
            ExitCode::FAILURE
        }
    }
}

/// env_logger at `info` by default; an instance under a supervisor tags
/// its lines with its number.
fn init_logging() {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if let Ok(instance) = std::env::var(INSTANCE_ENV) {
        builder.format(move |buf, record| {
            writeln!(
                buf,
                "[{} {:5} wspush#{instance}] {}",
                buf.timestamp(),
                record.level(),
                record.args()
            )
        });
    }
    builder.init();
}

/// The configuration the command line asks for (all but the connection
/// limit, which depends on the open-file limit), validated.
fn config(cli: &Cli) -> Result<Config, String> {
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
        c.upstream = cli.upstream.map(|UpstreamTo::Stdout| UpstreamConfig {
            max_bytes: cli.upstream_max_bytes,
            overflow: cli.upstream_overflow,
            events: cli.upstream_events,
        });
        c.stats_interval = (!cli.quiet).then_some(cli.stats_interval);
        // A stream's positions are of its epoch, on every host.
        c.epoch = cli.redis_stream.as_deref().map(redis_stream::epoch);
        c.batch_delay = cli.batch_delay;
        c.degraded = cli.healthz_degraded;
    });
    config
        .validate()
        .map_err(|e| format!("invalid setting: {e}"))?;
    Ok(config)
}

/// Tells the supervisor on `status` what this instance holds, every
/// second, for its `GET /stats`; ends with the pipe.
fn report_stats(mut status: std::fs::File, handle: Handle) -> Result<(), String> {
    std::thread::Builder::new()
        .name("stats".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            let m = handle.metrics();
            if status
                .write_all(&board::record(m.connections_open, m.channels))
                .is_err()
            {
                return;
            }
        })
        .map(drop)
        .map_err(|e| format!("cannot start the stats thread: {e}"))
}

/// The tokens (or keys: `what` they are) of a file of one per line.
fn read_tokens(path: &Path, what: &str) -> Result<Tokens, String> {
    let text = std::fs::read(path)
        .map_err(|e| format!("cannot read {what} file {}: {e}", path.display()))?;
    Tokens::parse(&text).map_err(|e| match e {
        TokenError::Empty => format!("no {what}s in {}", path.display()),
        TokenError::Invalid { .. } => format!("{}: {e}", path.display()),
    })
}

/// The publish listener the flags ask for, bound, answering `GET /stats`
/// with what `stats` says.
fn publish_listener(
    cli: &Cli,
    config: &Config,
    stats: publish::Stats,
) -> Result<Option<publish::Listener>, String> {
    let (Some(addr), Some(path)) = (cli.publish_listen, &cli.publish_key_file) else {
        return Ok(None);
    };
    let keys = read_tokens(path, "publish key")?;
    let max_message = config.max_message_bytes as usize;
    let limits = wspush::protocol::publish::Limits {
        max_body: config.max_pending_bytes,
        max_line: input::max_line_bytes(InputMode::Commands, max_message),
    };
    publish::Listener::bind(addr, keys, limits, config.max_pending_bytes, stats)
        .map(Some)
        .map_err(|e| format!("cannot listen on {addr} for publishers: {e}"))
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

/// Under a supervisor, instance K (from 1) serves metrics on PORT+K-1, so
/// each instance can be scraped on its own; port 0 stays 0.
fn instance_metrics_address(mut addr: SocketAddr) -> SocketAddr {
    if let (Some(k), true) = (instance_number(), addr.port() != 0) {
        addr.set_port(addr.port().saturating_add(k - 1));
    }
    addr
}

/// Where upstream lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum UpstreamTo {
    /// Standard output.
    Stdout,
}

/// Writes the upstream lines to standard output until the server is gone;
/// after a failed write, lines are counted as dropped.
fn write_upstream(reader: UpstreamReader) {
    let mut out = io::stdout().lock();
    let mut lines = Vec::new();
    let mut failed = false;
    while reader.read(&mut lines) {
        if !failed {
            match out.write_all(&lines).and_then(|()| out.flush()) {
                Ok(()) => continue,
                Err(e) => {
                    log::error!("writing to standard output failed: {e}; upstream lines are dropped and counted from now on");
                    failed = true;
                }
            }
        }
        reader.count_dropped(lines.iter().filter(|&&b| b == b'\n').count() as u64);
    }
}

/// The Redis feed and stream the command line asks for, checked; the
/// stream fills at most what `config`'s history holds at its start.
fn redis_inputs(
    cli: &Cli,
    config: &Config,
) -> Result<(Option<RedisFeed>, Option<StreamFeed>), String> {
    let Some(url) = cli.redis.as_deref() else {
        return Ok((None, None));
    };
    let feed = match cli.redis_channel.is_empty() {
        true => None,
        false => Some(RedisFeed::new(url, &cli.redis_channel)?),
    };
    let preload = redis_stream::Preload {
        messages: config.history_messages,
        age: config.history_age,
    };
    let stream = match &cli.redis_stream {
        Some(key) => Some(StreamFeed::new(url, key, preload)?),
        None => None,
    };
    Ok((feed, stream))
}

/// This instance's number under a supervisor (from 1), if it runs under one.
fn instance_number() -> Option<u16> {
    std::env::var(INSTANCE_ENV).ok()?.parse().ok()
}

/// A channel pattern given as a flag.
fn channel_pattern(value: &str) -> Result<Pattern, String> {
    Pattern::parse(value).map_err(|e| format!("a channel pattern {e}"))
}

/// One instance: the ordinary single-threaded loop.
fn serve(cli: Cli) -> Result<(), String> {
    let mut config = config(&cli)?;
    // An instance reads the history its supervisor keeps, through the
    // descriptor it inherited (named in its environment).
    if let Some(fd) = std::env::var(HISTORY_FD_ENV)
        .ok()
        .and_then(|fd| fd.parse().ok())
    {
        let fd = wspush::sys::inherited_fd(fd)
            .map_err(|e| format!("cannot read the supervisor's history: {e}"))?;
        config.history_fd = Some(std::sync::Arc::new(fd));
    }
    let (feed, stream) = redis_inputs(&cli, &config)?;
    let mode = cli.input;
    let max_message = config.max_message_bytes as usize;
    let max_line = input::max_line_bytes(mode, max_message);
    // Alone with a stream, the server keeps its history as a supervisor
    // does, apart from its loop: filled from the stream's tail, with the
    // stream's positions.
    let recorder = match &stream {
        Some(_) => {
            let history = SharedHistory::create(&config)
                .map_err(|e| format!("cannot make the history's shared memory: {e}"))?;
            config.history_fd = Some(std::sync::Arc::new(
                history
                    .reader_fd()
                    .map_err(|e| format!("cannot share the history: {e}"))?,
            ));
            Some(input::Recorder::new(history, mode, max_message))
        }
        None => None,
    };
    let capacity = open_file_capacity();
    config.max_connections = match cli.max_connections {
        Some(n) => {
            if n as u64 > capacity {
                log::warn!("--max-connections {n} exceeds the {capacity} connections the open-file limit allows");
            }
            n
        }
        None => capacity.clamp(1, usize::MAX as u64) as usize,
    };
    // Under a supervisor, the instance serves the listener the supervisor
    // holds for its number, and says when it does.
    let inherited = |name| std::env::var(name).ok().and_then(|fd| fd.parse().ok());
    let mut server = match inherited(LISTEN_FD_ENV) {
        Some(fd) => {
            let listener = wspush::sys::inherited_fd(fd)
                .map_err(|e| format!("cannot take the supervisor's listener: {e}"))?;
            Server::from_listener(config.clone(), listener.into())
        }
        None => Server::bind(config.clone()),
    }
    .map_err(|e| e.to_string())?;
    if let Some(fd) = inherited(STATUS_FD_ENV) {
        let status = wspush::sys::inherited_fd(fd)
            .map_err(|e| format!("cannot take the supervisor's status pipe: {e}"))?;
        let mut status = std::fs::File::from(status);
        status
            .write_all(&[supervisor::LISTENING])
            .map_err(|e| format!("cannot tell the supervisor this instance listens: {e}"))?;
        let reporter = status
            .try_clone()
            .map_err(|e| format!("cannot share the status pipe: {e}"))?;
        report_stats(reporter, server.handle())?;
        // The supervisor steers new connections away while it is full.
        server.watch_room(move |room| {
            let said = if room {
                supervisor::ROOM
            } else {
                supervisor::FULL
            };
            if let Err(e) = status.write_all(&[said]) {
                log::warn!("cannot tell the supervisor whether this instance has room: {e}");
            }
        });
    }
    log::info!(
        "listening on {} (path {}, {} mode, up to {} connections; the open-file limit allows {capacity})",
        server.local_addr(),
        config.path.as_deref().unwrap_or("any"),
        if config.echo { "echo" } else { "push" },
        config.max_connections
    );
    if let Some(addr) = server.metrics_addr() {
        log::info!("metrics on http://{addr}/metrics");
    }
    let handle = server.handle();
    if let Some(earlier) = std::env::var(RESTARTS_ENV)
        .ok()
        .and_then(|n| n.parse().ok())
    {
        handle.set_instance_restarts(earlier);
    }
    stop_on_signals(handle.clone())?;
    let upstream = match server.upstream() {
        Some(reader) => Some(
            std::thread::Builder::new()
                .name("upstream".into())
                .spawn(move || write_upstream(reader))
                .map_err(|e| format!("cannot start the upstream thread: {e}"))?,
        ),
        None => None,
    };
    // An instance reads its supervisor, which holds the Redis feed and
    // tells it the number of its first line; alone, the server merges its
    // sources as a supervisor does, and numbers from 1.
    let merged = match instance_number() {
        Some(_) => None,
        None => {
            let counts = handle.clone();
            let stats = Box::new(move || {
                let m = counts.metrics();
                format!(
                    "\"connections\":{},\"channels\":{}",
                    m.connections_open, m.channels
                )
            });
            let publish = publish_listener(&cli, &config, stats)?;
            Some(
                sources::spawn(io::stdin(), (feed, stream), publish, max_line, None)
                    .map_err(|e| format!("cannot start the input readers: {e}"))?,
            )
        }
    };
    let first_line = config.first_position;
    std::thread::Builder::new()
        .name("input".into())
        .spawn(move || {
            let input: Box<dyn BufRead> = match merged {
                Some(chunks) => Box::new(sources::Merged::new(chunks, recorder)),
                None => Box::new(BufReader::new(io::stdin().lock())),
            };
            match input::pump(input, &handle, mode, max_message, first_line) {
                PumpEnd::Eof => log::info!("the input ended; still serving"),
                PumpEnd::ServerGone => {}
                PumpEnd::Failed(e) => {
                    log::warn!("reading standard input failed: {e}; still serving")
                }
            }
        })
        .map_err(|e| format!("cannot start the input thread: {e}"))?;
    let ran = server.run().map_err(|e| format!("event loop failed: {e}"));
    // The last lines go out before the process ends.
    drop(server);
    if let Some(writer) = upstream {
        let _ = writer.join();
    }
    ran
}

/// Raises the open-file limit to its maximum and returns how many
/// connections fit (unbounded if the limit cannot be read).
fn open_file_capacity() -> u64 {
    raise_open_file_limit().map_or_else(
        |e| {
            log::warn!("cannot read or raise the open-file limit: {e}");
            u64::MAX
        },
        connection_capacity,
    )
}

/// SIGTERM starts a drain (see [`Handle::drain`]), SIGUSR1 a hand-over to
/// a replacement ([`Handle::hand_over`], sent by a supervisor), SIGINT a
/// shutdown; a second one of them exits at once. SIGHUP, which restarts a
/// supervisor's instances, is logged and ignored here.
fn stop_on_signals(handle: Handle) -> Result<(), String> {
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGUSR1, SIGHUP])
        .map_err(|e| format!("cannot handle signals: {e}"))?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut stopping = false;
            for signal in signals.forever() {
                if signal == SIGHUP {
                    log::info!("signal {signal} (SIGHUP): only a supervisor (--processes) restarts its instances; ignored");
                    continue;
                }
                if stopping {
                    log::warn!("second signal: exiting now");
                    std::process::exit(130);
                }
                stopping = true;
                let _ = match signal {
                    SIGTERM => {
                        log::info!("signal {signal} (SIGTERM): draining");
                        handle.drain()
                    }
                    SIGUSR1 => {
                        log::info!("signal {signal} (SIGUSR1): handing over to a replacement");
                        handle.hand_over()
                    }
                    _ => {
                        log::info!("signal {signal}: closing connections");
                        handle.shutdown()
                    }
                };
            }
        })
        .map(drop)
        .map_err(|e| format!("cannot start the signal thread: {e}"))
}

/// `--processes N|auto`: start the instances of this binary with
/// `--reuse-port` on one address (a port 0 is resolved first so that all
/// share it) and supervise them.
fn supervise(cli: &Cli, processes: Processes) -> Result<(), String> {
    // Refuse bad settings once, before starting any instance.
    let config = config(cli)?;
    // Instances inherit the raised limit (and raise it again themselves).
    let per_instance = match cli.max_connections {
        Some(n) => (n as u64).min(open_file_capacity()),
        None => open_file_capacity(),
    };
    let count = match processes {
        Processes::Count(n) => n,
        Processes::Auto => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            instances_for(cli.total_connections, per_instance, cores)
        }
    };
    let holds = (count as u64).saturating_mul(per_instance);
    if let Some(total) = cli.total_connections.filter(|&total| total > holds) {
        log::warn!(
            "{count} instances hold at most {holds} connections ({per_instance} each), fewer than --total-connections {total}"
        );
    }
    let (listen, _port_hold) = resolve_shared_address(cli.listen)?;
    let program = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut args = instance_args(std::env::args_os().skip(1));
    args.extend([
        "--listen".into(),
        listen.to_string().into(),
        "--reuse-port".into(),
    ]);
    let policy = Policy {
        on_exit: cli.on_instance_exit,
        max_backlog: cli.instance_backlog,
        stall_timeout: cli.instance_stall_timeout,
        // Instances get their drain and shutdown timeout, and some time to
        // exit after them.
        stop_grace: config.drain_grace
            + config.drain_time
            + config.shutdown_timeout
            + Duration::from_secs(5),
    };
    let inputs = redis_inputs(cli, &config)?;
    let max_message = config.max_message_bytes as usize;
    let max_line = input::max_line_bytes(cli.input, max_message);
    let history = SharedHistory::create(&config)
        .map_err(|e| format!("cannot make the history's shared memory: {e}"))?;
    let recorder = input::Recorder::new(history, cli.input, max_message);
    let merge = cli.upstream.is_some();
    // The supervisor holds a listener for each instance, which every
    // process of that instance serves in turn.
    let listeners = (0..count)
        .map(|_| wspush::listen(listen, true).map(OwnedFd::from))
        .collect::<io::Result<Vec<_>>>()
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    // Instances run this process's own binary, whatever is on disk later;
    // SIGUSR2 upgrades them to what is on disk then.
    let own = Path::new("/proc/self/exe");
    let supervisor = Supervisor::start(own, program, &args, listeners, policy, merge, recorder)
        .map_err(|e| e.to_string())?;
    log::info!(
        "listening on {listen} with {count} instances, up to {per_instance} connections each"
    );
    let stats = supervisor.stats();
    let publish = publish_listener(cli, &config, Box::new(move || stats.json()))?;
    let chunks = sources::spawn(
        io::stdin(),
        inputs,
        publish,
        max_line,
        Some(supervisor.waker()),
    )
    .map_err(|e| format!("cannot start the input readers: {e}"))?;
    supervisor.run(chunks).map_err(|e| e.to_string())
}

/// The help heading of the supervisor's own flags: an instance must not
/// supervise.
const SUPERVISOR_HEADING: &str = "Supervisor (--processes)";
/// The help heading of the Redis input's flags: under `--processes` the
/// supervisor holds the one Redis subscription, not its instances.
const PUBLISH_HEADING: &str = "HTTP publish (under --processes, the supervisor's)";
const JWT_HEADING: &str = "Signed tokens (JWT)";
const REDIS_HEADING: &str = "Redis input (under --processes, the supervisor's)";

/// The flags an instance is not given: those under the two headings above,
/// as `--name`, each taking a value.
fn supervisor_flags() -> Vec<String> {
    Cli::command()
        .get_arguments()
        .filter(|arg| {
            matches!(
                arg.get_help_heading(),
                Some(SUPERVISOR_HEADING | REDIS_HEADING | PUBLISH_HEADING)
            )
        })
        .filter_map(|arg| arg.get_long().map(|long| format!("--{long}")))
        .collect()
}

/// The command line without the supervisor's flags.
fn instance_args(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
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

/// For port 0, binds (without listening) an `SO_REUSEPORT` socket to pick
/// a port every instance can then share; the socket is held until the
/// supervisor exits so nothing else takes the port meanwhile.
fn resolve_shared_address(addr: SocketAddr) -> Result<(SocketAddr, Option<Socket>), String> {
    if addr.port() != 0 {
        return Ok((addr, None));
    }
    let reserve = || -> io::Result<(SocketAddr, Socket)> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        socket.set_reuse_port(true)?;
        socket.bind(&addr.into())?;
        let local = socket
            .local_addr()?
            .as_socket()
            .ok_or(io::ErrorKind::AddrNotAvailable)?;
        Ok((local, socket))
    };
    let (local, socket) = reserve().map_err(|e| format!("cannot pick a port on {addr}: {e}"))?;
    Ok((local, Some(socket)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_command_line_gives_the_librarys_defaults() {
        use clap::Parser;
        // The flags' defaults are the library's: a setting the binary
        // defaults otherwise would show up here.
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
        let operations = include_str!("../../../docs/OPERATIONS.md");
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
                "--instance-backlog",
                "--instance-stall-timeout",
                "--on-instance-exit",
                "--processes",
                "--publish-key-file",
                "--publish-listen",
                "--redis",
                "--redis-channel",
                "--redis-stream",
                "--total-connections"
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
    fn errors_fold_to_one_line() {
        let rendered = "error: the following required arguments were not provided:\n  --listen <ADDR>\n\nUsage: wspush";
        assert_eq!(
            one_line(rendered),
            "the following required arguments were not provided: --listen <ADDR>"
        );
    }
}

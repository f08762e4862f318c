//! The options of a `push` run ([`PushOptions`]): its command line, what
//! follows from it, and the checks of what does not depend on the machine.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::client::dial::Transports;
use crate::wire::message::{self, Padding};
use crate::Error;

/// Parameters of a `push` run.
#[derive(Debug, Clone, clap::Args)]
pub struct PushOptions {
    /// Connections to open.
    #[arg(long, default_value_t = 1000)]
    pub conns: usize,
    /// Broadcast messages to send, one at a time.
    #[arg(long, default_value_t = 10)]
    pub messages: u32,
    /// Size of each message payload (it carries a sequence number and a timestamp).
    #[arg(long, default_value_t = 32)]
    pub payload_bytes: usize,
    /// What fills each payload after its sequence number and timestamp:
    /// `dots`, or `json` (an order book, which compresses as a JSON feed
    /// does).
    #[arg(long, value_enum, default_value_t = Padding::Dots)]
    pub padding: Padding,
    /// The connections offer permessage-deflate, without context takeover
    /// either way, and fail if the server does not agree; they inflate
    /// what arrives compressed. The report adds the compressed share and
    /// the payload bytes on the wire over their plain size.
    #[arg(long)]
    pub deflate: bool,
    /// What the connections speak: `ws`, `sse` (event streams, as
    /// `EventSource` opens them: a `GET` with `Accept:
    /// text/event-stream`), or `mixed` (connections of odd ids are event
    /// streams). The messages are checked the same way for both.
    #[arg(long, value_enum, default_value_t = Transports::WebSocket)]
    pub transport: Transports,
    /// Every connection subscribes to this channel (`&channel=NAME` in its
    /// URL) and every line is sent as `pub NAME PAYLOAD`: for wspush with
    /// `--input commands`, a channel's messages instead of broadcasts.
    #[arg(long, value_name = "NAME")]
    pub channel: Option<String>,
    /// Every connection presents this token (`&token=TOKEN` in its URL):
    /// one of a token file's, or a signed one, for what checking tokens
    /// costs the setup.
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Send the broadcasts as `POST /publish` requests to this address (the
    /// server's `--publish-listen`), on one keep-alive connection, instead
    /// of on its standard input.
    #[arg(long, value_name = "ADDR", requires = "publish_key")]
    pub publish: Option<SocketAddr>,
    /// The key the requests present (`Authorization: Bearer KEY`).
    #[arg(long, value_name = "KEY", requires = "publish")]
    pub publish_key: Option<String>,
    /// Read the server's counts of what it encoded and delivered (its
    /// `/metrics` at this address) at the end of the run, for the report:
    /// a batch framed, made into events, or compressed once for every
    /// connection that gets it shows as one count per batch or message.
    #[arg(long, value_name = "ADDR")]
    pub metrics_from: Option<SocketAddr>,
    /// Connection attempts started per second.
    #[arg(long, default_value_t = 10_000)]
    pub rate: u32,
    /// Most connections connecting or upgrading at once (over all workers).
    #[arg(long, default_value_t = 512)]
    pub max_in_flight: usize,
    /// Source addresses used in turn: 127.0.0.2, 127.0.0.3, ... [default:
    /// enough for the connections to use at most 45% of the local port
    /// range per address: beyond half of it, connect() slows down 20×].
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=250))]
    pub sources: Option<u8>,
    /// The first source address (the others follow it).
    #[arg(long, value_name = "IP", default_value = "127.0.0.2")]
    pub first_source: Ipv4Addr,
    /// Most connections one worker process holds (each process may have at
    /// most RLIMIT_NOFILE descriptors).
    #[arg(long, default_value_t = 19_500)]
    pub per_worker: usize,
    /// Workers that open connections at the same time (they are filled in
    /// order). With 2, a fifth to a tenth of this 2-CPU machine stayed idle
    /// during the setup; 4 to 8 keep both CPUs busy.
    #[arg(long, default_value_t = 6)]
    pub active_workers: usize,
    /// Server port (default: a free one).
    #[arg(long)]
    pub port: Option<u16>,
    /// Idle time before each memory sample, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub settle_ms: u64,
    /// Seconds over which the server's idle CPU is measured after the setup.
    #[arg(long, default_value_t = 10)]
    pub idle_secs: u64,
    /// Pause between the end of one broadcast and the next, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub gap_ms: u64,
    /// Seconds the server gets to start listening.
    #[arg(long, default_value_t = 30)]
    pub start_timeout: u64,
    /// Seconds the whole connection setup may take [default: 60 s plus one
    /// second per 1,000 connections].
    #[arg(long)]
    pub setup_timeout: Option<u64>,
    /// Give up the setup when no connection opened or failed for this many
    /// seconds.
    #[arg(long, default_value_t = 30)]
    pub stall_timeout: u64,
    /// Seconds one connection may stay connecting or upgrading.
    #[arg(long, default_value_t = 10)]
    pub connect_timeout: u64,
    /// Seconds one broadcast may take to reach every connection [default:
    /// 10 s plus 50 µs per connection].
    #[arg(long)]
    pub message_timeout: Option<u64>,
    /// While a broadcast is arriving, a worker polls its sockets without
    /// blocking and naps this many microseconds, times the number of
    /// workers, whenever a poll found less than a full batch of events. A
    /// client blocked in `epoll_wait` is woken up by nearly every server
    /// `write()`, which charges the server for a cross-CPU wake-up per
    /// socket (costly in a VM); a napping client is not waiting on the
    /// sockets, so writes to it wake nobody. Receipt times are late by up
    /// to the nap. 0 blocks in `epoll_wait` instead.
    #[arg(long, default_value_t = 200)]
    pub nap_us: u64,
    /// Before starting the server, wait up to this many seconds for the
    /// machine to be quiet (other processes below 10% of a CPU for 5 s in
    /// a row).
    #[arg(long, default_value_t = 0)]
    pub wait_quiet: u64,
    /// After the broadcasts one at a time: a burst of this many lines
    /// written back to back (one write), timed until every connection has
    /// every one of them.
    #[arg(long, value_name = "LINES")]
    pub burst: Option<u32>,
    /// Then a feed of this many lines a second for `--feed-secs`.
    #[arg(long, value_name = "LINES_PER_SEC")]
    pub feed_rate: Option<f64>,
    /// Seconds of the feed.
    #[arg(long, default_value_t = 30)]
    pub feed_secs: u64,
    /// Instead of one feed: search the highest feed rate with p99 latency
    /// under `--feed-max-p99-ms` and every line delivered (steps of
    /// `--feed-search-secs` from `--feed-rate` or 100/s, doubling, then
    /// halving the interval), then hold the rate found for `--feed-secs`.
    #[arg(long)]
    pub find_max_feed_rate: bool,
    /// The p99 latency limit of the feed rate search, in ms.
    #[arg(long, default_value_t = 100.0)]
    pub feed_max_p99_ms: f64,
    /// Seconds of each step of the feed rate search.
    #[arg(long, default_value_t = 5)]
    pub feed_search_secs: u64,
    /// During each stream, probe the server's responsiveness every this
    /// many milliseconds: a new connection's upgrade time, and the ping
    /// round trip of a connected client (one more connection, besides
    /// `--conns`, that gets the stream too).
    #[arg(long, value_name = "MS")]
    pub probe_ms: Option<u64>,
    /// The connections ask for positions (`&positions=1`): each message
    /// comes as its position, a space and the payload, checked as before;
    /// a connection dialed again resumes with `&since=` its last position.
    #[arg(long)]
    pub positions: bool,
    /// With `--positions` or `--deflate`: only half the connections ask
    /// for positions (even ids), and only half offer permessage-deflate
    /// (ids 0 and 1 modulo 4), so that with both each of the four kinds
    /// is a quarter of the connections.
    #[arg(long)]
    pub mixed: bool,
    /// This many seconds into the feed, every connection is dropped by
    /// its client at once and dialed again (a reconnect storm), spread
    /// over `--storm-within-ms`, to the next server (host) of the run; the
    /// feed's report counts what each connection received, which must
    /// still be every line once, in order. Repeatable.
    #[arg(long, value_name = "SECS", requires = "feed_rate")]
    pub storm_at_secs: Vec<f64>,
    /// The reconnects of a storm are spread over this long.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub storm_within_ms: u64,
    /// This many seconds into the feed, one instance of the server (run
    /// with `--processes`) is killed with SIGKILL; its clients, dropped,
    /// dial again after 0 to 2 s (resuming, with `--positions`).
    #[arg(long, value_name = "SECS", requires = "feed_rate")]
    pub kill_instance_at_secs: Option<f64>,
    /// This many seconds into the feed, the server (a supervisor, run with
    /// `--processes`) is sent `--roll-signal`: a rolling restart, or an
    /// upgrade to the binary on disk. Clients it closes dial again after
    /// the delay the server's hint gives (resuming, with `--positions`);
    /// the feed's report gives the peak rate of those redials, and the
    /// failures line what was closed.
    #[arg(long, value_name = "SECS", requires = "feed_rate")]
    pub roll_at_secs: Option<f64>,
    /// What `--roll-at-secs` sends: `HUP` (a rolling restart) or `USR2`
    /// (an upgrade to the binary on disk).
    #[arg(long, value_name = "SIGNAL", default_value = "HUP", value_parser = ["HUP", "USR2"])]
    pub roll_signal: String,
    /// With `--roll-at-secs`: the feed's report gives the latency of the
    /// lines sent before the signal, and of those sent within this many
    /// seconds after it, apart.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub roll_window_secs: f64,
    /// This many seconds into the feed, the broker the servers read (the
    /// `hosts` measurement's redis-server) is stopped, and started again
    /// `--broker-outage-secs` later; the lines of the feed meanwhile
    /// wait in the publisher, which sends them once it is back.
    #[arg(long, value_name = "SECS", requires = "feed_rate")]
    pub broker_outage_at_secs: Option<f64>,
    /// How long the broker stays stopped.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub broker_outage_secs: f64,
}

impl PushOptions {
    /// What goes before each line's payload: `pub NAME ` with `--channel`.
    pub(super) fn line_prefix(&self) -> Vec<u8> {
        self.channel
            .as_ref()
            .map_or_else(Vec::new, |name| format!("pub {name} ").into_bytes())
    }

    pub(super) fn setup_timeout(&self) -> Duration {
        Duration::from_secs(self.setup_timeout.unwrap_or(60 + self.conns as u64 / 1000))
    }

    pub(super) fn message_timeout(&self) -> Duration {
        match self.message_timeout {
            Some(secs) => Duration::from_secs(secs),
            None => Duration::from_secs(10) + Duration::from_micros(50) * self.conns as u32,
        }
    }

    /// Checks the options that do not depend on the machine.
    pub fn check(&self) -> Result<(), Error> {
        if self.conns == 0
            || self.messages == 0
            || self.rate == 0
            || self.max_in_flight == 0
            || self.per_worker == 0
            || self.active_workers == 0
        {
            return Err(
                "--conns, --messages, --rate, --max-in-flight, --per-worker and \
                        --active-workers must be positive"
                    .into(),
            );
        }
        if self.burst == Some(0)
            || self.feed_rate.is_some_and(|r| !(r > 0.0 && r.is_finite()))
            || self.feed_secs == 0
            || self.feed_search_secs == 0
        {
            return Err(
                "--burst, --feed-rate, --feed-secs and --feed-search-secs must be positive".into(),
            );
        }
        // The widest stamp: the last sequence number with a 20-digit time.
        let streams = self.burst.is_some() || self.feed_rate.is_some() || self.find_max_feed_rate;
        let max_seq = if streams { u32::MAX } else { self.messages };
        Ok(message::check_room(self.payload_bytes, max_seq)?)
    }
}

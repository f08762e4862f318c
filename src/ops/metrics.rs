//! Counters the loop keeps, readable from any thread through a
//! `Handle`. Nothing is lost silently: every dropped
//! message and every closed or refused connection is counted by reason.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

macro_rules! metrics {
    ($( $(#[$doc:meta])* $name:ident: $kind:ident $prom:literal $labels:literal $help:literal, )*) => {
        /// Live counters. Only the loop thread writes them (relaxed atomics,
        /// uncontended); other threads take a [`MetricsSnapshot`]. Its
        /// words lie in table order (it may lie in shared memory: see
        /// [`Counters`]).
        #[derive(Debug, Default)]
        #[repr(C)]
        pub struct Metrics {
            $( $(#[$doc])* pub $name: AtomicU64, )*
        }

        /// A copy of every counter at one moment (more may come: read
        /// its fields, don't build one).
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct MetricsSnapshot {
            $( $(#[$doc])* pub $name: u64, )*
        }

        /// How each counter is exported, in table order.
        const EXPORTS: &[Export] = &[
            $( Export { name: $prom, labels: $labels, kind: Kind::$kind, help: $help }, )*
        ];

        /// Each counter's field, in table order.
        const FIELDS: &[&str] = &[ $( stringify!($name), )* ];

        impl Metrics {
            /// Reads every counter.
            pub fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }

            /// Every counter, in table order.
            fn all(&self) -> [&AtomicU64; EXPORTS.len()] {
                [ $( &self.$name, )* ]
            }
        }

        impl MetricsSnapshot {
            /// Every value, in table order.
            fn values(&self) -> [u64; EXPORTS.len()] {
                [ $( self.$name, )* ]
            }
        }
    };
}

/// How a counter is exported in the Prometheus format, and summed over
/// a host's instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A `counter`: only ever grows. The host's is the instances' sum.
    Counter,
    /// A `gauge`: a level now. The host's is the instances' sum.
    Gauge,
    /// A counter of the host's input, which every instance sees alike (a
    /// line refused, a feed lost): the host's is the largest instance's.
    HostCounter,
    /// A gauge of what every instance sees alike (the shared history, a
    /// feed's state) or of a worst case: the host's is the largest.
    HostGauge,
    /// Rendered apart, in another shape (the loop time histogram and
    /// maximum, in seconds).
    Apart,
}

/// One row of the metrics table: a counter, its exported name and label
/// set (rows of one name, adjacent, form one family), kind and help (the
/// family's, given on its first row).
#[derive(Debug)]
struct Export {
    name: &'static str,
    labels: &'static str,
    kind: Kind,
    help: &'static str,
}

/// The family of connections closed, by reason.
const CLOSED: &str = "wspush_connections_closed_total";
/// The family of requests refused before the upgrade, by status.
const REJECTED: &str = "wspush_requests_rejected_total";

// The one table of metrics: field (with its doc), kind, exported name,
// labels, help. The Prometheus text, the stats line's sums and the
// rejection counter lookup are all generated from it.
metrics! {
    /// TCP connections accepted.
    connections_accepted: Counter "wspush_connections_accepted_total" "" "TCP connections accepted.",
    /// WebSocket connections open now (upgraded, until closed).
    connections_open: Gauge "wspush_connections_open" "" "WebSocket connections open now (upgraded, until closed).",
    /// Connections not upgraded, held now: reading a request head, or
    /// answering a plain HTTP request or an error.
    connections_http: Gauge "wspush_connections_http" "" "Connections not upgraded, held now: reading a request head, or answering a plain HTTP request or an error.",
    /// Handshakes completed with `101 Switching Protocols`.
    upgrades: Counter "wspush_upgrades_total" "" "WebSocket handshakes completed.",
    /// Plain requests for `/healthz` answered.
    http_healthz: Counter "wspush_http_requests_total" "{path=\"/healthz\"}" "Plain HTTP requests answered, by path.",
    /// Plain requests for `/metrics` answered.
    http_metrics: Counter "wspush_http_requests_total" "{path=\"/metrics\"}" "",
    /// Plain requests for the demo page (`/` with `--demo`) answered.
    http_demo: Counter "wspush_http_requests_total" "{path=\"/\"}" "",
    /// Plain requests for the JavaScript client (`/wspush.js`) answered.
    http_client: Counter "wspush_http_requests_total" "{path=\"/wspush.js\"}" "",
    /// Requests answered with 400.
    rejected_400: Counter "wspush_requests_rejected_total" "{status=\"400\"}" "Requests refused before the upgrade, by HTTP status.",
    /// Requests answered with 401 (missing or wrong token).
    rejected_401: Counter "wspush_requests_rejected_total" "{status=\"401\"}" "",
    /// Requests answered with 403 (origin not allowed).
    rejected_403: Counter "wspush_requests_rejected_total" "{status=\"403\"}" "",
    /// Requests answered with 404.
    rejected_404: Counter "wspush_requests_rejected_total" "{status=\"404\"}" "",
    /// Requests answered with 405.
    rejected_405: Counter "wspush_requests_rejected_total" "{status=\"405\"}" "",
    /// Requests answered with 426.
    rejected_426: Counter "wspush_requests_rejected_total" "{status=\"426\"}" "",
    /// Connections refused because their IP address held its maximum (429).
    rejected_429: Counter "wspush_requests_rejected_total" "{status=\"429\"}" "",
    /// Requests answered with 431.
    rejected_431: Counter "wspush_requests_rejected_total" "{status=\"431\"}" "",
    /// Connections refused at accept because `max_connections` was reached (503).
    rejected_503: Counter "wspush_requests_rejected_total" "{status=\"503\"}" "",
    /// Closed after a completed close handshake (either side began it).
    closed_normal: Counter "wspush_connections_closed_total" "{reason=\"normal\"}" "Connections closed, by reason (and close code for protocol errors).",
    /// Closed after the server failed the connection for a protocol error (1002).
    closed_protocol_error: Counter "wspush_connections_closed_total" "{reason=\"protocol_error\",code=\"1002\"}" "",
    /// Closed after invalid UTF-8 (1007).
    closed_invalid_payload: Counter "wspush_connections_closed_total" "{reason=\"protocol_error\",code=\"1007\"}" "",
    /// Closed after a message over the size limit (1009).
    closed_message_too_big: Counter "wspush_connections_closed_total" "{reason=\"protocol_error\",code=\"1009\"}" "",
    /// Closed because the output queue was over its limit (1008).
    closed_slow_consumer: Counter "wspush_connections_closed_total" "{reason=\"slow_consumer\"}" "",
    /// Closed because nothing was heard from the client for the idle timeout (1001).
    closed_idle_timeout: Counter "wspush_connections_closed_total" "{reason=\"idle_timeout\"}" "",
    /// Closed because a handshake did not complete in time.
    closed_handshake_timeout: Counter "wspush_connections_closed_total" "{reason=\"handshake_timeout\"}" "",
    /// Closed after an HTTP rejection was sent.
    closed_rejected: Counter "wspush_connections_closed_total" "{reason=\"rejected\"}" "",
    /// Closed after a plain HTTP request (`/healthz`, `/metrics`, the demo
    /// page) was answered.
    closed_http: Counter "wspush_connections_closed_total" "{reason=\"http\"}" "",
    /// Closed during server shutdown (1001).
    closed_shutdown: Counter "wspush_connections_closed_total" "{reason=\"shutdown\"}" "",
    /// Closed by a drain, at its pace (1012, Service Restart).
    closed_drain: Counter "wspush_connections_closed_total" "{reason=\"drain\"}" "",
    /// Closed as its signed token expired (4001).
    closed_token_expired: Counter "wspush_connections_closed_total" "{reason=\"token_expired\"}" "",
    /// Closed as it resumed from a position this server did not reach in
    /// time (1013).
    closed_ahead: Counter "wspush_connections_closed_total" "{reason=\"ahead\"}" "",
    /// Closed by a publisher's `close` command (or `Handle::close`).
    closed_publisher: Counter "wspush_connections_closed_total" "{reason=\"publisher\"}" "",
    /// The peer vanished without a close handshake (EOF, reset or I/O error).
    closed_abnormal: Counter "wspush_connections_closed_total" "{reason=\"abnormal\"}" "",
    /// Broadcast messages encoded (each once).
    broadcasts: HostCounter "wspush_broadcasts_total" "" "Broadcast messages encoded (each once).",
    /// Batches fanned out: broadcasts queued together are framed into one
    /// batch, which each connection takes in one write.
    broadcast_batches: Counter "wspush_broadcast_batches_total" "" "Batches of broadcasts fanned out (each written to a connection at once).",
    /// Broadcast messages refused (larger than the message limit).
    broadcasts_rejected: HostCounter "wspush_broadcasts_rejected_total" "" "Broadcasts refused as larger than the message limit.",
    /// Broadcasts a handle queued that were not sent because a shutdown
    /// came first (the loop was behind), or that came after it (once the
    /// server is dropped, a handle's snapshot counts what was left queued).
    broadcasts_abandoned: Counter "wspush_broadcasts_abandoned_total" "" "Queued broadcasts not sent because the server shut down.",
    /// Bytes of broadcasts queued for the loop and not yet sent (payloads
    /// plus 64 bytes each; bounded by `max_pending_bytes`).
    broadcast_queue_bytes: Gauge "wspush_broadcast_queue_bytes" "" "Bytes of broadcasts queued and not yet sent.",
    /// Publishers (handles, the input reader) waiting for room in the
    /// broadcast queue now: the feed is faster than the fan-out and is
    /// being slowed down, not buffered.
    broadcast_producers_waiting: Gauge "wspush_broadcast_producers_waiting" "" "Publishers waiting for room in the broadcast queue.",
    /// How long the oldest broadcast not yet sent has waited, in
    /// microseconds (0 when none waits).
    broadcast_queue_age_us: HostGauge "wspush_broadcast_queue_age_microseconds" "" "Age of the oldest broadcast not yet sent.",
    /// Input lines not broadcast (invalid UTF-8, or over the message limit).
    input_lines_rejected: HostCounter "wspush_input_lines_rejected_total" "" "Input lines skipped (invalid UTF-8, too long, or not a command).",
    /// 1 while a drain is under way (`/healthz` answers 503 `draining`).
    draining: Gauge "wspush_draining" "" "1 while draining: /healthz answers 503 and connections are closed at a pace.",
    /// Connections a drain has still to close at its pace (0 when none is
    /// under way).
    drain_left: Gauge "wspush_drain_connections_left" "" "Connections the drain under way has still to close.",
    /// Feeds (a Redis subscription) disconnected now; `/healthz` reports
    /// the server degraded while any is.
    feeds_down: HostGauge "wspush_feeds_down" "" "Input feeds (Redis) disconnected now.",
    /// Times a feed was lost (one per outage, however many reconnection
    /// attempts it took): what was published meanwhile did not arrive.
    feed_outages: HostCounter "wspush_feed_outages_total" "" "Times an input feed (Redis) was lost; what pub/sub published meanwhile is lost, a stream's entries are read when it is back.",
    /// Milliseconds feeds were disconnected, over the outages that ended.
    feed_outage_ms: HostCounter "wspush_feed_outage_milliseconds_total" "" "Time input feeds were disconnected, over the outages that ended.",
    /// Times the Redis stream no longer held entries not read yet
    /// (trimmed during an outage): their positions are missing here.
    stream_gaps: HostCounter "wspush_stream_gaps_total" "" "Times the Redis stream no longer held entries not read yet; connected clients with positions, and resumes across them, are told the gap.",
    /// Connections handed over to a successor process, alive.
    handover_given: Counter "wspush_handover_connections_given_total" "" "Connections handed over, open, to a successor process (a deploy that closes nothing).",
    /// Connections taken over from the process this one replaced.
    handover_taken: Counter "wspush_handover_connections_taken_total" "" "Connections taken over, open, from the process this one replaced.",
    /// Connections lost in a handover that broke off (their clients
    /// reconnect, as after a crash).
    handover_lost: Counter "wspush_handover_connections_lost_total" "" "Connections lost in a handover that broke off (they reconnect as after a crash).",
    /// Handovers this process asked for and did not get (refused, or its
    /// predecessor gone): that one drains instead.
    handover_fallbacks: Counter "wspush_handover_fallbacks_total" "" "Handovers asked for and not had; the predecessor drains instead.",
    /// How long the last handover paused the loop, in microseconds.
    handover_pause_us: HostGauge "wspush_handover_pause_microseconds" "" "How long the last handover paused this loop.",
    /// Processes this instance had before this one under its supervisor:
    /// restarts after a death, and replacements in rolling restarts and
    /// upgrades (0 for a lone server).
    instance_restarts: Gauge "wspush_instance_restarts" "" "Processes this instance had before this one under its supervisor (restarts after a death, replacements in rolling restarts).",
    /// How far the entries read are behind the stream's last entry, by
    /// their ids' milliseconds (0: caught up).
    stream_lag_ms: HostGauge "wspush_stream_lag_milliseconds" "" "How far the Redis stream entries read are behind its last entry, by their ids.",
    /// Messages and commands for some connections that reached none here:
    /// an id, channel or connection key with no open connection (under
    /// `--processes`, those of the other instances).
    commands_unmatched: Counter "wspush_commands_unmatched_total" "" "Targeted messages and commands that reached no connection here.",
    /// Client messages written upstream (`--upstream`).
    upstream_messages: Counter "wspush_upstream_messages_total" "" "Client messages written upstream.",
    /// Upstream lines dropped: messages at the bound under
    /// `--upstream-overflow drop`, or lines after the reader failed (or,
    /// at exit, that the Redis stream did not take in time).
    upstream_dropped: Counter "wspush_upstream_dropped_total" "" "Upstream lines dropped (at the bound, after standard output failed, or at exit while the Redis stream was lost).",
    /// Times reading clients paused because the upstream reader was a bound behind.
    upstream_pauses: Counter "wspush_upstream_pauses_total" "" "Times reading clients paused for the upstream reader.",
    /// Upstream lines written into the Redis stream (`--upstream
    /// redis-stream`), each once.
    upstream_stream_entries: Counter "wspush_upstream_stream_entries_total" "" "Upstream lines written into the Redis stream, each once.",
    /// Batches of upstream lines the Redis stream took.
    upstream_stream_written: Counter "wspush_upstream_stream_batches_total" "{result=\"written\"}" "Batches of upstream lines sent to the Redis stream: written, or found written already (their reply had been lost).",
    /// Batches sent again after their reply was lost, found written
    /// already: not written twice.
    upstream_stream_found: Counter "wspush_upstream_stream_batches_total" "{result=\"found\"}" "",
    /// Times the Redis stream upstream was lost (one per outage).
    upstream_stream_outages: Counter "wspush_upstream_stream_outages_total" "" "Times the Redis stream upstream was lost; its lines wait, then the upstream bound and overflow policy apply.",
    /// Milliseconds the Redis stream upstream was lost, over the outages
    /// that ended.
    upstream_stream_outage_ms: Counter "wspush_upstream_stream_outage_milliseconds_total" "" "Time the Redis stream upstream was lost, over the outages that ended.",
    /// 1 while the Redis stream upstream is lost.
    upstream_stream_down: Gauge "wspush_upstream_stream_down" "" "1 while the Redis stream upstream is lost.",
    /// Subscriptions refused because the server holds its maximum of channels.
    subscriptions_refused: Counter "wspush_subscriptions_refused_total" "" "Subscriptions refused at the channel limit.",
    /// Channels with at least one subscriber now.
    channels: Gauge "wspush_channels" "" "Channels with at least one subscriber.",
    /// Subscriptions (connection and channel) held now.
    subscriptions: Gauge "wspush_subscriptions" "" "Subscriptions held (a connection in a channel).",
    /// Open connections that negotiated permessage-deflate now.
    connections_deflate: Gauge "wspush_connections_deflate" "" "Open connections that negotiated permessage-deflate.",
    /// Open event streams (SSE), of `connections_open`.
    connections_event_stream: Gauge "wspush_connections_event_stream" "" "Open event streams (SSE), of the open connections.",
    /// Broadcasts compressed (once each, for every connection that
    /// negotiated permessage-deflate).
    broadcasts_compressed: Counter "wspush_broadcasts_compressed_total" "" "Broadcasts compressed, once each, for the connections that negotiated permessage-deflate.",
    /// Open connections with a client id now.
    connections_with_id: Gauge "wspush_connections_with_id" "" "Connections with a client id.",
    /// Broadcast frames handed to connections (written or queued).
    broadcast_deliveries: Counter "wspush_broadcast_deliveries_total" "" "Broadcast frames handed to connections.",
    /// Broadcast frames a connection did not get because its queue was full
    /// (policy `drop`: each one skipped; policy `close`: the one that
    /// overflowed it, as the connection is closed).
    slow_consumer_drops: Counter "wspush_slow_consumer_drops_total" "" "Broadcasts skipped for a connection whose queue was full.",
    /// Of the broadcast deliveries, those to event streams (SSE).
    event_stream_deliveries: Counter "wspush_event_stream_deliveries_total" "" "Broadcast messages handed to event streams (SSE), of all deliveries.",
    /// Of the slow-consumer drops, those of event streams.
    event_stream_drops: Counter "wspush_event_stream_drops_total" "" "Broadcasts skipped for an event stream whose queue was full, of all such.",
    /// Batches of frames made into events (SSE): once for every event
    /// stream that gets them, as deflate compresses once.
    event_stream_batches: Counter "wspush_event_stream_batches_total" "" "Batches of frames made into events (SSE), once each for all the event streams that get them.",
    /// Event streams closed, for any reason (of all closes).
    closed_event_stream: Counter "wspush_event_streams_closed_total" "" "Event streams (SSE) closed, for any reason, of all closed connections.",
    /// Connections that asked for positions without `since`, told the
    /// current position.
    resumes_position: Counter "wspush_resumes_total" "{result=\"position\"}" "Connections that asked for positions, by what they were told: the current position (no since), recovered, gap, unknown.",
    /// Resumes given everything after their `since`.
    resumes_recovered: Counter "wspush_resumes_total" "{result=\"recovered\"}" "",
    /// Resumes whose `since` the history no longer reached: told the gap.
    resumes_gap: Counter "wspush_resumes_total" "{result=\"gap\"}" "",
    /// Resumes whose `since` was of another epoch or not a position.
    resumes_unknown: Counter "wspush_resumes_total" "{result=\"unknown\"}" "",
    /// Replays that found the history had dropped what was left of them
    /// (their connection took longer than the history keeps): told a gap.
    replay_overruns: Counter "wspush_replay_overruns_total" "" "Replays that outlasted the history (the connection was told of the gap).",
    /// Messages the history refused, each larger than its byte bound
    /// alone (the others stay; a resume across one is told the gap), over
    /// the host: the history's writer counts them.
    history_refused: HostCounter "wspush_history_refused_total" "" "Messages the history refused (each larger than its byte bound); resumes across one are told the gap.",
    /// Messages in the history now.
    history_messages: HostGauge "wspush_history_messages" "" "Messages held in the history.",
    /// Bytes of frames in the history now.
    history_bytes: HostGauge "wspush_history_bytes" "" "Bytes of frames held in the history.",
    /// Frames queued for a connection and never written whole: dropped
    /// when it was closed as a slow consumer, or still pending when it
    /// closed (the peer went, or a close or shutdown timed out).
    frames_discarded: Counter "wspush_frames_discarded_total" "" "Queued frames never written whole (slow consumer closed, or pending at close).",
    /// Frames handed to sockets: broadcasts, pings and each connection's own.
    frames_sent: Counter "wspush_frames_sent_total" "" "Frames handed to sockets.",
    /// Bytes the kernel took from the server's writes.
    bytes_written: Counter "wspush_bytes_written_total" "" "Bytes written to sockets.",
    /// Frames that could not be written whole at once and were queued.
    write_would_block: Counter "wspush_write_would_block_total" "" "Frames not written whole at once and queued.",
    /// Output bytes queued now over all connections, shared frames counted
    /// by their size (bounded by connections × `max_queued_bytes`).
    queued_bytes: Gauge "wspush_queued_bytes" "" "Output bytes queued over all connections.",
    /// Data messages received from clients.
    messages_received: Counter "wspush_messages_received_total" "" "Data messages received from clients.",
    /// Messages echoed back (echo mode).
    messages_echoed: Counter "wspush_messages_echoed_total" "" "Messages echoed back (echo mode).",
    /// Heartbeat pings sent.
    pings_sent: Counter "wspush_pings_sent_total" "" "Heartbeat pings sent.",
    /// Pings from clients, answered with a pong.
    pings_received: Counter "wspush_pings_received_total" "" "Pings received from clients and answered.",
    /// Buffers lent from the pool right now (partial input, echo messages).
    buffers_lent: Gauge "wspush_buffers_lent" "" "Pool buffers lent to connections now.",
    /// Free buffers the pool holds for reuse right now.
    buffers_idle: Gauge "wspush_buffers_idle" "" "Free pool buffers kept for reuse now.",
    /// Pool buffers given back to the system (over the idle limit, grown
    /// for an echo message, or unused for a whole trim period).
    buffers_released: Counter "wspush_buffers_released_total" "" "Pool buffers given back to the system.",
    /// Accept errors other than running out of file descriptors.
    accept_errors: Counter "wspush_accept_errors_total" "" "Accept errors other than running out of file descriptors.",
    /// Times accepting was paused because file descriptors ran out.
    accept_pauses: Counter "wspush_accept_pauses_total" "" "Times accepting paused because file descriptors ran out (EMFILE/ENFILE).",
    /// Loop iterations (one poll and everything it woke up).
    loop_iterations: Apart "" "" "",
    /// Time spent in loop iterations, not counting the wait, in nanoseconds.
    loop_busy_ns: Apart "" "" "",
    /// The longest loop iteration in the last 10 to 20 seconds, in nanoseconds.
    loop_max_ns: Apart "" "" "",
    /// Polls put off by the batch delay because the poll before them found
    /// several events.
    loop_batch_waits: Counter "wspush_loop_batch_waits_total" "" "Polls put off by the batch delay because the poll before found several events.",
}

/// Upper bounds of the loop iteration time histogram, in microseconds.
pub const LOOP_BUCKETS_US: [u64; 12] = [
    10, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 250_000, 1_000_000,
];

/// How many loop iterations took at most each [`LOOP_BUCKETS_US`] bound
/// (not cumulative; the rendering sums them).
#[derive(Debug, Default)]
#[repr(C)]
pub struct LoopHistogram {
    buckets: [AtomicU64; LOOP_BUCKETS_US.len()],
}

impl LoopHistogram {
    /// Records one iteration of `ns` nanoseconds (beyond the last bound: only in the count).
    pub fn record(&self, ns: u64) {
        let us = ns / 1_000;
        if let Some(i) = LOOP_BUCKETS_US.iter().position(|&bound| us < bound) {
            Metrics::incr(&self.buckets[i]);
        }
    }
}

/// Upper bounds of the delivery latency histograms, in microseconds.
pub const LATENCY_BUCKETS_US: [u64; 16] = [
    250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 5_000_000, 10_000_000, 30_000_000,
];

/// A histogram of delivery latency (a message's input to the socket
/// write that completes it) for one transport, each observation weighted
/// (a batch's messages count once each, observed at once).
#[derive(Debug, Default)]
#[repr(C)]
pub struct Latency {
    /// Observations up to each [`LATENCY_BUCKETS_US`] bound (not
    /// cumulative).
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len()],
    /// Observations in all (past the last bound too).
    count: AtomicU64,
    /// Their sum, in nanoseconds.
    sum_ns: AtomicU64,
}

impl Latency {
    /// Records `weight` observations of `ns` nanoseconds.
    pub fn observe(&self, ns: u64, weight: u64) {
        if weight == 0 {
            return;
        }
        let us = ns / 1_000;
        if let Some(i) = LATENCY_BUCKETS_US.iter().position(|&bound| us < bound) {
            Metrics::add(&self.buckets[i], weight);
        }
        Metrics::add(&self.count, weight);
        Metrics::add(&self.sum_ns, ns.saturating_mul(weight));
    }

    /// Its words, in layout order.
    fn words(&self) -> impl Iterator<Item = u64> + '_ {
        (self.buckets.iter())
            .chain([&self.count, &self.sum_ns])
            .map(|word| word.load(Ordering::Relaxed))
    }
}

/// Everything a server counts, as it lies in memory: in this process's
/// own, or in its slot of the host's metrics board (see `board`), where
/// its supervisor and the host's other processes read it as it changes.
/// `repr(C)`, of 64-bit words only, in the order of [`Counters::words`].
#[derive(Debug, Default)]
#[repr(C)]
pub struct Counters {
    /// The table's counters.
    pub metrics: Metrics,
    /// The loop's iteration times.
    pub loop_histogram: LoopHistogram,
    /// Delivery latency to WebSocket connections.
    pub websocket_latency: Latency,
    /// Delivery latency to event streams.
    pub event_stream_latency: Latency,
}

/// Where in [`Counters`]' words each part starts.
pub(crate) const LOOP_BUCKETS_AT: usize = EXPORTS.len();
pub(crate) const WEBSOCKET_LATENCY_AT: usize = LOOP_BUCKETS_AT + LOOP_BUCKETS_US.len();
pub(crate) const EVENT_STREAM_LATENCY_AT: usize =
    WEBSOCKET_LATENCY_AT + LATENCY_BUCKETS_US.len() + 2;
/// [`Counters`]' words.
pub(crate) const COUNTERS_WORDS: usize = EVENT_STREAM_LATENCY_AT + LATENCY_BUCKETS_US.len() + 2;

// The structures are their words and nothing else (see `sys::AtomicWords`).
const _: () = assert!(std::mem::size_of::<Counters>() == COUNTERS_WORDS * 8);
const _: () = assert!(std::mem::offset_of!(Counters, loop_histogram) == LOOP_BUCKETS_AT * 8);
const _: () =
    assert!(std::mem::offset_of!(Counters, websocket_latency) == WEBSOCKET_LATENCY_AT * 8);
const _: () =
    assert!(std::mem::offset_of!(Counters, event_stream_latency) == EVENT_STREAM_LATENCY_AT * 8);

impl Counters {
    /// Every word, in layout order, the table's as `metrics` has them (a
    /// snapshot, with the gauges read where they are kept).
    pub fn words(&self, metrics: &MetricsSnapshot) -> Vec<u64> {
        let loop_buckets = self.loop_histogram.buckets.iter();
        (metrics.values().into_iter())
            .chain(loop_buckets.map(|word| word.load(Ordering::Relaxed)))
            .chain(self.websocket_latency.words())
            .chain(self.event_stream_latency.words())
            .collect()
    }
}

/// How each row of the table is exported: its family, labels (within
/// braces, or empty), kind and help (the family's first row only).
pub(crate) fn table() -> impl Iterator<Item = (&'static str, &'static str, Kind, &'static str)> {
    EXPORTS.iter().map(|e| (e.name, e.labels, e.kind, e.help))
}

/// The words of the table's rows rendered apart: the loop's iterations,
/// busy time (ns) and longest iteration lately (ns).
pub(crate) fn loop_words() -> (usize, usize, usize) {
    let at = |name: &str| {
        FIELDS
            .iter()
            .position(|f| *f == name)
            .expect("bug: a loop row")
    };
    (at("loop_iterations"), at("loop_busy_ns"), at("loop_max_ns"))
}

/// Length of one window of [`LoopMax`].
const LOOP_MAX_WINDOW: Duration = Duration::from_secs(10);

/// The longest loop iteration lately: the maximum over the current 10 s
/// window and the one before, so a spike stays visible for 10 to 20 s.
#[derive(Debug, Default)]
pub struct LoopMax {
    current: u64,
    previous: u64,
    ends_at: Option<Instant>,
}

impl LoopMax {
    /// Records an iteration of `ns` nanoseconds at `now`; returns the new
    /// maximum when it changed.
    pub fn record(&mut self, ns: u64, now: Instant) -> Option<u64> {
        let before = self.current.max(self.previous);
        match self.ends_at {
            Some(end) if now < end => {}
            Some(end) => {
                // A window with no iteration at all counts as empty.
                self.previous = if now < end + LOOP_MAX_WINDOW {
                    self.current
                } else {
                    0
                };
                self.current = 0;
                self.ends_at = Some(now + LOOP_MAX_WINDOW);
            }
            None => self.ends_at = Some(now + LOOP_MAX_WINDOW),
        }
        self.current = self.current.max(ns);
        let after = self.current.max(self.previous);
        (after != before).then_some(after)
    }
}

/// The periodic info line: connections, traffic and trouble since `last`
/// (`over` ago), e.g. `1200 open (+40 accepted, -3 closed: 1 idle, 0
/// slow), 10 broadcasts, 12000 deliveries, 0 dropped, 0 discarded, 0 B queued, 1200
/// pings, 0 rejected, loop max 0.31 ms`.
pub fn summary(last: &MetricsSnapshot, now: &MetricsSnapshot, over: Duration) -> String {
    let closed = |m: &MetricsSnapshot| m.family_total(CLOSED);
    let rejected = |m: &MetricsSnapshot| m.family_total(REJECTED);
    format!(
        "{} open (+{} accepted, -{} closed: {} idle, {} slow) in {}s, {} broadcasts, {} deliveries, \
         {} dropped, {} discarded, {} B queued, {} pings, {} rejected, loop max {:.2} ms",
        now.connections_open,
        now.connections_accepted - last.connections_accepted,
        closed(now) - closed(last),
        now.closed_idle_timeout - last.closed_idle_timeout,
        now.closed_slow_consumer - last.closed_slow_consumer,
        over.as_secs(),
        now.broadcasts - last.broadcasts,
        now.broadcast_deliveries - last.broadcast_deliveries,
        now.slow_consumer_drops - last.slow_consumer_drops,
        now.frames_discarded - last.frames_discarded,
        now.queued_bytes,
        now.pings_sent - last.pings_sent,
        rejected(now) - rejected(last),
        now.loop_max_ns as f64 / 1e6,
    )
}

/// Counts a loop iteration gathers in plain integers and publishes once,
/// so the per-connection paths touch no atomics.
#[derive(Debug, Default)]
pub struct Tally {
    /// Frames handed to sockets.
    pub frames_sent: u64,
    /// Bytes the kernel took.
    pub bytes_written: u64,
    /// Change of the bytes queued over all connections.
    pub queued_bytes: i64,
    /// Broadcast messages handed to connections (written or queued).
    pub broadcast_deliveries: u64,
    /// Deliveries a socket could not take whole at once (queued).
    pub write_would_block: u64,
    /// Broadcast messages a connection missed because its queue was full.
    pub slow_consumer_drops: u64,
    /// Of `broadcast_deliveries`, those to event streams.
    pub event_stream_deliveries: u64,
    /// Of `slow_consumer_drops`, those of event streams.
    pub event_stream_drops: u64,
    /// Queued frames thrown away (a slow consumer closed, or a connection
    /// gone with output pending).
    pub frames_discarded: u64,
}

impl Tally {
    /// Counts bytes written and the queue change of one send or flush.
    pub fn wrote(&mut self, written: usize, queued_before: usize, queued_after: usize) {
        self.bytes_written += written as u64;
        self.queued_bytes += queued_after as i64 - queued_before as i64;
    }
}

impl Metrics {
    /// Adds one to a counter.
    pub fn incr(counter: &AtomicU64) {
        Metrics::add(counter, 1);
    }

    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Sets a gauge.
    pub fn set(gauge: &AtomicU64, value: u64) {
        gauge.store(value, Ordering::Relaxed);
    }

    /// Subtracts one from a gauge.
    pub fn decr(counter: &AtomicU64) {
        counter.fetch_sub(1, Ordering::Relaxed);
    }

    /// Adds what a [`Tally`] gathered and resets it.
    pub fn publish(&self, tally: &mut Tally) {
        let tally = std::mem::take(tally);
        if tally.frames_sent > 0 {
            Metrics::add(&self.frames_sent, tally.frames_sent);
        }
        if tally.bytes_written > 0 {
            Metrics::add(&self.bytes_written, tally.bytes_written);
        }
        if tally.queued_bytes != 0 {
            // Two's complement: adding the wrapped value subtracts.
            Metrics::add(&self.queued_bytes, tally.queued_bytes as u64);
        }
        for (counter, n) in [
            (&self.broadcast_deliveries, tally.broadcast_deliveries),
            (&self.write_would_block, tally.write_would_block),
            (&self.slow_consumer_drops, tally.slow_consumer_drops),
            (&self.event_stream_deliveries, tally.event_stream_deliveries),
            (&self.event_stream_drops, tally.event_stream_drops),
            (&self.frames_discarded, tally.frames_discarded),
        ] {
            if n > 0 {
                Metrics::add(counter, n);
            }
        }
    }

    /// The counter for a request rejected with `status` (400's for a
    /// status the table has no row for).
    pub fn rejected(&self, status: u16) -> &AtomicU64 {
        let row = |status: u16| {
            EXPORTS.iter().position(|e| {
                e.name == REJECTED
                    && e.labels
                        .strip_prefix("{status=\"")
                        .and_then(|l| l.strip_suffix("\"}"))
                        .and_then(|l| l.parse::<u16>().ok())
                        == Some(status)
            })
        };
        let index = row(status).or_else(|| row(400)).expect("bug: a 400 row");
        self.all()[index]
    }
}

impl MetricsSnapshot {
    /// The sum of a family's rows.
    fn family_total(&self, family: &str) -> u64 {
        EXPORTS
            .iter()
            .zip(self.values())
            .filter(|(e, _)| e.name == family)
            .map(|(_, value)| value)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_well_formed() {
        let mut seen = Vec::new();
        let mut family = "";
        for export in EXPORTS.iter().filter(|e| e.kind != Kind::Apart) {
            assert!(export.name.starts_with("wspush_"), "{export:?}");
            if export.name != family {
                assert!(!seen.contains(&export.name), "{} is split", export.name);
                assert!(!export.help.is_empty(), "{export:?}");
                family = export.name;
                seen.push(family);
            } else {
                assert!(export.help.is_empty(), "help twice: {export:?}");
                assert!(!export.labels.is_empty(), "{export:?}");
            }
        }
        assert!(seen.contains(&CLOSED) && seen.contains(&REJECTED));
        let m = Metrics::default();
        assert!(std::ptr::eq(m.rejected(431), &m.rejected_431));
        assert!(std::ptr::eq(m.rejected(503), &m.rejected_503));
        assert!(std::ptr::eq(m.rejected(418), &m.rejected_400));
    }

    #[test]
    fn the_loop_max_covers_the_last_ten_to_twenty_seconds() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut max = LoopMax::default();
        assert_eq!(max.record(500, t0), Some(500));
        assert_eq!(max.record(300, t0 + 5 * s), None);
        assert_eq!(
            max.record(100, t0 + 12 * s),
            None,
            "the spike is in the previous window"
        );
        assert_eq!(max.record(100, t0 + 23 * s), Some(100), "now it aged out");
        assert_eq!(
            max.record(50, t0 + 60 * s),
            Some(50),
            "empty windows in between"
        );
    }

    #[test]
    fn the_summary_reports_changes_since_the_last_line() {
        let last = MetricsSnapshot {
            connections_accepted: 10,
            closed_normal: 2,
            broadcasts: 1,
            ..MetricsSnapshot::default()
        };
        let now = MetricsSnapshot {
            connections_open: 9,
            connections_accepted: 12,
            closed_normal: 3,
            closed_idle_timeout: 1,
            broadcasts: 4,
            rejected_401: 2,
            loop_max_ns: 1_250_000,
            ..MetricsSnapshot::default()
        };
        let line = summary(&last, &now, Duration::from_secs(10));
        assert!(
            line.starts_with(
                "9 open (+2 accepted, -2 closed: 1 idle, 0 slow) in 10s, 3 broadcasts"
            ),
            "{line}"
        );
        assert!(line.ends_with("2 rejected, loop max 1.25 ms"), "{line}");
    }

    #[test]
    fn a_tally_publishes_signed_queue_changes() {
        let metrics = Metrics::default();
        let mut tally = Tally::default();
        tally.wrote(10, 0, 90);
        metrics.publish(&mut tally);
        tally.wrote(90, 90, 0);
        tally.frames_sent += 2;
        metrics.publish(&mut tally);
        let m = metrics.snapshot();
        assert_eq!(
            (m.bytes_written, m.queued_bytes, m.frames_sent),
            (100, 0, 2)
        );
    }
}

//! What a `push` run observed ([`Observations`]), and its summary as a
//! [`RunReport`].

use std::time::Duration;

use super::options::PushOptions;
use crate::observe::latency::LatencyReport;
use crate::observe::procfs::Usage;
use crate::observe::ramp::Ramp;
use crate::observe::server_latency::ServerLatencyReport;
use crate::report::{
    BroadcastReport, ConnectionReport, CpuReport, DeliveryReport, Memory, MemoryReport, RunInfo,
    RunReport, StreamReport,
};

/// Everything a run observed, before it is summarised.
pub struct Observations {
    /// Server usage before the connections.
    pub baseline: Usage,
    /// Server usage when the setup began.
    pub setup_start: Usage,
    /// Server usage at the end of the setup.
    pub setup_end: Usage,
    /// Server usage with the connections open, after settling.
    pub open: Usage,
    /// Server usage at the end of the idle period.
    pub idle_end: Usage,
    /// Server usage after the last broadcast.
    pub end: Usage,
    /// Length of the setup.
    pub setup: Duration,
    /// CPU time of the client (this process and its workers) during the setup.
    pub client_setup_ns: u64,
    /// Busy CPU time of the machine during the setup.
    pub machine_setup_ns: u64,
    /// Of that, interrupt time (softirq: loopback TCP work).
    pub interrupts_setup_ns: u64,
    /// Length of the idle period.
    pub idle: Duration,
    /// Connections open after the setup.
    pub open_conns: usize,
    /// The setup over time.
    pub ramp: Ramp,
    /// Send time of each message ([`sys::now_ns`](crate::observe::sys::now_ns)).
    pub sent_ns: Vec<u64>,
    /// Wall time from the first broadcast to the end of the last.
    pub broadcast_wall: Duration,
    /// CPU time of the client (this process and its workers) during the broadcasts.
    pub client_broadcast_ns: u64,
    /// Busy CPU time of the machine during the broadcasts.
    pub machine_broadcast_ns: u64,
    /// Memory of the worker processes with the connections open (none for threads).
    pub client: Option<Usage>,
    /// The streams after the broadcasts one at a time, in order.
    pub streams: Vec<StreamReport>,
    /// The steps of the feed rate search, in order.
    pub feed_search: Vec<StreamReport>,
    /// The highest feed rate the search found, held for `--feed-secs`.
    pub max_feed_rate: Option<f64>,
    /// What the connections observed.
    pub observed: crate::observe::stats::Observed,
    /// The server's counts `--metrics-from` read, at the end.
    pub counted: Vec<(String, u64)>,
    /// The server's latency histogram over the messages sent one at a
    /// time against the clients' (`--metrics-from`).
    pub server_latency: Option<ServerLatencyReport>,
}

/// Summarises what a run observed.
pub(super) fn summarise(
    info: RunInfo,
    options: &PushOptions,
    workers: usize,
    sources: u8,
    listeners: usize,
    o: Observations,
    warnings: Vec<String>,
) -> RunReport {
    let secs = |ns: u64| ns as f64 / 1e9;
    let percent = |ns: u64, wall: f64| 100.0 * secs(ns) / wall.max(1e-9);
    let open = o.open_conns as f64;
    let observed = &o.observed;
    let setup_ns = o.setup_end.cpu_ns.saturating_sub(o.setup_start.cpu_ns);
    let idle_ns = o.idle_end.cpu_ns.saturating_sub(o.open.cpu_ns);
    let broadcast_ns = o.end.cpu_ns.saturating_sub(o.idle_end.cpu_ns);
    // The messages sent one at a time (streams follow them).
    let expected: u64 = observed
        .messages
        .iter()
        .take(o.sent_ns.len())
        .map(|m| u64::from(m.expected))
        .sum();
    let rss_growth = o.open.rss_bytes as i64 - o.baseline.rss_bytes as i64;
    let pss_growth = o.open.pss_bytes as i64 - o.baseline.pss_bytes as i64;
    let broadcast_wall = o.broadcast_wall.as_secs_f64();
    let opened = o.ramp.points().last().map_or(0, |&(_, n)| n).max(1) as f64;
    let per_conn_us = |ns: u64| ns as f64 / 1e3 / opened;
    RunReport {
        server: info.server,
        round: info.round,
        command: info.command,
        connections: ConnectionReport {
            requested: options.conns as u64,
            open: o.open_conns as u64,
            failed: observed.failed(),
            failures: observed.failures.clone(),
            statuses: observed.statuses.clone(),
            setup_secs: o.setup.as_secs_f64(),
            rate: o.ramp.summary(o.setup),
            workers,
            sources,
            ramp: o.ramp.points().to_vec(),
        },
        memory: MemoryReport {
            processes: o.open.processes,
            listeners,
            baseline: o.baseline.into(),
            open: o.open.into(),
            end: o.end.into(),
            rss_growth_bytes: rss_growth,
            pss_growth_bytes: pss_growth,
            rss_per_conn: rss_growth as f64 / open,
            pss_per_conn: pss_growth as f64 / open,
            client: o.client.map(Memory::from),
        },
        cpu: CpuReport {
            server_setup_secs: secs(setup_ns),
            setup_percent: percent(setup_ns, o.setup.as_secs_f64()),
            server_setup_us_per_conn: per_conn_us(setup_ns),
            client_setup_us_per_conn: per_conn_us(o.client_setup_ns),
            interrupts_setup_us_per_conn: per_conn_us(o.interrupts_setup_ns),
            machine_setup_us_per_conn: per_conn_us(o.machine_setup_ns),
            server_idle_secs: secs(idle_ns),
            idle_wall_secs: o.idle.as_secs_f64(),
            idle_percent: percent(idle_ns, o.idle.as_secs_f64()),
            server_broadcast_secs: secs(broadcast_ns),
            broadcast_wall_secs: broadcast_wall,
            broadcast_percent: percent(broadcast_ns, broadcast_wall),
            server_us_per_delivery: broadcast_ns as f64 / 1e3 / expected.max(1) as f64,
            client_broadcast_secs: secs(o.client_broadcast_ns),
            machine_broadcast_secs: secs(o.machine_broadcast_ns),
        },
        broadcast: BroadcastReport::new(&o.sent_ns, &observed.messages, options.payload_bytes),
        latency: LatencyReport::from_histogram(&observed.histogram()),
        delivery: DeliveryReport {
            lost: observed.lost(),
            duplicates: observed.duplicates,
            out_of_order: observed.out_of_order,
            corrupt: observed.corrupt,
            payloads: observed.payloads,
        },
        streams: o.streams,
        feed_search: o.feed_search,
        max_feed_rate: o.max_feed_rate,
        counted: o.counted,
        server_latency: o.server_latency,
        warnings,
    }
}

//! The line protocol between the coordinator and its workers: one JSON
//! object per line, commands one way, reports the other.
//!
//! A worker gets its [`Plan`] first. With [`Plan::receipts`] (the
//! `channels` runs) it opens its connections at its own pace, reports
//! `Ready` once every one is open or failed, then every receipt (`Event`s,
//! in batches: at most a millisecond late, or 1,024 at a time) until its
//! input ends. Otherwise (push) it gets `Open` grants during the setup,
//! one `Arm` before each broadcast (answered with `Armed` and, once the
//! message has reached all its connections, `Received { done: true }`),
//! for a stream of messages one `ArmStream` (answered with `Armed`, then
//! `StreamProgress` until `done`) and an `EndStream` (answered with
//! `StreamEnded`), and finally `Finish`, answered with everything it
//! observed.

use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::client::clients::Counts;
use crate::client::dial::Transports;
use crate::client::receipts::{Event, Paths};
use crate::observe::stats::{Observed, Receipts, StreamReceipts};
use crate::wire::message::Padding;

/// What one worker connects to, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The server's addresses; connection `id` dials `servers[id % len]`
    /// (several for a server on several hosts).
    pub servers: Vec<SocketAddr>,
    /// Source addresses; connection `id` binds `sources[id % len]`.
    pub sources: Vec<Ipv4Addr>,
    /// Id of the worker's first connection.
    pub first_id: u64,
    /// Size of every broadcast payload.
    pub payload_bytes: usize,
    /// What pads each broadcast after its stamp.
    pub padding: Padding,
    /// The connections offer permessage-deflate (and require it).
    pub deflate: bool,
    /// What the connections speak.
    #[serde(default)]
    pub transports: Transports,
    /// The channel the connections subscribe to in their URL, if any.
    #[serde(default)]
    pub channel: Option<String>,
    /// The connections ask for positions (`&positions=1`), and resume
    /// with `&since=` when they reconnect.
    #[serde(default)]
    pub positions: bool,
    /// Only half the connections ask for positions, and half offer
    /// permessage-deflate (see [`crate::client::conn::Query::positions_for`]).
    #[serde(default)]
    pub mixed: bool,
    /// The token every connection presents (`&token=`), if any.
    #[serde(default)]
    pub token: Option<String>,
    /// How long a connection may stay connecting or upgrading, in ms.
    pub connect_timeout_ms: u64,
    /// Report every message's receipt instead of checking the order.
    #[serde(default)]
    pub receipts: Option<ReceiptsPlan>,
}

/// What a worker reporting receipts opens, at its own pace.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReceiptsPlan {
    /// The path of each connection.
    pub paths: Paths,
    /// Connections of the worker.
    pub count: u64,
    /// Connections started per second.
    pub rate: f64,
    /// Most connections connecting or upgrading at once.
    pub max_in_flight: usize,
}

impl Plan {
    /// The plan of the worker holding `share` connections from `first_id`
    /// on, of `total`: a receipts worker gets its share of the rate and of
    /// the connections in flight.
    pub fn share(&self, first_id: u64, share: usize, total: usize) -> Plan {
        let fraction = share as f64 / total.max(1) as f64;
        Plan {
            first_id,
            receipts: self.receipts.map(|r| ReceiptsPlan {
                count: share as u64,
                rate: r.rate * fraction,
                max_in_flight: ((r.max_in_flight as f64 * fraction).ceil() as usize).max(1),
                ..r
            }),
            ..self.clone()
        }
    }
}

/// Coordinator → worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// The first command: what to connect to.
    Plan(Plan),
    /// Start this many more connections now.
    Open {
        /// How many.
        count: usize,
    },
    /// Give up every connection still connecting or upgrading.
    Abandon,
    /// Message `seq` is about to be sent: answer with the connections
    /// expected to receive it, then watch its receipts; while they arrive,
    /// poll without blocking and nap `nap_us` between polls.
    Arm {
        /// Sequence number.
        seq: u32,
        /// Nap between non-blocking polls, in µs (0: block in `epoll_wait`).
        nap_us: u64,
    },
    /// Messages `first .. first + count` are about to be sent without
    /// waiting for each other: answer with the connections expected to
    /// receive them, then report the stream's progress, napping as for `Arm`.
    ArmStream {
        /// Sequence number of the first.
        first: u32,
        /// How many.
        count: u32,
        /// Nap between non-blocking polls, in µs (0: block in `epoll_wait`).
        nap_us: u64,
        /// Ranges of its messages (`start..end` sequence numbers) whose
        /// latency is also kept apart (e.g. before a deploy, and during it).
        #[serde(default)]
        windows: Vec<(u32, u32)>,
    },
    /// Stop watching the stream and report what it observed of it.
    EndStream,
    /// Drop every open connection at once and dial each again (resuming
    /// after the last position it had, with positions), spread over
    /// `within_ms`.
    Storm {
        /// The reconnects are spread over this long, in ms.
        within_ms: u64,
    },
    /// Report everything observed and exit.
    Finish,
}

/// Worker → coordinator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Report {
    /// The worker's counters changed (sent at most every few ms).
    Progress(Counts),
    /// Answer to `Arm`: connections open now, which are expected to receive it.
    Armed {
        /// Sequence number.
        seq: u32,
        /// Open connections.
        open: u32,
    },
    /// Receipts of message `seq` so far; `done` once every connection
    /// still open has it.
    Received {
        /// Sequence number.
        seq: u32,
        /// Receipts by this worker's connections.
        receipts: Receipts,
        /// Whether the worker expects no more receipts of it.
        done: bool,
    },
    /// Deliveries of the armed stream so far; `done` once every connection
    /// still open has every message of it.
    StreamProgress {
        /// Its first sequence number.
        first: u32,
        /// Deliveries so far.
        received: u64,
        /// Whether the worker expects no more of it.
        done: bool,
    },
    /// Answer to `EndStream`.
    StreamEnded {
        /// Its first sequence number.
        first: u32,
        /// What the worker's connections observed of it.
        receipts: StreamReceipts,
    },
    /// Answer to `Finish`.
    Final(Box<Observed>),
    /// A receipts worker's connections are all open or failed.
    Ready {
        /// Indices of the connections that failed.
        failed: Vec<u64>,
        /// Failures by kind ([`crate::client::dial::Failure::label`]).
        failures: std::collections::BTreeMap<String, u64>,
    },
    /// Receipts, or a connection lost or sent a corrupt payload.
    Event(Event),
    /// The worker stopped because of an error.
    Failed(String),
}

/// Writes `message` as one line and flushes.
pub fn send<T: Serialize>(out: &mut impl Write, message: &T) -> io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()
}

/// Parses one line written by [`send`].
pub fn parse<T: DeserializeOwned>(line: &str) -> io::Result<T> {
    serde_json::from_str(line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_reports_round_trip_as_single_lines() {
        let plan = Command::Plan(Plan {
            servers: vec!["127.0.0.1:9000".parse().unwrap()],
            sources: vec![Ipv4Addr::new(127, 0, 0, 2)],
            first_id: 19_500,
            payload_bytes: 32,
            padding: Padding::Json,
            deflate: true,
            transports: Transports::Mixed,
            channel: Some("hot".into()),
            positions: false,
            mixed: false,
            token: None,
            connect_timeout_ms: 10_000,
            receipts: Some(ReceiptsPlan {
                paths: Paths::Hot {
                    subscribers: 3,
                    total: 300,
                },
                count: 19_000,
                rate: 5000.0,
                max_in_flight: 256,
            }),
        });
        let reports = [
            Report::Progress(Counts {
                started: 3,
                pending: 1,
                open: 2,
                opened: 2,
                failed: 0,
            }),
            Report::Received {
                seq: 4,
                receipts: Receipts {
                    expected: 2,
                    received: 2,
                    first_ns: 1,
                    last_ns: 2,
                },
                done: true,
            },
            Report::Final(Box::default()),
            Report::Ready {
                failed: vec![5],
                failures: std::collections::BTreeMap::from([("refused".to_string(), 1)]),
            },
            Report::Event(Event::Got(vec![
                (1, 2, 3, 4),
                (u64::MAX, u32::MAX, u64::MAX, 0),
            ])),
            Report::Event(Event::Lost {
                conn: 3,
                why: "closed by server".into(),
            }),
            Report::Failed("boom\nwith a newline".into()),
        ];
        let mut out = Vec::new();
        send(&mut out, &plan).unwrap();
        for r in &reports {
            send(&mut out, r).unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        let mut lines = text.lines();
        assert_eq!(parse::<Command>(lines.next().unwrap()).unwrap(), plan);
        for r in &reports {
            assert_eq!(&parse::<Report>(lines.next().unwrap()).unwrap(), r);
        }
        assert!(lines.next().is_none());
        assert!(parse::<Command>("{\"Open\":{}}").is_err());
    }
}

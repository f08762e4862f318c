//! The `channels` check: every message a connection receives, as a
//! receipt (which connection, the message's sequence number and send time,
//! and when it arrived) for the coordinator to judge; connections ask each
//! for a URL of their own ([`Paths`]: `/?id=u17&channel=c3`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::client::conn::Check;
use crate::client::dial::{Failure, Transport};
use crate::wire::frame::Frame;
use crate::wire::message;

/// The path each connection asks for, by its index `i` (from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Paths {
    /// `/`.
    Plain,
    /// `/?id=u{i}`.
    Id,
    /// `/?id=u{i}&channel=c{i % channels}`.
    IdChannel {
        /// Channels in all.
        channels: u64,
    },
    /// `/?id=u{i}` and `per` channels `c{(i + k * step) % channels}` for
    /// `k` in `0..per` (distinct when `k * step % channels` is for `k <
    /// per`, as for 10, 7919 and 1000).
    IdChannels {
        /// Channels per connection.
        per: u32,
        /// Channels in all.
        channels: u64,
        /// Step between a connection's channels.
        step: u64,
    },
    /// `/?channel=hot` for `subscribers` of the `total` connections,
    /// spread evenly (see [`spread`]); `/` for the others.
    Hot {
        /// Connections on `hot`.
        subscribers: u64,
        /// All connections.
        total: u64,
    },
    /// `/?channel=ch{i}`: a channel of its own.
    OwnChannel,
}

impl Paths {
    /// The path of connection `i`.
    pub fn path(&self, i: u64) -> String {
        match *self {
            Paths::Plain => "/".into(),
            Paths::Id => format!("/?id=u{i}"),
            Paths::IdChannel { channels } => format!("/?id=u{i}&channel=c{}", i % channels.max(1)),
            Paths::IdChannels {
                per,
                channels,
                step,
            } => {
                let mut path = format!("/?id=u{i}");
                for k in 0..u64::from(per) {
                    let channel = (i + k * step) % channels.max(1);
                    write!(path, "&channel=c{channel}").expect("writing to a String");
                }
                path
            }
            Paths::Hot { subscribers, total } if spread(i, subscribers, total) => {
                "/?channel=hot".into()
            }
            Paths::Hot { .. } => "/".into(),
            Paths::OwnChannel => format!("/?channel=ch{i}"),
        }
    }
}

/// Whether `i` is one of `count` indices spread evenly over `0..total`:
/// exactly `min(count, total)` of them are.
pub fn spread(i: u64, count: u64, total: u64) -> bool {
    let count = count.min(total);
    total > 0 && (i + 1) * count / total > i * count / total
}

/// One message received: connection index, sequence number, send time (from
/// the payload) and receipt time, both [`crate::observe::sys::now_ns`].
pub type Receipt = (u64, u32, u64, u64);

/// What a connection reported besides its receipts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// Messages received, in the order each connection read them.
    Got(Vec<Receipt>),
    /// An open connection failed.
    Lost {
        /// Its index.
        conn: u64,
        /// Why ([`Failure::label`]).
        why: String,
    },
    /// A connection received a payload that is not a message.
    Corrupt {
        /// Its index.
        conn: u64,
    },
}

/// The receipts check; a worker takes what it recorded and reports it.
#[derive(Debug)]
pub struct Receipts {
    /// The path each connection asks for.
    pub paths: Paths,
    /// Size of every message payload ([`message::encode`]).
    pub payload_bytes: usize,
    /// Messages received and not yet reported.
    pub got: Vec<Receipt>,
    /// Connections lost or sent a corrupt payload, not yet reported.
    pub events: Vec<Event>,
    /// Indices of the connections that failed before they were open.
    pub failed: Vec<u64>,
    /// Those failures by kind ([`Failure::label`]).
    pub failures: BTreeMap<String, u64>,
}

impl Receipts {
    /// A check of connections asking for `paths`, expecting payloads of
    /// `payload_bytes`.
    pub fn new(paths: Paths, payload_bytes: usize) -> Receipts {
        Receipts {
            paths,
            payload_bytes,
            got: Vec::new(),
            events: Vec::new(),
            failed: Vec::new(),
            failures: BTreeMap::new(),
        }
    }
}

impl Check for Receipts {
    type State = ();

    fn transport(&self, _id: u64) -> Transport {
        Transport::WebSocket { deflate: false }
    }

    fn path(&self, id: u64, _state: &()) -> String {
        self.paths.path(id)
    }

    fn message(&mut self, id: u64, f: &Frame<'_>, _: &mut (), now: u64) -> Result<(), Failure> {
        match message::decode(f.payload, self.payload_bytes) {
            Some(stamp) => self.got.push((id, stamp.seq, stamp.sent_ns, now)),
            None => self.events.push(Event::Corrupt { conn: id }),
        }
        Ok(())
    }

    /// An open connection is reported lost; one that never opened is
    /// counted as failed.
    fn failed(&mut self, id: u64, _: &mut (), failure: Failure, was_open: bool) -> bool {
        if was_open {
            self.events.push(Event::Lost {
                conn: id,
                why: failure.label(),
            });
        } else {
            self.failed.push(id);
            *self.failures.entry(failure.label()).or_default() += 1;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_their_templates() {
        assert_eq!(Paths::Plain.path(7), "/");
        assert_eq!(Paths::Id.path(7), "/?id=u7");
        assert_eq!(
            Paths::IdChannel { channels: 100 }.path(1234),
            "/?id=u1234&channel=c34"
        );
        let ten = Paths::IdChannels {
            per: 10,
            channels: 1000,
            step: 7919,
        };
        let path = ten.path(5);
        assert!(
            path.starts_with("/?id=u5&channel=c5&channel=c924&"),
            "{path}"
        );
        let channels: std::collections::BTreeSet<&str> = path
            .split('&')
            .filter_map(|p| p.strip_prefix("channel="))
            .collect();
        assert_eq!(channels.len(), 10, "ten distinct channels: {path}");
        for i in 0..2000 {
            let p = ten.path(i);
            let distinct: std::collections::BTreeSet<&str> = p.split('&').skip(1).collect();
            assert_eq!(distinct.len(), 10);
        }
        assert_eq!(Paths::OwnChannel.path(99_999), "/?channel=ch99999");
        let hot = Paths::Hot {
            subscribers: 190,
            total: 19_000,
        };
        let on_hot = (0..19_000)
            .filter(|&i| hot.path(i) == "/?channel=hot")
            .count();
        assert_eq!(on_hot, 190);
        assert_eq!(hot.path(0), "/");
    }

    #[test]
    fn spread_picks_exactly_count_evenly() {
        for (count, total) in [(190, 19_000), (1, 1), (3, 10), (10, 10), (0, 5), (7, 3)] {
            let picked: Vec<u64> = (0..total).filter(|&i| spread(i, count, total)).collect();
            assert_eq!(picked.len() as u64, count.min(total), "{count} of {total}");
        }
        // 1% of 19,000: every hundredth, from 99.
        assert!(spread(99, 190, 19_000) && spread(199, 190, 19_000));
        assert!(!spread(100, 190, 19_000));
        assert!(!spread(0, 1, 0));
    }
}

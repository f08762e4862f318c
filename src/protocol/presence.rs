//! Presence, without I/O: what a backend may ask of who is connected
//! (a channel's ids and connection count, a client's connections, every
//! channel's count), the answer one loop gives, the answers of several
//! loops (a supervisor's instances) merged into one, and the forms they
//! travel in: a query as one line of words, an answer as lines of words
//! (names hold no space and no line end, see [`names`](crate::protocol::names)),
//! and the JSON a publish listener answers.
//!
//! Answers are bounded: at most `limit` names (at most [`MAX_LIMIT`]) in
//! name order, then a cursor (`next`, the last one given) from which the
//! next page goes on (`after`). Counts are always whole.

use std::cmp::Ordering;
use std::fmt::Write as _;

use crate::protocol::commands::ConnRef;
use crate::protocol::names::{ChannelName, ClientId};
use crate::protocol::query::params;

/// Names an answer gives when the query does not say.
pub const DEFAULT_LIMIT: u32 = 100;
/// The most names one answer gives.
pub const MAX_LIMIT: u32 = 1000;

/// What is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// A channel's connection count and its clients' ids.
    Channel {
        /// The channel.
        channel: ChannelName,
        /// Ids after this one (a cursor).
        after: Option<ClientId>,
        /// At most this many ids.
        limit: u32,
    },
    /// A client's connections, with their channels and transport.
    Client {
        /// The client id.
        id: ClientId,
        /// Connections after this one (a cursor).
        after: Option<ConnRef>,
        /// At most this many connections.
        limit: u32,
    },
    /// Every channel with its connection count.
    Channels {
        /// Channels after this one (a cursor).
        after: Option<ChannelName>,
        /// At most this many channels.
        limit: u32,
    },
}

/// How a connection reads its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Transport {
    /// A WebSocket.
    WebSocket,
    /// An event stream (SSE).
    EventStream,
}

impl Transport {
    /// Its name, as the metrics' `transport` label says it.
    pub fn name(self) -> &'static str {
        match self {
            Transport::WebSocket => "websocket",
            Transport::EventStream => "event_stream",
        }
    }

    fn parse(word: &str) -> Option<Transport> {
        [Transport::WebSocket, Transport::EventStream]
            .into_iter()
            .find(|t| t.name() == word)
    }
}

/// One connection of a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConn {
    /// Its key (`INSTANCE.SLOT.SERIAL`).
    pub conn: ConnRef,
    /// Its transport.
    pub transport: Transport,
    /// Its channels, in name order.
    pub channels: Vec<ChannelName>,
}

/// What is answered (by one loop, or merged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// To [`Query::Channel`].
    Channel {
        /// Open connections in the channel (all of them).
        connections: u64,
        /// The ids after the cursor, in order, each once.
        ids: Vec<ClientId>,
        /// More ids follow the last one.
        more: bool,
    },
    /// To [`Query::Client`].
    Client {
        /// The connections after the cursor, in key order.
        conns: Vec<ClientConn>,
        /// More connections follow the last one.
        more: bool,
    },
    /// To [`Query::Channels`].
    Channels {
        /// The channels after the cursor, in order, with their counts.
        channels: Vec<(ChannelName, u64)>,
        /// More channels follow the last one.
        more: bool,
    },
}

/// Why a presence request was refused (an HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadQuery(pub String);

/// The order of connection keys.
fn conn_order(a: &ConnRef, b: &ConnRef) -> Ordering {
    (a.instance, a.slot, a.serial).cmp(&(b.instance, b.slot, b.serial))
}

impl Query {
    /// The query a request asks (`path` `/presence` or `/clients`, and
    /// its query string): `channel=CH` (or none, for every channel),
    /// `id=ID`, `after=CURSOR`, `limit=N`.
    pub fn from_request(path: &str, query: &str) -> Result<Query, BadQuery> {
        let mut asked: [Option<&str>; 4] = [None; 4];
        for (key, value) in params(query) {
            let at = match key {
                "channel" if path == "/presence" => 0,
                "id" if path == "/clients" => 1,
                "after" => 2,
                "limit" => 3,
                _ => return Err(BadQuery(format!("unknown parameter {key:?}"))),
            };
            if asked[at].replace(value).is_some() {
                return Err(BadQuery(format!("{key} given twice")));
            }
        }
        let [channel, id, after, limit] = asked;
        let limit = match limit {
            None => DEFAULT_LIMIT,
            Some(n) => n
                .parse()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| BadQuery(format!("limit must be 1 to {MAX_LIMIT}")))?,
        };
        let name = |what: &str, text: &str| {
            ChannelName::new(text).map_err(|e| BadQuery(format!("{what} {text:?}: {e}")))
        };
        let id_named = |what: &str, text: &str| {
            ClientId::new(text).map_err(|e| BadQuery(format!("{what} {text:?}: {e}")))
        };
        match (path, channel, id) {
            ("/presence", Some(channel), _) => Ok(Query::Channel {
                channel: name("the channel", channel)?,
                after: after.map(|a| id_named("the cursor", a)).transpose()?,
                limit,
            }),
            ("/presence", None, _) => Ok(Query::Channels {
                after: after.map(|a| name("the cursor", a)).transpose()?,
                limit,
            }),
            ("/clients", _, Some(id)) => Ok(Query::Client {
                id: id_named("the id", id)?,
                after: after
                    .map(|a| {
                        ConnRef::parse(a)
                            .ok_or_else(|| BadQuery(format!("the cursor {a:?} is not a key")))
                    })
                    .transpose()?,
                limit,
            }),
            ("/clients", _, None) => Err(BadQuery("/clients needs id=ID".into())),
            _ => Err(BadQuery(format!("no presence at {path}"))),
        }
    }

    /// The query as one line of words, without its end. A cursor is
    /// written `+CURSOR`, no cursor `-`, so that no name reads as absent.
    pub fn line(&self) -> String {
        let cursor = |name: Option<String>| name.map_or_else(|| "-".into(), |n| format!("+{n}"));
        match self {
            Query::Channel {
                channel,
                after,
                limit,
            } => format!(
                "presence {channel} {} {limit}",
                cursor(after.as_ref().map(ToString::to_string))
            ),
            Query::Client { id, after, limit } => format!(
                "clients {id} {} {limit}",
                cursor(after.map(|a| a.to_string()))
            ),
            Query::Channels { after, limit } => format!(
                "channels {} {limit}",
                cursor(after.as_ref().map(ToString::to_string))
            ),
        }
    }

    /// Reads what [`Query::line`] wrote.
    pub fn parse_line(line: &str) -> Option<Query> {
        let words: Vec<&str> = line.split(' ').collect();
        let limit = |word: &str| word.parse().ok().filter(|n| (1..=MAX_LIMIT).contains(n));
        fn after(word: &str) -> Option<Option<&str>> {
            match word {
                "-" => Some(None),
                _ => word.strip_prefix('+').map(Some),
            }
        }
        Some(match words[..] {
            ["presence", channel, cursor, n] => Query::Channel {
                channel: ChannelName::new(channel).ok()?,
                after: after(cursor)?.map(ClientId::new).transpose().ok()?,
                limit: limit(n)?,
            },
            ["clients", id, cursor, n] => Query::Client {
                id: ClientId::new(id).ok()?,
                after: match after(cursor)? {
                    Some(key) => Some(ConnRef::parse(key)?),
                    None => None,
                },
                limit: limit(n)?,
            },
            ["channels", cursor, n] => Query::Channels {
                after: after(cursor)?.map(ChannelName::new).transpose().ok()?,
                limit: limit(n)?,
            },
            _ => return None,
        })
    }

    fn limit(&self) -> usize {
        match self {
            Query::Channel { limit, .. }
            | Query::Client { limit, .. }
            | Query::Channels { limit, .. } => *limit as usize,
        }
    }

    /// The answer with nothing in it.
    pub fn empty_answer(&self) -> Answer {
        match self {
            Query::Channel { .. } => Answer::Channel {
                connections: 0,
                ids: Vec::new(),
                more: false,
            },
            Query::Client { .. } => Answer::Client {
                conns: Vec::new(),
                more: false,
            },
            Query::Channels { .. } => Answer::Channels {
                channels: Vec::new(),
                more: false,
            },
        }
    }

    /// One loop's answer, from what it has: `ids` of the channel's open
    /// connections (`None` for one without an id), the client's
    /// connections, or every channel's count, in any order; only those
    /// after the cursor are kept, the `limit` first in order.
    pub fn answer_channel<'a>(&self, ids: impl Iterator<Item = Option<&'a str>>) -> Answer {
        let (after, limit) = match self {
            Query::Channel { after, .. } => (after.as_ref().map(|a| a.as_str()), self.limit()),
            _ => return self.empty_answer(),
        };
        let mut connections = 0;
        // Borrowed until the `limit` kept are known: one allocation each
        // for those only.
        let mut kept: Vec<&str> = Vec::new();
        for id in ids {
            connections += 1;
            if let Some(id) = id.filter(|&id| after.is_none_or(|a| id > a)) {
                kept.push(id);
            }
        }
        kept.sort_unstable();
        kept.dedup();
        let more = kept.len() > limit;
        kept.truncate(limit);
        Answer::Channel {
            connections,
            ids: kept
                .into_iter()
                .filter_map(|id| ClientId::new(id).ok())
                .collect(),
            more,
        }
    }

    /// One loop's answer to [`Query::Client`] from the client's
    /// connections (see [`Query::answer_channel`]).
    pub fn answer_client(&self, conns: impl Iterator<Item = ClientConn>) -> Answer {
        let (after, limit) = match self {
            Query::Client { after, .. } => (*after, self.limit()),
            _ => return self.empty_answer(),
        };
        let mut conns: Vec<ClientConn> = conns
            .filter(|c| after.is_none_or(|a| conn_order(&c.conn, &a).is_gt()))
            .collect();
        conns.sort_unstable_by(|a, b| conn_order(&a.conn, &b.conn));
        let more = conns.len() > limit;
        conns.truncate(limit);
        Answer::Client { conns, more }
    }

    /// One loop's answer to [`Query::Channels`] from every channel and
    /// its count (see [`Query::answer_channel`]).
    pub fn answer_channels<'a>(&self, channels: impl Iterator<Item = (&'a str, u64)>) -> Answer {
        let (after, limit) = match self {
            Query::Channels { after, .. } => (after.as_ref(), self.limit()),
            _ => return self.empty_answer(),
        };
        let mut kept: Vec<(&str, u64)> = channels
            .filter(|(name, n)| *n > 0 && after.is_none_or(|a| *name > a.as_str()))
            .collect();
        let more = kept.len() > limit;
        if more {
            kept.select_nth_unstable_by(limit, |a, b| a.0.cmp(b.0));
            kept.truncate(limit);
        }
        kept.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let channels = kept
            .into_iter()
            .filter_map(|(name, n)| Some((ChannelName::new(name).ok()?, n)))
            .collect();
        Answer::Channels { channels, more }
    }

    /// The answers of several loops as one: counts summed, names merged
    /// in order, each once, the `limit` first kept. (Each loop's own
    /// `limit` first hold the merged `limit` first.)
    pub fn merge(&self, answers: impl IntoIterator<Item = Answer>) -> Answer {
        let limit = self.limit();
        let mut merged = self.empty_answer();
        for answer in answers {
            match (&mut merged, answer) {
                (
                    Answer::Channel {
                        connections,
                        ids,
                        more,
                    },
                    Answer::Channel {
                        connections: n,
                        ids: more_ids,
                        more: m,
                    },
                ) => {
                    *connections = connections.saturating_add(n);
                    ids.extend(more_ids);
                    *more |= m;
                }
                (Answer::Client { conns, more }, Answer::Client { conns: c, more: m }) => {
                    conns.extend(c);
                    *more |= m;
                }
                (
                    Answer::Channels { channels, more },
                    Answer::Channels {
                        channels: c,
                        more: m,
                    },
                ) => {
                    channels.extend(c);
                    *more |= m;
                }
                // An answer to another question: not this one's.
                _ => {}
            }
        }
        let cut = |len: usize, more: &mut bool| {
            *more |= len > limit;
            len.min(limit)
        };
        match &mut merged {
            Answer::Channel { ids, more, .. } => {
                ids.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
                ids.dedup();
                ids.truncate(cut(ids.len(), more));
            }
            Answer::Client { conns, more } => {
                conns.sort_unstable_by(|a, b| conn_order(&a.conn, &b.conn));
                conns.truncate(cut(conns.len(), more));
            }
            Answer::Channels { channels, more } => {
                channels.sort_unstable_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
                channels.dedup_by(|next, first| {
                    let same = next.0 == first.0;
                    if same {
                        first.1 = first.1.saturating_add(next.1);
                    }
                    same
                });
                channels.truncate(cut(channels.len(), more));
            }
        }
        merged
    }

    /// The JSON object a publish listener answers with.
    pub fn json(&self, answer: &Answer) -> String {
        let mut out = String::new();
        let list = |out: &mut String, names: &mut dyn Iterator<Item = String>| {
            out.push('[');
            for (i, name) in names.enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&name);
            }
            out.push(']');
        };
        let quoted = |name: &dyn std::fmt::Display| format!("\"{name}\"");
        let next = |more: bool, last: Option<String>| match (more, last) {
            (true, Some(last)) => quoted(&last),
            _ => "null".to_string(),
        };
        match (self, answer) {
            (
                Query::Channel { channel, .. },
                Answer::Channel {
                    connections,
                    ids,
                    more,
                },
            ) => {
                let _ = write!(
                    out,
                    "{{\"channel\":\"{channel}\",\"connections\":{connections},\"ids\":"
                );
                list(&mut out, &mut ids.iter().map(|id| quoted(id)));
                let last = ids.last().map(ToString::to_string);
                let _ = write!(out, ",\"next\":{}}}", next(*more, last));
            }
            (Query::Client { id, .. }, Answer::Client { conns, more }) => {
                let _ = write!(out, "{{\"id\":\"{id}\",\"connections\":");
                list(
                    &mut out,
                    &mut conns.iter().map(|c| {
                        let mut channels = String::new();
                        list(&mut channels, &mut c.channels.iter().map(|ch| quoted(ch)));
                        format!(
                            "{{\"key\":\"{}\",\"instance\":{},\"transport\":\"{}\",\"channels\":{channels}}}",
                            c.conn,
                            c.conn.instance,
                            c.transport.name()
                        )
                    }),
                );
                let last = conns.last().map(|c| c.conn.to_string());
                let _ = write!(out, ",\"next\":{}}}", next(*more, last));
            }
            (Query::Channels { .. }, Answer::Channels { channels, more }) => {
                out.push_str("{\"channels\":");
                list(
                    &mut out,
                    &mut channels
                        .iter()
                        .map(|(name, n)| format!("{{\"channel\":\"{name}\",\"connections\":{n}}}")),
                );
                let last = channels.last().map(|(name, _)| name.to_string());
                let _ = write!(out, ",\"next\":{}}}", next(*more, last));
            }
            _ => out.push_str("{}"),
        }
        out
    }
}

impl Answer {
    /// The answer as lines of words, each ending in `\n`.
    pub fn lines(&self) -> String {
        let mut out = String::new();
        let more = |m: bool| u8::from(m);
        match self {
            Answer::Channel {
                connections,
                ids,
                more: m,
            } => {
                let _ = writeln!(out, "presence {connections} {}", more(*m));
                ids.iter().for_each(|id| {
                    let _ = writeln!(out, "{id}");
                });
            }
            Answer::Client { conns, more: m } => {
                let _ = writeln!(out, "clients {}", more(*m));
                for c in conns {
                    let _ = write!(out, "{} {}", c.conn, c.transport.name());
                    c.channels.iter().for_each(|ch| {
                        let _ = write!(out, " {ch}");
                    });
                    out.push('\n');
                }
            }
            Answer::Channels { channels, more: m } => {
                let _ = writeln!(out, "channels {}", more(*m));
                channels.iter().for_each(|(name, n)| {
                    let _ = writeln!(out, "{name} {n}");
                });
            }
        }
        out
    }

    /// Reads what [`Answer::lines`] wrote.
    pub fn parse(text: &str) -> Option<Answer> {
        let mut lines = text.lines();
        let head: Vec<&str> = lines.next()?.split(' ').collect();
        let flag = |w: &str| match w {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        };
        Some(match head[..] {
            ["presence", connections, more] => Answer::Channel {
                connections: connections.parse().ok()?,
                ids: lines.map(ClientId::new).collect::<Result<_, _>>().ok()?,
                more: flag(more)?,
            },
            ["clients", more] => Answer::Client {
                conns: lines
                    .map(|line| {
                        let mut words = line.split(' ');
                        let conn = ConnRef::parse(words.next()?)?;
                        let transport = Transport::parse(words.next()?)?;
                        let channels = words.map(ChannelName::new).collect::<Result<_, _>>();
                        Some(ClientConn {
                            conn,
                            transport,
                            channels: channels.ok()?,
                        })
                    })
                    .collect::<Option<_>>()?,
                more: flag(more)?,
            },
            ["channels", more] => Answer::Channels {
                channels: lines
                    .map(|line| {
                        let (name, n) = line.split_once(' ')?;
                        Some((ChannelName::new(name).ok()?, n.parse().ok()?))
                    })
                    .collect::<Option<_>>()?,
                more: flag(more)?,
            },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> ClientId {
        ClientId::new(name).unwrap()
    }

    fn channel_query(after: Option<&str>, limit: u32) -> Query {
        Query::Channel {
            channel: ChannelName::new("news").unwrap(),
            after: after.map(id),
            limit,
        }
    }

    fn ids(answer: &Answer) -> Vec<&str> {
        match answer {
            Answer::Channel { ids, .. } => ids.iter().map(|i| i.as_str()).collect(),
            _ => panic!("not a channel's answer: {answer:?}"),
        }
    }

    #[test]
    fn requests_are_read_into_queries_and_bad_ones_say_why() {
        assert_eq!(
            Query::from_request("/presence", "channel=news&limit=2&after=bob"),
            Ok(Query::Channel {
                channel: ChannelName::new("news").unwrap(),
                after: Some(id("bob")),
                limit: 2
            })
        );
        assert_eq!(
            Query::from_request("/presence", ""),
            Ok(Query::Channels {
                after: None,
                limit: DEFAULT_LIMIT
            })
        );
        assert_eq!(
            Query::from_request("/clients", "id=alice&after=2.5.1"),
            Ok(Query::Client {
                id: id("alice"),
                after: ConnRef::parse("2.5.1"),
                limit: DEFAULT_LIMIT
            })
        );
        for (path, query, why) in [
            ("/presence", "channel=a b", "the channel \"a b\": holds"),
            ("/presence", "limit=0", "limit must be 1 to 1000"),
            ("/presence", "limit=1001", "limit must be 1 to 1000"),
            ("/presence", "channel=a&channel=b", "channel given twice"),
            ("/presence", "id=a", "unknown parameter \"id\""),
            ("/clients", "", "/clients needs id=ID"),
            ("/clients", "id=a&after=x", "the cursor \"x\" is not a key"),
        ] {
            let err = Query::from_request(path, query).unwrap_err();
            assert!(err.0.starts_with(why), "{query}: {}", err.0);
        }
    }

    #[test]
    fn queries_and_answers_travel_as_lines_and_come_back_the_same() {
        for query in [
            channel_query(None, 5),
            channel_query(Some("bob"), 1000),
            channel_query(Some("-"), 3),
            Query::Channels {
                after: Some(ChannelName::new("-").unwrap()),
                limit: 2,
            },
            Query::Client {
                id: id("a@b:c"),
                after: ConnRef::parse("1.2.3"),
                limit: 7,
            },
            Query::Channels {
                after: None,
                limit: 1,
            },
        ] {
            assert_eq!(Query::parse_line(&query.line()), Some(query));
        }
        assert_eq!(Query::parse_line("presence news - 0"), None);
        assert_eq!(Query::parse_line("presence news -"), None);
        let conn = |key: &str, channels: &[&str]| ClientConn {
            conn: ConnRef::parse(key).unwrap(),
            transport: Transport::EventStream,
            channels: channels
                .iter()
                .map(|c| ChannelName::new(c).unwrap())
                .collect(),
        };
        for answer in [
            Answer::Channel {
                connections: 3,
                ids: vec![id("a"), id("b")],
                more: true,
            },
            Answer::Channel {
                connections: 0,
                ids: vec![],
                more: false,
            },
            Answer::Client {
                conns: vec![
                    conn("1.2.3", &["x", "y"]),
                    conn("2.0.1", &[]),
                    conn("2.0.2", &["-"]),
                ],
                more: false,
            },
            Answer::Channels {
                channels: vec![(ChannelName::new("x").unwrap(), 4)],
                more: true,
            },
        ] {
            assert_eq!(Answer::parse(&answer.lines()), Some(answer));
        }
        assert_eq!(Answer::parse("presence 1 2\n"), None);
        assert_eq!(Answer::parse("clients 0\n1.2.3 carrier -\n"), None);
    }

    #[test]
    fn one_loop_answers_its_ids_after_the_cursor_in_order_each_once_counting_all() {
        let query = channel_query(Some("b"), 2);
        let answer = query.answer_channel(
            ["d", "a", "c", "", "b", "c", "e"]
                .into_iter()
                .map(|n| (!n.is_empty()).then_some(n)),
        );
        assert_eq!(ids(&answer), ["c", "d"]);
        assert!(matches!(
            answer,
            Answer::Channel {
                connections: 7,
                more: true,
                ..
            }
        ));
        let last = channel_query(Some("d"), 2).answer_channel([Some("e")].into_iter());
        assert!(matches!(last, Answer::Channel { more: false, .. }));
    }

    #[test]
    fn loops_answers_merge_into_the_first_names_of_all_with_summed_counts() {
        let query = channel_query(None, 3);
        let one = query.answer_channel(["a", "c", "e", "g"].map(Some).into_iter());
        let two = query.answer_channel(["b", "c", "d"].map(Some).into_iter());
        let merged = query.merge([one, two]);
        assert_eq!(ids(&merged), ["a", "b", "c"]);
        assert!(matches!(
            merged,
            Answer::Channel {
                connections: 7,
                more: true,
                ..
            }
        ));
        // Page by page through the cursor, every id comes once.
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let query = channel_query(after.as_deref(), 2);
            let parts = [["a", "c", "e", "g"].as_slice(), &["b", "c", "d"]]
                .map(|names| query.answer_channel(names.iter().map(|n| Some(*n))));
            let merged = query.merge(parts);
            seen.extend(ids(&merged).iter().map(|s| s.to_string()));
            match merged {
                Answer::Channel {
                    more: true, ids, ..
                } => after = Some(ids.last().unwrap().to_string()),
                _ => break,
            }
        }
        assert_eq!(seen, ["a", "b", "c", "d", "e", "g"]);

        let channels = Query::Channels {
            after: None,
            limit: 2,
        };
        let merged = channels.merge([
            channels.answer_channels([("x", 2), ("a", 1), ("z", 0)].into_iter()),
            channels.answer_channels([("x", 3), ("y", 1)].into_iter()),
        ]);
        assert_eq!(
            channels.json(&merged),
            "{\"channels\":[{\"channel\":\"a\",\"connections\":1},{\"channel\":\"x\",\"connections\":5}],\"next\":\"x\"}"
        );
    }

    #[test]
    fn answers_are_written_as_json() {
        let query = channel_query(None, 10);
        let answer = query.answer_channel([Some("bob"), None].into_iter());
        assert_eq!(
            query.json(&answer),
            "{\"channel\":\"news\",\"connections\":2,\"ids\":[\"bob\"],\"next\":null}"
        );
        let client = Query::Client {
            id: id("bob"),
            after: None,
            limit: 1,
        };
        let conn = |key: &str| ClientConn {
            conn: ConnRef::parse(key).unwrap(),
            transport: Transport::WebSocket,
            channels: vec![ChannelName::new("news").unwrap()],
        };
        let answer = client.merge([
            client.answer_client([conn("2.1.1")].into_iter()),
            client.answer_client([conn("1.9.4")].into_iter()),
        ]);
        assert_eq!(
            client.json(&answer),
            "{\"id\":\"bob\",\"connections\":[{\"key\":\"1.9.4\",\"instance\":1,\"transport\":\"websocket\",\"channels\":[\"news\"]}],\"next\":\"1.9.4\"}"
        );
    }
}

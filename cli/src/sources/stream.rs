//! The Redis Streams input (`--redis URL --redis-stream KEY`): a stream's
//! entries read as input, beside standard input, each positioned by its
//! entry id, so that every host reading the stream gives a message the
//! same position, before and after a restart.
//!
//! An entry's field `line` holds one line of input, or several (its
//! other fields are ignored). Its lines' positions are made of its id
//! `MS-SEQ` ([`Id::position`]): `MS << 22 | SEQ << 7 | line`, the line's
//! index within the entry from 0. So an entry holds at most
//! [`MAX_LINES`] lines, and ids run to `2^42 - 1` milliseconds (the year
//! 2109) and `2^15 - 1` within one; an entry past them is skipped and
//! counted. The positions' epoch is the stream's ([`epoch`]).
//!
//! The reader runs on a thread of its own with the `redis` crate's
//! blocking client:
//! - At its first connection it fills the history from the stream's tail
//!   (`XREVRANGE`, at most the history's message bound, none older than
//!   its age bound), as entries for the history only, and says that
//!   nothing before them is held (a resume from before is told the gap).
//! - It reads on with `XREAD BLOCK` from the last entry it has.
//! - After an outage it goes on from there, so nothing published meanwhile
//!   is lost while the stream holds it. What the stream no longer holds
//!   (trimmed by `MAXLEN` meanwhile: fewer entries follow the last one
//!   read than were added since, as `XINFO STREAM`'s `entries-added`
//!   counts; trimming leaves `max-deleted-entry-id` alone) is said as a
//!   gap (`StreamFeed::lost_since`).
//! - Every [`LAG_EVERY`] it says how far behind the stream's last entry
//!   it is.
//!
//! All of it reaches the loop as lines and control lines ([`Control`]).

use std::hash::Hasher;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use redis::{Client, Connection, RedisError, Value};

use super::pubsub::{client, CONNECT_TIMEOUT};
use super::reconnect::{keep_reading, Where};
use super::source::{Outlet, Source};
use super::stop::{Carried, Halt, Stopper};
use crate::chunks::{decimal, Control, Skip, WholeLines};
use wspush::Epoch;

/// The most lines an entry's positions number.
pub const MAX_LINES: usize = 1 << LINE_BITS;
const LINE_BITS: u32 = 7;
const SEQ_BITS: u32 = 15;
const MS_BITS: u32 = 64 - SEQ_BITS - LINE_BITS;
/// How long one `XREAD` waits for entries.
const BLOCK: Duration = Duration::from_secs(1);
/// How much longer Redis may take to answer before the connection is
/// taken for lost.
const ANSWER_SLACK: Duration = Duration::from_secs(2);
/// Entries one `XREAD` takes at most.
const READ_COUNT: usize = 1000;
/// How often the lag behind the stream's last entry is measured.
pub const LAG_EVERY: Duration = Duration::from_secs(1);

/// The epoch of the positions of stream `key`: a hash of its name
/// (FNV-1a), the same on every host and in every release.
pub fn epoch(key: &str) -> Epoch {
    let mut hasher = Fnv1a::default();
    hasher.write(b"wspush redis stream\0");
    hasher.write(key.as_bytes());
    Epoch(hasher.finish())
}

/// The FNV-1a hash, 64 bits: fixed, unlike the standard library's.
struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// A stream entry's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Id {
    /// Its milliseconds.
    pub ms: u64,
    /// Its sequence number within them.
    pub seq: u64,
}

impl Id {
    /// Parses `MS-SEQ`.
    pub fn parse(text: &[u8]) -> Option<Id> {
        let text = std::str::from_utf8(text).ok()?;
        let (ms, seq) = text.split_once('-')?;
        Some(Id {
            ms: decimal(ms)?,
            seq: decimal(seq)?,
        })
    }

    /// The position of the entry's first line (`None`: past what a
    /// position holds).
    pub fn position(self) -> Option<u64> {
        (self.ms < 1 << MS_BITS && self.seq < 1 << SEQ_BITS)
            .then_some(self.ms << (SEQ_BITS + LINE_BITS) | self.seq << LINE_BITS)
    }

    /// The position of the last line an entry of this id could hold
    /// (saturating, for ids past what a position holds).
    fn last_position(self) -> u64 {
        self.position()
            .map_or(u64::MAX, |first| first + (MAX_LINES as u64 - 1))
    }
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// Appends entry `id`'s chunk to `out`: its control line and its lines
/// (`keep`: for the history only), or, if it cannot be read, a control
/// line that says it is skipped and why.
pub fn put_entry(
    id: Id,
    line: Option<&[u8]>,
    keep: bool,
    lines: &mut WholeLines,
    out: &mut Vec<u8>,
) {
    let skipped = |why| {
        Control::Skipped {
            ms: id.ms,
            seq: id.seq,
            why,
        }
        .line()
    };
    let Some(line) = line else {
        return out.extend(skipped(Skip::NoLine));
    };
    let Some(seq) = id.position() else {
        return out.extend(skipped(Skip::IdTooLarge));
    };
    let count = line.iter().filter(|&&b| b == b'\n').count() + usize::from(!line.ends_with(b"\n"));
    if count > MAX_LINES {
        return out.extend(skipped(Skip::TooManyLines));
    }
    out.extend(
        Control::Entry {
            seq,
            lines: count as u32,
            keep,
        }
        .line(),
    );
    lines.push_message(line, out);
}

/// How much of the stream's tail a host keeps at its start.
#[derive(Debug, Clone, Copy)]
pub struct Preload {
    /// Messages at most (the history's bound; 0: none).
    pub messages: usize,
    /// None older than this.
    pub age: Duration,
}

/// A Redis stream to read.
#[derive(Debug)]
pub struct StreamFeed {
    client: Client,
    /// The server, for logs (no password).
    server: String,
    key: String,
    preload: Preload,
    /// Where an earlier image of this process stopped reading, if any:
    /// it reads on from there (the history is its too).
    resume_at: Option<Read>,
    /// Where a re-exec asks it to stop, and it leaves where it was.
    halt: Arc<Halt<Read>>,
}

/// A stream's reader stops for a re-exec between reads, and leaves
/// where it was: the next image reads on from there.
impl Stopper for Halt<Read> {
    fn stop(&self) -> std::io::Result<()> {
        self.ask();
        Ok(())
    }

    fn carry(&self, carried: &mut Carried) {
        if let Some(at) = self.take() {
            carried.stream_at = Some((at.last.ms, at.last.seq, at.added));
        }
    }
}

impl StreamFeed {
    /// Stream `key` on the server of `url`; an error names what is wrong.
    pub fn new(url: &str, key: &str, preload: Preload) -> Result<StreamFeed, String> {
        let client = client(url)?;
        if key.is_empty() {
            return Err("--redis-stream: a key cannot be empty".into());
        }
        Ok(StreamFeed {
            server: client.get_connection_info().addr().to_string(),
            client,
            key: key.into(),
            preload,
            resume_at: None,
            halt: Halt::shared(),
        })
    }

    /// Reads on from `at` (the last entry an earlier image of this process
    /// read, and the stream's count of entries added then), not filling
    /// the history again.
    pub fn resuming(mut self, (ms, seq, added): (u64, u64, Option<u64>)) -> StreamFeed {
        self.resume_at = Some(Read {
            last: Id { ms, seq },
            added,
        });
        self
    }

    /// How it stops for a re-exec.
    pub fn stopper(&self) -> Arc<dyn Stopper> {
        Arc::clone(&self.halt) as Arc<dyn Stopper>
    }

    /// Reads the stream and hands its entries to `out` as chunks of whole
    /// lines (and control lines), reconnecting whenever the connection is
    /// lost, until `out` is gone.
    fn read(self, out: &Outlet) {
        let mut lines = WholeLines::new(out.max_line());
        let what = format!("stream {}", self.key);
        let source = Where {
            server: &self.server,
            what: &what,
            ready: "reading",
            meanwhile:
                "entries added meanwhile are read when it is back, while the stream holds them",
        };
        // Where it is (`None`: the history is not filled yet).
        let mut at: Option<Read> = self.resume_at;
        let session =
            |read: &mut dyn FnMut(Option<Vec<u8>>) -> bool| self.session(&mut at, &mut lines, read);
        keep_reading(source, session, |event| out.event(event), &|| {
            self.halt.asked()
        });
        if self.halt.asked() {
            if let Some(at) = at {
                log::info!(
                    "redis stream {} stopped for the next image after entry {}",
                    self.key,
                    at.last
                );
                self.halt.leave(at);
            }
        }
    }

    /// One connection: fills the history (the first time) or says what
    /// the stream lost meanwhile, then reads on from where it is.
    fn session(
        &self,
        at: &mut Option<Read>,
        lines: &mut WholeLines,
        read: &mut dyn FnMut(Option<Vec<u8>>) -> bool,
    ) -> Result<(), RedisError> {
        let mut connection = self.client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
        connection.set_read_timeout(Some(BLOCK + ANSWER_SLACK))?;
        connection.set_write_timeout(Some(ANSWER_SLACK))?;
        let (first, from) = match *at {
            None => {
                let (chunk, last) = self.fill(&mut connection, lines)?;
                (chunk, Read { last, added: None })
            }
            Some(at) => (self.lost_since(&mut connection, &at)?, at),
        };
        if !read(None) || (!first.is_empty() && !read(Some(first))) {
            return Ok(());
        }
        let mut here = from;
        *at = Some(here);
        let mut lag_due = Instant::now();
        loop {
            if !read(None) {
                return Ok(());
            }
            let reply: Value = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(READ_COUNT)
                .arg("BLOCK")
                .arg(BLOCK.as_millis() as u64)
                .arg("STREAMS")
                .arg(&self.key)
                .arg(here.last.to_string())
                .query(&mut connection)?;
            let entries = match &reply {
                Value::Nil => Vec::new(),
                Value::Array(streams) => match streams.first() {
                    Some(Value::Array(stream)) if stream.len() == 2 => entries(&stream[1])?,
                    _ => return Err(unexpected("XREAD")),
                },
                _ => return Err(unexpected("XREAD")),
            };
            if let Some(&(last, _)) = entries.last() {
                let mut chunk = Vec::new();
                for (id, line) in &entries {
                    put_entry(*id, line.as_deref(), false, lines, &mut chunk);
                }
                if !read(Some(chunk)) {
                    return Ok(());
                }
                here = Read {
                    last,
                    added: here.added.map(|n| n + entries.len() as u64),
                };
                *at = Some(here);
            }
            if Instant::now() >= lag_due {
                lag_due = Instant::now() + LAG_EVERY;
                let Some(info) = info(&mut connection, &self.key)? else {
                    continue;
                };
                if info.last_generated == here.last {
                    // Caught up: the count of entries added is where it is.
                    here.added = info.entries_added;
                    *at = Some(here);
                }
                let lag = info.last_generated.ms.saturating_sub(here.last.ms);
                if !read(Some(Control::Lag(Duration::from_millis(lag)).line())) {
                    return Ok(());
                }
            }
        }
    }

    /// Fills the history from the stream's tail: the chunk that does it,
    /// and the entry to read on from.
    fn fill(
        &self,
        connection: &mut Connection,
        lines: &mut WholeLines,
    ) -> Result<(Vec<u8>, Id), RedisError> {
        let tail: Value = redis::cmd("XREVRANGE")
            .arg(&self.key)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(self.preload.messages.max(1))
            .query(connection)?;
        let mut tail = entries(&tail)?;
        tail.reverse();
        let Some(&(newest, _)) = tail.last() else {
            return Ok((Vec::new(), Id::default()));
        };
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let oldest_ms = now_ms.saturating_sub(self.preload.age.as_millis() as u64);
        let keep_from = match self.preload.messages {
            0 => tail.len(),
            _ => tail.partition_point(|(id, _)| id.ms < oldest_ms),
        };
        let kept = &tail[keep_from..];
        let forgotten = match kept.first() {
            Some((first, _)) => first.position().unwrap_or(u64::MAX).saturating_sub(1),
            None => newest.last_position(),
        };
        let mut chunk = Control::Forget(forgotten).line();
        for (id, line) in kept {
            put_entry(*id, line.as_deref(), true, lines, &mut chunk);
        }
        log::info!(
            "redis stream {}: the history holds its last {} entries (up to {newest})",
            self.key,
            kept.len()
        );
        Ok((chunk, newest))
    }

    /// What the stream lost after entry `last` while this reader was
    /// away: a gap's control line, or nothing.
    fn lost_since(&self, connection: &mut Connection, read: &Read) -> Result<Vec<u8>, RedisError> {
        let Some(info) = info(connection, &self.key)? else {
            log::warn!(
                "redis stream {}: the stream is gone; reading on after {} when it is back",
                self.key,
                read.last
            );
            return Ok(Vec::new());
        };
        let Some(to) = trimmed(&info, read) else {
            return Ok(Vec::new());
        };
        let from = read.last.last_position().saturating_add(1);
        log::warn!(
            "redis stream {}: entries after {} were trimmed before they were read \
             (positions {from} to {to}); raise its MAXLEN to outlast outages",
            self.key,
            read.last
        );
        Ok(Control::Gap { from, to }.line())
    }
}

/// Where a reader is in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Read {
    /// The last entry read.
    last: Id,
    /// The stream's count of entries ever added when `last` was added,
    /// if known (from Redis 7 on, once the reader has caught up).
    added: Option<u64>,
}

impl Source for StreamFeed {
    fn name(&self) -> &'static str {
        "redis-stream"
    }

    fn run(self: Box<Self>, out: Outlet) {
        self.read(&out);
    }
}

/// The last position the stream trimmed of what came after `read.last`
/// before it was read, if it did: trimming drops the oldest entries, so
/// it did only if `read.last` is gone, and the entries added since are
/// more than it holds (unknown before Redis 7: then only if it is gone).
fn trimmed(info: &Info, read: &Read) -> Option<u64> {
    if info.last_generated <= read.last {
        return None; // Nothing added since.
    }
    let before_first = |first: Id| first.position().unwrap_or(u64::MAX).saturating_sub(1);
    match info.first_entry {
        Some(first) if first <= read.last => None,
        first => {
            let since = match (info.entries_added, read.added) {
                (Some(now), Some(then)) => Some(now.saturating_sub(then)),
                _ => None,
            };
            if since.is_some_and(|added| added <= info.length) {
                return None;
            }
            Some(first.map_or(info.last_generated.last_position(), before_first))
        }
    }
}

/// What `XINFO STREAM` says that the reader uses.
#[derive(Debug, PartialEq, Eq)]
struct Info {
    length: u64,
    last_generated: Id,
    /// Entries ever added (Redis 7 on).
    entries_added: Option<u64>,
    first_entry: Option<Id>,
}

/// `XINFO STREAM key`, or `None` if there is no such stream.
fn info(connection: &mut Connection, key: &str) -> Result<Option<Info>, RedisError> {
    match redis::cmd("XINFO")
        .arg("STREAM")
        .arg(key)
        .query::<Value>(connection)
    {
        Ok(reply) => parse_info(&reply).map(Some),
        Err(e) if e.to_string().contains("no such key") => Ok(None),
        Err(e) => Err(e),
    }
}

fn parse_info(reply: &Value) -> Result<Info, RedisError> {
    let pairs: Vec<(&Value, &Value)> = match reply {
        Value::Array(items) => items
            .chunks_exact(2)
            .map(|pair| (&pair[0], &pair[1]))
            .collect(),
        Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
        _ => return Err(unexpected("XINFO STREAM")),
    };
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| bytes(k) == Some(name.as_bytes()))
            .map(|(_, v)| *v)
    };
    let id = |value: Option<&Value>| value.and_then(bytes).and_then(Id::parse);
    let first_entry = match field("first-entry") {
        Some(Value::Array(entry)) => id(entry.first()),
        _ => None,
    };
    let number = |value: Option<&Value>| match value {
        Some(Value::Int(n)) => u64::try_from(*n).ok(),
        _ => None,
    };
    Ok(Info {
        length: number(field("length")).ok_or_else(|| unexpected("XINFO STREAM"))?,
        last_generated: id(field("last-generated-id")).ok_or_else(|| unexpected("XINFO STREAM"))?,
        entries_added: number(field("entries-added")),
        first_entry,
    })
}

/// An entry read: its id, and its `line` field (`None`: it has none).
type Entry = (Id, Option<Vec<u8>>);

/// The entries of an `XRANGE`-like reply.
fn entries(reply: &Value) -> Result<Vec<Entry>, RedisError> {
    let Value::Array(items) = reply else {
        return Err(unexpected("a range of entries"));
    };
    items
        .iter()
        .map(|item| {
            let Value::Array(entry) = item else {
                return Err(unexpected("an entry"));
            };
            let id = entry
                .first()
                .and_then(bytes)
                .and_then(Id::parse)
                .ok_or_else(|| unexpected("an entry's id"))?;
            let line = match entry.get(1) {
                Some(Value::Array(fields)) => fields
                    .chunks_exact(2)
                    .find(|pair| bytes(&pair[0]) == Some(b"line"))
                    .and_then(|pair| bytes(&pair[1]))
                    .map(<[u8]>::to_vec),
                _ => None,
            };
            Ok((id, line))
        })
        .collect()
}

fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn unexpected(what: &'static str) -> RedisError {
    RedisError::from((
        redis::ErrorKind::Parse,
        "an unexpected reply to",
        what.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn a_position_is_the_ids_milliseconds_sequence_and_line() {
        let id = Id::parse(b"1764763200123-5").unwrap();
        assert_eq!(
            id,
            Id {
                ms: 1_764_763_200_123,
                seq: 5
            }
        );
        assert_eq!(id.to_string(), "1764763200123-5");
        assert_eq!(id.position(), Some(1_764_763_200_123 << 22 | 5 << 7));
        // Later ids, later positions; every line of an entry before the next.
        let next = Id { ms: id.ms, seq: 6 }.position().unwrap();
        assert!(id.last_position() < next);
        assert!(
            Id {
                ms: id.ms + 1,
                seq: 0
            }
            .position()
            .unwrap()
                > Id {
                    ms: id.ms,
                    seq: 32767
                }
                .last_position()
        );
        // The largest that fits, and the first past it.
        assert_eq!(
            Id {
                ms: (1 << 42) - 1,
                seq: 32767
            }
            .last_position(),
            u64::MAX
        );
        assert_eq!(
            Id {
                ms: 1 << 42,
                seq: 0
            }
            .position(),
            None
        );
        assert_eq!(
            Id {
                ms: 1,
                seq: 1 << 15
            }
            .position(),
            None
        );
        for bad in [
            &b"12"[..],
            b"-1",
            b"1-",
            b"1-x",
            b"+1-2",
            b"18446744073709551616-0",
        ] {
            assert_eq!(Id::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_epoch_is_the_streams_on_every_host() {
        assert_eq!(epoch("feed"), epoch("feed"));
        assert_ne!(epoch("feed"), epoch("feed2"));
        // Fixed: a host of another release agrees.
        assert_eq!(epoch("feed").to_string().len(), 16);
        assert_eq!(
            epoch("feed"),
            Epoch(0x56e9_79a7_5d3f_5d94),
            "{}",
            epoch("feed")
        );
    }

    #[test]
    fn an_entry_is_its_control_line_and_its_lines_or_a_skip() {
        let id = Id { ms: 2, seq: 1 };
        let seq = id.position().unwrap();
        let mut lines = WholeLines::new(100);
        let mut out = Vec::new();
        put_entry(id, Some(b"a\nb"), false, &mut lines, &mut out);
        let mut expected = Control::Entry {
            seq,
            lines: 2,
            keep: false,
        }
        .line();
        expected.extend_from_slice(b"a\nb\n");
        assert_eq!(out, expected);
        out.clear();
        put_entry(id, Some(b""), true, &mut lines, &mut out);
        let mut expected = Control::Entry {
            seq,
            lines: 1,
            keep: true,
        }
        .line();
        expected.push(b'\n');
        assert_eq!(out, expected);
        let skip = |line: Option<&[u8]>, id: Id| {
            let mut out = Vec::new();
            put_entry(id, line, false, &mut WholeLines::new(100), &mut out);
            let end = out.iter().position(|&b| b == b'\n').unwrap();
            Control::parse(&out[..end])
        };
        let many = "x\n".repeat(MAX_LINES);
        assert!(matches!(
            skip(Some(many.as_bytes()), id),
            Some(Control::Entry { lines: 128, .. })
        ));
        let more = format!("{many}x");
        assert!(matches!(
            skip(Some(more.as_bytes()), id),
            Some(Control::Skipped {
                why: Skip::TooManyLines,
                ms: 2,
                seq: 1
            })
        ));
        assert!(matches!(
            skip(None, id),
            Some(Control::Skipped {
                why: Skip::NoLine,
                ..
            })
        ));
        let far = Id {
            ms: 1 << 42,
            seq: 0,
        };
        assert!(matches!(
            skip(Some(b"x"), far),
            Some(Control::Skipped {
                why: Skip::IdTooLarge,
                ..
            })
        ));
    }

    #[test]
    fn a_gap_is_told_only_if_entries_after_the_last_read_were_trimmed() {
        let id = |ms| Id { ms, seq: 0 };
        let info = |first: Option<u64>, length, added| Info {
            length,
            last_generated: id(20),
            entries_added: added,
            first_entry: first.map(id),
        };
        let read = |added| Read {
            last: id(10),
            added,
        };
        let before = |ms| id(ms).position().unwrap() - 1;
        // The last entry read is still there: nothing after it was trimmed.
        assert_eq!(trimmed(&info(Some(5), 9, Some(30)), &read(Some(10))), None);
        // Gone, but every entry added since is there.
        assert_eq!(trimmed(&info(Some(12), 5, Some(15)), &read(Some(10))), None);
        // Gone, and fewer are there than were added since.
        assert_eq!(
            trimmed(&info(Some(16), 5, Some(22)), &read(Some(10))),
            Some(before(16))
        );
        // Unknown how many were added: told, to be safe.
        assert_eq!(
            trimmed(&info(Some(12), 5, None), &read(None)),
            Some(before(12))
        );
        // Emptied after more were added.
        assert_eq!(
            trimmed(&info(None, 0, Some(12)), &read(Some(10))),
            Some(id(20).last_position())
        );
        // Nothing added since.
        let idle = Info {
            last_generated: id(10),
            ..info(None, 0, None)
        };
        assert_eq!(trimmed(&idle, &read(None)), None);
    }

    #[test]
    fn replies_are_read_as_redis_sends_them() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                bulk("5-0"),
                Value::Array(vec![bulk("other"), bulk("x"), bulk("line"), bulk("hi")]),
            ]),
            Value::Array(vec![
                bulk("6-1"),
                Value::Array(vec![bulk("text"), bulk("no line")]),
            ]),
        ]);
        assert_eq!(
            entries(&reply).unwrap(),
            [
                (Id { ms: 5, seq: 0 }, Some(b"hi".to_vec())),
                (Id { ms: 6, seq: 1 }, None)
            ]
        );
        assert!(entries(&Value::Array(vec![Value::Array(vec![bulk("x")])])).is_err());
        let info = Value::Array(vec![
            bulk("length"),
            Value::Int(2),
            bulk("last-generated-id"),
            bulk("9-3"),
            bulk("entries-added"),
            Value::Int(7),
            bulk("first-entry"),
            Value::Array(vec![bulk("5-0"), Value::Array(vec![])]),
        ]);
        assert_eq!(
            parse_info(&info).unwrap(),
            Info {
                length: 2,
                last_generated: Id { ms: 9, seq: 3 },
                entries_added: Some(7),
                first_entry: Some(Id { ms: 5, seq: 0 }),
            }
        );
    }
}

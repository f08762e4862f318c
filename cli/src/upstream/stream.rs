//! `--upstream redis-stream`: the upstream lines added to a Redis stream,
//! one entry each, exactly once and in order, across Redis outages.
//!
//! An entry is `host HOST seq N line LINE`: LINE is the line as standard
//! output has it (`msg KEY ID text PAYLOAD`, ...), HOST the writer's
//! name (`--host-name`, the machine's hostname by default), N its
//! sequence: 1, 2, 3... for every line of that host, across restarts.
//!
//! One thread writes, with the `redis` crate's blocking client, in
//! batches of at most [`BATCH_LINES`] lines or [`BATCH_BYTES`] bytes
//! (what came while the last one was under way), one round trip each.
//! A batch is one call of a script ([`SCRIPT`], atomic as a script is)
//! that reads the host's sequence (`wspush:upstream:HOST:KEY:seq`),
//! adds the entries after it (`XADD KEY MAXLEN ~ N *`) and sets it to
//! the batch's last. A batch whose reply was lost (the connection
//! broke, or Redis did not answer in [`ANSWER_TIMEOUT`]) is sent again,
//! the same lines after the same sequence: if the sequence already
//! stands at its last, the script adds nothing and says so (counted as
//! `found`), so no line is written twice, and none is skipped. No check
//! comes between the reconnection and the resend that could race it:
//! the script is the check.
//!
//! While Redis is away, the writer keeps its batch and what it took
//! with it, and reads no more: the server's upstream bound
//! (`--upstream-max-bytes`) fills, then its overflow policy applies
//! (pause the clients, or drop their messages, counted). The outage is
//! logged once, retried with a jittered backoff, and its end logged
//! (`reconnect`). At exit, lines Redis has still not taken after the
//! grace given (`--shutdown-timeout`) are dropped, counted and logged.

use std::ops::Range;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::{Client, Cmd, Connection, RedisError};
use wspush::UpstreamTally;

use crate::sources::pubsub::{client, CONNECT_TIMEOUT};
use crate::sources::reconnect::{keep_reading, Where};
use crate::sources::FeedEvent;

/// The most lines one batch holds.
pub const BATCH_LINES: usize = 1000;
/// The most bytes of lines one batch holds (a longer line goes alone).
pub const BATCH_BYTES: usize = 1 << 20;
/// How long Redis may take to answer before the connection is taken for
/// lost.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(3);

/// The script each batch is: KEYS the stream and the host's sequence;
/// ARGV the host, MAXLEN, the sequence before the batch, then its lines.
/// Answers `{1, AT}` once it added them after sequence AT (the one
/// given, unless Redis lost writes or another writer uses this host's
/// name), `{0, AT}` if the sequence already stood at the batch's last.
pub const SCRIPT: &str = r"
local at = tonumber(redis.call('GET', KEYS[2]) or '0')
local count = #ARGV - 3
if at == tonumber(ARGV[3]) + count then return {0, at} end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'stream' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a ' .. kind .. ', not a stream')
end
for i = 1, count do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*',
    'host', ARGV[1], 'seq', string.format('%d', at + i), 'line', ARGV[i + 3])
end
redis.call('SET', KEYS[2], string.format('%d', at + count))
return {1, at}
";

/// Where the lines go: a stream on a Redis server, as this host.
#[derive(Clone)]
pub struct Target {
    client: Client,
    /// The server, for logs (no password).
    server: String,
    key: String,
    host: String,
    /// The key of this host's sequence: `wspush:upstream:HOST:KEY:seq`.
    sequence: String,
    maxlen: usize,
    /// How often the writer logs what it wrote (never: `None`).
    report_every: Option<Duration>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream {} on {} as {}", self.key, self.server, self.host)
    }
}

impl Target {
    /// Stream `key` on the server of `url`, written as `host`, kept to
    /// about `maxlen` entries.
    pub fn new(url: &str, key: &str, host: String, maxlen: usize) -> Result<Target, String> {
        let client = client(url)?;
        if key.is_empty() {
            return Err("--upstream-stream: a key cannot be empty".into());
        }
        Ok(Target {
            server: client.get_connection_info().addr().to_string(),
            client,
            key: key.to_string(),
            sequence: format!("wspush:upstream:{host}:{key}:seq"),
            host,
            maxlen,
            report_every: None,
        })
    }

    /// Logs what was written every `every` (a line at exit still).
    pub fn reporting_every(mut self, every: Option<Duration>) -> Target {
        self.report_every = every;
        self
    }
}

/// When the writer gives up on lines Redis has not taken: at exit, after
/// a grace.
#[derive(Debug, Clone, Default)]
pub struct GiveUp(Arc<OnceLock<Instant>>);

impl GiveUp {
    /// From `grace` from now on (once; a later call changes nothing).
    pub fn after(&self, grace: Duration) {
        let _ = self.0.set(Instant::now() + grace);
    }

    fn due(&self) -> bool {
        self.0.get().is_some_and(|at| Instant::now() >= *at)
    }
}

/// The writer: its lines not written yet, and where it is in them.
struct Writer {
    target: Target,
    tally: UpstreamTally,
    /// Lines taken from the source; written up to `done`.
    lines: Vec<u8>,
    done: usize,
    /// The batch sent and not acknowledged yet (in `lines`), and the
    /// sequence it was sent after: sent again as it is.
    batch: Option<(Range<usize>, u64)>,
    /// The host's sequence as the last batch left it (learned at the
    /// first connection).
    at: Option<u64>,
    cmd: Cmd,
    /// What it wrote, for its log lines.
    counts: Counts,
}

/// What the writer wrote, for its log lines.
#[derive(Debug, Default)]
struct Counts {
    entries: u64,
    batches: u64,
    /// Of the batches, those found written after their reply was lost.
    found: u64,
    /// When it last logged them.
    logged: Option<Instant>,
}

/// Writes every line `next` gives into the stream of `target` until
/// `next` says there are no more (each call fills its argument with
/// whole lines, taken when all before were written), counting in
/// `tally`; gives up once `give_up` is due, dropping (and counting) what
/// is left.
pub fn write(
    target: Target,
    tally: UpstreamTally,
    mut next: impl FnMut(&mut Vec<u8>) -> bool,
    give_up: &GiveUp,
) {
    let what = format!("upstream stream {} (as {})", target.key, target.host);
    let server = target.server.clone();
    let source = Where {
        server: &server,
        what: &what,
        ready: "writing",
        meanwhile:
            "the lines not written wait; past --upstream-max-bytes, --upstream-overflow applies",
    };
    let mut writer = Writer {
        target,
        tally: tally.clone(),
        lines: Vec::new(),
        done: 0,
        batch: None,
        at: None,
        cmd: Cmd::new(),
        counts: Counts::default(),
    };
    let mut ended = false;
    keep_reading(
        source,
        |ready| writer.session(&what, &mut next, ready, &mut ended),
        |event| {
            match event {
                FeedEvent::Lost => tally.lost(),
                FeedEvent::Restored(outage) => tally.restored(outage),
                FeedEvent::Chunk(_) => {}
            }
            true
        },
        &|| give_up.due(),
    );
    writer.report(&what, true);
    if ended {
        return;
    }
    // Given up: what is left is dropped, counted.
    let mut dropped = count_lines(&writer.lines[writer.done..]);
    let mut rest = Vec::new();
    while next(&mut rest) {
        dropped += count_lines(&rest);
    }
    tally.dropped(dropped);
    log::error!(
        "redis {what}: {dropped} upstream lines dropped at exit: Redis did not take them in time"
    );
}

fn count_lines(lines: &[u8]) -> u64 {
    lines.iter().filter(|&&b| b == b'\n').count() as u64
}

impl Writer {
    /// One connection: learns the host's sequence (the first time), then
    /// writes batches (logging them as `what` now and then), taking lines
    /// from `next` once all it has are written; calls `ready` once it has
    /// written (or has nothing to). `Ok` once `next` has no more
    /// (`ended`) or `ready` says to stop.
    fn session(
        &mut self,
        what: &str,
        next: &mut impl FnMut(&mut Vec<u8>) -> bool,
        ready: &mut dyn FnMut(Option<Vec<u8>>) -> bool,
        ended: &mut bool,
    ) -> Result<(), RedisError> {
        let mut connection = self
            .target
            .client
            .get_connection_with_timeout(CONNECT_TIMEOUT)?;
        connection.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        connection.set_write_timeout(Some(ANSWER_TIMEOUT))?;
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(SCRIPT)
            .query(&mut connection)?;
        if self.at.is_none() {
            let at: Option<u64> = redis::cmd("GET")
                .arg(&self.target.sequence)
                .query(&mut connection)?;
            self.at = Some(at.unwrap_or(0));
        }
        let mut said = false;
        loop {
            if self.done == self.lines.len() {
                if !said && !ready(None) {
                    return Ok(());
                }
                said = true;
                self.done = 0;
                if !next(&mut self.lines) {
                    *ended = true;
                    return Ok(());
                }
                continue;
            }
            self.send(&mut connection, &sha)?;
            self.report(what, false);
            if !said && !ready(None) {
                return Ok(());
            }
            said = true;
        }
    }

    /// Sends the batch under way (the next one, if none is) and waits for
    /// its answer.
    fn send(&mut self, connection: &mut Connection, sha: &str) -> Result<(), RedisError> {
        let at = self.at.unwrap_or(0);
        let (range, before) = self
            .batch
            .get_or_insert_with(|| (next_batch(&self.lines, self.done), at))
            .clone();
        let target = &self.target;
        self.cmd.clear();
        self.cmd
            .arg("EVALSHA")
            .arg(sha)
            .arg(2)
            .arg(&target.key)
            .arg(&target.sequence)
            .arg(&target.host)
            .arg(target.maxlen)
            .arg(before);
        let mut body = &self.lines[range.clone()];
        body = body.strip_suffix(b"\n").unwrap_or(body);
        let mut count = 0u64;
        for line in body.split(|&b| b == b'\n') {
            self.cmd.arg(line);
            count += 1;
        }
        let (written, was): (i64, u64) = self.cmd.query(connection)?;
        if written == 1 && was != before {
            log::warn!(
                "redis upstream stream {}: the sequence of {} stood at {was}, not {before}: Redis lost writes, or another writer uses --host-name {}; its lines go on after {was}",
                target.key, target.host, target.host
            );
        }
        // Found written, the sequence stands at the batch's last already.
        self.at = Some(if written == 1 { was + count } else { was });
        self.tally.batch(count, written == 0);
        self.counts.entries += count;
        self.counts.batches += 1;
        self.counts.found += u64::from(written == 0);
        self.done = range.end;
        self.batch = None;
        Ok(())
    }
}

impl Writer {
    /// Logs what was written so far, if it is time (or `last`, at the
    /// end, if anything was).
    fn report(&mut self, what: &str, last: bool) {
        let Some(every) = self.target.report_every else {
            return;
        };
        let counts = &mut self.counts;
        let due = match counts.logged {
            Some(at) => at.elapsed() >= every,
            None => {
                counts.logged = Some(Instant::now());
                false
            }
        };
        if !(due || last && counts.batches > 0) {
            return;
        }
        counts.logged = Some(Instant::now());
        log::info!(
            "redis {what}: {} entries written in {} batches ({} found written after a lost reply), at sequence {}",
            counts.entries,
            counts.batches,
            counts.found,
            self.at.unwrap_or(0)
        );
    }
}

/// The lines of the next batch in `lines` from `from`: whole lines, each
/// ending with `\n` (what is left, if it has none).
fn next_batch(lines: &[u8], from: usize) -> Range<usize> {
    let mut end = from;
    let mut count = 0;
    let feeds = (lines[from..].iter().enumerate()).filter(|&(_, &b)| b == b'\n');
    for (at, _) in feeds {
        let next = from + at + 1;
        if count > 0 && (count == BATCH_LINES || next - from > BATCH_BYTES) {
            break;
        }
        end = next;
        count += 1;
    }
    match count {
        0 => from..lines.len(),
        _ => from..end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_whole_lines_up_to_its_bounds() {
        let lines = b"a\nbb\nccc\n";
        assert_eq!(next_batch(lines, 0), 0..9);
        assert_eq!(next_batch(lines, 2), 2..9);
        let many = b"x\n".repeat(BATCH_LINES + 5);
        assert_eq!(next_batch(&many, 0), 0..2 * BATCH_LINES);
        assert_eq!(
            next_batch(&many, 2 * BATCH_LINES),
            2 * BATCH_LINES..many.len()
        );
        // A line longer than the byte bound goes alone.
        let mut long = vec![b'y'; BATCH_BYTES + 1];
        long.extend_from_slice(b"\nz\n");
        assert_eq!(next_batch(&long, 0), 0..BATCH_BYTES + 2);
        assert_eq!(next_batch(b"no feed", 0), 0..7);
    }

    #[test]
    fn a_target_needs_a_key() {
        let url = "redis://127.0.0.1:6379";
        let target = Target::new(url, "up", "h1".into(), 10).unwrap();
        assert_eq!(target.sequence, "wspush:upstream:h1:up:seq");
        assert_eq!(format!("{target:?}"), "stream up on 127.0.0.1:6379 as h1");
        assert!(Target::new(url, "", "h1".into(), 10).is_err());
    }
}

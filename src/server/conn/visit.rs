//! The delivery visit: what a connection is owed (the stream's batches,
//! its own items among them, a replay), gathered as references to shared
//! frames and handed to the output stage in one `writev`; what its queue
//! has no room for is dropped for it, or closes it, by policy.

use super::wire::{Outgoing, Taking, WithTaking};
use super::{CloseReason, Conn, Ctx, Flags, Verdict, Visited};
use crate::config::SlowConsumerPolicy;
use crate::ops::metrics::Metrics;
use crate::server::frames::SharedFrames;
use crate::server::history::Replay;
use crate::server::key::ConnKey;
use crate::server::net::queue::Sent;
use crate::server::owed::{Item, Left, Owed};

impl Conn {
    /// A delivery visit (see `walk`): writes what this connection is
    /// owed, in order, with one `writev`: the stream's batches it has not
    /// had, each of its own items after the batches framed before it, and
    /// the batches after them up to `owed.up_to`. A close among its items
    /// goes out after what precedes it, and the rest is not sent. Counts
    /// what became of the messages: delivered, or missed. What it could
    /// not give of its items (a replay larger than its queue has room
    /// for, or ahead of this loop) is `Err`, for the walk to take back:
    /// the connection is kept.
    pub fn deliver(&mut self, key: ConnKey, owed: Owed<'_>, ctx: &mut Ctx<'_>) -> Visited {
        if !self.is_open() {
            return Ok(Verdict::Keep);
        }
        let (wire, positions) = (self.wire, self.flags.has(Flags::POSITIONS));
        let visit = Visit {
            conn: self,
            key,
            owed,
            ctx,
        };
        wire.visit(positions, visit)
    }

    /// [`Conn::deliver`], the frames taken as `taking` says.
    fn deliver_taking<T: Taking>(
        &mut self,
        key: ConnKey,
        owed: Owed<'_>,
        taking: T,
        ctx: &mut Ctx<'_>,
    ) -> Visited {
        let mut gathered = std::mem::take(ctx.gathered);
        let made = &ctx.counters.metrics.event_stream_batches;
        // After a replay, what it gave (up to `skip`) is not given again.
        let mut skip = None;
        let gather = |gathered: &mut Vec<SharedFrames>, frames: &[SharedFrames], skip| match skip {
            None => gathered.extend(frames.iter().map(|f| taking.take(f, made)).cloned()),
            Some(through) => gathered.extend(
                (frames.iter().filter_map(|f| f.after(through)))
                    .map(|rest| taking.take(&rest, made).clone()),
            ),
        };
        let mut cursor = self.next_batch;
        let mut close = None;
        let mut unfinished = None;
        for (at, item) in owed.items.iter().map(|a| &a.item).enumerate() {
            gather(
                &mut gathered,
                owed.batches.between(cursor, item.after()),
                skip,
            );
            cursor = item.after();
            match item {
                Item::Frames { frames, .. } => {
                    gather(&mut gathered, std::slice::from_ref(frames), skip)
                }
                Item::Close { code, reason, .. } => {
                    close = Some((*code, reason));
                    break;
                }
                Item::Replay { replay, .. } => {
                    match self.visit_replay(key, (at, replay), taking, &mut gathered, ctx) {
                        Ok(through) => skip = Some(through),
                        Err(left) => {
                            unfinished = Some(left);
                            break;
                        }
                    }
                }
            }
        }
        if close.is_none() && unfinished.is_none() {
            gather(
                &mut gathered,
                owed.batches.between(cursor, owed.up_to),
                skip,
            );
            cursor = owed.up_to;
        }
        self.next_batch = cursor;
        let mut verdict = Verdict::Keep;
        if !gathered.is_empty() {
            verdict = self.deliver_frames(key, &gathered, ctx);
            gathered.clear();
        }
        *ctx.gathered = gathered;
        if !matches!(verdict, Verdict::Keep) {
            return Ok(verdict);
        }
        if let Some((code, reason)) = close {
            return Ok(self.begin_close(key, reason, CloseReason::Publisher(code), ctx));
        }
        match unfinished {
            Some(left) => Err(left),
            None => Ok(Verdict::Keep),
        }
    }

    /// A replay item's part of a visit (the item at `at`): what the history holds of it, as much as the queue
    /// has room for, gathered. Returns the position it gave up to, or
    /// what is left of the items when it could not give it all (or it is
    /// ahead of this loop). Out of line: most visits have no replay.
    #[cold]
    #[inline(never)]
    fn visit_replay<T: Taking>(
        &self,
        key: ConnKey,
        (at, replay): (usize, &Replay),
        taking: T,
        gathered: &mut Vec<SharedFrames>,
        ctx: &mut Ctx<'_>,
    ) -> Result<u64, Left> {
        let pending: usize = gathered.iter().map(|f| f.bytes().len()).sum();
        let used = self.queued_bytes(key, ctx.aside) + pending;
        let room = ctx.config.max_queued_bytes.saturating_sub(used);
        let before = gathered.len();
        let progress = ctx
            .history
            .gather(replay, taking.compressed(), room, gathered);
        taking.replayed(
            &mut gathered[before..],
            &ctx.counters.metrics.event_stream_batches,
        );
        if progress.overrun {
            Metrics::incr(&ctx.counters.metrics.replay_overruns);
        }
        // Not all given yet, or all given but ahead of this loop.
        let more = progress
            .more
            .or(replay.ahead_of(ctx.history).then_some(replay.through));
        match more {
            Some(from) => Err(Left {
                at,
                from: from.max(replay.from),
            }),
            None => Ok(replay.through),
        }
    }

    /// [`Conn::deliver`] of the frames this connection gets (inlined in
    /// each copy of the visit, as it was in the one there was).
    #[inline(always)]
    fn deliver_frames(
        &mut self,
        key: ConnKey,
        owed: &[SharedFrames],
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        let messages = |frames: &[SharedFrames]| frames.iter().map(|f| f.count() as u64).sum();
        match self.send(key, Outgoing::Shared(owed), ctx) {
            Err(reason) => return Verdict::Close(reason),
            Ok(Sent::Written) => ctx.tally.broadcast_deliveries += messages(owed),
            Ok(Sent::Queued) => {
                ctx.tally.broadcast_deliveries += messages(owed);
                ctx.tally.write_would_block += 1;
            }
            Ok(Sent::Dropped { kept }) => {
                let (taken, missed) = owed.split_at(kept);
                let missed = messages(missed);
                ctx.tally.broadcast_deliveries += messages(taken);
                ctx.tally.slow_consumer_drops += missed;
                self.wire.count(ctx.tally, 0, missed);
                ctx.tally.write_would_block += 1;
                return self.on_slow_consumer(key, missed, ctx);
            }
        }
        Verdict::Keep
    }

    /// Broadcasts found its queue full: under policy `drop` it misses
    /// them; under `close` its output not started yet is discarded and it
    /// is closed with 1008. A connection with positions is never skipped
    /// silently: under `drop` it is closed with 1008 after what it was
    /// given, and resumes from there with nothing lost.
    fn on_slow_consumer(&mut self, key: ConnKey, missed: u64, ctx: &mut Ctx<'_>) -> Verdict {
        let why = "slow consumer";
        match ctx.config.slow_consumer {
            SlowConsumerPolicy::Drop if !self.flags.has(Flags::POSITIONS) => {
                log::debug!(
                    "slow consumer {key}: {} bytes queued, {missed} broadcasts dropped for it",
                    self.queued_bytes(key, ctx.aside),
                );
                Verdict::Keep
            }
            SlowConsumerPolicy::Drop => {
                log::debug!(
                    "slow consumer {key} with positions: {} bytes queued, {missed} broadcasts \
                     not given; closing after what it was given, to resume",
                    self.queued_bytes(key, ctx.aside),
                );
                self.begin_close(key, why, CloseReason::SlowConsumer, ctx)
            }
            SlowConsumerPolicy::Close => {
                let dropped = self.discard_output(key, false, ctx);
                log::debug!(
                    "slow consumer {key}: {} bytes queued, {dropped} frames dropped, closing",
                    self.queued_bytes(key, ctx.aside)
                );
                self.begin_close(key, why, CloseReason::SlowConsumer, ctx)
            }
        }
    }
}

/// A delivery visit, run with the way its wire takes frames.
struct Visit<'v, 'o, 'c> {
    conn: &'v mut Conn,
    key: ConnKey,
    owed: Owed<'o>,
    ctx: &'v mut Ctx<'c>,
}

impl WithTaking for Visit<'_, '_, '_> {
    type Output = Visited;

    #[inline(always)]
    fn run<T: Taking>(self, taking: T) -> Visited {
        self.conn
            .deliver_taking(self.key, self.owed, taking, self.ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::super::rig::Rig;
    use super::*;
    use crate::protocol::ws::OpCode;

    #[test]
    fn a_status_for_connections_with_positions_reaches_only_them() {
        let at = crate::protocol::position::Position {
            epoch: crate::protocol::position::Epoch(1),
            seq: 0,
        };
        let status = SharedFrames::positioned_only(br#"{"status":"gap"}"#, at);
        let text = SharedFrames::encode(OpCode::Text, b"hi");
        let mut rig = Rig::upgraded();
        assert_eq!(rig.offer(&status), Verdict::Keep);
        assert_eq!(rig.offer(&text), Verdict::Keep);
        assert_eq!(rig.tally.broadcast_deliveries, 1, "the text alone");
        assert_eq!(rig.client_frame_start(), [0x8A, 0], "an empty pong instead");
        assert_eq!(rig.client_frame_start(), [0x81, 2], "then the text");
        assert_eq!([rig.client_byte(), rig.client_byte()], *b"hi");
        rig.conn.flags.set(Flags::POSITIONS, true);
        assert_eq!(rig.offer(&status), Verdict::Keep);
        assert_eq!(rig.tally.broadcast_deliveries, 2);
        assert_eq!(rig.client_frame_start(), [0x81, 16], "the status");
    }

    #[test]
    fn a_full_queue_drops_broadcasts_or_closes_by_policy() {
        for policy in [SlowConsumerPolicy::Drop, SlowConsumerPolicy::Close] {
            let mut rig = Rig::upgraded();
            rig.config.max_queued_bytes = 1 << 20;
            rig.config.slow_consumer = policy;
            let frame = SharedFrames::encode(OpCode::Binary, &vec![1u8; 256 << 10]);
            let mut verdict = Verdict::Keep;
            let mut offered = 0u32;
            while rig.tally.slow_consumer_drops == 0 {
                assert!(offered < 1000, "the queue never filled");
                offered += 1;
                verdict = rig.offer(&frame);
            }
            assert_eq!(rig.tally.slow_consumer_drops, 1, "{policy:?}");
            assert_eq!(
                rig.tally.broadcast_deliveries + 1,
                u64::from(offered),
                "{policy:?}: each offered one delivered or dropped"
            );
            match policy {
                SlowConsumerPolicy::Drop => {
                    assert_eq!(verdict, Verdict::Keep);
                    assert!(rig.conn.is_open());
                    assert_eq!(rig.tally.frames_discarded, 0);
                }
                SlowConsumerPolicy::Close => {
                    assert_eq!(verdict, Verdict::Keep, "closing, the close frame queued");
                    assert!(!rig.conn.is_open());
                    assert!(rig.tally.frames_discarded > 0, "unstarted frames discarded");
                    assert_eq!(
                        rig.aside.queues[&ConnKey(0)].queued_frames(),
                        2,
                        "the started one and the close"
                    );
                }
            }
        }
    }
}

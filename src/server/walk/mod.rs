//! The walk: every duty toward the connections, carried one budgeted step
//! per loop iteration ([`Config::fanout_budget`] visits and
//! [`SLICE_BYTES`] handed to sockets, shared by all of them), after which
//! the loop polls and serves accepts, reads, pongs and timers before the
//! next step. Everything delivery is lives here: the broadcast `stream`,
//! the `targeted` items, the `directory` that addresses them, and the
//! `sweep`'s cursor over the keys.
//!
//! Each step, in order:
//!
//! - the waits given up: a connection whose replay waited in vain for
//!   this loop to reach its position is closed (1013, `ahead`);
//! - the targeted items' walk over their recipients, in key order (a
//!   channel's, an id's or one connection's messages and closes, and the
//!   replays a resuming connection waits for: see `targeted`), at most
//!   half the visits while the sweep has work too;
//! - the sweep, with one cursor over every key (see `sweep`): a pass of
//!   the broadcast stream and the closing sweep of a shutdown go a lap of
//!   it; the heartbeat's pings and a drain's closes move it at their pace.
//!   A key visited for several duties gets them all in one visit.
//!
//! A visit hands a connection what it is owed ([`Owed`]) through
//! [`Conn::deliver`], which writes it in order with one `writev`, then
//! any other duty ([`Duty`]) through [`Conn::owe`]. What a visit could
//! not give of a connection's items ([`Left`]) the walk takes back; the
//! verdicts other than keep are acted on in one place, the loop's
//! `settle`, once the step is over.

pub(crate) mod directory;
pub(crate) mod stream;
pub(crate) mod sweep;
pub(crate) mod targeted;

use std::sync::atomic::Ordering;
use std::time::Instant;

use mio::Registry;
use slab::Slab;

use crate::config::Config;
use crate::ops::metrics::{Counters, Tally};
use crate::protocol::presence::Transport;
use crate::server::admit::connections::sync_interest;
use crate::server::conn::{CloseReason, Conn, Ctx, Duty, Verdict};
use crate::server::frames::{transport_bit, SharedFrames};
use crate::server::key::ConnKey;
use crate::server::lifecycle::drain::Pace;
use crate::server::owed::{Addressed, Batches, Item, Left, Owed, Seq, WalkMark};
use crate::server::time::heartbeat::Heartbeat;
use stream::Stream;
use sweep::{Next, Paced, Sweep};
use targeted::{Targeted, Turn, Until};

/// Bytes one step hands to sockets (or queues), at most, before the loop
/// serves other events again (besides [`Config::fanout_budget`] visits).
const SLICE_BYTES: usize = 8 << 20;

/// What one step may still do.
#[derive(Debug, Clone, Copy)]
struct Budget {
    visits: usize,
    /// The tally's bytes written and queued when the step began.
    bytes_from: i64,
}

impl Budget {
    fn new(config: &Config, tally: &Tally) -> Budget {
        Budget {
            visits: config.fanout_budget,
            bytes_from: handed(tally),
        }
    }

    fn visit(&mut self) {
        self.visits = self.visits.saturating_sub(1);
    }

    /// The step has done its share, keeping `kept` visits back.
    fn spent(&self, tally: &Tally, kept: usize) -> bool {
        self.visits <= kept || handed(tally) - self.bytes_from >= SLICE_BYTES as i64
    }
}

/// Bytes handed to sockets so far: written, or queued.
fn handed(tally: &Tally) -> i64 {
    tally.bytes_written as i64 + tally.queued_bytes
}

/// The close a closing sweep gives every connection: an open one is sent
/// its close (after what it has queued), one still in its handshake is
/// dropped, one already closing is left to finish.
#[derive(Debug, Clone, Copy)]
pub(super) struct Closing {
    /// What the close frame says.
    pub why: &'static str,
    /// Why it closes.
    pub reason: CloseReason,
}

/// The schedules whose duties the sweep's cursor carries this step.
pub(super) struct Schedules<'a> {
    /// The heartbeat, while the loop sweeps (it serves and holds
    /// connections): it is told when the cursor goes round.
    pub heartbeat: Option<&'a mut Heartbeat>,
    /// The heartbeat's slice is due now, and yields to no work.
    pub pings_due: bool,
    /// A drain's pace, while it closes the connections.
    pub pace: Option<&'a mut Pace>,
}

/// The deliveries under way and the cursor over the keys: everything the
/// walk carries from step to step.
#[derive(Debug, Default)]
pub(super) struct Walk {
    /// The broadcast batches.
    pub(super) stream: Stream,
    /// Messages and closes for some connections, on their way.
    pub(super) targeted: Targeted,
    /// The cursor over the keys, and its lap.
    sweep: Sweep,
    /// The closing sweep's close, while its lap is under way.
    closing: Option<Closing>,
    /// Reused for the verdicts a step leaves to act on.
    unsettled: Vec<(ConnKey, Verdict)>,
}

impl Walk {
    /// Whether some delivery is under way or may be owed.
    pub(super) fn delivering(&self) -> bool {
        self.stream.is_busy() || !self.targeted.is_idle()
    }

    /// Begins the closing sweep: a lap that gives every connection
    /// `closing`.
    pub(super) fn begin_closing(&mut self, closing: Closing) {
        self.closing = Some(closing);
        self.sweep.begin_lap();
    }

    /// Whether the closing sweep has keys left to visit.
    pub(super) fn closing_pending(&self) -> bool {
        self.closing.is_some()
    }

    /// Whether a step has anything to do at `now`, besides what the
    /// schedules have due (`scheduled`: the heartbeat's slice or a
    /// drain's pace): a delivery, a lap, or a wait that is over. Most
    /// iterations of an idle loop have nothing, and skip the step.
    pub(super) fn has_work(&self, now: Instant, scheduled: bool) -> bool {
        scheduled
            || self.delivering()
            || self.sweep.in_lap()
            || self.targeted.next_overdue().is_some_and(|at| at <= now)
    }

    /// Keys the cursor has passed since the loop began (a drain's round is
    /// measured by it).
    pub(super) fn travelled(&self) -> u64 {
        self.sweep.travelled()
    }

    /// Carries every duty one step further under one budget, visiting
    /// `conns` below `key_bound` with `ctx` (`scratch` for the reads a
    /// heartbeat's idle check makes): gives up the waits that are over,
    /// walks the targeted items' recipients, sweeps; then drops the
    /// batches no connection needs any more. Returns the verdicts other
    /// than keep, for the loop to act on (give the list back with
    /// [`Walk::settled`]).
    pub(super) fn step(
        &mut self,
        (conns, key_bound): (&mut Slab<Conn>, usize),
        (registry, scratch): (&Registry, &mut [u8]),
        ctx: Ctx<'_>,
        schedules: Schedules<'_>,
    ) -> Vec<(ConnKey, Verdict)> {
        let mut unsettled = std::mem::take(&mut self.unsettled);
        let mut visitor = Visitor {
            conns,
            registry,
            scratch,
            ctx,
            unsettled: &mut unsettled,
        };
        let mut budget = Budget::new(visitor.ctx.config, visitor.ctx.tally);
        visitor.give_up_waits(&mut self.targeted, &mut budget);
        let sweeping = self.sweep.in_lap()
            || self.stream.is_busy()
            || schedules.pings_due
            || schedules.pace.is_some();
        let kept = if sweeping { budget.visits / 2 } else { 0 };
        visitor.walk(&mut self.targeted, &self.stream, &mut budget, kept);
        let lap = (&mut self.stream, &mut self.closing);
        visitor.sweep(&mut self.sweep, lap, (key_bound, schedules), &mut budget);
        self.targeted.settle_floor();
        self.stream.trim(self.targeted.floor());
        unsettled
    }

    /// Takes back the emptied list [`Walk::step`] gave.
    pub(super) fn settled(&mut self, unsettled: Vec<(ConnKey, Verdict)>) {
        self.unsettled = unsettled;
    }
}

/// Whether a pass owes `conn` the stream's batches before `up_to`: it is
/// open, behind, and not left to the targeted walk.
fn owes_batches(conn: &Conn, up_to: Seq) -> bool {
    !conn.walk_mark().is_marked() && conn.next_batch().is_some_and(|next| next != up_to)
}

/// The connections and what a visit needs, borrowed from the loop.
struct Visitor<'a, 'c> {
    conns: &'a mut Slab<Conn>,
    registry: &'a Registry,
    scratch: &'a mut [u8],
    ctx: Ctx<'c>,
    /// Verdicts other than keep, for the loop to act on.
    unsettled: &'a mut Vec<(ConnKey, Verdict)>,
}

impl Visitor<'_, '_> {
    /// The one visit: gives the connection at `key` what it is `owed`,
    /// then does `duty`, and keeps its writable interest in step with its
    /// queue. Returns what the visit could not give of its items.
    fn visit(
        &mut self,
        key: ConnKey,
        owed: Option<Owed<'_>>,
        duty: Option<Duty<'_>>,
    ) -> Option<Left> {
        let conn = self.conns.get_mut(key.0)?;
        let (mut verdict, mut left) = (Verdict::Keep, None);
        if let Some(owed) = owed {
            match conn.deliver(key, owed, &mut self.ctx) {
                Ok(given) => verdict = given,
                Err(stopped) => left = Some(stopped),
            }
        }
        if let (Verdict::Keep, Some(duty)) = (&verdict, duty) {
            verdict = conn.owe(key, duty, self.scratch, &mut self.ctx);
        }
        if verdict != Verdict::Keep {
            self.unsettled.push((key, verdict));
            return None;
        }
        if !sync_interest(self.registry, key, conn) {
            self.unsettled
                .push((key, Verdict::Close(CloseReason::Abnormal)));
        }
        left
    }

    /// Closes (1013) the connections that resumed from a position this
    /// loop has not framed in the handshake timeout since (see
    /// [`Targeted::overdue`]).
    fn give_up_waits(&mut self, targeted: &mut Targeted, budget: &mut Budget) {
        let now = self.ctx.now;
        if targeted.next_overdue().is_none_or(|at| at > now) {
            return;
        }
        let current = self.ctx.history.current();
        for (slot, serial) in targeted.overdue(now) {
            let key = ConnKey(slot as usize);
            let conn = self.conns.get_mut(key.0);
            let Some(conn) = conn.filter(|c| c.serial() == serial) else {
                continue;
            };
            if conn.is_open() {
                log::info!(
                    "connection {key} resumed from a position this server has not reached \
                     (it is at {current}): closed with 1013 to try again"
                );
            }
            budget.visit();
            self.visit(key, None, Some(Duty::Ahead));
        }
    }

    /// One step of the walk over the recipients of targeted items,
    /// keeping `kept` visits of the budget back.
    fn walk(&mut self, targeted: &mut Targeted, stream: &Stream, budget: &mut Budget, kept: usize) {
        while !budget.spent(self.ctx.tally, kept) {
            let Some(turn) = targeted.next_turn() else {
                return;
            };
            budget.visit();
            let key = ConnKey(turn.slot as usize);
            let items = targeted.items(turn.items.clone());
            let Some(conn) = self
                .conns
                .get_mut(key.0)
                .filter(|c| c.serial() == turn.serial && c.walk_mark().is_marked())
            else {
                // Closed, or its slot taken by another since.
                hand_over(self.ctx.counters, items);
                continue;
            };
            let mark = conn.walk_mark();
            let up_to = match targeted.next_after() {
                Some(after) if targeted.waits_for_next(mark) => after,
                _ => {
                    conn.mark_walk(WalkMark::Unmarked);
                    stream.next_seq()
                }
            };
            let owed = Owed {
                batches: stream.batches(),
                items: targeted.items(turn.items.clone()),
                up_to,
            };
            let left = self.visit(key, Some(owed), None);
            let handed = left.as_ref().map_or(items.len(), |left| left.at);
            hand_over(self.ctx.counters, &items[..handed]);
            if let Some(left) = left {
                self.leave(key, targeted, turn, left);
            }
        }
    }

    /// Takes back what a visit left of a connection's items (the replay
    /// at `left.at`, from `left.from` on, and those after it): they wait
    /// for its queue to drain if it has output queued (its writable
    /// event brings them back), else for the next walk.
    fn leave(&mut self, key: ConnKey, targeted: &mut Targeted, turn: Turn, left: Left) {
        let items = targeted.items(turn.items);
        let mut rest = Vec::with_capacity(items.len() - left.at);
        let mut first = items[left.at].clone();
        if let Item::Replay { replay, .. } = &mut first.item {
            replay.from = left.from;
        }
        rest.push(first);
        rest.extend_from_slice(&items[left.at + 1..]);
        let Some(conn) = self.conns.get_mut(key.0).filter(|c| c.is_open()) else {
            hand_over(self.ctx.counters, &rest);
            return;
        };
        let park = match &rest[0].item {
            Item::Replay { replay, .. } if replay.ahead_of(self.ctx.history) => {
                Some(Until::Framed {
                    through: replay.through,
                    by: self.ctx.now + self.ctx.config.handshake_timeout,
                })
            }
            _ if conn.has_queued() => Some(Until::Drained),
            _ => None,
        };
        let mark = targeted.leave((turn.slot, turn.serial, conn.walk_mark()), rest, park);
        conn.mark_walk(mark);
    }

    /// A visit of a lap alone: the connection at `key` is given the
    /// stream's batches up to `up_to` if a pass is under way (`batches`)
    /// and it is owed some, and the closing sweep's `close`, if one is
    /// under way.
    #[inline]
    fn lap_visit(
        &mut self,
        key: ConnKey,
        (batches, up_to): (Option<Batches<'_>>, Seq),
        close: Option<Duty<'_>>,
        budget: &mut Budget,
    ) {
        let Some(conn) = self.conns.get_mut(key.0) else {
            return;
        };
        budget.visit();
        let owed = batches.filter(|_| owes_batches(conn, up_to));
        if owed.is_some() || close.is_some() {
            let owed = owed.map(|batches| Owed {
                batches,
                items: &[],
                up_to,
            });
            self.visit(key, owed, close);
        }
    }

    /// One step of the sweep over the keys below `bound`: the lap under
    /// way (the stream's pass, beginning one if a connection may be owed
    /// a batch, and the closing sweep) and the paced duties of
    /// `schedules`.
    fn sweep(
        &mut self,
        sweep: &mut Sweep,
        (stream, closing): (&mut Stream, &mut Option<Closing>),
        (bound, schedules): (usize, Schedules<'_>),
        budget: &mut Budget,
    ) {
        let Schedules {
            mut heartbeat,
            pings_due,
            mut pace,
        } = schedules;
        let now = self.ctx.now;
        let mut paced = Paced::default();
        let reach = |hb: &mut Heartbeat, paced: &mut Paced| {
            paced.ping_below = hb.reach(now, bound);
            paced.round_over = hb.pass_over(now);
        };
        let mut ping: Option<(SharedFrames, u16)> = None;
        if let Some(hb) = heartbeat.as_deref_mut().filter(|_| pings_due) {
            reach(hb, &mut paced);
            ping = Some((hb.ping().clone(), hb.close_after()));
        }
        if let Some(pace) = pace.as_deref() {
            paced.draining = Some(pace.until());
            paced.closes = pace.due(now);
        }
        if stream.begin_pass() {
            sweep.begin_lap();
        }
        let up_to = stream.next_seq();
        let mut cut = false;
        loop {
            if budget.spent(self.ctx.tally, 0) {
                cut = true;
                break;
            }
            let (key, lap) = match sweep.next(bound, &paced) {
                Next::Idle => break,
                Next::LapEnded => {
                    // Measured now: the pass's writes are done.
                    let done = Instant::now();
                    observe_delivered(self.ctx.counters, stream.end_pass(), done);
                    *closing = None;
                    if stream.begin_pass() {
                        sweep.begin_lap();
                    }
                    continue;
                }
                Next::Round => {
                    if let Some(hb) = heartbeat.as_deref_mut() {
                        hb.new_pass(now);
                        if ping.is_some() {
                            reach(hb, &mut paced);
                        }
                    }
                    continue;
                }
                Next::Lap(keys) => {
                    let close = closing.map(|Closing { why, reason }| Duty::Close { why, reason });
                    let owed = stream.in_pass().then(|| stream.batches());
                    let mut key = keys.start;
                    while key < keys.end && !budget.spent(self.ctx.tally, 0) {
                        self.lap_visit(ConnKey(key), (owed, up_to), close, budget);
                        key += 1;
                    }
                    sweep.lap_reached(key);
                    continue;
                }
                Next::Paced { key, lap } => (ConnKey(key), lap),
            };
            let Some(conn) = self.conns.get_mut(key.0) else {
                continue;
            };
            budget.visit();
            let owes = lap && stream.in_pass() && owes_batches(conn, up_to);
            let duty = match (closing.as_ref(), pace.as_deref_mut(), &ping) {
                (Some(&Closing { why, reason }), ..) if lap => Some(Duty::Close { why, reason }),
                (_, Some(pace), _) if paced.closes > 0 && conn.is_open() => {
                    paced.closes -= 1;
                    pace.closed_one();
                    Some(Duty::Drain { delay: pace.hint() })
                }
                (_, _, Some((ping, close_after))) if key.0 < paced.ping_below => Some(Duty::Ping {
                    ping,
                    close_after: *close_after,
                }),
                _ => None,
            };
            if owes || duty.is_some() {
                let owed = owes.then(|| Owed {
                    batches: stream.batches(),
                    items: &[],
                    up_to,
                });
                self.visit(key, owed, duty);
            }
        }
        if let Some(hb) = heartbeat.filter(|_| pings_due) {
            // Stopped short of the pings due by the budget: still due.
            let short = cut && paced.draining.is_none() && sweep.cursor() < paced.ping_below;
            hb.swept(now, !short);
        }
    }
}

/// Counts the delivery latency of `batches`, which every connection has
/// now (written, or queued where a socket could not take them whole):
/// one observation per batch, of its messages' weight, from its input,
/// for each transport that has connections open.
fn observe_delivered(counters: &Counters, batches: &[SharedFrames], now: Instant) {
    let metrics = &counters.metrics;
    let open = metrics.connections_open.load(Ordering::Relaxed);
    let streams = metrics.connections_event_stream.load(Ordering::Relaxed);
    let mut transports = 0;
    if open > streams {
        transports |= transport_bit(Transport::WebSocket);
    }
    if streams > 0 {
        transports |= transport_bit(Transport::EventStream);
    }
    for batch in batches {
        observe(counters, batch, transports, now);
    }
}

/// Counts the delivery latency of `batch`, which its recipients of
/// `transports` (bits, see [`transport_bit`]) have now: one observation,
/// of its messages' weight, from its input, for each.
fn observe(counters: &Counters, batch: &SharedFrames, transports: u8, now: Instant) {
    let Some(input) = batch.input_time() else {
        return;
    };
    let ns = now.saturating_duration_since(input).as_nanos() as u64;
    let weight = batch.count() as u64;
    if transports & transport_bit(Transport::WebSocket) != 0 {
        counters.websocket_latency.observe(ns, weight);
    }
    if transports & transport_bit(Transport::EventStream) != 0 {
        counters.event_stream_latency.observe(ns, weight);
    }
}

/// `items`' recipient has them, or is gone: a batch of messages handed
/// to its last recipient has its delivery latency counted.
fn hand_over(counters: &Counters, items: &[Addressed]) {
    for addressed in items {
        if let Item::Frames { frames, .. } = &addressed.item {
            if let Some(transports) = frames.handed() {
                observe(counters, frames, transports, Instant::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::metrics::{
        Metrics, EVENT_STREAM_LATENCY_AT, LATENCY_BUCKETS_US, WEBSOCKET_LATENCY_AT,
    };
    use crate::protocol::ws::OpCode;
    use crate::server::frames::ToFrame;
    use std::time::Duration;

    /// A latency histogram's count and sum (ns).
    fn count_and_sum(counters: &Counters, at: usize) -> (u64, u64) {
        let words = counters.words(&counters.metrics.snapshot());
        let count = at + LATENCY_BUCKETS_US.len();
        (words[count], words[count + 1])
    }

    #[test]
    fn a_delivered_batch_is_one_observation_weighted_by_its_messages_for_each_transport_open() {
        let counters = Counters::default();
        let now = Instant::now();
        let batch = |messages: usize, ago: u64| {
            let message = ToFrame {
                opcode: OpCode::Text,
                payload: b"x",
                deflated: None,
                position: None,
            };
            SharedFrames::encode_batch(std::iter::repeat_n(message, messages))
                .input_at(now - Duration::from_millis(ago))
        };
        Metrics::add(&counters.metrics.connections_open, 5);
        let own = SharedFrames::encode(OpCode::Text, b"not input");
        observe_delivered(&counters, &[batch(3, 2), batch(2, 40), own], now);
        assert_eq!(
            count_and_sum(&counters, WEBSOCKET_LATENCY_AT),
            (5, 3 * 2_000_000 + 2 * 40_000_000)
        );
        assert_eq!(count_and_sum(&counters, EVENT_STREAM_LATENCY_AT), (0, 0));
        // Every connection open an event stream: those alone.
        Metrics::add(&counters.metrics.connections_event_stream, 5);
        observe_delivered(&counters, &[batch(1, 1)], now);
        assert_eq!(count_and_sum(&counters, WEBSOCKET_LATENCY_AT).0, 5);
        assert_eq!(
            count_and_sum(&counters, EVENT_STREAM_LATENCY_AT),
            (1, 1_000_000)
        );
    }
}

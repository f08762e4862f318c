//! Delivery: the one way anything queued for connections reaches them.
//!
//! Two walks carry it, both in key order, both resumable, sharing one
//! budget per loop iteration ([`Config::fanout_budget`] visits and
//! [`SLICE_BYTES`] handed to sockets), after which the loop polls and
//! serves accepts, reads, pongs and timers before the next slice:
//!
//! - the walk over the recipients of targeted items (messages for a
//!   channel, an id or a connection, and closes: see `owed::targeted`);
//! - the pass over every connection, for the broadcast stream (see
//!   `owed::stream`), which leaves a connection with targeted items waiting to
//!   the first walk, so that it gets everything in order.
//!
//! Each visit hands a connection what it is owed ([`Owed`]) through one
//! function, [`Conn::deliver`], which writes it in order with one
//! `writev` and answers with one [`Verdict`]: what a walk's visit could
//! not give (the `Err` of [`Visited`]) the walk takes back; the other
//! verdicts but keep are acted on in one place, the loop's `settle`, once
//! the slice is over.

pub(crate) mod directory;

use mio::Registry;
use slab::Slab;

use crate::config::Config;
use crate::ops::metrics::Tally;
use crate::server::admit::connections::sync_interest;
use crate::server::conn::{CloseReason, Conn, Ctx, Verdict, Visited};
use crate::server::key::ConnKey;
use crate::server::owed::stream::Stream;
use crate::server::owed::targeted::{Targeted, Turn, Until, WalkMark};
use crate::server::owed::{Addressed, Item, Owed, Unfinished};

/// Bytes one slice hands to sockets (or queues), at most, before the loop
/// serves other events again (besides [`Config::fanout_budget`] visits).
const SLICE_BYTES: usize = 8 << 20;

/// What one slice may still do.
#[derive(Debug, Clone, Copy)]
struct Budget {
    visits: usize,
    /// The tally's bytes written and queued when the slice began.
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

    /// The slice has done its share.
    fn spent(&self, tally: &Tally) -> bool {
        self.visits == 0 || handed(tally) - self.bytes_from >= SLICE_BYTES as i64
    }
}

/// Bytes handed to sockets so far: written, or queued.
fn handed(tally: &Tally) -> i64 {
    tally.bytes_written as i64 + tally.queued_bytes
}

/// The connections and what a visit needs, borrowed from the loop.
struct Visitor<'a, 'c> {
    conns: &'a mut Slab<Conn>,
    registry: &'a Registry,
    ctx: Ctx<'c>,
    /// Verdicts other than keep, for the loop to act on.
    unsettled: &'a mut Vec<(ConnKey, Verdict)>,
}

impl Visitor<'_, '_> {
    /// Gives the connection at `key` what it is owed, and keeps its
    /// writable interest in step with its queue. Returns what the visit
    /// left of its items, if it could not give them all.
    fn visit(&mut self, key: ConnKey, owed: Owed<'_>) -> Option<Box<Unfinished>> {
        let conn = self.conns.get_mut(key.0)?;
        let visited: Visited = conn.deliver(key, owed, &mut self.ctx);
        let left = match visited {
            Ok(Verdict::Keep) => None,
            Err(left) => Some(left),
            Ok(verdict) => {
                self.unsettled.push((key, verdict));
                return None;
            }
        };
        if !sync_interest(self.registry, key, conn) {
            self.unsettled
                .push((key, Verdict::Close(CloseReason::Abnormal)));
        }
        left
    }

    /// One slice of the walk over the recipients of targeted items.
    fn walk(&mut self, targeted: &mut Targeted, stream: &Stream, budget: &mut Budget) {
        while !budget.spent(self.ctx.tally) {
            let Some(turn) = targeted.next_turn() else {
                return;
            };
            budget.visit();
            let key = ConnKey(turn.slot as usize);
            let Some(conn) = self.conns.get_mut(key.0) else {
                continue;
            };
            let mark = conn.walk_mark();
            if conn.serial() != turn.serial || !mark.is_marked() {
                continue; // Closed, or its slot taken by another since.
            }
            let up_to = match targeted.next_after() {
                Some(after) if targeted.waits_for_next(mark) => after,
                _ => {
                    conn.mark_walk(WalkMark::Unmarked);
                    stream.next_seq()
                }
            };
            let items = targeted.items(turn.items.clone());
            let owed = Owed {
                stream,
                items,
                up_to,
            };
            if let Some(left) = self.visit(key, owed) {
                self.leave(key, targeted, turn, *left);
            }
        }
    }

    /// Takes back what a visit left of a connection's items: they wait
    /// for its queue to drain if it has output queued (its writable
    /// event brings them back), else for the next walk.
    fn leave(&mut self, key: ConnKey, targeted: &mut Targeted, turn: Turn, left: Unfinished) {
        let items = targeted.items(turn.items);
        let mut rest = Vec::with_capacity(items.len() - left.at);
        rest.push(Addressed {
            item: left.item,
            ..items[left.at].clone()
        });
        rest.extend_from_slice(&items[left.at + 1..]);
        let Some(conn) = self.conns.get_mut(key.0).filter(|c| c.is_open()) else {
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

    /// One slice of the pass over every connection (starting one if a
    /// connection may be owed a batch).
    fn pass(&mut self, stream: &mut Stream, key_bound: usize, budget: &mut Budget) {
        let Some(pass) = stream.begin_pass() else {
            return;
        };
        let up_to = stream.next_seq();
        let mut key = pass.cursor;
        while key < key_bound && !budget.spent(self.ctx.tally) {
            let this = ConnKey(key);
            key += 1;
            let Some(conn) = self.conns.get_mut(this.0) else {
                continue;
            };
            budget.visit();
            let owed = conn.next_batch().filter(|&next| next != up_to);
            if owed.is_none() || conn.walk_mark().is_marked() {
                continue; // Up to date, not open, or the walk's.
            }
            self.visit(
                this,
                Owed {
                    stream,
                    items: &[],
                    up_to,
                },
            );
        }
        stream.advance(key);
        if key >= key_bound {
            stream.end_pass();
        }
    }
}

/// The deliveries under way: the broadcast stream with its pass, the
/// targeted items with their walk, and the verdicts a slice leaves.
#[derive(Debug, Default)]
pub(super) struct Delivery {
    /// The broadcast batches, and the pass carrying them to the connections.
    pub(super) stream: Stream,
    /// Messages and closes for some connections, on their way.
    pub(super) targeted: Targeted,
    /// Reused for the verdicts a delivery slice leaves to act on.
    unsettled: Vec<(ConnKey, Verdict)>,
}

impl Delivery {
    /// Whether some delivery is under way or may be owed.
    pub(super) fn delivering(&self) -> bool {
        self.stream.is_busy() || !self.targeted.is_idle()
    }

    /// Carries every delivery one slice further under one budget, visiting
    /// `conns` below `key_bound` with `ctx`: the walk over targeted items
    /// first, then the pass; then drops the batches no connection needs
    /// any more. Returns the verdicts other than keep, for the loop to act
    /// on (give the list back with [`Delivery::settled`]).
    pub(super) fn slice(
        &mut self,
        (conns, key_bound): (&mut Slab<Conn>, usize),
        registry: &Registry,
        ctx: Ctx<'_>,
    ) -> Vec<(ConnKey, Verdict)> {
        let mut unsettled = std::mem::take(&mut self.unsettled);
        let mut visitor = Visitor {
            conns,
            registry,
            ctx,
            unsettled: &mut unsettled,
        };
        let mut budget = Budget::new(visitor.ctx.config, visitor.ctx.tally);
        visitor.walk(&mut self.targeted, &self.stream, &mut budget);
        visitor.pass(&mut self.stream, key_bound, &mut budget);
        self.targeted.settle_floor();
        self.stream.trim(self.targeted.floor());
        unsettled
    }

    /// Takes back the emptied list [`Delivery::slice`] gave.
    pub(super) fn settled(&mut self, unsettled: Vec<(ConnKey, Verdict)>) {
        self.unsettled = unsettled;
    }
}

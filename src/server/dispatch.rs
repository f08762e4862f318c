//! Running connection handlers on the loop's parts and acting on their
//! verdicts. [`Handling`] is the one place a handler's [`Ctx`] is made,
//! by borrowing the parts apart; every event that reaches a connection
//! (readiness, an accept, a deadline, an endpoint, a step of the walk)
//! runs its handler with it, and the verdict goes to `settle`, the one
//! place verdicts are acted on. Every duty toward the connections that
//! is not an event of their own (what they are owed, a ping, a drain's, a
//! shutdown's and an `ahead` close) is done on the one walk (see `walk`).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mio::Registry;
use slab::Slab;

use crate::ops::metrics::Metrics;
use crate::protocol::http::{Endpoint, Method};
use crate::server::admit::connections::sync_interest;
use crate::server::admit::{self, Accepted, ACCEPTS_PER_WAKE};
use crate::server::conn::{CloseReason, Conn, Ctx, Verdict};
use crate::server::endpoints;
use crate::server::handle::HAND_OVER;
use crate::server::key::ConnKey;
use crate::server::lifecycle::drain::Pace;
use crate::server::lifecycle::{Ending, Lifecycle};
use crate::server::net::sockets::{Door, Ready};
use crate::server::time::heartbeat::Heartbeat;
use crate::server::walk::directory::Directory;
use crate::server::walk::{Closing, Schedules, Walk};
use crate::server::Server;

/// The parts of a server a connection handler (or a step of the walk)
/// works with, borrowed apart.
pub(super) struct Handling<'a> {
    conns: &'a mut Slab<Conn>,
    registry: &'a Registry,
    scratch: &'a mut [u8],
    pub(super) ctx: Ctx<'a>,
    walk: &'a mut Walk,
    heartbeat: &'a mut Heartbeat,
    lifecycle: &'a mut Lifecycle,
}

impl Server {
    /// Borrows the loop's parts apart so a connection can be handled while
    /// the slab, registry and pool are all in use: the one place a [`Ctx`]
    /// is made.
    pub(super) fn handling(&mut self, now: Instant) -> Handling<'_> {
        let Server {
            config,
            sockets,
            conns,
            buffers,
            records,
            walk,
            clock,
            report,
            lifecycle,
            ..
        } = self;
        Handling {
            conns: &mut conns.slab,
            registry: sockets.registry(),
            scratch: &mut buffers.scratch,
            ctx: Ctx {
                config,
                pool: &mut buffers.pool,
                timers: &mut clock.timers,
                counters: &report.shared.counters,
                tally: &mut report.tally,
                replies: &mut buffers.replies,
                routes: &mut records.routes,
                upstream: conns.upstream.as_mut(),
                deflate: &mut buffers.deflate,
                gathered: &mut buffers.gathered,
                aside: &mut buffers.aside,
                now,
                next_batch: walk.stream.next_seq(),
                history: &records.history,
            },
            walk,
            heartbeat: &mut clock.heartbeat,
            lifecycle,
        }
    }

    pub(super) fn on_conn_event(&mut self, key: ConnKey, ready: Ready, now: Instant) {
        let handling = self.handling(now);
        let mut ctx = handling.ctx;
        let Some(conn) = handling.conns.get_mut(key.0) else {
            return; // A spurious event for a connection already closed.
        };
        let mut verdict = Verdict::Keep;
        if ready.write {
            verdict = conn.on_writable(key, handling.scratch, &mut ctx);
        }
        if ready.read && verdict == Verdict::Keep {
            verdict = conn.on_readable(key, ready.edge, handling.scratch, &mut ctx);
        }
        self.settle(key, verdict);
    }

    /// Acts on a handler's verdict: close, schedule another read, and keep
    /// the writable interest in step with the output queue.
    pub(super) fn settle(&mut self, key: ConnKey, verdict: Verdict) {
        match verdict {
            Verdict::Replay(replay) => {
                let mut dir = Directory::new(
                    &mut self.walk,
                    &mut self.conns.slab,
                    &mut self.records.routes,
                    self.config.instance,
                    &self.report.shared.counters.metrics,
                );
                dir.address_replay(key, *replay);
                self.conns.read_again(key);
            }
            Verdict::Close(reason) => return self.close(key, reason),
            Verdict::Serve(endpoint, method) => {
                let answered = self.serve(key, endpoint, method);
                return self.settle(key, answered);
            }
            Verdict::ReadAgain => self.conns.read_again(key),
            Verdict::AwaitUpstream => self.conns.await_upstream(key),
            Verdict::Keep => {}
        }
        let registry = self.sockets.registry();
        let targeted = &mut self.walk.targeted;
        if let Some(conn) = self.conns.slab.get_mut(key.0) {
            if !sync_interest(registry, key, conn) {
                return self.close(key, CloseReason::Abnormal);
            }
            if targeted.has_parked() && !conn.has_queued() {
                // Its queue drained: its replay goes on.
                if let Some(mark) = targeted.unpark(key.slot(), conn.serial()) {
                    conn.mark_walk(mark);
                }
            }
        }
    }

    fn close(&mut self, key: ConnKey, reason: CloseReason) {
        let Some(conn) = self.conns.remove(key) else {
            return;
        };
        self.walk.targeted.forget(key.slot());
        let mut ctx = self.handling(Instant::now()).ctx;
        conn.close(key, reason, &mut ctx);
    }

    /// Drops every connection left, each counted for the close it was in
    /// (a drain's, a publisher's...), or for `reason` if it was in none.
    pub(super) fn close_all(&mut self, reason: CloseReason) {
        let left: Vec<(usize, CloseReason)> = (self.conns.slab.iter())
            .map(|(key, conn)| (key, conn.closing_reason().unwrap_or(reason)))
            .collect();
        for (key, reason) in left {
            self.close(ConnKey(key), reason);
        }
    }

    pub(super) fn retry_reads(&mut self, now: Instant) {
        let mut keys = self.conns.take_reads();
        for key in keys.drain(..) {
            self.on_conn_event(key, Ready::RETRY_READ, now);
        }
        self.conns.reads_done(keys);
    }

    /// Stops accepting and starts closing every connection left (with
    /// 1001 for a shutdown, 1012 at the end of a drain) on a lap of the
    /// walk; gives up on them the shutdown timeout after the request was
    /// seen (or from now).
    pub(super) fn close_everything(&mut self, now: Instant, ending: Ending) {
        let timeout = self.config.shutdown_timeout;
        if !self.lifecycle.begin_closing(now, timeout) {
            return;
        }
        let open = self.conns.len();
        if open > 0 || ending == Ending::Shutdown {
            log::info!("shutting down: closing {open} connections");
        }
        Metrics::set(&self.report.shared.counters.metrics.drain_left, 0);
        self.sockets.close(Door::Main);
        self.sockets.close(Door::Metrics);
        let closing = match ending {
            Ending::Shutdown => Closing {
                why: "server shutting down",
                reason: CloseReason::Shutdown,
            },
            Ending::Drain => Closing {
                why: "service restart",
                reason: CloseReason::Drain,
            },
        };
        self.walk.begin_closing(closing);
    }

    /// Carries a drain one step on (see [`Handle::drain`](crate::server::Handle::drain)):
    /// announces it when a handle asked, stops accepting at the end of the
    /// grace and sets the pace (the walk's cursor makes its closes, in one
    /// round), and ends it once every connection that was open has been
    /// closed, or the round is over.
    pub(super) fn drain(&mut self, now: Instant) {
        let metrics = &self.report.shared.counters.metrics;
        let over = self.config.drain_time;
        let asked = self.report.shared.drain_asked.load(Ordering::Acquire);
        let grace = match asked {
            HAND_OVER => Duration::ZERO,
            _ => self.config.drain_grace,
        };
        if asked != 0 && self.lifecycle.begin_announcing(now, grace) {
            Metrics::set(&metrics.draining, 1);
            if asked == HAND_OVER {
                log::info!(
                    "handing over: the listeners close; closing the connections over {over:?}"
                );
                self.sockets.close(Door::Metrics);
            } else {
                log::info!(
                    "draining: /healthz answers 503; accepting for {grace:?} more, then closing the connections over {over:?}"
                );
            }
        }
        let travelled = self.walk.travelled();
        if self.lifecycle.announced(now) {
            self.sockets.close(Door::Main);
            let total = self.conns.len();
            let per_second = total as f64 / over.as_secs_f64();
            log::info!(
                "draining: accepting stopped; closing {total} connections over {over:?} ({per_second:.0} a second)"
            );
            let seed = RandomState::new().build_hasher().finish();
            let round = travelled + self.conns.key_bound() as u64;
            self.lifecycle
                .begin_pacing(Pace::new(now, over, (total, round), seed));
        }
        let Some(pace) = self.lifecycle.pace() else {
            return;
        };
        Metrics::set(&metrics.drain_left, pace.left() as u64);
        if pace.next_at(now).is_none() || travelled >= pace.until() {
            log::info!("draining: every connection was asked to close");
            self.close_everything(now, Ending::Drain);
        }
    }

    /// Accepts at `door` until the backlog is empty, the per-wake cap is
    /// reached, or file descriptors run out (then pauses instead of
    /// spinning); each connection is read at once.
    pub(super) fn accept(&mut self, door: Door, now: Instant) {
        if !self.lifecycle.begin_accepting(door) {
            return;
        }
        for _ in 0..ACCEPTS_PER_WAKE {
            let metrics = &self.report.shared.counters.metrics;
            let scratch = &mut self.buffers.scratch;
            match admit::accept_one(
                door,
                &self.sockets,
                &mut self.conns,
                scratch,
                &self.config,
                metrics,
            ) {
                Accepted::Admitted(key) => {
                    self.clock.heartbeat.accepted();
                    // A supervisor steers new connections away from a
                    // server this one filled as soon as it can. One at
                    // its very limit leaves its group before the client
                    // hears back, so that the next try goes elsewhere.
                    self.keep_room();
                    if self.conns.len() >= self.config.max_connections {
                        self.keep_group(now);
                    }
                    self.on_accepted(key, now)
                }
                Accepted::Refused => {}
                Accepted::Empty => return,
                Accepted::Exhausted(e) => {
                    let open = self.conns.len();
                    return self.lifecycle.pause_accepting(&e, now, open, metrics);
                }
            }
        }
        self.lifecycle.accept_again(door);
    }

    /// The request arrived with the connection (the listener defers
    /// accepting until it has): reading now saves a trip through the poll.
    fn on_accepted(&mut self, key: ConnKey, now: Instant) {
        let handling = self.handling(now);
        let mut ctx = handling.ctx;
        let verdict = handling.conns[key.0].on_accepted(key, handling.scratch, &mut ctx);
        self.settle(key, verdict);
    }

    /// Accepts again where connections were left, once a pause is over.
    pub(super) fn resume_accepting(&mut self, now: Instant) {
        let again = self.lifecycle.resume_accepting(now);
        for door in [Door::Main, Door::Metrics] {
            if again[door as usize] {
                self.accept(door, now);
            }
        }
    }

    /// Answers `endpoint` on connection `key` (see `endpoints`), its head
    /// alone if `method` asks.
    fn serve(&mut self, key: ConnKey, endpoint: Endpoint, method: Method) -> Verdict {
        if endpoint == Endpoint::Metrics {
            // Include what this loop iteration has gathered so far.
            self.publish_metrics(Instant::now());
        }
        let mut page = std::mem::take(&mut self.report.page);
        let answer = endpoints::answer(
            endpoint,
            (&self.report.shared, self.report.host.as_ref()),
            self.config.degraded,
            &mut page,
        );
        let handling = self.handling(Instant::now());
        let mut ctx = handling.ctx;
        let verdict = match handling.conns.get_mut(key.0) {
            Some(conn) => {
                let body = (answer.body, method);
                conn.respond(key, answer.status, answer.content_type, body, &mut ctx)
            }
            None => Verdict::Keep,
        };
        self.report.page = page;
        verdict
    }

    pub(super) fn expire_deadlines(&mut self, now: Instant) {
        let mut due = self.clock.due_deadlines(now);
        for (key, tick) in due.drain(..) {
            let handling = self.handling(now);
            let mut ctx = handling.ctx;
            let conn = handling.conns.get_mut(key.0);
            let Some(conn) = conn.filter(|conn| conn.is_due(tick)) else {
                continue; // Stale: re-armed, cleared, or the slot was reused.
            };
            let verdict = conn.on_deadline(key, &mut ctx);
            self.settle(key, verdict);
        }
        self.clock.deadlines_done(due);
    }

    /// Carries the walk one step further (see `walk`), with the
    /// heartbeat's slice if it is due and a drain's pace, then acts on the
    /// verdicts; nothing, when the walk has nothing to do.
    pub(super) fn walk_step(&mut self, now: Instant) {
        let sweeping = self.sweeping();
        let busy = self.walk.stream.is_busy();
        let pings_due = self.clock.pings_due(now, sweeping, busy);
        if !self
            .walk
            .has_work(now, pings_due || self.lifecycle.is_pacing())
        {
            return;
        }
        let key_bound = self.conns.key_bound();
        let handling = self.handling(now);
        let schedules = Schedules {
            heartbeat: sweeping.then_some(handling.heartbeat),
            pings_due,
            pace: handling.lifecycle.pace(),
        };
        let parts = (handling.registry, handling.scratch);
        let conns = (handling.conns, key_bound);
        let mut unsettled = handling.walk.step(conns, parts, handling.ctx, schedules);
        for (key, verdict) in unsettled.drain(..) {
            self.settle(key, verdict);
        }
        self.walk.settled(unsettled);
    }
}

//! A connection moving to another process (a handover): taken apart into
//! its state (`protocol::handover::Moved`) and its socket, and put together
//! again on the other side, where it goes on as if nothing happened. It
//! is neither closed nor opened: no close is counted, no upstream event
//! is written, and its key stays the same.

use mio::net::TcpStream;

use super::wire::{Outgoing, Wire};
use super::{Conn, Ctx, Flags, Phase, Verdict};
use crate::ops::metrics::Metrics;
use crate::protocol::handover::Moved;
use crate::protocol::names::ChannelNameRef;
use crate::protocol::target::RequestTarget;
use crate::protocol::ws::Decoder;
use crate::server::key::ConnKey;
use crate::server::owed::WalkMark;
use crate::server::time::heartbeat::Liveness;
use crate::server::time::unix_now;

impl Conn {
    /// Whether it can move: open, with nothing waiting for the walk.
    pub fn movable(&self) -> bool {
        self.is_open() && self.walk_mark() == WalkMark::Unmarked
    }

    /// Takes it apart: its state, given every message up to `through`
    /// (what it holds aside in it), and its socket. It leaves the routes
    /// and its gauges; nothing is counted closed.
    pub fn move_out(mut self, key: ConnKey, through: u64, ctx: &mut Ctx<'_>) -> (Moved, TcpStream) {
        let Phase::Open(decoder) = self.phase else {
            unreachable!("bug: only open connections move");
        };
        let slot = key.slot();
        let channels = ctx.routes.channels_of(slot).map(str::to_owned).collect();
        ctx.routes.leave(slot, self.target.id());
        let closes_at_ms = match self.deadline.at(ctx.timers) {
            Some(at) => {
                let left = at.saturating_duration_since(ctx.now);
                (unix_now() + left).as_millis() as u64
            }
            None => 0,
        };
        self.deadline.clear(ctx.timers);
        let mut queued = Vec::new();
        let mut queue = self.take_queue(key, ctx);
        let before = queue.queued_bytes();
        let _ = queue.flush(&mut queued);
        ctx.tally.wrote(0, before, 0);
        let mut aside = |flag, table: &mut super::aside::ByKey<_>| {
            if !self.flags.take(flag) {
                return Vec::new();
            }
            table
                .remove(&key)
                .map_or_else(Vec::new, |buf: Box<Vec<u8>>| {
                    let bytes = buf.to_vec();
                    ctx.pool.give_back(buf);
                    bytes
                })
        };
        let held = aside(Flags::HOLDING, &mut ctx.aside.held);
        let assembling = aside(Flags::ASSEMBLING, &mut ctx.aside.messages);
        Metrics::decr(&ctx.counters.metrics.connections_open);
        self.wire.moved_out(&ctx.counters.metrics);
        let moved = Moved {
            slot,
            serial: self.serial,
            wire: self.wire.code(),
            positions: self.flags.has(Flags::POSITIONS),
            liveness: self.liveness.to_bits(),
            closes_at_ms,
            given: through,
            decoder: decoder.to_bytes(),
            target: self.target.as_str().to_owned(),
            channels,
            held,
            assembling,
            queued,
        };
        (moved, self.stream)
    }

    /// Puts a moved connection together on `stream` under `key` (its
    /// slot): in the routes, on its gauges, its token's close armed and
    /// what it had queued sent on. Fails for a state this build cannot
    /// hold (a channel name or a decoder it does not know).
    pub fn move_in(
        moved: &Moved,
        stream: TcpStream,
        key: ConnKey,
        ctx: &mut Ctx<'_>,
    ) -> Result<(Conn, Verdict), &'static str> {
        let decoder = Decoder::from_bytes(&moved.decoder).ok_or("a decoder state unknown here")?;
        let wire = Wire::from_code(moved.wire).ok_or("a wire unknown here")?;
        let channels = moved
            .channels
            .iter()
            .map(|name| ChannelNameRef::new(name).map_err(|_| "a channel name not valid here"))
            .collect::<Result<Vec<_>, _>>()?;
        let mut conn = Conn {
            stream,
            phase: Phase::Open(decoder),
            next_batch: ctx.next_batch,
            deadline: Default::default(),
            flags: Flags::default(),
            liveness: Liveness::from_bits(moved.liveness),
            wire,
            serial: moved.serial,
            target: RequestTarget::kept(&moved.target, None),
        };
        conn.flags.set(Flags::POSITIONS, moved.positions);
        let slot = key.slot();
        ctx.routes.join(slot, conn.target.id());
        for &channel in &channels {
            if ctx.routes.subscribe(slot, channel).is_err() {
                ctx.routes.leave(slot, conn.target.id());
                return Err("more channels than --max-channels allows here");
            }
        }
        let mut aside = |bytes: &[u8], flag, table: &mut super::aside::ByKey<_>| {
            if !bytes.is_empty() {
                let mut buf = ctx.pool.lend();
                buf.extend_from_slice(bytes);
                conn.flags.set(flag, true);
                table.insert(key, buf);
            }
        };
        aside(&moved.held, Flags::HOLDING, &mut ctx.aside.held);
        aside(
            &moved.assembling,
            Flags::ASSEMBLING,
            &mut ctx.aside.messages,
        );
        if moved.closes_at_ms != 0 {
            let left =
                std::time::Duration::from_millis(moved.closes_at_ms).saturating_sub(unix_now());
            conn.arm_within(key, left, ctx);
        }
        Metrics::incr(&ctx.counters.metrics.connections_open);
        conn.wire.moved_in(&ctx.counters.metrics);
        let verdict = match moved.queued.is_empty() {
            true => Verdict::Keep,
            false => Verdict::after(conn.send(key, Outgoing::Response(&moved.queued, &[]), ctx)),
        };
        Ok((conn, verdict))
    }
}

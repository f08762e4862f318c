//! Addressing the commands for some connections: a channel's
//! subscribers, a client id's connections, one connection (found through
//! the routes), and the replays connections asked for. Each recipient is
//! given an item "after stream batch N, this" and marked as waiting for
//! the walk (see `targeted`); subscription changes are made here too.

use std::sync::Arc;

use slab::Slab;

use crate::ops::metrics::Metrics;
use crate::protocol::commands::Recipients;
use crate::protocol::names::{ChannelName, ClientId};
use crate::protocol::ws::CloseCode;
use crate::server::conn::Conn;
use crate::server::frames::{transport_bit, SharedFrames};
use crate::server::history::Replay;
use crate::server::key::ConnKey;
use crate::server::owed::Item;
use crate::server::routes::{Routes, Slot};
use crate::server::walk::stream::Stream;
use crate::server::walk::targeted::Targeted;
use crate::server::walk::Walk;

/// What addressing a command goes by: the targeted items, the stream's
/// batch numbers, the connections, the routes, this instance's number
/// and the counters.
pub(crate) struct Directory<'a> {
    pub(crate) targeted: &'a mut Targeted,
    pub(crate) stream: &'a mut Stream,
    pub(crate) conns: &'a mut Slab<Conn>,
    pub(crate) routes: &'a mut Routes,
    pub(crate) instance: u32,
    pub(crate) metrics: &'a Metrics,
}

impl<'a> Directory<'a> {
    /// The directory over the walk's items and stream, `conns` and
    /// `routes`, for instance `instance`.
    pub(crate) fn new(
        walk: &'a mut Walk,
        conns: &'a mut Slab<Conn>,
        routes: &'a mut Routes,
        instance: u32,
        metrics: &'a Metrics,
    ) -> Directory<'a> {
        Directory {
            targeted: &mut walk.targeted,
            stream: &mut walk.stream,
            conns,
            routes,
            instance,
            metrics,
        }
    }

    /// Addresses a batch of messages to `to`'s open connections now.
    pub(crate) fn address_frames(&mut self, to: &Recipients, frames: SharedFrames) {
        let after = self.stream.next_seq();
        let awaited = frames.clone();
        let (recipients, transports) = self.address(to, || Item::Frames {
            after,
            frames: frames.clone(),
        });
        awaited.await_recipients(recipients, transports);
    }

    /// Addresses a close to `whom`'s open connections now.
    pub(crate) fn address_close(&mut self, whom: &Recipients, code: CloseCode, reason: &str) {
        let after = self.stream.next_seq();
        let reason: Arc<str> = reason.into();
        self.address(whom, || Item::Close {
            after,
            code,
            reason: Arc::clone(&reason),
        });
    }

    /// Addresses the `replay` the connection at `key` asked for as it
    /// upgraded, before anything live: at the batch it starts at.
    pub(crate) fn address_replay(&mut self, key: ConnKey, replay: Replay) {
        let stream = &*self.stream;
        let Some(conn) = self.conns.get_mut(key.0) else {
            return;
        };
        let Some(after) = conn.next_batch() else {
            return;
        };
        let recipient = (key.slot(), conn.serial(), conn.walk_mark());
        let item = Item::Replay { after, replay };
        let earlier = |a, b| stream.earlier(a, b);
        let mark = self.targeted.push(recipient, after, item, earlier);
        conn.mark_walk(mark);
    }

    /// Releases the replays that waited for the loop to frame up to
    /// `framed`, if any wait: the connections are marked for the next walk.
    pub(crate) fn release_framed_through(&mut self, framed: u64) {
        if !self.targeted.has_parked() {
            return;
        }
        for (slot, serial, mark) in self.targeted.framed(framed) {
            if let Some(conn) = self
                .conns
                .get_mut(slot as usize)
                .filter(|c| c.serial() == serial)
            {
                conn.mark_walk(mark);
            }
        }
    }

    /// Gives each of `to`'s open connections an item, and marks it as
    /// waiting for the next walk. Returns how many it gave one, and their
    /// transports (bits, see [`transport_bit`]).
    fn address(&mut self, to: &Recipients, item: impl Fn() -> Item) -> (u32, u8) {
        let (mut given, mut transports) = (0, 0);
        self.find_recipients(to);
        let recipients = std::mem::take(&mut self.targeted.recipients);
        let stream = &*self.stream;
        for &slot in &recipients {
            let key = ConnKey(slot as usize);
            let Some(conn) = self.conns.get_mut(key.0) else {
                continue;
            };
            let Some(cursor) = conn.next_batch() else {
                continue;
            };
            let recipient = (slot, conn.serial(), conn.walk_mark());
            let earlier = |a, b| stream.earlier(a, b);
            let mark = self.targeted.push(recipient, cursor, item(), earlier);
            conn.mark_walk(mark);
            given += 1;
            transports |= transport_bit(conn.transport());
        }
        self.targeted.recipients = recipients;
        (given, transports)
    }

    /// Subscribes (or unsubscribes) client `id`'s open connections.
    pub(crate) fn change_subscription(
        &mut self,
        on: bool,
        id: &ClientId,
        channels: &[ChannelName],
    ) {
        self.find_recipients(&Recipients::Id(id.clone()));
        let metrics = self.metrics;
        for &slot in &self.targeted.recipients {
            for channel in channels {
                if !on {
                    self.routes.unsubscribe(slot, channel.borrowed());
                } else if self.routes.subscribe(slot, channel.borrowed()).is_err() {
                    Metrics::incr(&metrics.subscriptions_refused);
                    log::warn!("subscription of {id} to {channel} refused: at the channel limit");
                }
            }
        }
    }

    /// Puts the open connections `to` names into `targeted.recipients`,
    /// each once; counts a command that names none.
    fn find_recipients(&mut self, to: &Recipients) {
        let recipients = &mut self.targeted.recipients;
        recipients.clear();
        let conns = &*self.conns;
        let open = |slot: &Slot| conns.get(*slot as usize).is_some_and(|c| c.is_open());
        match to {
            Recipients::All => {
                recipients.extend(
                    conns
                        .iter()
                        .filter(|(_, c)| c.is_open())
                        .map(|(k, _)| k as Slot),
                );
            }
            Recipients::Channels(channels) => {
                for channel in channels {
                    recipients.extend(
                        self.routes
                            .subscribers(channel.borrowed())
                            .iter()
                            .filter(|s| open(s)),
                    );
                }
                if channels.len() > 1 {
                    recipients.sort_unstable();
                    recipients.dedup();
                }
            }
            Recipients::Id(id) => {
                let id_of = |slot: Slot| conns.get(slot as usize).and_then(|c| c.id());
                recipients.extend(
                    self.routes
                        .holders(id.borrowed(), id_of)
                        .filter(|s| open(s)),
                );
            }
            Recipients::Conn(conn) => {
                let holder = conns.get(conn.slot as usize);
                if conn.instance == self.instance
                    && holder.is_some_and(|c| c.serial() == conn.serial)
                    && open(&conn.slot)
                {
                    recipients.push(conn.slot);
                }
            }
        }
        if recipients.is_empty() {
            Metrics::incr(&self.metrics.commands_unmatched);
        }
    }
}

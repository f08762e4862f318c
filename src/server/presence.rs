//! One loop's answer to a presence query, from its routes: only open
//! connections count (one closing is on its way out).

use slab::Slab;

use crate::protocol::names::ChannelName;
use crate::protocol::presence::{Answer, ClientConn, Query};
use crate::server::conn::Conn;
use crate::server::key::ConnKey;
use crate::server::routes::{Routes, Slot};

/// What this loop (instance `instance`) answers to `query`.
pub(crate) fn answer(query: &Query, routes: &Routes, conns: &Slab<Conn>, instance: u32) -> Answer {
    let open = |slot: Slot| conns.get(slot as usize).filter(|c| c.is_open());
    match query {
        Query::Channel { channel, .. } => query.answer_channel(
            routes
                .subscribers(channel.borrowed())
                .iter()
                .filter_map(|&slot| open(slot))
                .map(|c| c.id().map(|id| id.as_str())),
        ),
        Query::Client { id, .. } => {
            let id_of = |slot: Slot| conns.get(slot as usize).and_then(|c| c.id());
            query.answer_client(routes.holders(id.borrowed(), id_of).filter_map(|slot| {
                let conn = open(slot)?;
                let mut channels: Vec<ChannelName> = routes
                    .channels_of(slot)
                    .filter_map(|name| ChannelName::new(name).ok())
                    .collect();
                channels.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
                Some(ClientConn {
                    conn: conn.conn_ref(ConnKey(slot as usize), instance),
                    transport: conn.transport(),
                    channels,
                })
            }))
        }
        Query::Channels { .. } => query.answer_channels(routes.channels().map(|(name, slots)| {
            let count = slots.iter().filter(|&&slot| open(slot).is_some()).count();
            (name, count as u64)
        })),
    }
}

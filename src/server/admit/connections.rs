//! The connections: the slab that holds them, what names them (keys and
//! serials), the per-address limit, and the lists of those to read again.

use std::net::IpAddr;

use mio::net::TcpStream;
use mio::{Interest, Registry};
use slab::Slab;

use crate::config::Config;
use crate::protocol::http::Endpoints;
use crate::server::admit::per_ip::{OverLimit, PerIpLimit};
use crate::server::conn::Conn;
use crate::server::handle::upstream::Outbox;
use crate::server::key::{ConnKey, Serials};

/// Slab slots reserved up front (address space only: untouched pages cost
/// no memory), so growing to many connections never copies the slab.
const SLAB_RESERVE: usize = 1 << 20;

/// Every connection the loop holds, by key, and the reading that waits.
#[derive(Debug)]
pub(crate) struct Connections {
    /// The connections, the key being the slot.
    pub(crate) slab: Slab<Conn>,
    /// One more than the highest key ever used: the heartbeat sweeps
    /// and the pass visit `0..key_bound`.
    key_bound: usize,
    /// The serial of the next connection (see
    /// [`ConnRef`](crate::protocol::commands::ConnRef)).
    serials: Serials,
    per_ip: Option<PerIpLimit>,
    /// Connections that used their read budget with input left.
    read_again: Vec<ConnKey>,
    /// Client messages on their way to the upstream reader, if they go there.
    pub(crate) upstream: Option<Outbox>,
    /// Connections whose reading waits for the upstream reader.
    upstream_waiting: Vec<ConnKey>,
}

impl Connections {
    /// None yet, with room reserved for `config.max_connections`.
    pub(crate) fn new(config: &Config, upstream: Option<Outbox>) -> Connections {
        Connections {
            slab: Slab::with_capacity(config.max_connections.min(SLAB_RESERVE)),
            key_bound: 0,
            serials: Serials::default(),
            per_ip: config.max_connections_per_ip.map(PerIpLimit::new),
            read_again: Vec::new(),
            upstream,
            upstream_waiting: Vec::new(),
        }
    }

    /// How many connections there are.
    pub(crate) fn len(&self) -> usize {
        self.slab.len()
    }

    /// There are none.
    pub(crate) fn is_empty(&self) -> bool {
        self.slab.is_empty()
    }

    /// One more than the highest key ever used.
    pub(crate) fn key_bound(&self) -> usize {
        self.key_bound
    }

    /// Counts a connection from `ip` under `key`, unless its address holds
    /// its maximum already.
    pub(crate) fn admit_peer(&mut self, key: ConnKey, ip: IpAddr) -> Result<(), OverLimit> {
        match &mut self.per_ip {
            Some(per_ip) => per_ip.admit(key, ip),
            None => Ok(()),
        }
    }

    /// Uncounts the connection under `key` from its address.
    pub(crate) fn release_peer(&mut self, key: ConnKey) {
        if let Some(per_ip) = &mut self.per_ip {
            per_ip.release(key);
        }
    }

    /// Takes an accepted socket in, with a serial of its own; returns its key.
    pub(crate) fn insert(&mut self, stream: TcpStream, endpoints: Endpoints) -> ConnKey {
        let serial = self.serials.assign();
        let key = self.slab.insert(Conn::accepted(stream, endpoints, serial));
        self.key_bound = self.key_bound.max(key + 1);
        ConnKey(key)
    }

    /// Registers in the poll a connection moved from another process,
    /// under the key it had there (a socket with output queued for it is
    /// watched for writing too; one with input waiting raises its event
    /// at once), and counts it against its address.
    /// Done as each arrives, so that the rest of the handover overlaps
    /// these calls; [`Connections::adopt`] then takes them all in.
    pub(crate) fn welcome(&mut self, key: ConnKey, conn: &mut Conn, registry: &Registry) {
        let interest = if conn.has_queued() {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        let registered = registry.register(conn.stream_mut(), mio::Token(key.0), interest);
        if let Err(e) = registered {
            log::warn!("a connection taken over could not be registered: {e}");
        }
        if self.per_ip.is_some() {
            if let Ok(peer) = conn.stream_mut().peer_addr() {
                let _ = self.admit_peer(key, peer.ip());
            }
        }
        self.key_bound = self.key_bound.max(key.0 + 1);
    }

    /// Takes in the connections moved from another process (each
    /// [`Connections::welcome`]d), each under the key it had there.
    pub(crate) fn adopt(&mut self, entries: Vec<(usize, Conn)>) {
        debug_assert!(self.slab.is_empty(), "bug: adopting beside connections");
        let mut slab: Slab<Conn> = entries.into_iter().collect();
        slab.reserve(self.slab.capacity().saturating_sub(slab.len()));
        self.slab = slab;
    }

    /// Takes the connection under `key` out, uncounted from its address.
    pub(crate) fn remove(&mut self, key: ConnKey) -> Option<Conn> {
        let conn = self.slab.try_remove(key.0)?;
        self.release_peer(key);
        Some(conn)
    }

    /// Some connection is to be read again.
    pub(crate) fn reads_pending(&self) -> bool {
        !self.read_again.is_empty()
    }

    /// Reads `key` again after the others, before the next poll.
    pub(crate) fn read_again(&mut self, key: ConnKey) {
        self.read_again.push(key);
    }

    /// Reads `key` again once the upstream reader caught up.
    pub(crate) fn await_upstream(&mut self, key: ConnKey) {
        self.upstream_waiting.push(key);
    }

    /// The connections to read again, taken out (give the list back with
    /// [`Connections::reads_done`], to keep its capacity).
    pub(crate) fn take_reads(&mut self) -> Vec<ConnKey> {
        std::mem::take(&mut self.read_again)
    }

    /// Takes back the emptied list [`Connections::take_reads`] gave, unless
    /// more were added meanwhile.
    pub(crate) fn reads_done(&mut self, keys: Vec<ConnKey>) {
        if self.read_again.is_empty() {
            self.read_again = keys;
        }
    }

    /// Hands the iteration's upstream lines to the reader; once it has
    /// caught up, the connections that waited for it are read again.
    pub(crate) fn hand_over_upstream(&mut self) {
        if let Some(upstream) = &mut self.upstream {
            if upstream.hand_over() {
                // A connection may have waited from several events.
                self.upstream_waiting.sort_unstable();
                self.upstream_waiting.dedup();
                self.read_again.append(&mut self.upstream_waiting);
            }
        }
    }
}

/// Registers or drops writable interest when the connection's output
/// queue changed between empty and not; `false` if the registry failed.
pub(crate) fn sync_interest(registry: &Registry, key: ConnKey, conn: &mut Conn) -> bool {
    let Some(want_writable) = conn.interest_change() else {
        return true;
    };
    let interest = if want_writable {
        Interest::READABLE | Interest::WRITABLE
    } else {
        Interest::READABLE
    };
    match registry.reregister(conn.stream_mut(), key.into(), interest) {
        Ok(()) => true,
        Err(e) => {
            log::debug!("reregister failed: {e}");
            false
        }
    }
}

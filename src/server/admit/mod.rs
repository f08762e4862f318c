//! Accepting connections: admission (limits, the slab, the poll
//! registration) and refusals before a connection exists.

pub(crate) mod connections;
pub(crate) mod per_ip;
pub(crate) mod room;

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};

use mio::net::TcpStream;
use mio::{Interest, Registry, Token};

use crate::config::Config;
use crate::ops::metrics::Metrics;
use crate::protocol::http::{Endpoints, Rejection, MAX_RESPONSE_LEN};
use crate::server::admit::connections::Connections;
use crate::server::key::ConnKey;
use crate::server::net::sockets::{Door, Sockets};

/// Connections accepted per wake-up before the loop serves the others.
pub(super) const ACCEPTS_PER_WAKE: usize = 256;

/// What one turn at a listener came to.
#[derive(Debug)]
pub(super) enum Accepted {
    /// A connection, in the slab under this key: the loop reads it at once.
    Admitted(ConnKey),
    /// A connection refused (over a limit), or an accept that failed.
    Refused,
    /// The backlog is empty.
    Empty,
    /// File descriptors or kernel memory ran out: retrying at once would spin.
    Exhausted(io::Error),
}

/// Out of file descriptors or kernel memory: retrying at once would spin.
fn is_resource_exhaustion(e: &io::Error) -> bool {
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    const ENOBUFS: i32 = 105;
    const ENOMEM: i32 = 12;
    matches!(e.raw_os_error(), Some(ENFILE | EMFILE | ENOBUFS | ENOMEM))
}

/// Best effort 503 or 429 for a connection over a limit, without taking a
/// slot: read what the client sent (so closing does not reset the
/// response away), answer, close.
fn refuse(mut stream: TcpStream, rejection: Rejection, scratch: &mut [u8]) {
    let _ = stream.read(scratch);
    let mut response = [0u8; MAX_RESPONSE_LEN];
    let len = rejection.write_response(&mut response);
    let _ = stream.write(&response[..len]);
    let _ = stream.shutdown(Shutdown::Write);
}

/// Takes the next connection waiting at `door` into `conns`, or refuses
/// it (reading its request into `scratch`).
pub(super) fn accept_one(
    door: Door,
    io: &Sockets,
    conns: &mut Connections,
    scratch: &mut [u8],
    config: &Config,
    metrics: &Metrics,
) -> Accepted {
    match io.accept(door) {
        Ok(Some((stream, peer))) => {
            let admission = Admission {
                registry: io.registry(),
                metrics_listener: io.has_metrics_listener(),
                config,
                metrics,
            };
            admission.admit(conns, stream, peer, door, scratch)
        }
        Ok(None) => Accepted::Empty,
        Err(e) if is_resource_exhaustion(&e) => Accepted::Exhausted(e),
        Err(e) => {
            Metrics::incr(&metrics.accept_errors);
            log::debug!("accept failed: {e}");
            Accepted::Refused
        }
    }
}

/// What admitting a connection goes by.
struct Admission<'a> {
    registry: &'a Registry,
    /// `/metrics` has a listener of its own.
    metrics_listener: bool,
    config: &'a Config,
    metrics: &'a Metrics,
}

impl Admission<'_> {
    /// Takes a new TCP connection into the slab, or refuses it with 503
    /// when the server is full or 429 when its address is.
    fn admit(
        &self,
        conns: &mut Connections,
        mut stream: TcpStream,
        peer: SocketAddr,
        door: Door,
        scratch: &mut [u8],
    ) -> Accepted {
        let metrics = self.metrics;
        Metrics::incr(&metrics.connections_accepted);
        if conns.len() >= self.config.max_connections {
            Metrics::incr(&metrics.rejected_503);
            refuse(stream, Rejection::ServiceUnavailable, scratch);
            return Accepted::Refused;
        }
        let key = ConnKey(conns.slab.vacant_key());
        if door == Door::Main && conns.admit_peer(key, peer.ip()).is_err() {
            Metrics::incr(&metrics.rejected_429);
            log::debug!("{} holds its maximum of connections: 429", peer.ip());
            refuse(stream, Rejection::TooManyRequests, scratch);
            return Accepted::Refused;
        }
        if let Err(e) = self
            .registry
            .register(&mut stream, Token(key.0), Interest::READABLE)
        {
            Metrics::incr(&metrics.accept_errors);
            log::warn!("register failed: {e}");
            conns.release_peer(key);
            return Accepted::Refused;
        }
        Metrics::incr(&metrics.connections_http);
        let endpoints = match door {
            Door::Main => Endpoints {
                websocket: true,
                metrics: !self.metrics_listener,
                demo: self.config.demo,
            },
            Door::Metrics => Endpoints {
                websocket: false,
                metrics: true,
                demo: false,
            },
        };
        Accepted::Admitted(conns.insert(stream, endpoints))
    }
}

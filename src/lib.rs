//! # wspush
//!
//! A WebSocket push server built to hold a very large number of connections
//! on one small machine and deliver every broadcast to all of them.
//!
//! One `mio` poll loop on one thread owns a `slab` of connection state
//! machines. Each connection parses its HTTP/1.1 upgrade and then its
//! WebSocket frames incrementally; bytes it cannot consume yet go into a
//! buffer lent from a pool the loop owns, so an idle connection holds no
//! heap buffer. A broadcast is encoded once into one shared buffer that
//! every connection writes from; a socket that cannot take it all keeps a
//! reference and an offset.
//!
//! ## Embedding
//!
//! ```no_run
//! use std::time::Duration;
//! use wspush::{Config, MessageKind, Server};
//!
//! let mut server = Server::bind(Config::default().with(|c| c.echo = false))?;
//! let addr = server.local_addr(); // port 0 picked a free port
//! # let _ = addr;
//! // Deterministic tests drive the loop one step at a time ...
//! server.poll_once(Some(Duration::from_millis(10)))?;
//! server.broadcast(MessageKind::Text, b"tick")?;
//! // ... or hand it a thread and talk to it through a Handle.
//! let handle = server.handle();
//! let loop_thread = std::thread::spawn(move || server.run());
//! handle.broadcast_text("hello")?;
//! handle.shutdown()?;
//! loop_thread.join().map_err(|_| "the loop thread panicked")??;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The crate is layered, and each layer uses only those below it:
//!
//! - [`protocol`]: pure code over byte slices, no I/O: the WebSocket codec
//!   ([`ws`]), the HTTP upgrade ([`http`]), tokens and origins, request
//!   targets, the input line rules. It can be used on its own.
//! - the loop (`server`): the poll loop, the connection state machine, the
//!   output queues, the buffer pool, time events, heartbeats and the
//!   fan-out of broadcasts: [`Server`], [`Handle`] and [`Config`].
//! - operations (`ops`): metrics ([`MetricsSnapshot`]) and the OS calls
//!   ([`sys`], the crate's only `unsafe` code).
//!
//! The `wspush` binary (`src/bin/wspush/`) adds the command line, the
//! standard-input reader and the `--processes` supervisor.
#![deny(missing_docs)]

mod config;
mod ops;
pub mod protocol;
mod server;
#[cfg(test)]
mod testing;

pub use ops::sys;
pub use protocol::{http, ws};

pub use config::{
    Config, ConfigError, Degraded, Overflow, SlowConsumerPolicy, UpstreamConfig,
    DEFAULT_BATCH_DELAY, MAX_BATCH_DELAY, MAX_DURATION, MAX_MESSAGE_LIMIT,
};
pub use ops::metrics::MetricsSnapshot;
pub use protocol::auth::{TokenError, Tokens};
pub use protocol::commands::ConnRef;
pub use protocol::ws::{CloseCode, MessageKind};
pub use server::{
    BindError, BroadcastError, ConnectionInfo, Handle, MessageTooBig, Recipients, Server,
    ServerGone, SharedHistory, UpstreamReader,
};

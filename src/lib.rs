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
//! use wspush::{ChannelName, ClientId, Config, MessageKind, Recipients, Server};
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
//! // Names are checked once, as they are made; a bad one is a NameError.
//! let news = ChannelName::new("news")?;
//! handle.subscribe(ClientId::new("alice")?, [news.clone()])?;
//! handle.send(Recipients::Channels(Box::new([news])), MessageKind::Text, "hi")?;
//! handle.shutdown()?;
//! loop_thread.join().map_err(|_| "the loop thread panicked")??;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The crate is layered, and each layer uses only those below it:
//!
//! - the protocol (`protocol`): pure code over byte slices, no I/O: the
//!   WebSocket codec, the HTTP upgrade, tokens and origins, request
//!   targets, the input line rules and the command language, whose types
//!   are public: a [`Command`] parses from a line, and its [`Recipients`]
//!   hold a [`ChannelName`], a [`ClientId`] or a [`ConnRef`], each checked
//!   once as it is made (by a parse, or by [`ChannelName::new`] and
//!   [`ClientId::new`]) and never again.
//! - the loop (`server`): the poll loop, the connection state machine, the
//!   output queues, the buffer pool, time events, heartbeats and the
//!   fan-out of broadcasts: [`Server`], [`Handle`] and [`Config`].
//! - operations (`ops`): metrics ([`MetricsSnapshot`]) and the OS calls
//!   (`sys`, the crate's only `unsafe` code).
//!
//! The `wspush` binary (the `wspush-cli` package, `cli/`) adds the command
//! line, standard input and Redis as input, and the `--processes`
//! supervisor.
//!
//! ## Features
//!
//! None is on by default: a plain dependency sees the API above. Both are
//! the binary's. `cli` derives clap's `ValueEnum` on the settings' enums.
//! `internals` makes `protocol` and `sys` public, and the binary's
//! plumbing (on the handle, the shared history's writers, and the
//! settings a supervisor gives its instances: `Config::instance`,
//! `first_position`, `degraded`, `host_fd` and `metrics_board`; the host's
//! metrics `board`), for the binary, the bench and the
//! fuzz targets; it is not a stable API.
#![deny(missing_docs)]

mod config;
mod ops;
#[cfg(feature = "internals")]
pub mod protocol;
#[cfg(not(feature = "internals"))]
mod protocol;
mod server;
#[cfg(test)]
mod testing;

#[cfg(feature = "internals")]
pub use ops::board;
#[cfg(feature = "internals")]
pub use ops::sys;

#[cfg(feature = "internals")]
pub use config::Degraded;
pub use config::{
    Config, ConfigError, Overflow, SlowConsumerPolicy, UpstreamConfig, DEFAULT_BATCH_DELAY,
    MAX_BATCH_DELAY, MAX_DURATION, MAX_MESSAGE_LIMIT,
};
pub use ops::metrics::MetricsSnapshot;
pub use protocol::auth::{Grant, TokenError, Tokens};
pub use protocol::commands::{
    Command, CommandError, ConnRef, Payload, Recipients, MAX_CHANNEL_LIST_LEN, MAX_REASON_LEN,
};
pub use protocol::handover::VERSION as STATE_FORMAT;
pub use protocol::jwt::{Algorithm, Claims, KeyError, TokenRefusal, Verifier};
pub use protocol::names::{
    ChannelName, ChannelNameRef, ClientId, ClientIdRef, NameError, Pattern, MAX_NAME_LEN,
};
pub use protocol::position::Epoch;
pub use protocol::ws::{CloseCode, MessageKind};
#[cfg(feature = "internals")]
pub use server::host_memory;
#[cfg(feature = "internals")]
pub use server::UpstreamTally;
pub use server::{
    introduce_successor, listen, BindError, BroadcastError, ConnectionInfo, Handle, MessageTooBig,
    Server, ServerGone, SharedHistory, Suspended, TakeOverError, UpstreamReader, HANDOVER_TIMEOUT,
};

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
//! let mut server = Server::bind(Config { echo: false, ..Config::default() })?;
//! let addr = server.local_addr(); // port 0 picked a free port
//! # let _ = addr;
//! // Deterministic tests drive the loop one step at a time ...
//! server.poll_once(Some(Duration::from_millis(10)))?;
//! server.broadcast(MessageKind::Text, b"tick").unwrap();
//! // ... or hand it a thread and talk to it through a Handle.
//! let handle = server.handle();
//! let loop_thread = std::thread::spawn(move || server.run());
//! handle.broadcast_text("hello")?;
//! handle.shutdown()?;
//! loop_thread.join().unwrap()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The protocol layer ([`ws`], [`http`]) is pure code over byte slices and
//! can be used on its own.
#![deny(missing_docs)]

mod alarm;
mod auth;
mod batching;
mod broadcast;
mod config;
mod conn;
mod fanout;
mod feed;
mod heap;
mod heartbeat;
pub mod http;
pub mod input;
mod io;
mod metrics;
mod per_ip;
mod pool;
pub mod rlimit;
mod server;
pub mod supervisor;
mod target;
#[cfg(test)]
mod testing;
mod timer;
pub mod ws;

pub use auth::Tokens;
pub use config::{
    Config, ConfigError, SlowConsumerPolicy, DEFAULT_BATCH_DELAY, MAX_BATCH_DELAY, MAX_DURATION,
    MAX_MESSAGE_LIMIT,
};
pub use metrics::MetricsSnapshot;
pub use server::{ConnectionInfo, Handle, MessageTooBig, Server, ServerGone};
pub use ws::MessageKind;

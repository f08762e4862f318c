//! `wspush-bench`: measures WebSocket push servers that follow the wspush
//! contract (upgrade on any path; each stdin line is broadcast as one text
//! message to every client), next to a bare-epoll reference in the same run;
//! and event-stream (SSE) servers, whose clients get each line as an event.
//!
//! The crate is in layers; each uses only the ones below it:
//!
//! - [`wire`]: frames, handshake, permessage-deflate, event streams,
//!   payloads, the JSON feed; pure, no imports from the crate;
//! - [`observe`]: receipts, latency, `/proc`, CPU marks, formats;
//! - [`client`]: dialing, the one connection state machine
//!   ([`client::conn::Conn`]) with a [`client::conn::Check`] per kind of
//!   run (in order for push, receipts for `channels`, echoes for `echo`),
//!   the one per-process loop ([`client::clients::Clients`]), probes;
//! - [`fleet`]: worker processes, their one protocol and the one
//!   coordinator ([`fleet::coordinator::Fleet`]), for push (granted
//!   openings, armed broadcasts) and `channels` (receipts);
//! - [`target`]: the server under test (spawned or running) and the floor,
//!   the bare reference server;
//! - [`report`]: tables and plots of a run;
//! - [`scenario`]: the subcommands' measurements (`push`, `echo`, `compare`,
//!   `channels`, `hosts`, `trickle`, `deflate`); nothing in the library
//!   below them uses them (the binary and the tests do).
//!
//! The library exists so that tests can run the same measurement against an
//! embedded server: [`scenario::push::measure`] takes any
//! [`target::Target`] (an address, a way to send a broadcast line, a
//! process to watch).
#![deny(missing_docs)]

pub mod client;
pub mod fleet;
pub mod observe;
pub mod report;
pub mod scenario;
pub mod target;
pub mod wire;

/// The error type of every fallible step of a run.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

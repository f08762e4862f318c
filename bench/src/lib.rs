//! `wspush-bench`: measures WebSocket push servers that follow the wspush
//! contract (upgrade on any path; each stdin line is broadcast as one text
//! message to every client), next to a bare-epoll reference in the same run.
//!
//! The binary's subcommands map onto these modules:
//!
//! - `floor` ([`floor`], [`supervisor`]): the bare reference server, one
//!   process or N behind `SO_REUSEPORT`;
//! - `push` ([`push`]): open N idle connections through worker processes
//!   ([`fleet`], [`worker`]), measure the server's memory and CPU, broadcast
//!   K messages and check every delivery;
//! - `echo` ([`echo`]): C connections × M messages/s × P bytes, round trips
//!   checked and timed; optionally the highest rate with p99 under a limit;
//! - `compare` ([`compare`]): `push` and `echo` over several servers, one table;
//! - `channels` ([`channels`], [`swarm`]): targeted push in wspush (ids and
//!   channels): memory, fan-out to a fraction, CPU per `id` message,
//!   throughput over many channels;
//! - `hosts` ([`hosts`]): `push` over wspush on several hosts (network
//!   namespaces), fed through Redis or each host's standard input;
//! - `deflate` ([`deflate`]): DEFLATE implementations on one JSON feed.
//!
//! The library exists so that tests can run the same measurement against an
//! embedded server: [`push::measure`] takes any [`target::Target`] (an
//! address, a way to send a broadcast line, a process to watch).
#![deny(missing_docs)]

pub mod channels;
pub mod clients;
pub mod compare;
pub mod compression;
pub mod conn;
pub mod deflate;
pub mod dial;
pub mod echo;
pub mod echoer;
pub mod fleet;
pub mod floor;
pub mod format;
pub mod frame;
pub mod handshake;
pub mod hosts;

pub mod latency;
pub mod message;
pub mod pacing;
pub mod plot;
pub mod probe;
pub mod procfs;
pub mod protocol;
pub mod push;
pub mod ramp;
pub mod report;
pub mod server;
pub mod stats;
pub mod supervisor;
pub mod swarm;
pub mod sys;
pub mod target;
pub mod trickle;
pub mod worker;

/// The error type of every fallible step of a run.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

//! `channels`: what targeted push costs in wspush (`--input commands`),
//! in four modes, each against servers it spawns:
//!
//! - `memory`: server memory per idle connection for several URL variants
//!   (`/`, an id and a channel, an id and ten channels), each in a server
//!   of its own; the subscriptions from `/metrics`; bytes per subscription;
//! - `fanout`: `pub hot` to the 1% of the connections on `hot`, one
//!   message at a time, timed to the last subscriber's receipt, next to
//!   the floor writing the same lines to the same share of as many
//!   connections (`floor --channel hot`), and to that many sockets alone;
//!   the others must get nothing but a closing `all`;
//! - `id`: `id u{random}` messages one at a time (or in bursts), the
//!   server's CPU per message, next to a wspush sending the same messages
//!   with `all` to its one connection;
//! - `throughput`: one `pub ch{i}` per channel of C, each with one
//!   subscriber, written as fast as the server takes them: messages a
//!   second until all are delivered, each exactly to its subscriber;
//! - `presence`: `GET /presence` of a channel every connection is in,
//!   `/clients` and every channel's count, timed, with the loops' upgrade
//!   and pong probed meanwhile.
//!
//! The clients are [`Fleet`](crate::fleet::coordinator::Fleet) workers;
//! every receipt comes back to the [`Ledger`] here, which judges it.

use std::thread;
use std::time::Duration;

use serde::Serialize;

use crate::Error;

mod fanout;
mod id;
mod ledger;
mod lines;
mod memory;
mod options;
mod presence;
mod stage;
mod throughput;

pub use fanout::{FanoutRun, FanoutSide};
pub use id::{IdRun, IdSide};
pub use ledger::{Checks, Ledger, SENTINEL};
pub use lines::{line, target};
pub use memory::{MemoryRow, MemoryRun};
pub use options::{ChannelsOptions, Mode, Variant};
pub use presence::PresenceRun;
pub use stage::SetupReport;
pub use throughput::ThroughputRun;

/// A report of any mode.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelsReport {
    /// `memory`.
    Memory(MemoryRun),
    /// `fanout`.
    Fanout(Box<FanoutRun>),
    /// `id`.
    Id(Box<IdRun>),
    /// `throughput`.
    Throughput(Box<ThroughputRun>),
    /// `presence`.
    Presence(Box<PresenceRun>),
}

impl ChannelsReport {
    /// The report as text.
    pub fn render_text(&self) -> String {
        match self {
            ChannelsReport::Memory(r) => r.render_text(),
            ChannelsReport::Fanout(r) => r.render_text(),
            ChannelsReport::Id(r) => r.render_text(),
            ChannelsReport::Throughput(r) => r.render_text(),
            ChannelsReport::Presence(r) => r.render_text(),
        }
    }
}

/// Runs the mode `options` names.
pub fn run(options: &ChannelsOptions) -> Result<ChannelsReport, Error> {
    options.check()?;
    // A write to a server that stopped reading blocks (and is retried
    // after a signal): the limit ends even that.
    let limit = options.time_limit;
    thread::Builder::new()
        .name("time-limit".into())
        .spawn(move || {
            thread::sleep(Duration::from_secs(limit));
            eprintln!("wspush-bench channels: --time-limit {limit} s reached: stopping");
            std::process::exit(1);
        })?;
    Ok(match options.mode {
        Mode::Memory => ChannelsReport::Memory(memory::memory(options)?),
        Mode::Fanout => ChannelsReport::Fanout(Box::new(fanout::fanout(options)?)),
        Mode::Id => ChannelsReport::Id(Box::new(id::id(options)?)),
        Mode::Throughput => ChannelsReport::Throughput(Box::new(throughput::throughput(options)?)),
        Mode::Presence => ChannelsReport::Presence(Box::new(presence::presence(options)?)),
    })
}

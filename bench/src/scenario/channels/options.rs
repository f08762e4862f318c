//! The options of a `channels` run: what it measures ([`Mode`]), the URL
//! variants of `memory` ([`Variant`]), and the command line
//! ([`ChannelsOptions`]) with what follows from it.

use std::time::Duration;

use serde::Serialize;

use crate::client::receipts::Paths;
use crate::target::server;
use crate::wire::message;
use crate::Error;

/// What `channels` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Memory per idle connection for each `--variants` URL, in separate servers.
    Memory,
    /// `pub hot` to `--fraction` of `--conns`, one at a time, against the floor.
    Fanout,
    /// `id u{random}` to one of `--conns`: CPU per message against `all` to one.
    Id,
    /// One `pub ch{i}` to each of `--channels` one-subscriber channels.
    Throughput,
    /// `GET /presence` of a channel all `--conns` are in, `--messages`
    /// times, over `--server-processes` instances (`auto`: 8).
    Presence,
}

/// The URL of each connection in a `memory` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum Variant {
    /// `/`.
    #[value(name = "plain")]
    #[serde(rename = "plain")]
    Plain,
    /// `/?id=u{i}`.
    #[value(name = "id")]
    #[serde(rename = "id")]
    Id,
    /// `/?id=u{i}&channel=c{i % 100}`.
    #[value(name = "id+channel")]
    #[serde(rename = "id+channel")]
    IdChannel,
    /// `/?id=u{i}` and ten `channel=c{(i + k * 7919) % 1000}`, k = 0..10.
    #[value(name = "id+10ch")]
    #[serde(rename = "id+10ch")]
    IdTenChannels,
}

impl Variant {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Id => "id",
            Variant::IdChannel => "id+channel",
            Variant::IdTenChannels => "id+10ch",
        }
    }

    /// The paths of its connections.
    pub fn paths(self) -> Paths {
        match self {
            Variant::Plain => Paths::Plain,
            Variant::Id => Paths::Id,
            Variant::IdChannel => Paths::IdChannel { channels: 100 },
            Variant::IdTenChannels => Paths::IdChannels {
                per: 10,
                channels: 1000,
                step: 7919,
            },
        }
    }

    /// Channels each connection subscribes to.
    pub fn channels_per_conn(self) -> u64 {
        match self {
            Variant::Plain | Variant::Id => 0,
            Variant::IdChannel => 1,
            Variant::IdTenChannels => 10,
        }
    }
}

/// Parameters of a `channels` run.
#[derive(Debug, Clone, clap::Args)]
pub struct ChannelsOptions {
    /// What to measure.
    #[arg(value_enum)]
    pub mode: Mode,
    /// Connections (memory, fanout, id).
    #[arg(long, default_value_t = 19_000)]
    pub conns: u64,
    /// Channels, one subscriber each (throughput).
    #[arg(long, default_value_t = 100_000)]
    pub channels: u64,
    /// Messages [default: 20 for fanout, 10,000 for id].
    #[arg(long)]
    pub messages: Option<u32>,
    /// Share of the connections on `hot` (fanout).
    #[arg(long, default_value_t = 0.01)]
    pub fraction: f64,
    /// Messages written at once before waiting for their receipts (id).
    /// With 1 both servers make one socket write per message; in larger
    /// bursts `all` to one connection shares one write per burst, so the
    /// difference includes the writes.
    #[arg(long, default_value_t = 1)]
    pub burst: u32,
    /// Lines written at once, each stamped just before (throughput).
    #[arg(long, default_value_t = 1000)]
    pub feed_chunk: usize,
    /// URL variants, each in a server of its own (memory).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "plain,id+channel,id+10ch"
    )]
    pub variants: Vec<Variant>,
    /// Size of each message payload (a sequence number and a send time, padded).
    #[arg(long, default_value_t = 32)]
    pub payload_bytes: usize,
    /// Connections started per second.
    #[arg(long, default_value_t = 10_000.0)]
    pub rate: f64,
    /// Most connections connecting or upgrading at once (over all workers).
    #[arg(long, default_value_t = 512)]
    pub max_in_flight: usize,
    /// Most connections one client process holds.
    #[arg(long, default_value_t = 19_000)]
    pub per_worker: usize,
    /// Source addresses 127.0.0.2, 127.0.0.3, ... [default: 45% of the
    /// local port range each at most].
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=250))]
    pub sources: Option<u8>,
    /// Idle time before each memory sample and before the messages, in ms.
    #[arg(long, default_value_t = 2000)]
    pub settle_ms: u64,
    /// Pause between two messages sent one at a time, in ms (fanout).
    #[arg(long, default_value_t = 50)]
    pub gap_ms: u64,
    /// Seconds a message (fanout), a burst (id) or the whole feed beyond
    /// 50 µs per line (throughput) may take to be delivered.
    #[arg(long, default_value_t = 10)]
    pub message_timeout: u64,
    /// Seconds the connection setup may take [default: 60 s plus one
    /// second per 1,000 connections].
    #[arg(long)]
    pub setup_timeout: Option<u64>,
    /// Seconds one connection may stay connecting or upgrading.
    #[arg(long, default_value_t = 10)]
    pub connect_timeout: u64,
    /// Seconds a server gets to start listening.
    #[arg(long, default_value_t = 30)]
    pub start_timeout: u64,
    /// The wspush to measure: `sh -c "exec COMMAND"`, `{port}` replaced by
    /// the port; it must read commands on stdin [default: the wspush next
    /// to this program with `--input commands --quiet --ping-interval 1h`].
    #[arg(long, value_name = "COMMAND")]
    pub server: Option<String>,
    /// Instances of the default wspush in `throughput` (`--processes`;
    /// `auto`: as many as the channels need).
    #[arg(long, value_name = "N|auto", default_value = "auto")]
    pub server_processes: String,
    /// Seed of the `id` mode's choice of targets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// `id` mode: every message to the same connection, whose socket stays
    /// warm, to tell the lookup's cost from a cold socket's.
    #[arg(long)]
    pub one_target: bool,
    /// Before each server starts, wait up to this many seconds for the
    /// machine to be quiet.
    #[arg(long, default_value_t = 0)]
    pub wait_quiet: u64,
    /// Stop the whole run after this many seconds, wherever it is (its
    /// servers and client workers die with it).
    #[arg(long, default_value_t = 900)]
    pub time_limit: u64,
}

impl ChannelsOptions {
    /// Checks the options that do not depend on the machine.
    pub fn check(&self) -> Result<(), Error> {
        if self.conns == 0
            || self.channels == 0
            || self.messages == Some(0)
            || self.burst == 0
            || self.feed_chunk == 0
            || self.per_worker == 0
            || self.max_in_flight == 0
            || !(self.rate > 0.0 && self.rate.is_finite())
        {
            return Err("counts, sizes and rates must be positive".into());
        }
        if !(self.fraction > 0.0 && self.fraction <= 1.0) {
            return Err("--fraction must be in (0, 1]".into());
        }
        if self.variants.is_empty() {
            return Err("--variants needs at least one".into());
        }
        Ok(message::check_room(self.payload_bytes, u32::MAX)?)
    }

    pub(super) fn setup_timeout(&self, conns: u64) -> Duration {
        Duration::from_secs(self.setup_timeout.unwrap_or(60 + conns / 1000))
    }

    pub(super) fn message_timeout(&self) -> Duration {
        Duration::from_secs(self.message_timeout)
    }

    /// The command of the wspush to measure (`processes`: the default's
    /// `--processes`, for `conns` connections in all).
    pub(super) fn wspush_command(&self, processes: Option<(&str, u64)>) -> Result<String, Error> {
        if let Some(command) = &self.server {
            return Ok(command.clone());
        }
        let exe = server::wspush_exe(&std::env::current_exe()?);
        let base = format!("{exe} --input commands --quiet --ping-interval 1h");
        Ok(match processes {
            None => format!("{base} --listen 127.0.0.1:{{port}}"),
            Some(("auto", conns)) => {
                format!("{base} --processes auto --total-connections {conns} --listen 127.0.0.1:{{port}}")
            }
            Some((n, _)) => format!("{base} --processes {n} --listen 127.0.0.1:{{port}}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_options_parse_with_their_defaults() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            o: ChannelsOptions,
        }
        let o = Cli::try_parse_from(["x", "memory"]).unwrap().o;
        assert_eq!(
            o.variants,
            [Variant::Plain, Variant::IdChannel, Variant::IdTenChannels]
        );
        assert_eq!(o.conns, 19_000);
        o.check().unwrap();
        let o = Cli::try_parse_from(["x", "memory", "--variants", "id,id+10ch"])
            .unwrap()
            .o;
        assert_eq!(o.variants, [Variant::Id, Variant::IdTenChannels]);
        let o = Cli::try_parse_from(["x", "fanout", "--fraction", "0"])
            .unwrap()
            .o;
        assert!(o.check().is_err());
        assert!(Cli::try_parse_from(["x", "sideways"]).is_err());
    }
}

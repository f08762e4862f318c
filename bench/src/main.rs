//! The `wspush-bench` command line: subcommand dispatch over the library.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde::Serialize;
use wspush_bench::fleet::coordinator::Launch;
use wspush_bench::fleet::worker;
use wspush_bench::observe::sys;
use wspush_bench::report::plot;
use wspush_bench::report::RunInfo;
use wspush_bench::report::RunReport;
use wspush_bench::scenario::channels::{self, ChannelsOptions};
use wspush_bench::scenario::compare::{self, CompareOptions};
use wspush_bench::scenario::deflate::{self, DeflateOptions};
use wspush_bench::scenario::echo::{self, EchoOptions, EchoOutcome};
use wspush_bench::scenario::hosts::{self, HostsOptions};
use wspush_bench::scenario::push::{self, PushOptions};
use wspush_bench::scenario::trickle::{self, TrickleOptions};
use wspush_bench::scenario::upstream::{self, UpstreamOptions};
use wspush_bench::target::floor;
use wspush_bench::target::publish;
use wspush_bench::target::server::{self, ServerSpec};
use wspush_bench::target::supervisor::{self, Processes};
use wspush_bench::target::External;
use wspush_bench::Error;

#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Which server a `push` or `echo` measures.
#[derive(Debug, clap::Args)]
struct ServerChoice {
    /// Run the server: `sh -c "exec COMMAND"`, `{port}` replaced by the port
    /// (else the port is appended); `floor [OPTIONS]` runs this program's
    /// floor. Without COMMAND: wspush with `--processes auto` (or more
    /// instances if the connections need them), from next to this program
    /// or target/release.
    #[arg(long, value_name = "COMMAND", num_args = 0..=1, default_missing_value = "",
          conflicts_with = "connect")]
    spawn: Option<String>,
    /// Measure a server that is already running at this address instead.
    #[arg(long, value_name = "ADDR", requires = "server_pid")]
    connect: Option<SocketAddr>,
    /// With `--connect`: the server's process (its whole tree is measured).
    #[arg(long, value_name = "PID")]
    server_pid: Option<u32>,
    /// With `--connect`: a FIFO the server reads its broadcast lines from.
    #[arg(long, value_name = "PATH")]
    fifo: Option<PathBuf>,
    /// Name of the server in the report [default: `floor`, `wspush` or `server`].
    #[arg(long)]
    label: Option<String>,
}

impl ServerChoice {
    /// The server to spawn for `conns` connections, if one is to be
    /// spawned; `extra` goes into the default wspush command.
    fn spec(&self, extra: &str, conns: usize) -> Result<Option<ServerSpec>, Error> {
        let command = match (&self.spawn, self.connect) {
            (_, Some(_)) => return Ok(None),
            (Some(c), None) if !c.trim().is_empty() => c.trim().to_string(),
            _ => server::default_wspush(&std::env::current_exe()?, extra, conns),
        };
        let label = self.label.clone().unwrap_or_else(|| {
            if command.split_whitespace().next() == Some(server::FLOOR) {
                server::FLOOR.into()
            } else if self.spawn.as_deref().is_none_or(|c| c.trim().is_empty()) {
                "wspush".into()
            } else {
                "server".into()
            }
        });
        Ok(Some(ServerSpec { label, command }))
    }

    /// For `--connect`: the running server and how the report names it.
    fn external(&self, needs_fifo: bool) -> Result<(External, SocketAddr, RunInfo), Error> {
        let addr = self.connect.expect("called with --connect");
        let pid = self.server_pid.expect("clap requires --server-pid");
        if needs_fifo && self.fifo.is_none() {
            return Err("--connect needs --fifo to send broadcasts".into());
        }
        let target = External::new(pid, self.fifo.as_deref())?;
        let info = RunInfo {
            server: self.label.clone().unwrap_or_else(|| "server".into()),
            command: format!("running at {addr}, pid {pid}"),
            round: 1,
        };
        Ok((target, addr, info))
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Bare epoll push server: upgrades, holds sockets, writes each stdin line
    /// as one pre-encoded text frame to every socket, echoes client frames.
    /// Runs until killed.
    Floor {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: SocketAddr,
        /// Share the port with other processes (`SO_REUSEPORT`).
        #[arg(long)]
        reuse_port: bool,
        /// Run N instances behind the port (`auto`: one per CPU, like
        /// wspush), each getting every stdin line.
        #[arg(long, default_value = "1")]
        processes: Processes,
        /// Write a ping to every socket this often, in milliseconds (the
        /// bare cost of heartbeats).
        #[arg(long, value_name = "MS")]
        ping_interval_ms: Option<u64>,
        /// Write the lines only to connections whose request named this
        /// channel (`?channel=NAME`); hold the others without writing.
        #[arg(long, value_name = "NAME")]
        channel: Option<String>,
    },
    /// Open idle connections, measure the server's memory and CPU, then
    /// broadcast messages one at a time: exactly-once delivery, latency
    /// and fan-out time.
    Push {
        #[command(flatten)]
        server: ServerChoice,
        #[command(flatten)]
        options: PushOptions,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Draw the connection ramp and the latency CDF into this SVG file.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
    },
    /// C connections × M messages/s × P bytes: echoes verified, round trips
    /// timed, server CPU per echoed message; or the highest rate with p99
    /// under a limit.
    Echo {
        #[command(flatten)]
        server: ServerChoice,
        #[command(flatten)]
        options: EchoOptions,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// `push` and `echo` against each server in turn (for every round); one table.
    Compare {
        #[command(flatten)]
        compare: CompareOptions,
        #[command(flatten)]
        options: PushOptions,
        /// Print all reports as a JSON array instead of the table.
        #[arg(long)]
        json: bool,
        /// Draw every push run's ramp and latency CDF into this SVG file.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
    },
    /// Clients send their upgrade requests one byte at a time, all in step:
    /// the server's CPU per connection for partial request heads.
    Trickle {
        #[command(flatten)]
        server: ServerChoice,
        #[command(flatten)]
        options: TrickleOptions,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Targeted push in wspush (`--input commands`): memory per connection
    /// with ids and channels, `pub` fan-out to a fraction against the floor,
    /// CPU per `id` message, throughput over many channels.
    Channels {
        #[command(flatten)]
        options: ChannelsOptions,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// `push` over wspush on several hosts (network namespaces: see
    /// bench/multihost.sh), every line published once on Redis or written
    /// to each host's standard input; plus Redis's CPU per line.
    Hosts {
        #[command(flatten)]
        hosts: HostsOptions,
        #[command(flatten)]
        options: PushOptions,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Client messages into a Redis stream (`--upstream redis-stream`),
    /// read back and checked whole, once and in each client's order,
    /// through a Redis outage if asked.
    Upstream {
        #[command(flatten)]
        options: UpstreamOptions,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// DEFLATE implementations on one JSON feed: ratio, and µs per message
    /// to compress (each alone) and to inflate.
    Deflate {
        #[command(flatten)]
        options: DeflateOptions,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Single-message `POST /publish?all` requests on one keep-alive
    /// connection to a running server's publish listener, each after the
    /// last was answered: requests taken a second, and their round trips.
    PublishLoad {
        /// The publish listener (`--publish-listen`).
        #[arg(long, value_name = "ADDR")]
        addr: SocketAddr,
        /// The key (`Authorization: Bearer KEY`).
        #[arg(long, value_name = "KEY")]
        key: String,
        /// How long to send.
        #[arg(long, default_value_t = 5.0)]
        secs: f64,
        /// Bytes of each message.
        #[arg(long, default_value_t = 32)]
        payload_bytes: usize,
        /// Requests written and not yet answered, at most (1: each after
        /// the last was answered).
        #[arg(long, default_value_t = 1)]
        in_flight: usize,
    },
    /// (Internal) a client worker process of `push` or `channels`, driven
    /// through its standard input and output.
    #[command(hide = true)]
    Worker,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Floor {
            listen,
            reuse_port,
            processes,
            ping_interval_ms,
            channel,
        } => run_floor(listen, reuse_port, processes, ping_interval_ms, channel),
        Command::Push {
            server,
            options,
            json,
            plot,
        } => run_push(&server, &options, json, plot.as_deref()),
        Command::Echo {
            server,
            options,
            json,
        } => run_echo(&server, &options, json),
        Command::Compare {
            compare,
            options,
            json,
            plot,
        } => run_compare(&compare, &options, json, plot.as_deref()),
        Command::Trickle {
            server,
            options,
            json,
        } => run_trickle(&server, &options, json),
        Command::Channels { options, json } => run_channels(&options, json),
        Command::PublishLoad {
            addr,
            key,
            secs,
            payload_bytes,
            in_flight,
        } => run_publish_load(addr, &key, secs, payload_bytes, in_flight),
        Command::Hosts {
            hosts,
            options,
            json,
        } => run_hosts(&hosts, &options, json),
        Command::Upstream { options, json } => upstream::run(&options)
            .and_then(|report| print_report(&report, json, upstream::UpstreamRun::render_text)),
        Command::Deflate { options, json } => deflate::run(&options)
            .and_then(|report| print_report(&report, json, deflate::DeflateRun::render_text)),
        Command::Worker => worker::run(std::io::stdin(), std::io::stdout().lock()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wspush-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_hosts(hosts: &HostsOptions, options: &PushOptions, json: bool) -> Result<(), Error> {
    sys::install_interrupt_handler()?;
    let report = hosts::run(hosts, options)?;
    print_report(&report, json, hosts::HostsReport::render_text)
}

fn run_trickle(server: &ServerChoice, options: &TrickleOptions, json: bool) -> Result<(), Error> {
    let Some(spec) = server.spec("", options.conns)? else {
        return Err("trickle spawns its server: --connect is not supported".into());
    };
    let report = trickle::run(&spec, options)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render_text());
    }
    Ok(())
}

fn run_channels(options: &ChannelsOptions, json: bool) -> Result<(), Error> {
    sys::install_interrupt_handler()?;
    let report = channels::run(options)?;
    print_report(&report, json, channels::ChannelsReport::render_text)
}

fn run_floor(
    listen: SocketAddr,
    reuse_port: bool,
    processes: Processes,
    ping_interval_ms: Option<u64>,
    channel: Option<String>,
) -> Result<(), Error> {
    wspush::sys::raise_open_file_limit()?;
    let options = floor::FloorOptions {
        ping_interval: ping_interval_ms.map(std::time::Duration::from_millis),
        channel: channel.clone(),
    };
    match processes.count() {
        1 => Ok(floor::run(listen, reuse_port, options)?),
        n => {
            let mut extra: Vec<String> = ping_interval_ms
                .map(|ms| vec!["--ping-interval-ms".into(), ms.to_string()])
                .unwrap_or_default();
            extra.extend(
                channel
                    .map(|c| ["--channel".into(), c])
                    .into_iter()
                    .flatten(),
            );
            Ok(supervisor::run(
                &std::env::current_exe()?,
                listen,
                n,
                &extra,
            )?)
        }
    }
}

fn run_publish_load(
    addr: SocketAddr,
    key: &str,
    secs: f64,
    payload_bytes: usize,
    in_flight: usize,
) -> Result<(), Error> {
    let payload = vec![b'x'; payload_bytes];
    let load = publish::load(addr, key, &payload, secs, in_flight)?;
    println!(
        "publish-load {addr}, {in_flight} in flight: {} requests taken in {:.2} s: {:.0}/s on one connection; round trip median {:.1} µs, p99 {:.1} µs; {} answered 503",
        load.requests,
        load.secs,
        load.requests as f64 / load.secs,
        load.p50_us,
        load.p99_us,
        load.busy
    );
    Ok(())
}

fn run_push(
    choice: &ServerChoice,
    options: &PushOptions,
    json: bool,
    plot_path: Option<&Path>,
) -> Result<(), Error> {
    sys::install_interrupt_handler()?;
    let report = match choice.spec("", options.conns)? {
        Some(spec) => push::run(&spec, options, 1)?,
        None => {
            let (mut target, addr, info) = choice.external(true)?;
            let launch = Launch::Processes {
                exe: std::env::current_exe()?,
            };
            push::measure(&mut target, addr, options, &launch, info)?
        }
    };
    if let Some(path) = plot_path {
        std::fs::write(path, plot::svg(&[&report]))?;
    }
    print_report(&report, json, RunReport::render_text)
}

fn run_echo(choice: &ServerChoice, options: &EchoOptions, json: bool) -> Result<(), Error> {
    sys::install_interrupt_handler()?;
    let outcome = match choice.spec(" --echo", options.conns)? {
        Some(spec) => echo::run(&spec, options, 1)?,
        None => {
            let (mut target, addr, info) = choice.external(false)?;
            if options.find_max_rate {
                return Err("--find-max-rate spawns its server: use --spawn".into());
            }
            EchoOutcome::One(Box::new(echo::measure(
                &mut target,
                addr,
                options,
                options.rate,
                &info,
            )?))
        }
    };
    print_report(&outcome, json, EchoOutcome::render_text)
}

fn run_compare(
    compare: &CompareOptions,
    options: &PushOptions,
    json: bool,
    plot_path: Option<&Path>,
) -> Result<(), Error> {
    sys::install_interrupt_handler()?;
    let (rows, failed) = compare::run(compare, options)?;
    if let Some(path) = plot_path {
        let runs: Vec<&RunReport> = rows.iter().filter_map(|r| r.push.as_ref()).collect();
        std::fs::write(path, plot::svg(&runs))?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", compare::render_table(&rows, &compare.baseline));
    }
    match failed {
        0 => Ok(()),
        n => Err(format!("{n} measurement(s) failed").into()),
    }
}

/// Prints `report` as JSON or as `text` renders it.
fn print_report<T: Serialize>(report: &T, json: bool, text: fn(&T) -> String) -> Result<(), Error> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", text(report));
    }
    Ok(())
}

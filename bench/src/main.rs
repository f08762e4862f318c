//! `wspush-bench`: measures WebSocket push servers that follow the wspush
//! contract (upgrade on any path; each stdin line is broadcast as one text
//! message to every client), next to a bare-epoll reference in the same run.
//!
//! - `floor`: the bare reference server itself;
//! - `push`: spawn one server, open N idle connections, measure its memory
//!   per connection, broadcast K messages and time their fan-out;
//! - `compare`: `push` over several servers in turn, one table.

mod clients;
mod conn;
mod floor;
mod frame;
mod handshake;
mod message;
mod procfs;
mod push;
mod report;
mod server;
mod stats;
mod sys;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::push::PushOptions;
use crate::report::RunReport;
use crate::server::ServerSpec;

#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Bare epoll push server: upgrades, holds sockets, writes each stdin line
    /// as one pre-encoded text frame to every socket. Runs until killed.
    Floor {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: SocketAddr,
    },
    /// Spawn a server, open idle connections, measure memory per connection,
    /// then broadcast messages one at a time and measure their fan-out.
    Push {
        /// Server command, run as `sh -c "exec COMMAND"`; `{port}` is replaced
        /// by the port, else the port is appended. `floor` runs this
        /// program's floor server.
        #[arg(long)]
        spawn: String,
        /// Name of the server in the report [default: `floor` for the
        /// floor, else `server`].
        #[arg(long)]
        label: Option<String>,
        #[command(flatten)]
        options: PushOptions,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run `push` against each server in turn (for every round) and print one table.
    Compare {
        /// `NAME=COMMAND` as for `push --spawn`, or just `floor`; repeatable.
        #[arg(long = "server", required = true)]
        servers: Vec<ServerSpec>,
        /// How many times to measure every server, alternating between them.
        #[arg(long, default_value_t = 1)]
        rounds: u32,
        /// Server whose fan-out the `×base` column divides by.
        #[arg(long, default_value = server::FLOOR)]
        baseline: String,
        #[command(flatten)]
        options: PushOptions,
        /// Print all reports as a JSON array instead of the table.
        #[arg(long)]
        json: bool,
    },
}

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Floor { listen } => floor::run(listen).map_err(Error::from),
        Command::Push {
            spawn,
            label,
            options,
            json,
        } => {
            let label = label.unwrap_or_else(|| {
                let floor = spawn.trim() == server::FLOOR;
                (if floor { server::FLOOR } else { "server" }).to_string()
            });
            run_push(
                ServerSpec {
                    label,
                    command: spawn,
                },
                &options,
                json,
            )
        }
        Command::Compare {
            servers,
            rounds,
            baseline,
            options,
            json,
        } => run_compare(&servers, rounds, &baseline, &options, json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wspush-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_push(spec: ServerSpec, options: &PushOptions, json: bool) -> Result<(), Error> {
    sys::install_interrupt_handler()?;
    let report = push::run(&spec, options, 1)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render_text());
    }
    Ok(())
}

fn run_compare(
    servers: &[ServerSpec],
    rounds: u32,
    baseline: &str,
    options: &PushOptions,
    json: bool,
) -> Result<(), Error> {
    sys::install_interrupt_handler()?;
    let mut runs: Vec<RunReport> = Vec::new();
    let mut failed = 0;
    for round in 1..=rounds {
        for spec in servers {
            // One server failing does not void the others' numbers.
            match push::run(spec, options, round) {
                Ok(report) => {
                    eprint!("{}", report.render_text());
                    runs.push(report);
                }
                Err(_) if sys::interrupted() => return Err("interrupted".into()),
                Err(e) => {
                    eprintln!("[{}] round {round} failed: {e}", spec.label);
                    failed += 1;
                }
            }
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&runs)?);
    } else {
        print!("{}", report::render_table(&runs, baseline));
    }
    match failed {
        0 => Ok(()),
        n => Err(format!("{n} run(s) failed").into()),
    }
}

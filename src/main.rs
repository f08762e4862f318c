//! The `wspush` binary: flags, logging, and standard input → broadcasts.

use std::io::{self, BufReader};
use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use wspush::input::{pump_lines, PumpEnd};
use wspush::{Config, Server, SlowConsumerPolicy, MAX_MESSAGE_LIMIT};

/// A WebSocket push server: every line on standard input is broadcast as
/// one text message to every connected client.
#[derive(Debug, Parser)]
#[command(
    version,
    after_help = "Example:\n  tail -f feed | wspush --listen 0.0.0.0:8080 --path /ws\n\n\
                  Standard input: each line (without its \\n or \\r\\n) is one text message; an empty\n\
                  line is an empty message; lines that are not UTF-8 or exceed --max-message-bytes are\n\
                  skipped with a warning. End of input does not stop the server; SIGINT/SIGTERM do.\n\
                  Logging: RUST_LOG=debug|info|warn (default info)."
)]
struct Cli {
    /// Address to listen on, e.g. 127.0.0.1:8080 or 0.0.0.0:8080.
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// Serve WebSocket upgrades only on this path (other paths get 404).
    #[arg(long, value_name = "PATH")]
    path: Option<String>,
    /// Echo every client message back (conformance testing) instead of discarding it.
    #[arg(long)]
    echo: bool,
    /// Largest message accepted from a client or broadcast, in bytes.
    #[arg(long, value_name = "N", default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1..=MAX_MESSAGE_LIMIT))]
    max_message_bytes: u64,
    /// Most connections held at once; more get HTTP 503.
    #[arg(long, value_name = "N", default_value_t = 1_000_000, value_parser = positive)]
    max_connections: usize,
    /// Output a connection may have queued before the slow-consumer policy applies, in bytes.
    #[arg(long, value_name = "N", default_value_t = 1 << 20, value_parser = positive)]
    max_queued_bytes: usize,
    /// What a connection whose queue is full gets instead of a broadcast.
    #[arg(long, value_name = "POLICY", default_value = "close")]
    slow_consumer: SlowConsumer,
}

/// `--slow-consumer` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum SlowConsumer {
    /// Close it with 1008 (policy violation).
    Close,
    /// Skip the message for it.
    Drop,
}

fn positive(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// clap's error without its usage and hint paragraphs, on one line.
fn one_line(rendered: &str) -> String {
    let message = rendered.split("\n\n").next().unwrap_or(rendered);
    let message = message.trim_start_matches("error: ");
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("wspush: {}", one_line(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match serve(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("wspush: {message}");
            ExitCode::FAILURE
        }
    }
}

fn serve(cli: Cli) -> Result<(), String> {
    let config = Config {
        listen: cli.listen,
        path: cli.path,
        echo: cli.echo,
        max_message_bytes: cli.max_message_bytes,
        max_connections: cli.max_connections,
        max_queued_bytes: cli.max_queued_bytes,
        slow_consumer: match cli.slow_consumer {
            SlowConsumer::Close => SlowConsumerPolicy::Close,
            SlowConsumer::Drop => SlowConsumerPolicy::Drop,
        },
        ..Config::default()
    };
    let max_line = config.max_message_bytes as usize;
    let mut server = Server::bind(config.clone())
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    log::info!(
        "listening on {} (path {}, {} mode)",
        server.local_addr(),
        config.path.as_deref().unwrap_or("any"),
        if config.echo { "echo" } else { "push" }
    );
    let handle = server.handle();
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(
            move || match pump_lines(BufReader::new(io::stdin().lock()), &handle, max_line) {
                PumpEnd::Eof => log::info!("standard input closed; still serving"),
                PumpEnd::ServerGone => {}
                PumpEnd::Failed(e) => {
                    log::warn!("reading standard input failed: {e}; still serving")
                }
            },
        )
        .map_err(|e| format!("cannot start the input thread: {e}"))?;
    server.run().map_err(|e| format!("event loop failed: {e}"))
}

//! `compare`: `push` and `echo` over several servers, alternating, for a
//! number of rounds; one table with a column per headline number.
//!
//! Every other round runs the servers in reverse order, so that no server
//! always has the same place: on this VM the first setup after a pause
//! tended to be the fastest (cause unknown: the VM handing freed memory
//! back to its host was ruled out, README), and with a fixed order the
//! first server got that place in every round.

use serde::Serialize;

use crate::client::dial::Transports;
use crate::observe::format;
use crate::observe::sys;
use crate::report::{RunReport, StreamReport};
use crate::scenario::echo::{self, EchoOptions, EchoOutcome};
use crate::scenario::push::{self, PushOptions};
use crate::target::server::ServerSpec;
use crate::Error;

/// Parameters of a comparison besides the push options.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareOptions {
    /// `NAME=COMMAND` as for `push --spawn`, or `floor [OPTIONS]`;
    /// repeatable. The server must echo for the echo columns (wspush:
    /// `--echo`; the floor and the peers always do).
    #[arg(long = "server", required_unless_present_any = ["deflate_servers", "sse_servers"])]
    pub servers: Vec<ServerSpec>,
    /// `NAME=COMMAND` as for `--server`, measured with clients that offer
    /// permessage-deflate (`push --deflate`, `echo --deflate`); repeatable,
    /// measured in the rounds after the `--server`s.
    #[arg(long = "deflate-server")]
    pub deflate_servers: Vec<ServerSpec>,
    /// `NAME=COMMAND` as for `--server`, measured with clients that open
    /// event streams (`push --transport sse`; no echo: they only
    /// receive); repeatable, measured in the rounds after the others.
    #[arg(long = "sse-server")]
    pub sse_servers: Vec<ServerSpec>,
    /// How many times to measure every server, alternating between them
    /// (in reverse order every other round).
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Server whose setup rate and fan-out the `×base` columns divide by.
    #[arg(long, default_value = crate::target::server::FLOOR)]
    pub baseline: String,
    /// Skip the echo measurement.
    #[arg(long)]
    pub no_echo: bool,
    /// Echo: connections.
    #[arg(long, default_value_t = 1000)]
    pub echo_conns: usize,
    /// Echo: messages per second per connection.
    #[arg(long, default_value_t = 20.0)]
    pub echo_rate: f64,
    /// Echo: payload bytes.
    #[arg(long, default_value_t = 1024)]
    pub echo_bytes: usize,
    /// Echo: seconds of sending.
    #[arg(long, default_value_t = 10)]
    pub echo_secs: u64,
    /// Seconds of sending per step of the max-rate search.
    #[arg(long, default_value_t = 5)]
    pub search_secs: u64,
    /// Also search each server's highest echo rate with p99 under
    /// `--max-p99-ms` (see `echo --find-max-rate`).
    #[arg(long)]
    pub find_max_rate: bool,
    /// The p99 round-trip limit of the max-rate search, in ms.
    #[arg(long, default_value_t = 50.0)]
    pub max_p99_ms: f64,
}

impl CompareOptions {
    /// Every server with the clients it is measured with.
    fn servers(&self) -> Vec<(&ServerSpec, Clients)> {
        [
            (&self.servers, Clients::Plain),
            (&self.deflate_servers, Clients::Deflate),
            (&self.sse_servers, Clients::EventStream),
        ]
        .into_iter()
        .flat_map(|(servers, clients)| servers.iter().map(move |s| (s, clients)))
        .collect()
    }

    /// The echo options for a plain run (`find_max_rate` false) or the search.
    fn echo_options(&self, find_max_rate: bool, wait_quiet: u64) -> Result<EchoOptions, Error> {
        let secs = if find_max_rate {
            self.search_secs
        } else {
            self.echo_secs
        };
        let mut args = vec![
            "--conns".to_string(),
            self.echo_conns.to_string(),
            "--rate".into(),
            self.echo_rate.to_string(),
            "--payload-bytes".into(),
            self.echo_bytes.to_string(),
            "--secs".into(),
            secs.to_string(),
            "--max-p99-ms".into(),
            self.max_p99_ms.to_string(),
            "--wait-quiet".into(),
            wait_quiet.to_string(),
        ];
        if find_max_rate {
            args.push("--find-max-rate".into());
        }
        Ok(EchoOptions::from_args(&args)?)
    }
}

/// The clients a server is measured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Clients {
    /// As the push options say.
    Plain,
    /// Offering permessage-deflate.
    Deflate,
    /// Event streams, push only.
    EventStream,
}

/// One server in one round.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Label of the server.
    pub server: String,
    /// Round (from 1).
    pub round: u32,
    /// The push run.
    pub push: Option<RunReport>,
    /// The echo run at the fixed rate.
    pub echo: Option<EchoOutcome>,
    /// The max-rate search.
    pub max_rate: Option<EchoOutcome>,
}

/// Runs every measurement; a failing one does not stop the others. Every
/// report goes to standard error as it is done. Returns the rows and the
/// number of failed measurements.
pub fn run(options: &CompareOptions, push: &PushOptions) -> Result<(Vec<Row>, usize), Error> {
    let plain_echo = options.echo_options(false, push.wait_quiet)?;
    let plain_search = options.echo_options(true, push.wait_quiet)?;
    let servers = options.servers();
    let mut rows = Vec::new();
    let mut failed = 0;
    for round in 1..=options.rounds {
        for &(spec, clients) in round_order(&servers, round) {
            let deflate = clients == Clients::Deflate;
            let echoes = clients != Clients::EventStream;
            let with_deflate = |echo: &EchoOptions| EchoOptions {
                deflate,
                ..echo.clone()
            };
            let (echo, search) = (with_deflate(&plain_echo), with_deflate(&plain_search));
            let push = &PushOptions {
                deflate: deflate || push.deflate,
                transport: match clients {
                    Clients::EventStream => Transports::EventStream,
                    _ => push.transport,
                },
                ..push.clone()
            };
            let mut row = Row {
                server: spec.label.clone(),
                round,
                push: None,
                echo: None,
                max_rate: None,
            };
            let mut note = |what: &str, e: Error| -> Result<(), Error> {
                if sys::interrupted() {
                    return Err("interrupted".into());
                }
                eprintln!("[{}] round {round}: {what} failed: {e}", spec.label);
                failed += 1;
                Ok(())
            };
            match push::run(spec, push, round) {
                Ok(r) => {
                    eprint!("{}", r.render_text());
                    row.push = Some(r);
                }
                Err(e) => note("push", e)?,
            }
            if echoes && !options.no_echo {
                match echo::run(spec, &echo, round) {
                    Ok(r) => {
                        eprint!("{}", r.render_text());
                        row.echo = Some(r);
                    }
                    Err(e) => note("echo", e)?,
                }
            }
            if echoes && options.find_max_rate {
                match echo::run(spec, &search, round) {
                    Ok(r) => {
                        eprint!("{}", r.render_text());
                        row.max_rate = Some(r);
                    }
                    Err(e) => note("max-rate search", e)?,
                }
            }
            rows.push(row);
        }
    }
    Ok((rows, failed))
}

/// The servers in the order round `round` (from 1) runs them: as given in
/// odd rounds, reversed in even ones.
fn round_order<T>(servers: &[T], round: u32) -> Vec<&T> {
    let mut order: Vec<&T> = servers.iter().collect();
    if round.is_multiple_of(2) {
        order.reverse();
    }
    order
}

/// The comparison table; the `×base` columns divide each row's average
/// setup rate and median fan-out per connection by those of the `baseline`
/// server in the same round.
pub fn render_table(rows: &[Row], baseline: &str) -> String {
    let cells: Vec<Vec<(&str, String)>> =
        rows.iter().map(|r| table_row(r, rows, baseline)).collect();
    format::render_columns(&cells)
}

fn table_row(row: &Row, rows: &[Row], baseline: &str) -> Vec<(&'static str, String)> {
    let dash = || "-".to_string();
    let fanout = |r: &Row| r.push.as_ref().and_then(|p| p.broadcast.per_conn_us);
    let setup_rate = |r: &Row| r.push.as_ref().map(|p| p.connections.rate.average);
    let base = rows
        .iter()
        .find(|r| r.server == baseline && r.round == row.round);
    let ratio = |value: Option<f64>, base: Option<f64>| match (value, base) {
        (Some(v), Some(b)) if b > 0.0 => format!("{:.2}", v / b),
        _ => dash(),
    };
    let fanout_ratio = ratio(
        fanout(row).map(|s| s.median),
        base.and_then(fanout).map(|s| s.median),
    );
    let setup_ratio = ratio(setup_rate(row), base.and_then(setup_rate));
    let p = row.push.as_ref();
    let push_cell = |f: &dyn Fn(&RunReport) -> String| p.map_or_else(dash, f);
    let echo = match &row.echo {
        Some(EchoOutcome::One(e)) => Some(&**e),
        _ => None,
    };
    let echo_cell = |f: &dyn Fn(&echo::EchoReport) -> String| echo.map_or_else(dash, f);
    let mut cells = vec![
        ("server", row.server.clone()),
        ("round", row.round.to_string()),
        ("open", push_cell(&|p| p.connections.open.to_string())),
        ("failed", push_cell(&|p| p.connections.failed.to_string())),
        (
            "setup/s",
            push_cell(&|p| format!("{:.0}", p.connections.rate.average)),
        ),
        ("setup ×base", setup_ratio),
        (
            "slowest s",
            push_cell(&|p| {
                p.connections
                    .rate
                    .slowest_second
                    .map_or_else(dash, |n| n.to_string())
            }),
        ),
        (
            "setup µs srv/cli/irq/all",
            push_cell(&|p| {
                format!(
                    "{:.0}/{:.0}/{:.0}/{:.0}",
                    p.cpu.server_setup_us_per_conn,
                    p.cpu.client_setup_us_per_conn,
                    p.cpu.interrupts_setup_us_per_conn,
                    p.cpu.machine_setup_us_per_conn
                )
            }),
        ),
        (
            "RSS B/conn",
            push_cell(&|p| format!("{:.1}", p.memory.rss_per_conn)),
        ),
        (
            "PSS B/conn",
            push_cell(&|p| format!("{:.1}", p.memory.pss_per_conn)),
        ),
        (
            "fan-out µs/conn",
            fanout(row).map_or_else(dash, |s| format!("{:.2}", s.median)),
        ),
        ("×base", fanout_ratio),
        (
            "wire/plain",
            push_cell(&|p| {
                let payloads = p.delivery.payloads;
                if payloads.compressed == 0 {
                    return dash();
                }
                format!("{:.3}", payloads.ratio())
            }),
        ),
        (
            "cpu µs/deliv",
            push_cell(&|p| format!("{:.2}", p.cpu.server_us_per_delivery)),
        ),
        (
            "idle cpu %",
            push_cell(&|p| format!("{:.2}", p.cpu.idle_percent)),
        ),
        (
            "lost/dup/ooo",
            push_cell(&|p| {
                format!(
                    "{}/{}/{}",
                    p.delivery.lost, p.delivery.duplicates, p.delivery.out_of_order
                )
            }),
        ),
        (
            "echo cpu %",
            echo_cell(&|e| format!("{:.1}", e.server_cpu_percent)),
        ),
        (
            "echo µs/msg",
            echo_cell(&|e| format!("{:.2}", e.server_us_per_echo)),
        ),
        (
            "echo p99 ms",
            echo_cell(&|e| format!("{:.2}", e.rtt.p99_us / 1e3)),
        ),
    ];
    cells.extend(stream_cells(row, rows, base));
    if let Some(EchoOutcome::MaxRate(m)) = &row.max_rate {
        cells.push((
            "max msg/s/conn",
            match (m.best_rate, m.client_limited) {
                (Some(r), true) => format!("≥{r:.0}"),
                (Some(r), false) => format!("{r:.0}"),
                (None, _) => dash(),
            },
        ));
    } else if rows.iter().any(|r| r.max_rate.is_some()) {
        cells.push(("max msg/s/conn", dash()));
    }
    cells
}

/// The stream columns, where any row has streams: the burst's completion
/// time (and over the baseline's), deliveries a second and p99; the feed's
/// p99; the highest feed rate found.
fn stream_cells(row: &Row, rows: &[Row], base: Option<&Row>) -> Vec<(&'static str, String)> {
    let stream = |r: &Row, kind: &str| {
        r.push
            .as_ref()
            .and_then(|p| p.streams.iter().find(|s| s.kind == kind).cloned())
    };
    let any = |kind: &str| rows.iter().any(|r| stream(r, kind).is_some());
    let dash = || "-".to_string();
    let mut cells = Vec::new();
    if any("burst") {
        let burst = stream(row, "burst");
        let base = base.and_then(|b| stream(b, "burst"));
        let cell = |f: &dyn Fn(&StreamReport) -> String| burst.as_ref().map_or_else(dash, f);
        cells.push(("burst s", cell(&|b| format!("{:.3}", b.completion_secs))));
        cells.push((
            "burst ×base",
            match (&burst, &base) {
                (Some(b), Some(x)) if x.completion_secs > 0.0 => {
                    format!("{:.2}", b.completion_secs / x.completion_secs)
                }
                _ => dash(),
            },
        ));
        cells.push((
            "burst deliv/s",
            cell(&|b| format!("{:.0}", b.deliveries_per_sec)),
        ));
        cells.push((
            "burst p50/p99 ms",
            cell(&|b| {
                format!(
                    "{:.1}/{:.1}",
                    b.latency.p50_us / 1e3,
                    b.latency.p99_us / 1e3
                )
            }),
        ));
    }
    if any("feed") {
        let feed = stream(row, "feed");
        let cell = |f: &dyn Fn(&StreamReport) -> String| feed.as_ref().map_or_else(dash, f);
        cells.push((
            "feed lines/s",
            cell(&|f| format!("{:.0}", f.rate.unwrap_or_default())),
        ));
        cells.push((
            "feed p99 ms",
            cell(&|f| format!("{:.1}", f.latency.p99_us / 1e3)),
        ));
    }
    if rows
        .iter()
        .any(|r| r.push.as_ref().is_some_and(|p| !p.feed_search.is_empty()))
    {
        cells.push((
            "max feed/s",
            row.push
                .as_ref()
                .and_then(|p| p.max_feed_rate)
                .map_or_else(dash, |r| format!("{r:.0}")),
        ));
    }
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(server: &str, round: u32, per_conn: f64, setup_rate: f64) -> Row {
        let mut push = crate::report::sample(server, round, [per_conn; 3]);
        push.connections.rate.average = setup_rate;
        Row {
            server: server.into(),
            round,
            push: Some(push),
            echo: None,
            max_rate: None,
        }
    }

    #[test]
    fn ratios_use_the_baseline_of_the_same_round() {
        let rows = [
            row("wspush", 1, 12.0, 900.0),
            row("floor", 1, 10.0, 1000.0),
            row("floor", 2, 20.0, 400.0),
            row("wspush", 2, 30.0, 500.0),
        ];
        let table = render_table(&rows, "floor");
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 5);
        assert!(
            lines[0].starts_with("server  round  open  failed  setup/s  setup ×base"),
            "{table}"
        );
        let header: Vec<&str> = lines[0].split("  ").filter(|c| !c.is_empty()).collect();
        let column = |name: &str| {
            let col = header.iter().position(|h| h.trim() == name).unwrap();
            move |line: &str| line.split_whitespace().nth(col).unwrap().to_string()
        };
        let (fanout, setup) = (column("×base"), column("setup ×base"));
        let fanouts: Vec<String> = lines[1..].iter().map(|l| fanout(l)).collect();
        assert_eq!(fanouts, ["1.20", "1.00", "1.00", "1.50"], "{table}");
        let setups: Vec<String> = lines[1..].iter().map(|l| setup(l)).collect();
        assert_eq!(setups, ["0.90", "1.00", "1.00", "1.25"], "{table}");
        let last3: Vec<&str> = lines[1].split_whitespace().rev().take(3).collect();
        assert_eq!(last3, ["-", "-", "-"], "no echo columns: {table}");
        let alone = render_table(&rows[..1], "floor");
        assert_eq!(alone.lines().nth(1).map(&fanout), Some("-".into()));
        assert_eq!(alone.lines().nth(1).map(&setup), Some("-".into()));
    }

    #[test]
    fn stream_columns_appear_with_streams_and_divide_by_the_baseline() {
        let mut rows = vec![
            row("floor", 1, 10.0, 1000.0),
            row("wspush", 1, 10.0, 1000.0),
        ];
        let bursts = [0.4, 0.1];
        for (r, secs) in rows.iter_mut().zip(bursts) {
            let push = r.push.as_mut().unwrap();
            push.streams
                .push(crate::report::sample_stream("burst", 200, secs));
        }
        rows[1].push.as_mut().unwrap().feed_search =
            vec![crate::report::sample_stream("feed", 500, 5.0)];
        rows[1].push.as_mut().unwrap().max_feed_rate = Some(640.0);
        let table = render_table(&rows, "floor");
        let header: Vec<&str> = table
            .lines()
            .next()
            .unwrap()
            .split("  ")
            .filter(|c| !c.is_empty())
            .collect();
        let cell = |line: usize, name: &str| {
            let col = header.iter().position(|h| h.trim() == name).unwrap();
            table
                .lines()
                .nth(line)
                .unwrap()
                .split_whitespace()
                .nth(col)
                .unwrap()
                .to_string()
        };
        assert_eq!(cell(1, "burst s"), "0.400", "{table}");
        assert_eq!(cell(2, "burst ×base"), "0.25", "{table}");
        assert_eq!(cell(2, "burst deliv/s"), "200000", "{table}");
        assert_eq!(cell(1, "max feed/s"), "-", "{table}");
        assert_eq!(cell(2, "max feed/s"), "640", "{table}");
        assert!(
            !table.contains("feed p99"),
            "no row has a plain feed: {table}"
        );
    }

    #[test]
    fn every_other_round_runs_the_servers_in_reverse() {
        let servers = ["floor", "wspush", "peer"];
        let order = |round| {
            round_order(&servers, round)
                .into_iter()
                .copied()
                .collect::<Vec<_>>()
        };
        assert_eq!(order(1), ["floor", "wspush", "peer"]);
        assert_eq!(order(2), ["peer", "wspush", "floor"]);
        assert_eq!(order(3), order(1));
        assert!(round_order(&[] as &[&str], 2).is_empty());
    }
}

//! The `push` measurement: open N idle connections through worker
//! processes, sample the server's memory and CPU, watch it idle, then
//! broadcast K messages one at a time and check and time every delivery;
//! optionally then streams: a burst of lines written back to back, a feed
//! at a steady rate, or a search for the highest rate a feed can have
//! with its p99 latency under a limit.

use std::net::{Ipv4Addr, SocketAddr};

use crate::client::dial::auto_sources;
use crate::client::pacing;
use crate::fleet::coordinator::{Fleet, Launch};
use crate::fleet::protocol::Plan;
use crate::observe::procfs;
use crate::report::{RunInfo, RunReport};
use crate::target::publish::ThroughPublish;
use crate::target::server::{start_server, ServerSpec};
use crate::target::Target;
use crate::Error;

mod options;
mod phases;
mod run;
mod setup;
mod streams;
mod summary;

pub use options::PushOptions;
pub use summary::Observations;

use run::Run;
use summary::summarise;

/// Descriptors a worker needs besides one per connection.
const SPARE_FDS: usize = 64;

/// Spawns `spec` on a free port, measures it with worker processes of
/// this program, and stops it (also on error).
pub fn run(spec: &ServerSpec, options: &PushOptions, round: u32) -> Result<RunReport, Error> {
    options.check()?;
    let (mut server, command, port) = start_server(
        spec,
        options.port,
        options.wait_quiet,
        options.start_timeout,
    )?;
    let info = RunInfo {
        server: spec.label.clone(),
        command,
        round,
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let launch = Launch::Processes {
        exe: std::env::current_exe()?,
    };
    match (options.publish, &options.publish_key) {
        (Some(publish), Some(key)) => {
            let commands = options.channel.is_some();
            let mut via = ThroughPublish::new(&mut server, publish, key, commands)?;
            measure(&mut via, addr, options, &launch, info)
        }
        _ => measure(&mut server, addr, options, &launch, info),
    }
}

/// Measures the listening server `target` at `addr`, phase by phase, with
/// workers launched as `launch` says.
pub fn measure(
    target: &mut dyn Target,
    addr: SocketAddr,
    options: &PushOptions,
    launch: &Launch,
    info: RunInfo,
) -> Result<RunReport, Error> {
    measure_hosts(target, &[addr], options, launch, info)
}

/// [`measure`] for a server on several hosts, `servers`: connection `i`
/// dials `servers[i % len]`; the probes go to the first.
pub fn measure_hosts(
    target: &mut dyn Target,
    servers: &[SocketAddr],
    options: &PushOptions,
    launch: &Launch,
    info: RunInfo,
) -> Result<RunReport, Error> {
    let addr = *servers.first().ok_or("no server address")?;
    options.check()?;
    let nofile = wspush::sys::raise_open_file_limit()? as usize;
    let workers = options.conns.div_ceil(options.per_worker);
    let per_process = match launch {
        Launch::Processes { .. } => options.per_worker.min(options.conns),
        Launch::Threads => options.conns,
    };
    if per_process + SPARE_FDS > nofile {
        return Err(format!(
            "{per_process} connections in one process need more than the {nofile} open files \
             a process may have: lower --per-worker"
        )
        .into());
    }
    let sources = match options.sources {
        Some(n) => n,
        None => auto_sources(options.conns)?,
    };
    let first = u32::from(options.first_source);
    let plan = Plan {
        servers: servers.to_vec(),
        sources: (0..u32::from(sources))
            .map(|i| Ipv4Addr::from(first + i))
            .collect(),
        first_id: 0,
        payload_bytes: options.payload_bytes,
        padding: options.padding,
        deflate: options.deflate,
        transports: options.transport,
        channel: options.channel.clone(),
        positions: options.positions,
        mixed: options.mixed,
        token: options.token.clone(),
        connect_timeout_ms: options.connect_timeout * 1000,
        receipts: None,
    };
    let shares = pacing::split_evenly(options.conns, workers);
    let fleet = Fleet::launch(launch, &plan, &shares)?;
    let label = info.server.clone();
    let mut run = Run {
        addr,
        target,
        fleet,
        options,
        label: &label,
        warnings: Vec::new(),
    };
    let observations = run.observe()?;
    let listeners = procfs::listeners(addr.port()).unwrap_or(0);
    Ok(summarise(
        info,
        options,
        run.fleet.len(),
        sources,
        listeners,
        observations,
        run.warnings,
    ))
}

//! The `wspush` binary: flags, logging, signals, standard input →
//! broadcasts, and `--processes` (a supervisor over single-threaded instances).

use std::ffi::OsString;
use std::io::{self, BufReader, Write};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use clap::Parser;
use signal_hook::consts::{SIGHUP, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::Signals;
use socket2::{Domain, Socket, Type};
use wspush::sys::raise_open_file_limit;

use cli::{config, instance_args, instance_number, one_line, Cli, Processes};
use input::PumpEnd;
use rlimit::{connection_capacity, instances_for};
use supervisor::{
    Policy, Signaled, Supervisor, CONTROL_FD_ENV, HISTORY_FD_ENV, HOST_FD_ENV, INSTANCE_ENV,
    LISTEN_FD_ENV, RESTARTS_ENV, STATUS_FD_ENV, TAKE_OVER_FD_ENV,
};

mod asks;
mod binary;
mod board;
mod chunks;
mod cli;
mod host_metrics;
mod input;
mod merge;
mod reexec;
mod rlimit;
mod sources;
mod status;
mod supervisor;
use asks::{AnswerTo, Asks};
mod upstream;
use board::Board;
use sources::stop::Carried;
use sources::Source;
use wspush::{Config, Handle, Server, SharedHistory};

/// The input sources' readers.
type Readers = Vec<Box<dyn Source>>;

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
    init_logging();
    // The signals handled are held in every thread this process starts
    // (they inherit the mask): only the main thread takes them, once its
    // loop runs, so that one that comes while the process re-executes
    // itself stays pending for its next image (see `reexec`).
    if let Err(e) = wspush::sys::hold_signals(&reexec::ALL_HANDLED) {
        eprintln!("wspush: cannot hold signals: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.processes {
        Some(processes) => supervise(&cli, processes),
        None => serve(cli),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("wspush: {message}");
            ExitCode::FAILURE
        }
    }
}

/// env_logger at `info` by default; an instance under a supervisor tags
/// its lines with its number.
fn init_logging() {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if let Ok(instance) = std::env::var(INSTANCE_ENV) {
        builder.format(move |buf, record| {
            writeln!(
                buf,
                "[{} {:5} wspush#{instance}] {}",
                buf.timestamp(),
                record.level(),
                record.args()
            )
        });
    }
    builder.init();
}

/// One instance: the ordinary single-threaded loop, alone or under a
/// supervisor, from its flags to its last upstream line; alone, it may
/// re-execute itself (SIGUSR2, see `reexec`), or be such a re-exec.
fn serve(cli: Cli) -> Result<(), String> {
    let mut config = config(&cli)?;
    let sink = cli::upstream_sink(&cli)?;
    // Before any socket listens: a signal that comes once one does is
    // handled, never fatal.
    let signals = Signals::new(reexec::HELD).map_err(|e| format!("cannot handle signals: {e}"))?;
    let resumed = reexec::resumed()?;
    if let Some(history) = inherited_memory(HISTORY_FD_ENV, "history")? {
        config.history_fd = Some(history);
    }
    if let Some(host) = inherited_memory(HOST_FD_ENV, "host's words")? {
        config.host_fd = Some(host);
    }
    config.metrics_board = host_metrics::instance_place(!cli.metrics_sums_only)?;
    let counted = Arc::new(OnceLock::<Handle>::new());
    let carried = match &resumed {
        Some(suspended) => Carried::decode(suspended.extra())?,
        None => Carried::default(),
    };
    let asks = Asks::new();
    let sources = lone_sources(&cli, &config, &counted, &carried, &asks)?;
    let recorder = lone_history(&cli, &mut config, &carried)?;
    let capacity = open_file_capacity();
    config.max_connections = max_connections(cli.max_connections, capacity);
    // A process a roll starts takes connections over: it starts, too, at
    // the raised priority of a handover.
    let urgent = inherited::<i32>(TAKE_OVER_FD_ENV).map(|_| wspush::sys::Urgent::raise());
    let mut server = match resumed {
        Some(suspended) => {
            config.first_position = suspended.next_position();
            let (server, _) =
                Server::resume(config.clone(), suspended).map_err(|e| e.to_string())?;
            server
        }
        None => listen(&config)?,
    };
    let mut status = supervisor_status()?;
    carry_connections(&mut server, status.as_mut())?;
    drop(urgent);
    // Presence questions come through the input: under a supervisor, the
    // answers go back on the status pipe; alone, to who asked.
    let answer_to = status::report(&mut server, status)?
        .unwrap_or_else(|| Arc::new(move |id, answer| asks.answer(id, answer)) as AnswerTo);
    log_listening(&server, &config, capacity);
    let handle = server.handle();
    if let Some(earlier) = inherited(RESTARTS_ENV) {
        handle.set_instance_restarts(earlier);
    }
    let upstream = upstream::spawn(&server, sink)?;
    let _ = counted.set(handle.clone());
    let stopping = Arc::new(AtomicBool::new(false));
    let (readers, stoppers) = match sources {
        Some(sources) => (Some(sources.readers), Some(sources.stoppers)),
        None => (None, None),
    };
    let input = spawn_input(
        &cli,
        &config,
        (readers, Arc::clone(&stopping)),
        recorder,
        (handle.clone(), answer_to),
    )?;
    let reexec = match stoppers {
        None => Err("only the supervisor (--processes) upgrades its instances"),
        Some(stoppers) => Ok(Arc::new(reexec::Reexec::new(
            on_disk(),
            stoppers,
            input,
            handle.clone(),
            stopping,
        ))),
    };
    stop_on_signals(signals, handle, reexec.clone())?;
    // Those that came meanwhile (or while an earlier image re-executed
    // this process) arrive now.
    wspush::sys::release_signals(&reexec::HELD)
        .map_err(|e| format!("cannot handle signals: {e}"))?;
    let ran = server.run().map_err(|e| format!("event loop failed: {e}"));
    let suspended = server.take_suspended();
    if suspended.is_some() {
        // Signals wait for the next image from here on.
        wspush::sys::hold_signals(&reexec::HELD)
            .map_err(|e| format!("cannot hold signals: {e}"))?;
    }
    // The last lines go out before the process ends (or re-executes).
    drop(server);
    if let Some(writer) = upstream {
        writer.finish(config.shutdown_timeout);
    }
    match (suspended, reexec) {
        (Some(suspended), Ok(reexec)) => Err(reexec.exec(suspended)),
        _ => ran,
    }
}

/// The path of this program's binary on disk, as it was started.
fn on_disk() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    // A binary renamed over since this process started reads so.
    match exe
        .to_str()
        .and_then(|path| path.strip_suffix(" (deleted)"))
    {
        Some(path) => PathBuf::from(path),
        None => exe,
    }
}

/// The number in the environment variable `name`: a descriptor, or a
/// count, a supervisor hands an instance.
fn inherited<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
}

/// Under a supervisor, a memory it shares with its instances (its history,
/// the host's words), through the descriptor named in `env`; alone, none.
fn inherited_memory(env: &str, what: &str) -> Result<Option<Arc<OwnedFd>>, String> {
    let Some(fd) = inherited(env) else {
        return Ok(None);
    };
    let fd = wspush::sys::inherited_fd(fd)
        .map_err(|e| format!("cannot read the supervisor's {what}: {e}"))?;
    Ok(Some(Arc::new(fd)))
}

/// Alone, the input sources, checked (and the publish listener bound)
/// before the server listens, each going on from what an earlier image
/// left it (`carried`); `GET /stats` reads the server's handle once
/// `counted` holds it. Under a supervisor, none: the instance reads its
/// supervisor.
fn lone_sources(
    cli: &Cli,
    config: &Config,
    counted: &Arc<OnceLock<Handle>>,
    carried: &Carried,
    asks: &Arc<Asks>,
) -> Result<Option<cli::Sources>, String> {
    if instance_number().is_some() {
        return Ok(None);
    }
    let counted = Arc::clone(counted);
    let stats = Box::new(move || {
        let Some(m) = counted.get().map(Handle::metrics) else {
            return String::new();
        };
        format!(
            "\"connections\":{},\"channels\":{}",
            m.connections_open, m.channels
        )
    });
    cli::sources_from(cli, config, (stats, Arc::clone(asks)), carried).map(Some)
}

/// Alone with a stream, the server keeps its history as a supervisor
/// does, apart from its loop: filled from the stream's tail, with the
/// stream's positions. Its reader's descriptor goes into `config`.
fn lone_history(
    cli: &Cli,
    config: &mut Config,
    carried: &Carried,
) -> Result<Option<input::Recorder>, String> {
    if cli.redis.is_none() || cli.redis_stream.is_none() {
        return Ok(None);
    }
    if let Some(kept) = &carried.history {
        // As an earlier image of this process left it; its loop reads it
        // as it is now, so no ring of an earlier layout needs writing.
        let mut recorder = input::Recorder::resumed(kept, config, cli.input)?;
        recorder.retire_former();
        let reader = recorder
            .reader_fd()
            .map_err(|e| format!("cannot share the history: {e}"))?;
        config.history_fd = Some(Arc::new(reader));
        return Ok(Some(recorder));
    }
    let history = SharedHistory::create(config)
        .map_err(|e| format!("cannot make the history's shared memory: {e}"))?;
    let reader = history
        .reader_fd()
        .map_err(|e| format!("cannot share the history: {e}"))?;
    config.history_fd = Some(Arc::new(reader));
    let max_message = config.max_message_bytes as usize;
    input::Recorder::new(history, cli.input, max_message)
        .map(Some)
        .map_err(|e| format!("cannot share the history: {e}"))
}

/// `--max-connections`, or as many as `capacity` (the open-file limit)
/// allows; a flag over that is warned about, and kept.
fn max_connections(flag: Option<usize>, capacity: u64) -> usize {
    match flag {
        Some(n) => {
            if n as u64 > capacity {
                log::warn!("--max-connections {n} exceeds the {capacity} connections the open-file limit allows");
            }
            n
        }
        None => capacity.clamp(1, usize::MAX as u64) as usize,
    }
}

/// The server: under a supervisor, on the listener the supervisor holds
/// for this instance's number; alone, on its own.
fn listen(config: &Config) -> Result<Server, String> {
    match inherited(LISTEN_FD_ENV) {
        Some(fd) => {
            let listener = wspush::sys::inherited_fd(fd)
                .map_err(|e| format!("cannot take the supervisor's listener: {e}"))?;
            Server::from_listener(config.clone(), listener.into())
        }
        None => Server::bind(config.clone()),
    }
    .map_err(|e| e.to_string())
}

/// Under a supervisor, the pipe on which this instance tells it how it
/// is (see [`supervisor::LISTENING`]).
fn supervisor_status() -> Result<Option<std::fs::File>, String> {
    let Some(fd) = inherited(STATUS_FD_ENV) else {
        return Ok(None);
    };
    let status = wspush::sys::inherited_fd(fd)
        .map_err(|e| format!("cannot take the supervisor's status pipe: {e}"))?;
    Ok(Some(std::fs::File::from(status)))
}

/// Under a supervisor: takes the connections of the process this one
/// replaces, if a roll started it (a refusal or a failure leaves them to
/// that process's drain), and watches for a successor to hand them to.
fn carry_connections(
    server: &mut Server,
    mut status: Option<&mut std::fs::File>,
) -> Result<(), String> {
    if let Some(fd) = inherited(TAKE_OVER_FD_ENV) {
        let socket = wspush::sys::inherited_fd(fd)
            .map_err(|e| format!("cannot take the predecessor's handover socket: {e}"))?;
        // The supervisor gives a handover longer than a start, and goes
        // on with its roll once this one took everything.
        let mut tell = |word: u8| match status.as_deref_mut() {
            Some(status) => status
                .write_all(&[word])
                .map_err(|e| format!("cannot tell the supervisor: {e}")),
            None => Ok(()),
        };
        tell(supervisor::TAKING_OVER)?;
        // Logged (and counted) by the server either way.
        if server.take_over(socket).is_ok() {
            tell(supervisor::TOOK_OVER)?;
        }
    }
    if let Some(fd) = inherited(CONTROL_FD_ENV) {
        let control = wspush::sys::inherited_fd(fd)
            .map_err(|e| format!("cannot take the supervisor's handover socket: {e}"))?;
        server
            .hand_over_on(control)
            .map_err(|e| format!("cannot watch the handover socket: {e}"))?;
    }
    Ok(())
}

/// Logs where the server listens, and its metrics.
fn log_listening(server: &Server, config: &Config, capacity: u64) {
    log::info!(
        "listening on {} (path {}, {} mode, up to {} connections; the open-file limit allows {capacity})",
        server.local_addr(),
        config.path.as_deref().unwrap_or("any"),
        if config.echo { "echo" } else { "push" },
        config.max_connections
    );
    if let Some(addr) = server.metrics_addr() {
        log::info!("metrics on http://{addr}/metrics");
    }
}

/// The input thread: an instance reads its supervisor, which holds the
/// sources and tells it the number of its first line; alone, the server
/// merges its sources as a supervisor does, and numbers from its first
/// position. The thread ends with the input (`stopped`: a re-exec
/// stopped it), giving back the recorder of a lone server's history.
fn spawn_input(
    cli: &Cli,
    config: &Config,
    (sources, stopped): (Option<Readers>, Arc<AtomicBool>),
    recorder: Option<input::Recorder>,
    (handle, answer_to): (Handle, AnswerTo),
) -> Result<JoinHandle<Option<input::Recorder>>, String> {
    let (mode, max_message) = (cli.input, config.max_message_bytes as usize);
    let max_line = input::max_line_bytes(mode, max_message);
    let merged = match sources {
        None => None,
        Some(sources) => Some(
            sources::spawn(sources, max_line, None)
                .map_err(|e| format!("cannot start the input readers: {e}"))?,
        ),
    };
    let first_line = config.first_position;
    std::thread::Builder::new()
        .name("input".into())
        .spawn(move || {
            let (ended, recorder) = match merged {
                Some(chunks) => {
                    let mut input = sources::Merged::new(chunks, recorder);
                    let ended = input::pump(
                        &mut input,
                        (&handle, &answer_to),
                        mode,
                        max_message,
                        first_line,
                    );
                    (ended, input.into_recorder())
                }
                None => {
                    let input = BufReader::new(io::stdin().lock());
                    let ended =
                        input::pump(input, (&handle, &answer_to), mode, max_message, first_line);
                    (ended, None)
                }
            };
            match ended {
                PumpEnd::Eof if stopped.load(Ordering::Acquire) => {
                    log::info!("every line read was handed to the loop before the re-exec")
                }
                PumpEnd::Eof => log::info!("the input ended; still serving"),
                PumpEnd::ServerGone => {}
                PumpEnd::Failed(e) => {
                    log::warn!("reading standard input failed: {e}; still serving")
                }
            }
            recorder
        })
        .map_err(|e| format!("cannot start the input thread: {e}"))
}

/// Raises the open-file limit to its maximum and returns how many
/// connections fit (unbounded if the limit cannot be read).
fn open_file_capacity() -> u64 {
    raise_open_file_limit().map_or_else(
        |e| {
            log::warn!("cannot read or raise the open-file limit: {e}");
            u64::MAX
        },
        connection_capacity,
    )
}

/// SIGTERM starts a drain (see [`Handle::drain`]), SIGUSR1 a hand-over to
/// a replacement ([`Handle::hand_over`], sent by a supervisor), SIGINT a
/// shutdown; a second one of them exits at once. SIGUSR2 re-executes a
/// lone server with the binary on disk (`reexec`), if it can (else it
/// says why not, as it does for SIGHUP, which restarts a supervisor's
/// instances): never the default death. `signals` were registered
/// before the server listened; those that came meanwhile are acted on
/// now.
fn stop_on_signals(
    mut signals: Signals,
    handle: Handle,
    reexec: Result<Arc<reexec::Reexec>, &'static str>,
) -> Result<(), String> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut stopping = false;
            for signal in signals.forever() {
                if signal == SIGHUP {
                    log::info!("signal {signal} (SIGHUP): only a supervisor (--processes) restarts its instances; ignored");
                    continue;
                }
                if signal == SIGUSR2 {
                    match (&reexec, stopping) {
                        (Ok(reexec), false) => reexec.begin(),
                        (_, true) => log::warn!("signal {signal} (SIGUSR2): the server is stopping; ignored"),
                        (Err(why), _) => log::warn!("signal {signal} (SIGUSR2): {why}; ignored, still serving"),
                    }
                    continue;
                }
                if stopping {
                    log::warn!("second signal: exiting now");
                    std::process::exit(130);
                }
                stopping = true;
                let _ = match signal {
                    SIGTERM => {
                        log::info!("signal {signal} (SIGTERM): draining");
                        handle.drain()
                    }
                    SIGUSR1 => {
                        log::info!("signal {signal} (SIGUSR1): handing over to a replacement");
                        handle.hand_over()
                    }
                    _ => {
                        log::info!("signal {signal}: closing connections");
                        handle.shutdown()
                    }
                };
            }
        })
        .map(drop)
        .map_err(|e| format!("cannot start the signal thread: {e}"))
}

/// `--processes N|auto`: start the instances of this binary with
/// `--reuse-port` on one address (a port 0 is resolved first so that all
/// share it) and supervise them.
fn supervise(cli: &Cli, processes: Processes) -> Result<(), String> {
    // Refuse bad settings once, before starting any instance.
    let config = config(cli)?;
    // Before any socket listens: a signal that comes once one does is
    // handled, never fatal (held until the loop runs, see `main`).
    let signaled = Signaled::register().map_err(|e| format!("cannot handle signals: {e}"))?;
    let image = reexec::supervisor_image()?;
    let (count, per_instance) = instance_count(cli, processes);
    let (listen, port_hold) = match &image {
        Some(image) => reexec::resumed_address(image)?,
        None => resolve_shared_address(cli.listen)?,
    };
    let (program, args) = instance_command(listen)?;
    let policy = Policy {
        on_exit: cli.on_instance_exit,
        max_backlog: cli.instance_backlog,
        stall_timeout: cli.instance_stall_timeout,
        // Instances get their drain and shutdown timeout, and some time to
        // exit after them.
        stop_grace: config.drain_grace
            + config.drain_time
            + config.shutdown_timeout
            + Duration::from_secs(5),
        merge_output: cli::upstream_sink(cli)?,
        upstream_grace: config.shutdown_timeout,
        shared_epoch: config.epoch,
    };
    // The sources are checked (and the publish listener bound) before any
    // instance starts; `GET /stats` reads the supervisor's board once it is.
    let board = Arc::new(OnceLock::<Board>::new());
    let stats = {
        let board = Arc::clone(&board);
        Box::new(move || board.get().map_or_else(String::new, Board::json))
    };
    let carried = image
        .as_ref()
        .map(|i| i.carried.clone())
        .unwrap_or_default();
    let asks = Asks::new();
    let sources = cli::sources_from(cli, &config, (stats, Arc::clone(&asks)), &carried)?;
    let max_message = config.max_message_bytes as usize;
    let recorder = match &image {
        Some(image) => input::Recorder::resumed(&image.history, &config, cli.input)?,
        None => {
            let history = SharedHistory::create(&config)
                .map_err(|e| format!("cannot make the history's shared memory: {e}"))?;
            input::Recorder::new(history, cli.input, max_message)
                .map_err(|e| format!("cannot share the history: {e}"))?
        }
    };
    // Instances run this process's own binary, whatever is on disk later;
    // SIGUSR2 upgrades them to what is on disk then.
    let own = Path::new("/proc/self/exe");
    let mut supervisor = match &image {
        Some(image) => Supervisor::resume(image, own, program, &args, policy, recorder, signaled),
        None => {
            // The supervisor holds a listener for each instance, which
            // every process of that instance serves in turn.
            let listeners = (0..count)
                .map(|_| wspush::listen(listen, true).map(OwnedFd::from))
                .collect::<io::Result<Vec<_>>>()
                .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
            Supervisor::start(own, program, &args, listeners, policy, recorder, signaled)
        }
    }
    .map_err(|e| e.to_string())?;
    supervisor.reexec_with(sources.stoppers.clone());
    supervisor.answer_to(asks);
    log::info!(
        "listening on {listen} with {count} instances, up to {per_instance} connections each"
    );
    let _ = board.set(supervisor.stats());
    if let Some(addr) = cli.metrics_listen {
        let board = (supervisor.metrics_board())
            .map_err(|e| format!("cannot read the metrics board: {e}"))?;
        host_metrics::serve(addr, board, !cli.metrics_sums_only)?;
    }
    let max_line = input::max_line_bytes(cli.input, max_message);
    let chunks = sources::spawn(sources.readers, max_line, Some(supervisor.waker()))
        .map_err(|e| format!("cannot start the input readers: {e}"))?;
    // Those that came meanwhile (or while an earlier image re-executed
    // this supervisor) arrive now.
    wspush::sys::release_signals(&supervisor::SIGNALS_HANDLED)
        .map_err(|e| format!("cannot handle signals: {e}"))?;
    match supervisor.run(chunks).map_err(|e| e.to_string())? {
        supervisor::RunEnd::Stopped => Ok(()),
        supervisor::RunEnd::ReExec(mut image, binary) => {
            image.listen = listen.to_string();
            for stopper in &sources.stoppers {
                stopper.carry(&mut image.carried);
            }
            Err(reexec::exec_supervisor(*image, port_hold, binary))
        }
    }
}

/// How many instances to start, and how many connections each holds:
/// `--processes N`, or with `auto` as many as the host's cores and
/// `--total-connections` ask (warned about when they hold fewer). The
/// instances inherit the raised open-file limit (and raise it again
/// themselves).
fn instance_count(cli: &Cli, processes: Processes) -> (usize, u64) {
    let per_instance = match cli.max_connections {
        Some(n) => (n as u64).min(open_file_capacity()),
        None => open_file_capacity(),
    };
    let count = match processes {
        Processes::Count(n) => n,
        Processes::Auto => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            instances_for(cli.total_connections, per_instance, cores)
        }
    };
    let holds = (count as u64).saturating_mul(per_instance);
    if let Some(total) = cli.total_connections.filter(|&total| total > holds) {
        log::warn!(
            "{count} instances hold at most {holds} connections ({per_instance} each), fewer than --total-connections {total}"
        );
    }
    (count, per_instance)
}

/// The program the instances run and their arguments: this process's own,
/// less the supervisor's, sharing `listen` behind `SO_REUSEPORT`.
fn instance_command(listen: SocketAddr) -> Result<(PathBuf, Vec<OsString>), String> {
    let program = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut args = instance_args(std::env::args_os().skip(1));
    args.extend([
        "--listen".into(),
        listen.to_string().into(),
        "--reuse-port".into(),
    ]);
    Ok((program, args))
}

/// For port 0, binds (without listening) an `SO_REUSEPORT` socket to pick
/// a port every instance can then share; the socket is held until the
/// supervisor exits so nothing else takes the port meanwhile.
fn resolve_shared_address(addr: SocketAddr) -> Result<(SocketAddr, Option<Socket>), String> {
    if addr.port() != 0 {
        return Ok((addr, None));
    }
    let reserve = || -> io::Result<(SocketAddr, Socket)> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        socket.set_reuse_port(true)?;
        socket.bind(&addr.into())?;
        let local = socket
            .local_addr()?
            .as_socket()
            .ok_or(io::ErrorKind::AddrNotAvailable)?;
        Ok((local, socket))
    };
    let (local, socket) = reserve().map_err(|e| format!("cannot pick a port on {addr}: {e}"))?;
    Ok((local, Some(socket)))
}

//! This process's re-exec with the binary on disk, in place (the same
//! process, so a pipeline or a service manager notices nothing).
//!
//! A lone server's SIGUSR2 ([`Reexec`]): the binary is checked first (it
//! must run and name, in its `--version` line, the state format this
//! build writes; else the server serves on). Then the sources stop where
//! nothing is lost (see `sources::stop`), every line read is delivered,
//! the loop suspends (see [`wspush::Suspended`]), and the process execs;
//! its next image goes on with the listener, every connection, the
//! history and the sources from where they stopped. The supervisor's own
//! exec and what its next image takes back are here too
//! ([`exec_supervisor`], [`supervisor_image`]). Should an exec fail, this
//! image runs again from the same state; should the new image not read
//! the state, it runs the earlier binary (kept open for it) again.

use std::ffi::{CString, OsString};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
use socket2::Socket;
use wspush::{Handle, Suspended};

use crate::binary::{check_binary, state_format_words};
use crate::input::Recorder;
use crate::sources::stop::{Carried, Stopper};
use crate::supervisor::image::Image;
use crate::supervisor::SIGNALS_HANDLED;

/// The memory file holding the state, named to the next image.
pub const RESUME_FD_ENV: &str = "WSPUSH_RESUME_FD";
/// The earlier image's binary, named to the next image: it runs it again
/// if it cannot read the state.
pub const EARLIER_FD_ENV: &str = "WSPUSH_EARLIER_BINARY_FD";

/// What a lone server needs to re-execute itself.
pub struct Reexec {
    /// The binary on disk (the path this one was started from).
    on_disk: PathBuf,
    /// Stop the sources, each at a boundary of what it hands over.
    stoppers: Vec<Arc<dyn Stopper>>,
    /// Set once they are asked to: the input's end is the re-exec's.
    stopping: Arc<AtomicBool>,
    /// The input thread, which ends once the input stopped and every
    /// line read was handed to the loop, giving back the recorder of the
    /// history, if this server keeps one apart from its loop.
    input: Mutex<Option<JoinHandle<Option<Recorder>>>>,
    /// The loop's handle.
    handle: Handle,
    /// A re-exec is under way.
    busy: AtomicBool,
    /// The checked binary and what the sources left, once the loop
    /// suspends.
    next: Mutex<Option<NextImage>>,
}

/// What the exec needs beside the server's state.
struct NextImage {
    /// The binary checked, open (what runs is what was checked).
    binary: std::fs::File,
    /// What the sources left the next image.
    carried: Carried,
}

impl Reexec {
    /// A re-exec of the binary at `on_disk`, stopping the sources with
    /// `stoppers` (and saying so in `stopping`), whose lines the thread
    /// `input` hands to `handle`'s loop.
    pub fn new(
        on_disk: PathBuf,
        stoppers: Vec<Arc<dyn Stopper>>,
        input: JoinHandle<Option<Recorder>>,
        handle: Handle,
        stopping: Arc<AtomicBool>,
    ) -> Reexec {
        Reexec {
            on_disk,
            stoppers,
            stopping,
            input: Mutex::new(Some(input)),
            handle,
            busy: AtomicBool::new(false),
            next: Mutex::new(None),
        }
    }

    /// SIGUSR2: checks the binary on disk and, if it reads this build's
    /// state, stops the input and suspends the loop (on a thread, so that
    /// other signals are heard meanwhile); [`Reexec::exec`] follows once
    /// the loop returned.
    pub fn begin(self: &Arc<Self>) {
        if self.busy.swap(true, Ordering::AcqRel) {
            log::warn!("SIGUSR2: a re-exec is under way already; ignored");
            return;
        }
        let this = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("reexec".into())
            .spawn(move || this.prepare());
        if let Err(e) = spawned {
            log::error!("cannot start the re-exec: {e}; serving on");
            self.busy.store(false, Ordering::Release);
        }
    }

    /// Checks, stops the input, suspends the loop.
    fn prepare(&self) {
        log::info!(
            "SIGUSR2: checking {} to re-execute this server with it",
            self.on_disk.display()
        );
        let (binary, version) = match check_binary(&self.on_disk) {
            Ok(checked) => checked,
            Err(why) => {
                log::error!(
                    "the re-exec is refused: {} {why}; serving on",
                    self.on_disk.display()
                );
                self.busy.store(false, Ordering::Release);
                return;
            }
        };
        if !version.ends_with(&state_format_words()) {
            log::error!(
                "the re-exec is refused: {} is {version:?}, which does not read this build's {}; serving on (restart it to run it)",
                self.on_disk.display(),
                state_format_words()
            );
            self.busy.store(false, Ordering::Release);
            return;
        }
        log::info!("re-executing as {version}: the input stops at a line's end first");
        self.stopping.store(true, Ordering::Release);
        for stopper in &self.stoppers {
            if let Err(e) = stopper.stop() {
                // Its thread was not woken: the re-exec waits until that
                // source ends by itself.
                log::error!("cannot stop an input source ({e}); the re-exec waits for it");
            }
        }
        let input = self.input.lock().unwrap_or_else(|e| e.into_inner()).take();
        let recorder = input.and_then(|input| input.join().ok().flatten());
        let mut carried = Carried::default();
        for stopper in &self.stoppers {
            stopper.carry(&mut carried);
        }
        if let Some(mut recorder) = recorder {
            match recorder.keep_for_next_image() {
                Ok(kept) => carried.history = Some(kept),
                Err(e) => log::error!(
                    "cannot keep the history for the next image ({e}): the next image starts a new one"
                ),
            }
        }
        *self.next.lock().unwrap_or_else(|e| e.into_inner()) = Some(NextImage { binary, carried });
        if self.handle.suspend().is_err() {
            log::warn!("the server ended before it could suspend");
        }
    }

    /// Once the loop returned suspended: saves `suspended` with what the
    /// sources left, and execs the checked binary (or,
    /// failing that, this one again). Returns only if neither runs.
    pub fn exec(&self, mut suspended: Suspended) -> String {
        let Some(next) = self.next.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return "the server suspended with no re-exec under way".into();
        };
        let connections = suspended.connections();
        suspended.set_extra(next.carried.encode());
        let state = match suspended.save() {
            Ok(fd) => fd,
            Err(e) => {
                return format!(
                "cannot keep the state for the next image: {e}; {connections} connections are lost"
            )
            }
        };
        let earlier = earlier_binary().map_or_else(String::new, |fd| fd.to_string());
        let new = format!("/proc/self/fd/{}", next.binary.as_raw_fd());
        log::info!("re-executing with {connections} connections");
        let e = image(&new, state, &earlier);
        log::error!("cannot run the new binary: {e}; running this one again");
        let e = image("/proc/self/exe", state, "");
        format!("cannot run this binary again either: {e}; {connections} connections are lost")
    }
}

/// The signals a lone server handles, held across its exec (see
/// [`wspush::sys::exec_holding_signals`]); its next image releases them
/// once it handles them.
pub const HELD: [i32; 5] = [SIGINT, SIGTERM, SIGUSR1, SIGHUP, SIGUSR2];

/// Every signal either kind of process handles: held in every thread but
/// the main one once its loop runs (see `main`).
pub const ALL_HANDLED: [i32; 6] = [SIGINT, SIGTERM, SIGUSR1, SIGHUP, SIGUSR2, SIGCHLD];

/// Execs `program` as this process's next image, with its arguments and
/// environment, naming the state's memory file and the earlier binary.
/// Returns only if it failed.
fn image(program: &str, state: i32, earlier: &str) -> std::io::Error {
    let mut vars = vec![(RESUME_FD_ENV, state.to_string())];
    if !earlier.is_empty() {
        vars.push((EARLIER_FD_ENV, earlier.to_string()));
    }
    exec_image(program, &vars, &HELD)
}

/// Execs `program` with this process's arguments and environment, `vars`
/// set (and this module's others unset), `held` signals held across.
/// Returns only if it failed.
fn exec_image(program: &str, vars: &[(&str, String)], held: &[i32]) -> std::io::Error {
    let cstring = |bytes: Vec<u8>| {
        CString::new(bytes).map_err(|_| std::io::Error::other("a NUL in an argument"))
    };
    let ours = [RESUME_FD_ENV, EARLIER_FD_ENV, SUPERVISOR_STATE_ENV];
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(name, _)| !ours.iter().any(|ours| name == ours))
        .collect();
    env.extend(vars.iter().map(|(name, value)| (name.into(), value.into())));
    let made = (|| {
        let program = cstring(program.as_bytes().to_vec())?;
        let argv = (std::env::args_os())
            .map(|arg| cstring(arg.into_vec()))
            .collect::<std::io::Result<Vec<_>>>()?;
        let env = (env.into_iter())
            .map(|(name, value)| {
                let mut pair = name.into_vec();
                pair.push(b'=');
                pair.extend(value.into_vec());
                cstring(pair)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok((program, argv, env))
    })();
    match made {
        Ok((program, argv, env)) => wspush::sys::exec_holding_signals(&program, &argv, &env, held),
        Err(e) => e,
    }
}

/// The state's memory file an earlier image named in `env`, and the
/// earlier binary's descriptor (empty if none), both taken out of the
/// environment (not for the processes this one starts, nor its next
/// image); `None` if this process was not re-executed.
fn named_state(env: &str) -> Result<Option<(i32, String)>, String> {
    let Some(state) = std::env::var(env).ok() else {
        return Ok(None);
    };
    let earlier = std::env::var(EARLIER_FD_ENV).unwrap_or_default();
    std::env::remove_var(env);
    std::env::remove_var(EARLIER_FD_ENV);
    let fd = state
        .parse()
        .map_err(|_| format!("{env} is not a descriptor: {state:?}"))?;
    Ok(Some((fd, earlier)))
}

/// This process's binary, open across an exec (for a next image that
/// cannot read the state to run it again): its descriptor, if it opens.
fn earlier_binary() -> Option<i32> {
    let file = std::fs::File::open("/proc/self/exe").ok()?;
    wspush::sys::keep_across_exec(file.as_fd(), true).ok()?;
    Some(file.into_raw_fd())
}

/// The memory file holding a supervisor's state, named to its next image.
pub const SUPERVISOR_STATE_ENV: &str = "WSPUSH_SUPERVISOR_STATE_FD";

/// The state an earlier image of this supervisor left, if it re-executed
/// it (its descriptors are taken as their owners are made).
pub fn supervisor_image() -> Result<Option<Image>, String> {
    let Some((fd, earlier)) = named_state(SUPERVISOR_STATE_ENV)? else {
        return Ok(None);
    };
    let cannot = |e: std::io::Error| format!("cannot read the supervisor's state: {e}");
    let file = std::fs::File::from(wspush::sys::adopt_fd(fd).map_err(cannot)?);
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut &file, &mut bytes).map_err(cannot)?;
    match Image::decode(&bytes) {
        Ok(image) => {
            if let Ok(fd) = earlier.parse::<i32>() {
                // The earlier binary is not needed any more.
                drop(wspush::sys::adopt_fd(fd));
            }
            Ok(Some(image))
        }
        Err(why) if !earlier.is_empty() => {
            log::error!("cannot read the earlier image's state ({why}): running the earlier binary again with it");
            wspush::sys::keep_across_exec(file.as_fd(), true).map_err(cannot)?;
            let fd = file.into_raw_fd();
            let program = format!("/proc/self/fd/{earlier}");
            let e = exec_image(
                &program,
                &[(SUPERVISOR_STATE_ENV, fd.to_string())],
                &SIGNALS_HANDLED,
            );
            Err(format!("cannot run the earlier binary again: {e}"))
        }
        Err(why) => Err(why),
    }
}

/// The address the instances listen on, and the socket holding its port,
/// as the earlier image left them.
pub fn resumed_address(image: &Image) -> Result<(SocketAddr, Option<Socket>), String> {
    let listen = image.listen.parse().map_err(|_| {
        format!(
            "the supervisor's state names no address: {:?}",
            image.listen
        )
    })?;
    let hold = match image.port_hold {
        Some(fd) => {
            Some(Socket::from(wspush::sys::adopt_fd(fd).map_err(|e| {
                format!("cannot take the port's socket: {e}")
            })?))
        }
        None => None,
    };
    Ok((listen, hold))
}

/// Execs the checked `binary` as the supervisor's next image with
/// `image` (and the socket holding the port); failing that, this binary
/// again. Returns only if neither runs.
pub fn exec_supervisor(
    mut image: Image,
    port_hold: Option<Socket>,
    binary: std::fs::File,
) -> String {
    let kept = |fd: OwnedFd| -> std::io::Result<i32> {
        wspush::sys::keep_across_exec(fd.as_fd(), true)?;
        Ok(fd.into_raw_fd())
    };
    if let Some(hold) = port_hold {
        match kept(hold.into()) {
            Ok(fd) => image.port_hold = Some(fd),
            Err(e) => return format!("cannot keep the port for the next image: {e}"),
        }
    }
    let state = wspush::sys::memory_file("wspush-supervisor", &image.encode()).and_then(kept);
    let state = match state {
        Ok(fd) => fd,
        Err(e) => return format!("cannot keep the state for the next image: {e}"),
    };
    let mut vars = vec![(SUPERVISOR_STATE_ENV, state.to_string())];
    if let Some(earlier) = earlier_binary() {
        vars.push((EARLIER_FD_ENV, earlier.to_string()));
    }
    let new = format!("/proc/self/fd/{}", binary.as_raw_fd());
    log::info!(
        "re-executing the supervisor with its {} instances",
        image.instances.len()
    );
    let e = exec_image(&new, &vars, &SIGNALS_HANDLED);
    log::error!("cannot run the new binary: {e}; running this one again");
    let e = exec_image("/proc/self/exe", &vars[..1], &SIGNALS_HANDLED);
    format!("cannot run this binary again either: {e}")
}

/// The state an earlier image of this process left, if it re-executed
/// it. One this build cannot read runs the earlier binary again with it
/// (which does not return); without one, the error.
pub fn resumed() -> Result<Option<Suspended>, String> {
    let Some((fd, earlier)) = named_state(RESUME_FD_ENV)? else {
        return Ok(None);
    };
    match Suspended::load(fd) {
        Ok(suspended) => {
            if let Ok(fd) = earlier.parse::<i32>() {
                // The earlier binary is not needed any more.
                drop(wspush::sys::inherited_fd(fd));
            }
            Ok(Some(suspended))
        }
        Err(e) if !earlier.is_empty() => {
            log::error!("cannot read the earlier image's state ({e}): running the earlier binary again with it");
            let e = image(&format!("/proc/self/fd/{earlier}"), fd, "");
            Err(format!(
                "cannot run the earlier binary again: {e}; its connections are lost"
            ))
        }
        Err(e) => Err(format!("cannot read the earlier image's state: {e}")),
    }
}

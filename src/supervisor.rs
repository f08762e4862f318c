//! `--processes N`: a small supervisor process that starts N ordinary
//! single-threaded instances of a server on one address (`SO_REUSEPORT`, so
//! the kernel spreads connections among them), hands each instance every
//! byte of its standard input in the same order, forwards SIGINT/SIGTERM,
//! and stops everything with an error if an instance dies.
//!
//! It sleeps on signals (SIGCHLD included) and on its input; it holds no
//! connection and does no polling, so its own CPU and memory stay negligible.

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::Duration;

use rustix::process::{kill_process, set_parent_process_death_signal, Pid, Signal};
use signal_hook::consts::{SIGALRM, SIGCHLD, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// The environment variable that tells an instance its number (1-based).
pub const INSTANCE_ENV: &str = "WSPUSH_INSTANCE";

/// Input copied to the instances per read.
const INPUT_CHUNK: usize = 64 * 1024;

/// Why the supervisor stopped with an error.
#[derive(Debug)]
pub enum SupervisorError {
    /// An instance exited while nothing asked it to.
    InstanceDied {
        /// Its number.
        instance: usize,
        /// Its process id.
        pid: u32,
        /// How it ended.
        status: ExitStatus,
    },
    /// Starting or watching the instances failed.
    Io(io::Error),
}

impl fmt::Display for SupervisorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SupervisorError::InstanceDied { instance, pid, status } => match (status.code(), status.signal()) {
                (Some(code), _) => write!(f, "instance {instance} (pid {pid}) exited with status {code}; stopped the others"),
                (_, Some(signal)) => write!(f, "instance {instance} (pid {pid}) was killed by signal {signal}; stopped the others"),
                _ => write!(f, "instance {instance} (pid {pid}) ended ({status}); stopped the others"),
            },
            SupervisorError::Io(e) => write!(f, "supervising instances failed: {e}"),
        }
    }
}

impl std::error::Error for SupervisorError {}

impl From<io::Error> for SupervisorError {
    fn from(e: io::Error) -> Self {
        SupervisorError::Io(e)
    }
}

/// One started instance.
#[derive(Debug)]
struct Instance {
    number: usize,
    child: Child,
    exited: Option<ExitStatus>,
}

/// Running instances and the signals that drive the supervisor.
#[derive(Debug)]
pub struct Supervisor {
    instances: Instances,
    inputs: Vec<ChildStdin>,
    signals: Signals,
}

impl Supervisor {
    /// Starts `count` instances of `program args…`, each with a piped
    /// standard input, its number in [`INSTANCE_ENV`], its own process
    /// group (a terminal's Ctrl-C reaches only the supervisor, which
    /// forwards it once) and SIGTERM as its parent-death signal (no orphans
    /// if the supervisor is killed).
    pub fn start(
        program: &Path,
        args: &[OsString],
        count: usize,
    ) -> Result<Supervisor, SupervisorError> {
        // Registered before any child exists, so no SIGCHLD is missed.
        // SIGALRM is the supervisor's own "grace period over" alarm.
        let signals = Signals::new([SIGINT, SIGTERM, SIGCHLD, SIGALRM])?;
        let mut supervisor = Supervisor {
            instances: Instances(Vec::with_capacity(count)),
            inputs: Vec::with_capacity(count),
            signals,
        };
        for number in 1..=count {
            let mut command = Command::new(program);
            command
                .args(args)
                .env(INSTANCE_ENV, number.to_string())
                .stdin(Stdio::piped())
                .process_group(0);
            // SAFETY: the closure runs in the forked child before exec. It
            // makes one async-signal-safe system call (prctl) and neither
            // allocates nor touches locks, which is all that is allowed there.
            unsafe {
                command.pre_exec(|| {
                    set_parent_process_death_signal(Some(Signal::TERM)).map_err(io::Error::from)
                });
            }
            let mut child = match command.spawn() {
                Ok(child) => child,
                Err(e) => {
                    supervisor.instances.stop_all();
                    return Err(e.into());
                }
            };
            supervisor.inputs.extend(child.stdin.take());
            supervisor.instances.0.push(Instance {
                number,
                child,
                exited: None,
            });
        }
        Ok(supervisor)
    }

    /// Copies `input` to every instance until it ends (then closes their
    /// inputs; instances keep serving), and supervises until all instances
    /// have exited: after SIGINT/SIGTERM (forwarded to each) that is
    /// success, otherwise the first instance to die is the error.
    /// Instances still running `stop_grace` after being told to stop are
    /// killed.
    pub fn run(
        self,
        input: impl Read + Send + 'static,
        stop_grace: Duration,
    ) -> Result<(), SupervisorError> {
        let Supervisor {
            mut instances,
            inputs,
            mut signals,
        } = self;
        std::thread::Builder::new()
            .name("fan-out".into())
            .spawn(move || copy_to_all(input, inputs))?;
        let mut failure = None;
        let mut stopping = false;
        let mut forever = signals.forever();
        while instances.0.iter().any(|i| i.exited.is_none()) {
            let Some(signal) = forever.next() else { break };
            match signal {
                SIGCHLD => {
                    let died = instances.reap()?;
                    if let (Some(died), false) = (died, stopping) {
                        failure = Some(died);
                        stopping = true;
                        instances.signal_all(Signal::TERM);
                        alarm_after(stop_grace);
                    }
                }
                SIGALRM => {
                    log::warn!(
                        "instances still running {stop_grace:?} after SIGTERM: killing them"
                    );
                    for instance in instances.0.iter_mut().filter(|i| i.exited.is_none()) {
                        let _ = instance.child.kill();
                    }
                }
                _ => {
                    log::info!(
                        "received signal {signal}: stopping {} instances",
                        instances.0.len()
                    );
                    if !stopping {
                        stopping = true;
                        alarm_after(stop_grace);
                    }
                    instances.signal_all(if signal == SIGINT {
                        Signal::INT
                    } else {
                        Signal::TERM
                    });
                }
            }
        }
        failure.map_or(Ok(()), Err)
    }
}

/// The started instances.
#[derive(Debug)]
struct Instances(Vec<Instance>);

impl Instances {
    /// Records every instance that exited; returns the first, as an error.
    fn reap(&mut self) -> io::Result<Option<SupervisorError>> {
        let mut died = None;
        for instance in self.0.iter_mut().filter(|i| i.exited.is_none()) {
            instance.exited = instance.child.try_wait()?;
            if let (Some(status), None) = (instance.exited, &died) {
                died = Some(SupervisorError::InstanceDied {
                    instance: instance.number,
                    pid: instance.child.id(),
                    status,
                });
            }
        }
        Ok(died)
    }

    /// Sends `signal` to every instance not yet reaped (so its pid is
    /// still its own).
    fn signal_all(&self, signal: Signal) {
        for instance in self.0.iter().filter(|i| i.exited.is_none()) {
            let _ = kill_process(Pid::from_child(&instance.child), signal);
        }
    }

    /// Kills and reaps whatever was started (start-up failed half way).
    fn stop_all(&mut self) {
        for instance in &mut self.0 {
            let _ = instance.child.kill();
            let _ = instance.child.wait();
        }
    }
}

/// Raises SIGALRM in this process after `delay` (the supervisor's loop
/// then kills what is left).
fn alarm_after(delay: Duration) {
    let _ = std::thread::Builder::new()
        .name("stop-timer".into())
        .spawn(move || {
            std::thread::sleep(delay);
            let _ = signal_hook::low_level::raise(SIGALRM);
        });
}

/// Copies `input` to every output in order, chunk by chunk; an output
/// whose instance died is dropped. Ends at end of input, closing them all.
fn copy_to_all(mut input: impl Read, mut outputs: Vec<ChildStdin>) {
    let mut chunk = vec![0u8; INPUT_CHUNK];
    loop {
        let n = match input.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::warn!("reading standard input failed: {e}");
                break;
            }
        };
        outputs.retain_mut(|out| out.write_all(&chunk[..n]).is_ok());
    }
    log::info!("standard input closed; instances keep serving");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<OsString> {
        vec!["-c".into(), script.into()]
    }

    #[test]
    fn a_dying_instance_stops_the_others_and_is_reported() {
        let script = "if [ \"$WSPUSH_INSTANCE\" = 2 ]; then exit 3; fi; exec sleep 30";
        let supervisor = Supervisor::start(Path::new("/bin/sh"), &sh(script), 3).unwrap();
        let started = std::time::Instant::now();
        let grace = Duration::from_secs(10);
        match supervisor.run(io::empty(), grace).unwrap_err() {
            SupervisorError::InstanceDied {
                instance, status, ..
            } => {
                assert_eq!((instance, status.code()), (2, Some(3)));
            }
            other => panic!("{other}"),
        }
        assert!(started.elapsed() < grace, "the others stopped on SIGTERM");
    }
}

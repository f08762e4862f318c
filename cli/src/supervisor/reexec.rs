//! The supervisor's own upgrade: SIGUSR2 with a binary that reads this
//! build's state re-executes the supervisor first (the same process, so
//! its instances stay its children, and a service manager sees the same
//! pid), then its next image rolls the instances to that binary. Before
//! the exec, the sources stop where nothing is lost and every chunk read is
//! queued for the instances; the state ([`Image`]) keeps the instances,
//! their processes with their pipes and what is queued for them, the
//! history and the input's numbering.

use std::os::fd::IntoRawFd;

use super::image::{Image, InstanceImage, Pending, ProcImage, RunEnd, FORMAT};
use super::*;
use crate::sources::stop::Stopper;

/// Keeps `fd` open across the exec, and gives up owning it: its number,
/// for the image.
fn kept(fd: impl Into<OwnedFd>) -> io::Result<i32> {
    let fd: OwnedFd = fd.into();
    wspush::sys::keep_across_exec(fd.as_fd(), true)?;
    Ok(fd.into_raw_fd())
}

impl Supervisor {
    /// Lets SIGUSR2 re-execute the supervisor before it upgrades its
    /// instances, stopping the sources with `stoppers`.
    pub fn reexec_with(&mut self, stoppers: Vec<Arc<dyn Stopper>>) {
        self.stoppers = stoppers;
    }

    /// A new binary that reads this build's state was checked: stops the
    /// input for the re-exec, if this supervisor can re-execute now
    /// (false: the caller upgrades the instances only).
    pub(super) fn begin_reexec(
        &mut self,
        binary: std::fs::File,
        version: &str,
    ) -> Result<(), std::fs::File> {
        if !version.ends_with(&crate::binary::state_format_words()) {
            log::info!("{version} does not read this supervisor's state: it keeps running its own binary; the instances are upgraded");
            return Err(binary);
        }
        let busy = self
            .procs
            .iter()
            .any(|(_, p)| !matches!(p.role, Role::Serving));
        if busy {
            log::info!("a process is starting or handing over: the supervisor keeps running its own binary; the instances are upgraded");
            return Err(binary);
        }
        if self.recorder.has_former() {
            log::info!("processes still read the history's earlier layout: the supervisor keeps running its own binary; the instances are upgraded");
            return Err(binary);
        }
        if self.stoppers.is_empty() {
            return Err(binary);
        }
        for stopper in &self.stoppers {
            if let Err(e) = stopper.stop() {
                log::error!("cannot stop an input source ({e}); the re-exec waits for it");
            }
        }
        log::info!("re-executing the supervisor as {version} (its instances next): the input stops at a line's end first");
        self.pending_reexec = Some(Pending { binary });
        Ok(())
    }

    /// Every chunk read was queued for the instances: the state for the
    /// next image, every descriptor it names kept open across the exec.
    pub(super) fn suspend(mut self) -> io::Result<RunEnd> {
        let Some(pending) = self.pending_reexec.take() else {
            return Ok(RunEnd::Stopped);
        };
        // From here on, signals wait for the next image (see `main`); one
        // the loop has not acted on yet is made pending again for it.
        wspush::sys::hold_signals(&SIGNALS_HANDLED)?;
        for signal in SIGNALS_HANDLED {
            if self.take_signal(signal) {
                wspush::sys::raise_held(signal)?;
            }
        }
        let registry = self.poll.registry();
        let mut outputs: std::collections::HashMap<usize, (Receiver, Vec<u8>)> = self
            .merge
            .take()
            .map(|merge| merge.suspend(registry))
            .unwrap_or_default()
            .into_iter()
            .map(|(slot, pipe, unfinished)| (slot - 1, (pipe, unfinished)))
            .collect();
        let now = Instant::now();
        let mut procs = Vec::with_capacity(self.procs.len());
        for (key, mut proc) in std::mem::take(&mut self.procs) {
            let input = match proc.input.take() {
                Some(mut pipe) => {
                    let _ = registry.deregister(&mut pipe);
                    Some(kept(pipe)?)
                }
                None => None,
            };
            let status = match proc.status.take() {
                Some(mut pipe) => {
                    let _ = registry.deregister(&mut pipe);
                    Some(kept(pipe)?)
                }
                None => None,
            };
            let (output, output_unfinished) = match outputs.remove(&key) {
                Some((pipe, unfinished)) => (Some(kept(pipe)?), unfinished),
                None => (None, Vec::new()),
            };
            procs.push(ProcImage {
                key,
                number: proc.number,
                pid: proc.child.id(),
                input,
                backlog: proc.backlog.bytes_left(),
                age_ms: now.duration_since(proc.started).as_millis() as u64,
                status,
                heard: proc.heard.begun(),
                listening: proc.listening,
                metrics_slot: proc.metrics_slot,
                full: proc.full,
                control: kept(proc.control)?,
                output,
                output_unfinished,
            });
        }
        let instances = std::mem::take(&mut self.instances)
            .into_iter()
            .map(|instance| {
                let (running, waiting_ms) = match instance.life {
                    Life::Running(key) => (Some(key), None),
                    Life::Waiting { until } => (
                        None,
                        Some(until.saturating_duration_since(now).as_millis() as u64),
                    ),
                    Life::Gone => (None, None),
                };
                Ok(InstanceImage {
                    listener: kept(instance.listener)?,
                    running,
                    waiting_ms,
                    young_deaths: instance.young_deaths,
                    restarts: instance.restarts,
                    processes: instance.processes,
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        let history = self.recorder.keep_for_next_image()?;
        let host = self._host.inheritable()?.try_clone_to_owned()?;
        let metrics = self.metrics.inheritable()?.try_clone_to_owned()?;
        let image = Image {
            format: FORMAT,
            // The caller's.
            listen: String::new(),
            port_hold: None,
            history,
            host: kept(host)?,
            metrics: Some(kept(metrics)?),
            carried: Default::default(),
            restarts: self.restarts,
            feeds_lost: self.feeds_lost,
            instances,
            procs,
        };
        Ok(RunEnd::ReExec(Box::new(image), pending.binary))
    }

    /// The supervisor an earlier image of this process left in `image`:
    /// the same instances and processes (its children still), the
    /// history, and the input numbered on; it then upgrades the
    /// instances to this binary, one at a time, each handing its
    /// connections over.
    pub fn resume(
        image: &Image,
        program: &Path,
        on_disk: PathBuf,
        args: &[OsString],
        policy: Policy,
        recorder: Recorder,
        signaled: Signaled,
    ) -> Result<Supervisor, SupervisorError> {
        let adopt = |fd: i32| wspush::sys::adopt_fd(fd);
        let host = SharedMemory::open(adopt(image.host)?)?;
        let metrics = match image.metrics {
            Some(fd) => MetricsBoard::open(adopt(fd)?)?,
            None => MetricsBoard::create(metrics_slots(image.instances.len()))?,
        };
        let shared = (host, metrics);
        let mut supervisor =
            Supervisor::empty(program, on_disk, args, policy, recorder, shared, signaled)?;
        supervisor.restarts = image.restarts;
        supervisor.feeds_lost = image.feeds_lost;
        let now = Instant::now();
        for instance in &image.instances {
            let life = match (instance.running, instance.waiting_ms) {
                (Some(key), _) => Life::Running(key),
                (None, Some(ms)) => Life::Waiting {
                    until: now + Duration::from_millis(ms),
                },
                (None, None) => Life::Gone,
            };
            supervisor.instances.push(Instance {
                life,
                listener: adopt(instance.listener)?,
                young_deaths: instance.young_deaths,
                restarts: instance.restarts,
                processes: instance.processes,
            });
        }
        let mut procs = Vec::with_capacity(image.procs.len());
        for proc in &image.procs {
            let registry = supervisor.poll.registry();
            let mut input = match proc.input {
                Some(fd) => Some(Sender::from(adopt(fd)?)),
                None => None,
            };
            if let Some(input) = &mut input {
                input.set_nonblocking(true)?;
                registry.register(input, Token(proc.key), Interest::WRITABLE)?;
            }
            let mut status = match proc.status {
                Some(fd) => Some(Receiver::from(adopt(fd)?)),
                None => None,
            };
            if let Some(status) = &mut status {
                status.set_nonblocking(true)?;
                registry.register(status, Token(STATUS_TOKENS + proc.key), Interest::READABLE)?;
            }
            if let (Some(merge), Some(fd)) = (&mut supervisor.merge, proc.output) {
                let pipe = Receiver::from(adopt(fd)?);
                merge.attach_resumed(
                    proc.key + 1,
                    proc.number,
                    pipe,
                    &proc.output_unfinished,
                    registry,
                )?;
            }
            let mut backlog = Backlog::default();
            if !proc.backlog.is_empty() {
                backlog.push(proc.backlog.clone().into());
            }
            let mut heard = Heard::default();
            for &byte in &proc.heard {
                heard.byte(byte);
            }
            procs.push((
                proc.key,
                Proc {
                    number: proc.number,
                    child: Process(proc.pid),
                    input,
                    backlog,
                    started: now
                        .checked_sub(Duration::from_millis(proc.age_ms))
                        .unwrap_or(now),
                    stalled_since: None,
                    killed_stuck: false,
                    role: Role::Serving,
                    status,
                    listening: proc.listening,
                    took_over: false,
                    reads_former: supervisor.recorder.has_former(),
                    metrics_slot: proc.metrics_slot,
                    full: proc.full,
                    heard,
                    control: adopt(proc.control)?,
                    urgent: None,
                },
            ));
        }
        supervisor.procs = procs.into_iter().collect();
        for key in supervisor
            .procs
            .iter()
            .map(|(key, _)| key)
            .collect::<Vec<_>>()
        {
            supervisor.flush(key, now);
        }
        supervisor.steer();
        log::info!(
            "the supervisor re-executed with its {} instances; upgrading them one at a time",
            supervisor.instances.len()
        );
        supervisor.roll = Some(Roll {
            program: Rc::clone(&supervisor.program),
            left: (1..=supervisor.instances.len()).collect(),
            what: "upgrade",
        });
        Ok(supervisor)
    }
}

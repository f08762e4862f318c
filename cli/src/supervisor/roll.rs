//! Rolling the instances (SIGHUP) and upgrading them (SIGUSR2): the
//! binary checked, a new process beside each instance's in turn, its
//! status heard, the old one handed over; and the steering of new
//! connections to the instances that have room.

use super::*;

impl Supervisor {
    /// Checks the binary on disk on a thread (it opens it, so that what
    /// is checked is what runs, then runs it with `--version`); the
    /// outcome wakes the poll.
    pub(super) fn check_binary(&mut self) {
        let path = self.on_disk.clone();
        let waker = Arc::clone(&self.waker);
        let (tx, rx) = mpsc::channel();
        log::info!(
            "SIGUSR2: checking {} to upgrade the instances to it",
            path.display()
        );
        let spawned = std::thread::Builder::new()
            .name("upgrade-check".into())
            .spawn(move || {
                // Signals are the loop's own (see `main`).
                let _ = wspush::sys::hold_signals(&SIGNALS_HANDLED);
                let _ = tx.send(check_binary(&path));
                let _ = waker.wake();
            });
        match spawned {
            Ok(_) => self.checking = Some(rx),
            Err(e) => log::error!("cannot check the new binary: {e}; the upgrade is refused"),
        }
    }

    /// A new binary's check ended: rolls the instances to it, or says why
    /// it is refused.
    pub(super) fn on_checked(&mut self) {
        let Some(checked) = self.checking.as_ref().and_then(|rx| rx.try_recv().ok()) else {
            return;
        };
        self.checking = None;
        let checked = checked.and_then(|(file, version)| match self.begin_reexec(file, &version) {
            // The supervisor first; its next image upgrades the instances.
            Ok(()) => Err(String::new()),
            Err(file) => Ok((file, version)),
        });
        match checked {
            Err(reexec) if reexec.is_empty() => {}
            Ok((file, version)) => {
                log::info!(
                    "upgrading the {} instances one at a time to {} ({version})",
                    self.instances.len(),
                    self.on_disk.display()
                );
                let program = Program {
                    path: PathBuf::from(format!(
                        "/proc/{}/fd/{}",
                        std::process::id(),
                        file.as_raw_fd()
                    )),
                    args: self.program.args.clone(),
                    history_fd: self.program.history_fd,
                    host_fd: self.program.host_fd,
                    metrics_fd: self.program.metrics_fd,
                    shared_epoch: self.program.shared_epoch,
                    _binary: Some(file),
                };
                self.roll = Some(Roll {
                    program: Rc::new(program),
                    left: (1..=self.instances.len()).collect(),
                    what: "upgrade",
                });
            }
            Err(why) => log::error!(
                "the upgrade is refused: {} {why}; the instances keep running",
                self.on_disk.display()
            ),
        }
    }

    /// Starts the next step of a roll when none is under way: a process
    /// beside the next instance's; once every instance is replaced, an
    /// upgrade's binary becomes the one restarts run.
    pub(super) fn advance_roll(&mut self, now: Instant, input_open: bool) {
        // A process whose connections were all taken over holds nothing
        // back; one that drains does (its clients come back elsewhere).
        let busy = self
            .procs
            .iter()
            .any(|(_, p)| !matches!(p.role, Role::Serving | Role::Retiring { emptied: true, .. }));
        let Some(roll) = self.roll.as_mut().filter(|_| !busy) else {
            return;
        };
        let Some(number) = roll.left.pop_front() else {
            let roll = self.roll.take().expect("a roll");
            log::info!(
                "the {} of the {} instances is done",
                roll.what,
                self.instances.len()
            );
            if roll.what == "upgrade" {
                self.program = roll.program;
            }
            return;
        };
        let Life::Running(old) = self.instances[number - 1].life else {
            // Dead meanwhile: it is started again as it would be.
            return;
        };
        let program = Rc::clone(&roll.program);
        let what = roll.what;
        let first_line = input_open.then_some(self.recorder.next_line());
        let role = Role::Starting {
            deadline: now + LISTEN_TIMEOUT,
        };
        match self.launch(&program, number, first_line, role) {
            Ok(key) => {
                log::info!(
                    "{what}: instance {number}: pid {} starts beside pid {}",
                    self.procs[key].child.id(),
                    self.procs[old].child.id()
                );
            }
            Err(e) => self.give_up_roll(&format!("instance {number} could not be started: {e}")),
        }
    }

    /// Ends a roll before its end, the instances not replaced yet left as
    /// they are.
    pub(super) fn give_up_roll(&mut self, why: &str) {
        // Those that serve on do so at their own priority.
        for (_, proc) in &mut self.procs {
            proc.urgent = None;
        }
        if let Some(roll) = self.roll.take() {
            log::error!(
                "the {} is refused: {why}; the instances not replaced yet keep running",
                roll.what
            );
        }
    }

    /// A status pipe is readable: what the process says. Once one a roll
    /// started listens (it took the connections over first), it becomes
    /// its instance's process, and the one it replaces hands over what
    /// could not move (SIGUSR1). New connections are
    /// steered to the instances that listen and have room.
    pub(super) fn on_status(&mut self, key: usize) {
        let Some(proc) = self.procs.get_mut(key) else {
            return;
        };
        let mut said = [0u8; 64];
        // Whether it became full or has room, last.
        let mut full = None;
        let mut answers = Vec::new();
        while let Some(pipe) = &mut proc.status {
            match pipe.read(&mut said) {
                Ok(0) => {
                    // It ended (or closed it): its exit says the rest.
                    if let Some(mut pipe) = proc.status.take() {
                        let _ = self.poll.registry().deregister(&mut pipe);
                    }
                }
                Ok(n) => said[..n]
                    .iter()
                    .for_each(|&byte| match proc.heard.byte(byte) {
                        Word::Byte(byte) => full = proc.hear(byte).or(full),
                        Word::Counts(connections, channels) => {
                            self.board.set(key, proc.number, (connections, channels))
                        }
                        Word::Answer(id, text) => answers.push((id, text)),
                        Word::Nothing => {}
                    }),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let number = proc.number;
        let listening = proc.listening;
        for (id, text) in answers {
            self.heard_answer(key, id, &text);
        }
        let Some(proc) = self.procs.get_mut(key) else {
            return;
        };
        if listening && matches!(proc.role, Role::Starting { .. }) {
            self.promote(key);
        }
        self.steer();
        // Said once new connections are steered.
        match full {
            Some(true) => {
                log::info!("instance {number} is full: new connections go to the others")
            }
            Some(false) => log::info!("instance {number} has room again"),
            None => {}
        }
    }

    /// Process `key`, started by a roll, listens: it becomes its
    /// instance's process, and the one it replaces hands over what could
    /// not move to it (SIGUSR1: a drain without its grace).
    pub(super) fn promote(&mut self, key: usize) {
        let proc = &mut self.procs[key];
        proc.role = Role::Serving;
        let (number, pid, emptied) = (proc.number, proc.child.id(), proc.took_over);
        let instance = &mut self.instances[number - 1];
        let old = match std::mem::replace(&mut instance.life, Life::Running(key)) {
            Life::Running(old) if old != key => old,
            // Its predecessor exited already, after handing over.
            _ => {
                log::info!("instance {number}: pid {pid} listens");
                return;
            }
        };
        let old = &mut self.procs[old];
        // What it still holds it drains at its own priority.
        old.urgent = None;
        let deadline = Instant::now() + self.policy.stop_grace;
        old.role = Role::Retiring { deadline, emptied };
        let _ = kill_process(old.child.pid(), Signal::USR1);
        log::info!(
            "instance {number}: pid {pid} listens; pid {} hands over what it still holds",
            old.child.id()
        );
    }

    /// Steers new connections to the instances whose process listens and
    /// has room (to all, by the kernel's pick, when none has), attaching
    /// a program to the group when that changes (see
    /// [`wspush::sys::steer_reuseport`]).
    pub(super) fn steer(&mut self) {
        if self.instances.len() < 2 {
            return;
        }
        let open: Vec<u32> = self
            .instances
            .iter()
            .enumerate()
            .filter(|(_, instance)| match instance.life {
                Life::Running(key) => self.procs[key].listening && !self.procs[key].full,
                _ => false,
            })
            .map(|(index, _)| index as u32)
            .collect();
        if self.steered.as_ref() == Some(&open) {
            return;
        }
        let group = self.instances[0].listener.as_fd();
        match wspush::sys::steer_reuseport(group, &open) {
            Ok(()) => log::debug!("new connections go to the instances {open:?} (from 0)"),
            Err(e) => log::warn!(
                "cannot steer new connections away from full or dead instances: {e}; they keep their share"
            ),
        }
        self.steered = Some(open);
    }
}

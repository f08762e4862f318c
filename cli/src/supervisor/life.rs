//! The instances' lives: started, reaped, started again after their
//! backoff (or the crash loop that stops everything), stopped and killed.

use super::*;

impl Supervisor {
    /// Kills a process a roll started that did not listen in time (the
    /// roll is given up), and a retiring one still running at its
    /// deadline.
    pub(super) fn expire(&mut self, now: Instant) {
        let mut late = Vec::new();
        for (key, proc) in &self.procs {
            match proc.role {
                Role::Starting { deadline, .. } | Role::Retiring { deadline, .. }
                    if now >= deadline =>
                {
                    late.push(key)
                }
                _ => {}
            }
        }
        for key in late {
            let proc = &mut self.procs[key];
            let (number, pid) = (proc.number, proc.child.id());
            let starting = matches!(proc.role, Role::Starting { .. });
            let _ = proc.child.kill();
            proc.role = Role::Killed;
            if starting {
                self.give_up_roll(&format!(
                    "instance {number}'s new process (pid {pid}) did not listen in time ({LISTEN_TIMEOUT:?}, or {TAKE_OVER_TIMEOUT:?} once it takes connections over)"
                ));
            } else {
                log::warn!(
                    "instance {number}'s old process (pid {pid}) was still handing over: killed it"
                );
            }
        }
    }

    /// Records every process that exited. An instance's process: a
    /// requested stop lets it go; otherwise it is scheduled to start again,
    /// or the policy says stop. A process a roll started that exited
    /// before it listened gives the roll up; one that handed over is done.
    pub(super) fn reap(
        &mut self,
        now: Instant,
        stopping: bool,
    ) -> io::Result<Option<SupervisorError>> {
        let mut error = None;
        let mut exited = Vec::new();
        for (key, proc) in &mut self.procs {
            if let Some(status) = proc.child.try_wait()? {
                exited.push((key, status));
            }
        }
        for (key, status) in exited {
            let mut proc = self.procs.remove(key);
            if proc.reads_former && !self.procs.iter().any(|(_, p)| p.reads_former) {
                self.recorder.retire_former();
            }
            if let Some(slot) = proc.metrics_slot {
                self.metrics.retire(slot);
            }
            // Its priority is its own no more: the process is gone.
            if let Some(urgent) = proc.urgent.take() {
                urgent.forget();
            }
            self.board.remove(key);
            self.no_answer_from(key);
            if let Some(merge) = &mut self.merge {
                merge.detach(key + 1, self.poll.registry());
            }
            if let Some(mut pipe) = proc.status.take() {
                let _ = self.poll.registry().deregister(&mut pipe);
            }
            let (number, pid, lived) = (proc.number, proc.child.id(), now - proc.started);
            let (bytes, lines) = proc.backlog.clear();
            let its_process =
                matches!(self.instances[number - 1].life, Life::Running(k) if k == key);
            match proc.role {
                Role::Serving => {
                    // A process a roll started beside it takes its place
                    // (its connections, if they were handed over).
                    if let Some(successor) = self.successor_of(number) {
                        self.instances[number - 1].life = Life::Running(successor);
                        log::info!(
                            "instance {number}: pid {pid} {} while pid {} takes its place",
                            Ended(status),
                            self.procs[successor].child.id()
                        );
                        continue;
                    }
                }
                Role::Starting { .. } if !its_process => {
                    let ended = Ended(status);
                    self.give_up_roll(&format!(
                        "instance {number}'s new process (pid {pid}) {ended} before it listened"
                    ));
                    continue;
                }
                Role::Starting { .. } | Role::Killed if its_process => {
                    // It had taken its predecessor's place: its death
                    // (or its being killed for not listening in time)
                    // is the instance's.
                    self.give_up_roll(&format!(
                        "instance {number}'s new process (pid {pid}) {} after it took its predecessor's place",
                        Ended(status)
                    ));
                }
                Role::Retiring { .. } => {
                    log::info!(
                        "instance {number}: pid {pid} {} after handing over",
                        Ended(status)
                    );
                    continue;
                }
                Role::Starting { .. } | Role::Killed => continue,
            }
            let instance = &mut self.instances[number - 1];
            if stopping {
                instance.life = Life::Gone;
                continue;
            }
            let dropped = if bytes > 0 {
                format!("; dropped {bytes} bytes ({lines} lines) of input queued for it")
            } else {
                String::new()
            };
            if self.policy.on_exit == OnExit::Stop {
                log::error!("instance {number} (pid {pid}) {}{dropped}", Ended(status));
                instance.life = Life::Gone;
                error.get_or_insert(SupervisorError::InstanceDied {
                    instance: number,
                    pid,
                    status,
                });
                continue;
            }
            if lived < YOUNG && !proc.killed_stuck {
                instance.young_deaths += 1;
            } else {
                instance.young_deaths = 0;
            }
            if instance.young_deaths >= CRASH_LOOP {
                log::error!(
                    "instance {number} (pid {pid}) {} {lived:.1?} after starting{dropped}",
                    Ended(status)
                );
                instance.life = Life::Gone;
                error.get_or_insert(SupervisorError::CrashLoop {
                    instance: number,
                    status,
                });
                continue;
            }
            let backoff = MIN_BACKOFF
                .saturating_mul(1 << instance.young_deaths.saturating_sub(1).min(10))
                .min(MAX_BACKOFF);
            let cause = if proc.killed_stuck {
                "was replaced for being stuck".to_string()
            } else {
                Ended(status).to_string()
            };
            log::warn!(
                "instance {number} (pid {pid}) {cause} after {lived:.1?}{dropped}; starting it again in {backoff:?}"
            );
            instance.life = Life::Waiting {
                until: now + backoff,
            };
        }
        self.steer();
        Ok(error)
    }

    /// The process a roll started beside instance `number`'s, if one is
    /// starting.
    fn successor_of(&self, number: usize) -> Option<usize> {
        self.procs
            .iter()
            .find(|(_, p)| p.number == number && matches!(p.role, Role::Starting { .. }))
            .map(|(key, _)| key)
    }

    /// Starts again every instance whose backoff is over.
    pub(super) fn restart_due(&mut self, now: Instant, input_open: bool) {
        for index in 0..self.instances.len() {
            match self.instances[index].life {
                Life::Waiting { until } if now >= until => {}
                _ => continue,
            }
            let number = index + 1;
            let first_line = input_open.then_some(self.recorder.next_line());
            let program = Rc::clone(&self.program);
            let launched = self.launch(&program, number, first_line, Role::Serving);
            self.restarts += 1;
            let instance = &mut self.instances[index];
            instance.restarts += 1;
            match launched {
                Ok(key) => {
                    instance.life = Life::Running(key);
                    let proc = &mut self.procs[key];
                    if input_open {
                        for _ in 0..self.feeds_lost {
                            proc.backlog.push(Control::FeedLost.line().into());
                        }
                    }
                    log::warn!(
                        "instance {number} started again (pid {}): restart {} of it, {} in all",
                        proc.child.id(),
                        instance.restarts,
                        self.restarts
                    );
                }
                Err(e) => {
                    log::error!(
                        "instance {number} could not be started again: {e}; trying again in {MAX_BACKOFF:?}"
                    );
                    instance.life = Life::Waiting {
                        until: now + MAX_BACKOFF,
                    };
                }
            }
        }
    }

    /// Sends `signal` (SIGTERM: drain; SIGINT: close at once) to every
    /// process, cancels pending restarts and any roll, and returns when
    /// to kill what is left.
    pub(super) fn stop_all(&mut self, now: Instant, signal: Signal) -> Instant {
        for (_, proc) in &self.procs {
            let _ = kill_process(proc.child.pid(), signal);
        }
        for instance in &mut self.instances {
            if let Life::Waiting { .. } = instance.life {
                instance.life = Life::Gone;
            }
        }
        self.roll = None;
        now + self.policy.stop_grace
    }

    /// Kills every process (start-up failed, or the stop grace is over);
    /// they are reaped on their SIGCHLD.
    pub(super) fn kill_all(&mut self) {
        for (_, proc) in &mut self.procs {
            let _ = proc.child.kill();
        }
    }

    /// Starts a process of instance `number` running `program` (see
    /// [`Program::spawn`]) and registers its pipes; returns its key.
    pub(super) fn launch(
        &mut self,
        program: &Program,
        number: usize,
        first_line: Option<u64>,
        role: Role,
    ) -> io::Result<usize> {
        let (mut status, writer) = status_pipe()?;
        let (control, theirs) = std::os::unix::net::UnixStream::pair()?;
        let (control, theirs) = (OwnedFd::from(control), OwnedFd::from(theirs));
        // A roll's process takes the connections of the one it replaces.
        let take_over = match (&role, &self.instances[number - 1].life) {
            (Role::Starting { .. }, Life::Running(old)) => {
                let old = &mut self.procs[*old];
                old.urgent = Some(wspush::sys::Urgent::raise_process(old.child.id()));
                wspush::introduce_successor(old.control.as_fd())
                    .inspect_err(|e| {
                        log::warn!("instance {number}: no handover ({e}); the old process drains")
                    })
                    .ok()
            }
            _ => None,
        };
        let metrics_slot = self.metrics.claim(number);
        let start = Start {
            metrics_slot,
            number,
            earlier: self.instances[number - 1].processes,
            first_line,
            capture_output: self.merge.is_some(),
            listener: &self.instances[number - 1].listener,
            status: &writer,
            control: &theirs,
            take_over: take_over.as_ref(),
        };
        let (mut child, mut input) = program.spawn(&start).inspect_err(|_| {
            if let Some(slot) = metrics_slot {
                self.metrics.retire(slot);
            }
        })?;
        // The child's ends are its own: a successor that dies closes them.
        drop((writer, theirs, take_over));
        self.instances[number - 1].processes += 1;
        let entry = self.procs.vacant_entry();
        let key = entry.key();
        let registry = self.poll.registry();
        if let Some(input) = &mut input {
            registry.register(input, Token(key), Interest::WRITABLE)?;
        }
        registry.register(&mut status, Token(STATUS_TOKENS + key), Interest::READABLE)?;
        if let (Some(merge), Some(output)) = (&mut self.merge, child.stdout.take()) {
            merge.attach(key + 1, number, Receiver::from(output), registry)?;
        }
        entry.insert(Proc {
            number,
            child: Process(child.id()),
            input,
            backlog: Backlog::default(),
            started: Instant::now(),
            stalled_since: None,
            killed_stuck: false,
            role,
            status: Some(status),
            listening: false,
            took_over: false,
            reads_former: false,
            metrics_slot,
            full: false,
            heard: Heard::default(),
            control,
            urgent: None,
        });
        Ok(key)
    }
}

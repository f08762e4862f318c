//! The input on its way to the instances: each one's backlog, written as
//! its pipe takes it, and the instance that stopped taking it replaced.

use super::*;

impl Supervisor {
    /// Whether some running process has nothing waiting here: the input
    /// may advance. (While none runs, it waits for one to start again.)
    pub(super) fn lead_is_idle(&self) -> bool {
        self.procs
            .iter()
            .any(|(_, p)| p.input.is_some() && p.backlog.bytes == 0)
    }

    /// Queues `chunk` for every process that takes input, and writes it;
    /// notes what a control line says of the feed.
    pub(super) fn deliver(&mut self, chunk: Vec<u8>, now: Instant) {
        let chunk: Rc<[u8]> = chunk.into();
        let keys: Vec<usize> = self
            .procs
            .iter()
            .filter(|(_, p)| p.input.is_some())
            .map(|(key, _)| key)
            .collect();
        if chunk.first() == Some(&CONTROL) {
            let line = chunk.strip_suffix(b"\n").unwrap_or(&chunk);
            match Control::parse(line) {
                Some(Control::FeedLost) => self.feeds_lost += 1,
                Some(Control::FeedRestored(_)) => {
                    self.feeds_lost = self.feeds_lost.saturating_sub(1)
                }
                Some(Control::Ask { id, query }) => self.asked(id, query, &keys),
                _ => {}
            }
        }
        self.recorder.record(&chunk);
        for key in keys {
            self.procs[key].backlog.push(Rc::clone(&chunk));
            self.flush(key, now);
        }
    }

    /// Writes process `key`'s backlog into its pipe, as far as it goes.
    pub(super) fn flush(&mut self, key: usize, now: Instant) {
        let Some(proc) = self.procs.get_mut(key) else {
            return;
        };
        let Some(pipe) = &mut proc.input else {
            return;
        };
        match proc.backlog.write_to(pipe) {
            Ok(written) => {
                if written > 0 || proc.backlog.bytes == 0 {
                    proc.stalled_since = None;
                }
                if proc.backlog.bytes > 0 {
                    proc.stalled_since.get_or_insert(now);
                }
            }
            Err(e) => {
                // It closed its input or died (its SIGCHLD follows).
                let (bytes, lines) = proc.backlog.clear();
                log::warn!(
                    "instance {} (pid {}) stopped taking input ({e}); dropped {bytes} bytes ({lines} lines) queued for it",
                    proc.number,
                    proc.child.id()
                );
                proc.input = None;
                self.no_answer_from(key);
            }
        }
    }

    /// Once the input has ended, closes each pipe whose backlog is written.
    pub(super) fn close_drained_inputs(&mut self) {
        for (_, proc) in &mut self.procs {
            if proc.backlog.bytes == 0 {
                proc.input = None;
            }
        }
    }

    /// Kills (to be started again) every instance's process that is
    /// stuck: too much input waiting, or none taken for the stall timeout.
    pub(super) fn replace_stuck(&mut self, now: Instant) {
        let policy = &self.policy;
        for (_, proc) in &mut self.procs {
            let Some(since) = proc.stalled_since else {
                continue;
            };
            if proc.killed_stuck || !matches!(proc.role, Role::Serving) {
                continue;
            }
            let stalled = now.saturating_duration_since(since);
            let why = if proc.backlog.bytes > policy.max_backlog {
                format!(
                    "has {} bytes of input waiting (the bound is {})",
                    proc.backlog.bytes, policy.max_backlog
                )
            } else if stalled >= policy.stall_timeout {
                format!("has taken no input for {stalled:.1?}")
            } else {
                continue;
            };
            log::warn!(
                "instance {} (pid {}) is stuck: it {why}; killing it to start it again",
                proc.number,
                proc.child.id()
            );
            let _ = proc.child.kill();
            proc.killed_stuck = true;
        }
    }
}

//! A re-exec that closes nothing: the loop stops after what was queued
//! ([`Handle::suspend`](crate::server::Handle::suspend)), takes every
//! connection apart as a handover to a successor does, and the state
//! ([`Suspended`]) is kept in a memory file that the process's next image
//! reads ([`Suspended::save`], [`Suspended::load`]); the listener, the
//! history's memory and every connection's socket stay open across the
//! exec. The next image puts each connection back in its slot
//! ([`Server::resume`]): its key, its cursor and its bytes in both
//! directions are as they were, and the history goes on where it was.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::ops::metrics::Metrics;
use crate::ops::sys;
use crate::protocol::handover::{Image, Record};
use crate::server::handover::RecordSource;
use crate::server::history::History;
use crate::server::lifecycle::handover::{Giving, Suspended, Taker};
use crate::server::lifecycle::Ending;
use crate::server::net::channel::invalid;
use crate::server::net::sockets::Door;
use crate::server::records::{bounds, Records};
use crate::server::{BindError, Server};

impl Suspended {
    /// How many connections it holds.
    pub fn connections(&self) -> usize {
        self.sockets.len()
    }

    /// The position the next image's first message gets (unless its
    /// source numbers it).
    pub fn next_position(&self) -> u64 {
        self.through + 1
    }

    /// What the embedding program keeps beside the server's state (the
    /// binary: its input's unfinished line).
    pub fn extra(&self) -> &[u8] {
        &self.extra
    }

    /// Keeps `extra` beside the server's state.
    pub fn set_extra(&mut self, extra: Vec<u8>) {
        self.extra = extra;
    }

    /// Writes the state into a memory file and keeps it, and every
    /// descriptor it names, open across an exec: returns the memory
    /// file's number, for the next image's [`Suspended::load`]. The
    /// descriptors are this process's until it execs.
    pub fn save(self) -> io::Result<i32> {
        let mut fds = vec![self.listener, self.history];
        fds.extend(self.sockets);
        let image = Image {
            through: self.through,
            stopped_ns: self.stopped_ns,
            fds: fds.iter().map(AsRawFd::as_raw_fd).collect(),
            ages_ms: (self.ages.as_ref())
                .map(|ages| ages.iter().map(|age| age.as_millis() as u64).collect()),
            extra: self.extra,
            records: self.records,
        };
        let file = sys::memory_file("wspush-image", &image.encode())?;
        for fd in fds.iter().chain([&file]) {
            sys::keep_across_exec(fd.as_fd(), true)?;
        }
        for fd in fds {
            // Open until the exec, for the next image to own.
            let _ = fd.into_raw_fd();
        }
        Ok(file.into_raw_fd())
    }

    /// The state an earlier image of this process saved in memory file
    /// `fd` ([`Suspended::save`]); its descriptors are this process's
    /// now, closed across a later exec. A state of another format version
    /// (or none) is an error, and leaves every descriptor as it was, open
    /// across an exec, for an image that reads it.
    pub fn load(fd: i32) -> io::Result<Suspended> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::from(sys::adopt_fd(fd)?);
        let mut bytes = vec![0u8; file.metadata()?.len() as usize];
        let image = file
            .read_exact_at(&mut bytes, 0)
            .and_then(|()| Image::decode(&bytes).map_err(invalid));
        let image = match image {
            Ok(image) => image,
            Err(e) => {
                sys::keep_across_exec(file.as_fd(), true)?;
                let _ = file.into_raw_fd();
                return Err(e);
            }
        };
        let mut fds = (image.fds.iter())
            .map(|&fd| sys::adopt_fd(fd))
            .collect::<io::Result<VecDeque<_>>>()?;
        let (Some(listener), Some(history)) = (fds.pop_front(), fds.pop_front()) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a state without its listener and history",
            ));
        };
        Ok(Suspended {
            through: image.through,
            stopped_ns: image.stopped_ns,
            records: image.records,
            sockets: fds,
            listener,
            history,
            ages: (image.ages_ms).map(|ages| ages.into_iter().map(Duration::from_millis).collect()),
            extra: image.extra,
        })
    }
}

/// The records a [`Suspended`] holds, read back with their sockets.
struct Spooled {
    records: Vec<u8>,
    at: usize,
    sockets: VecDeque<OwnedFd>,
}

impl RecordSource for Spooled {
    fn read_record(&mut self) -> io::Result<Record> {
        match Record::decode(&self.records[self.at..]).map_err(invalid)? {
            Some((record, used)) => {
                self.at += used;
                Ok(record)
            }
            None => Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }

    fn take_fd(&mut self) -> Option<OwnedFd> {
        self.sockets.pop_front()
    }
}

impl Server {
    /// The state this server stopped in for its next image, once a
    /// [`Handle::suspend`](crate::server::Handle::suspend) ended its
    /// [`Server::run`] (once).
    pub fn take_suspended(&mut self) -> Option<Suspended> {
        self.handover.suspended.take()
    }

    /// A server that goes on from `suspended`, as an earlier image of
    /// this process left it: on its listener, with its history, each of
    /// its connections in the slot it had, owed what came after the last
    /// position delivered. `config` is validated; its metrics address, if
    /// any, is bound again. Returns the server and how many connections it
    /// took (one that cannot be put back is closed, and counted in
    /// `handover_lost`).
    pub fn resume(mut config: Config, suspended: Suspended) -> Result<(Server, usize), BindError> {
        config.validate().map_err(BindError::Config)?;
        let started = Instant::now();
        let Suspended {
            through,
            stopped_ns,
            records,
            sockets,
            listener,
            history,
            ages,
            ..
        } = suspended;
        config.first_position = through + 1;
        // A history this loop read is read as `config` names it now: its
        // writer may have carried it into another ring (see
        // `SharedHistory::resumed`).
        let history = match (ages, &config.history_fd) {
            (Some(ages), _) => History::resumed(history, bounds(&config), &ages, through),
            (None, Some(named)) => named
                .try_clone()
                .and_then(|fd| History::shared(fd, through + 1)),
            (None, None) => History::shared(history, through + 1),
        }
        .map_err(BindError::Io)?;
        let records_kept = Records::on(&config, history);
        let listener = std::net::TcpListener::from(listener);
        let mut server =
            Server::open_with(config, Some(listener), records_kept).map_err(BindError::Io)?;
        let mut spooled = Spooled {
            records,
            at: 0,
            sockets,
        };
        let (taken, whole) = server.take_records(&mut spooled);
        let metrics = &server.report.shared.counters.metrics;
        Metrics::add(&metrics.handover_taken, taken as u64);
        // The pause the clients see: from the earlier loop's stop (the
        // clock is the host's) to this one's start.
        let taking = started.elapsed();
        let paused_us = sys::monotonic_nanos().saturating_sub(stopped_ns) / 1000;
        Metrics::set(&metrics.handover_pause_us, paused_us);
        match whole {
            true => log::info!(
                "took {taken} connections back from the earlier image in {:.1} ms; the loop paused {:.1} ms in all",
                taking.as_secs_f64() * 1e3,
                paused_us as f64 / 1e3
            ),
            false => log::error!(
                "the earlier image's state broke off: {taken} connections taken back"
            ),
        }
        Ok((server, taken))
    }

    /// Begins the suspension a handle asked for, once every command
    /// queued before it was taken and no successor is under way.
    pub(super) fn begin_suspending(&mut self, now: Instant) {
        let asked = &self.report.shared.suspend_after;
        let after = asked.load(Ordering::Acquire);
        if after == u64::MAX
            || self.intake.taken() < after
            || !self.lifecycle.is_serving()
            || self.handover.busy()
        {
            return;
        }
        asked.store(u64::MAX, Ordering::Release);
        log::info!("suspending for the next image: the fan-out under way finishes first");
        self.handover.giving = Some(Giving {
            taker: Taker::NextImage,
            first: self.records.history.current().seq + 1,
            since: now,
            _urgent: crate::ops::sys::Urgent::raise(),
        });
    }

    /// Takes every open connection apart for the next image, each given
    /// every message up to `through`, with the listener and the history;
    /// closes what could not move, and ends the loop.
    pub(super) fn suspend(&mut self, through: u64, now: Instant) {
        let started = Instant::now();
        let stopped_ns = sys::monotonic_nanos();
        let kept = self.records.history.suspend(now);
        let listener = self.sockets.take(Door::Main);
        let (kept, listener) = match (kept, listener) {
            (Ok(kept), Some(listener)) => (kept, listener),
            (Err(e), _) => {
                log::error!("cannot keep the history for the next image: {e}; serving on");
                return;
            }
            (_, None) => {
                log::error!("no listener to keep for the next image; serving on");
                return;
            }
        };
        let mut records = Vec::new();
        let moving = self.move_out_all(through, now, |bytes, _| {
            records.extend_from_slice(bytes);
            Ok(())
        });
        Record::End {
            count: moving.given,
        }
        .encode(&mut records);
        let registry = self.sockets.registry();
        let sockets = (moving.sent.into_iter())
            .map(|mut stream| {
                let _ = registry.deregister(&mut stream);
                OwnedFd::from(std::net::TcpStream::from(stream))
            })
            .collect();
        let (history, ages) = kept;
        self.handover.suspended = Some(Suspended {
            through,
            stopped_ns,
            records,
            sockets,
            listener: OwnedFd::from(std::net::TcpListener::from(listener)),
            history,
            ages,
            extra: Vec::new(),
        });
        let paused = started.elapsed();
        let metrics = &self.report.shared.counters.metrics;
        Metrics::add(&metrics.handover_given, u64::from(moving.given));
        Metrics::set(&metrics.handover_pause_us, paused.as_micros() as u64);
        log::info!(
            "suspended {} connections for the next image (given through position {through}) in {:.1} ms; {} could not move and close",
            moving.given,
            paused.as_secs_f64() * 1e3,
            self.conns.len()
        );
        self.close_everything(now, Ending::Shutdown);
    }
}

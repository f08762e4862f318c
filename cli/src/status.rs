//! Under a supervisor, what an instance says on its status pipe: that it
//! listens, what it holds every second (for `GET /stats`), whether it
//! has room, and its answers to presence questions ([`crate::asks`]).
//!
//! Several threads write there (the loop its room, the status thread the
//! rest), and an answer may be longer than a pipe writes at once: each
//! writes a whole word or record under one lock, so none cuts another.

use std::fs::File;
use std::io::Write;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use wspush::{Handle, Server};

use crate::asks::{self, AnswerTo};
use crate::{board, supervisor};

/// How often what the instance holds is said.
const STATS_EVERY: Duration = Duration::from_secs(1);

/// The status pipe, shared by its writers.
#[derive(Debug, Clone)]
struct Pipe(Arc<Mutex<File>>);

impl Pipe {
    /// Writes `bytes` whole, before any other writer's.
    fn say(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut file = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        file.write_all(bytes)
    }
}

/// Under a supervisor (`status` is its pipe): says that the instance
/// listens, then what it holds every second, and whether it has room as
/// that changes (the supervisor steers new connections away while it is
/// full). Gives where the loop's answers to presence questions go.
pub fn report(server: &mut Server, status: Option<File>) -> Result<Option<AnswerTo>, String> {
    let Some(mut status) = status else {
        return Ok(None);
    };
    status
        .write_all(&[supervisor::LISTENING])
        .map_err(|e| format!("cannot tell the supervisor this instance listens: {e}"))?;
    let pipe = Pipe(Arc::new(Mutex::new(status)));
    let (answers, answered) = mpsc::channel();
    let handle = server.handle();
    let said = pipe.clone();
    std::thread::Builder::new()
        .name("status".into())
        .spawn(move || tell(&said, &handle, &answered))
        .map_err(|e| format!("cannot start the status thread: {e}"))?;
    server.watch_room(move |room| {
        let said = if room {
            supervisor::ROOM
        } else {
            supervisor::FULL
        };
        if let Err(e) = pipe.say(&[said]) {
            log::warn!("cannot tell the supervisor whether this instance has room: {e}");
        }
    });
    Ok(Some(Arc::new(move |id, answer| {
        let _ = answers.send(asks::record(id, &answer));
    })))
}

/// The status thread: each answer as it comes, and what the instance
/// holds every second; ends with the pipe.
fn tell(pipe: &Pipe, handle: &Handle, answered: &mpsc::Receiver<Vec<u8>>) {
    let mut next_stats = Instant::now() + STATS_EVERY;
    loop {
        let wait = next_stats.saturating_duration_since(Instant::now());
        let said = match answered.recv_timeout(wait) {
            Ok(record) => pipe.say(&record),
            Err(e) => {
                if e == RecvTimeoutError::Disconnected {
                    std::thread::sleep(wait);
                }
                next_stats = Instant::now() + STATS_EVERY;
                let m = handle.metrics();
                pipe.say(&board::record(m.connections_open, m.channels))
            }
        };
        if said.is_err() {
            return;
        }
    }
}

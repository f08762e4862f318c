//! Where the upstream lines (`--upstream`: what clients send) go:
//! standard output, or a Redis stream ([`stream`]). Alone, a thread of
//! the server's writes them ([`spawn`]); under `--processes`, each
//! instance writes its own to standard output, a pipe its supervisor
//! reads, and the supervisor's merge writes them all (`merge`).

use std::io::{self, Write};
use std::thread::JoinHandle;
use std::time::Duration;

use wspush::{Server, UpstreamReader};

pub mod stream;

/// Where this process writes the upstream lines.
#[derive(Debug, Clone)]
pub enum Sink {
    /// Standard output.
    Stdout,
    /// A Redis stream.
    Stream(Box<stream::Target>),
}

/// A lone server's writer of its upstream lines.
#[derive(Debug)]
pub struct Writer {
    thread: JoinHandle<()>,
    give_up: stream::GiveUp,
}

impl Writer {
    /// The server is gone: waits until the writer has written its last
    /// lines, or (Redis away) until `grace` has passed and it dropped
    /// them, counted.
    pub fn finish(self, grace: Duration) {
        self.give_up.after(grace);
        let _ = self.thread.join();
    }
}

/// With `--upstream`, a thread writing the server's upstream lines to
/// `sink`.
pub fn spawn(server: &Server, sink: Option<Sink>) -> Result<Option<Writer>, String> {
    let (Some(reader), Some(sink)) = (server.upstream(), sink) else {
        return Ok(None);
    };
    let give_up = stream::GiveUp::default();
    let giving_up = give_up.clone();
    std::thread::Builder::new()
        .name("upstream".into())
        .spawn(move || match sink {
            Sink::Stdout => write_stdout(&reader),
            Sink::Stream(target) => {
                let next = |lines: &mut Vec<u8>| reader.read(lines);
                stream::write(*target, reader.tally(), next, &giving_up);
            }
        })
        .map(|thread| Some(Writer { thread, give_up }))
        .map_err(|e| format!("cannot start the upstream thread: {e}"))
}

/// Writes the upstream lines to standard output until the server is
/// gone; after a failed write, lines are counted as dropped.
fn write_stdout(reader: &UpstreamReader) {
    let mut out = io::stdout().lock();
    let mut lines = Vec::new();
    let mut failed = false;
    while reader.read(&mut lines) {
        if !failed {
            match out.write_all(&lines).and_then(|()| out.flush()) {
                Ok(()) => continue,
                Err(e) => {
                    log::error!("writing to standard output failed: {e}; upstream lines are dropped and counted from now on");
                    failed = true;
                }
            }
        }
        reader.count_dropped(lines.iter().filter(|&&b| b == b'\n').count() as u64);
    }
}

//! The host's `/metrics` under `--processes`: the supervisor answers it
//! on `--metrics-listen`, from the host's metrics board (see
//! [`wspush::board`]), where every process of the host keeps its
//! counters: the sums, and each instance's (labelled `instance`) unless
//! `--metrics-sums-only`. Read from shared memory, the answer never waits
//! for an instance, however busy its loop. It is served on a thread of
//! its own, a request at a time, each connection closed after its answer.

use std::io::{self, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use wspush::board::{Board, MetricsBoard};

/// The environment variable that names, in an instance, the host's
/// metrics board's descriptor.
pub const METRICS_FD_ENV: &str = "WSPUSH_METRICS_FD";
/// The environment variable that names an instance's slot on it.
pub const METRICS_SLOT_ENV: &str = "WSPUSH_METRICS_SLOT";

/// The slots a board has for `instances`: three each (its process, a
/// successor's during a handover, and its processes gone), two for the
/// supervisor's own counts (its image's, and its earlier images'), and a
/// few spare for restarts while a dead process is not reaped yet.
pub fn metrics_slots(instances: usize) -> usize {
    3 * instances + 6
}

/// How long a scraper has to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest request head read.
const MAX_HEAD: usize = 8 * 1024;

/// Under a supervisor, this process's place on the host's metrics board,
/// as the supervisor named it (none alone, or if the board was full).
pub fn instance_place(per_instance: bool) -> Result<Option<MetricsBoard>, String> {
    let named = |env| std::env::var(env).ok();
    let fd = named(METRICS_FD_ENV).and_then(|fd| fd.parse::<i32>().ok());
    let slot = named(METRICS_SLOT_ENV).and_then(|slot| slot.parse::<usize>().ok());
    let (Some(fd), Some(slot)) = (fd, slot) else {
        return Ok(None);
    };
    let fd = wspush::sys::inherited_fd(fd)
        .map_err(|e| format!("cannot read the supervisor's metrics board: {e}"))?;
    Ok(Some(MetricsBoard {
        fd: std::sync::Arc::new(fd),
        slot,
        per_instance,
    }))
}

/// Answers `/metrics` and `/healthz` on `addr` from `board`, on a thread
/// of its own, for as long as the process runs.
pub fn serve(addr: SocketAddr, board: Board, per_instance: bool) -> Result<(), String> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| format!("cannot listen for /metrics on {addr}: {e}"))?;
    let at = listener.local_addr().unwrap_or(addr);
    std::thread::Builder::new()
        .name("host-metrics".into())
        .spawn(move || {
            // Mostly idle, it answers at once even while the instances
            // keep the host's cores busy.
            let _urgent = wspush::sys::Urgent::raise();
            let mut page = Vec::new();
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => {
                        if let Err(e) = answer(stream, &board, per_instance, &mut page) {
                            log::debug!("a /metrics request: {e}");
                        }
                    }
                    Err(e) => {
                        log::warn!("the host's /metrics listener: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })
        .map_err(|e| format!("cannot serve /metrics: {e}"))?;
    log::info!("the host's metrics on http://{at}/metrics");
    Ok(())
}

/// Reads one request head from `stream` and answers it.
fn answer(
    mut stream: TcpStream,
    board: &Board,
    per_instance: bool,
    page: &mut Vec<u8>,
) -> io::Result<()> {
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    stream.set_write_timeout(Some(READ_TIMEOUT))?;
    // The answer's last segment goes out at once, not after the client's
    // (perhaps delayed) acknowledgement of the ones before.
    stream.set_nodelay(true)?;
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk)?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return respond(
                &mut stream,
                "400 Bad Request",
                "text/plain",
                b"bad request\n",
            );
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (parts.next(), parts.next());
    let path = target.map(|t| t.split(|&b| b == b'?').next().unwrap_or_default());
    match (method, path) {
        (Some(b"GET"), Some(b"/metrics")) => {
            page.clear();
            board.render(per_instance, page);
            let media = "text/plain; version=0.0.4; charset=utf-8";
            respond(&mut stream, "200 OK", media, page)
        }
        (Some(b"GET"), Some(b"/healthz")) => respond(&mut stream, "200 OK", "text/plain", b"ok\n"),
        (Some(b"GET"), _) => respond(&mut stream, "404 Not Found", "text/plain", b"not found\n"),
        _ => respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            b"method not allowed\n",
        ),
    }
}

/// Writes the answer's head and body together (one segment for a short
/// answer, full segments for a long one).
fn respond(stream: &mut TcpStream, status: &str, media: &str, body: &[u8]) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {media}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let (head, total) = (head.as_bytes(), head.len() + body.len());
    let mut written = 0;
    while written < total {
        let rest = match written.checked_sub(head.len()) {
            None => [IoSlice::new(&head[written..]), IoSlice::new(body)],
            Some(at) => [IoSlice::new(&body[at..]), IoSlice::new(&[])],
        };
        match stream.write_vectored(&rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

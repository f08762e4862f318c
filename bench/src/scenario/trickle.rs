//! `trickle`: many clients each send their upgrade request one byte at a
//! time, all in step, and the server's CPU over the whole of it is
//! measured. What a server spends per connection here is what it spends
//! re-reading partial request heads: linear in the head's size if it
//! looks only at the new bytes, quadratic if it parses from the start on
//! every read.
//!
//! One thread, blocking sockets with `TCP_NODELAY` (each byte its own
//! segment): a round writes byte `i` to every connection, then the next
//! round byte `i + 1`. Every connection must get its 101 at the end (give
//! the server a handshake timeout longer than the trickle).

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::observe::procfs;
use crate::target::server::start_server;
use crate::target::server::ServerSpec;
use crate::wire::handshake;
use crate::Error;

/// What `trickle` does.
#[derive(Debug, Clone, clap::Args)]
pub struct TrickleOptions {
    /// Connections that trickle their heads at the same time.
    #[arg(long, default_value = "10000")]
    pub conns: usize,
    /// Size of each upgrade request head, in bytes (padded with one
    /// `X-Pad` header; at least the plain request's size).
    #[arg(long, default_value = "8000")]
    pub head_bytes: usize,
    /// Server port (default: a free one).
    #[arg(long)]
    pub port: Option<u16>,
    /// Seconds the server gets to start listening.
    #[arg(long, default_value = "30")]
    pub start_timeout: u64,
    /// Before starting the server, wait up to this many seconds for the
    /// machine to be quiet.
    #[arg(long, default_value = "0")]
    pub wait_quiet: u64,
    /// Seconds a connection's 101 may take once its last byte is sent.
    #[arg(long, default_value = "30")]
    pub answer_timeout: u64,
}

/// The measurement.
#[derive(Debug, Clone, Serialize)]
pub struct TrickleReport {
    /// The server's command line.
    pub command: String,
    /// Connections.
    pub conns: usize,
    /// Bytes in each request head.
    pub head_bytes: usize,
    /// Connections that got a valid 101.
    pub upgraded: usize,
    /// Wall time from the first connection to the last 101.
    pub secs: f64,
    /// The server's CPU (user + system, all its processes) over that time
    /// (accepts and answers included).
    pub server_cpu_secs: f64,
    /// The user part of it: the server's own code (parsing), not the
    /// kernel's (a read per byte).
    pub server_user_secs: f64,
    /// That CPU per connection, in microseconds.
    pub server_us_per_conn: f64,
    /// That CPU per byte of head, in nanoseconds.
    pub server_ns_per_byte: f64,
}

impl TrickleReport {
    /// The report as text.
    pub fn render_text(&self) -> String {
        format!(
            "trickle: {} connections x {}-byte heads, one byte per write: {} upgraded in {:.1} s; \
             server CPU {:.2} s (user {:.2} s) = {:.0} us per connection, {:.1} ns per byte\n  server: {}\n",
            self.conns,
            self.head_bytes,
            self.upgraded,
            self.secs,
            self.server_cpu_secs,
            self.server_user_secs,
            self.server_us_per_conn,
            self.server_ns_per_byte,
            self.command
        )
    }
}

/// The upgrade request of `head_bytes` bytes for connection `id`.
fn padded_request(id: u64, head_bytes: usize) -> Result<(Vec<u8>, String), Error> {
    let key = handshake::client_key(id);
    let plain = handshake::client_request("127.0.0.1", "/", &key, false);
    let pad_line = "X-Pad: \r\n".len();
    if head_bytes < plain.len() + pad_line + 1 {
        return Err(format!(
            "--head-bytes must be at least {} (the request without padding)",
            plain.len() + pad_line + 1
        )
        .into());
    }
    let pad = "a".repeat(head_bytes - plain.len() - pad_line);
    let head = String::from_utf8(plain).expect("ASCII");
    let request = head.replacen("\r\n", &format!("\r\nX-Pad: {pad}\r\n"), 1);
    debug_assert_eq!(request.len(), head_bytes);
    Ok((request.into_bytes(), key))
}

/// Spawns `spec`, trickles, checks every answer and stops the server.
pub fn run(spec: &ServerSpec, options: &TrickleOptions) -> Result<TrickleReport, Error> {
    if options.conns == 0 || options.conns > 19_000 {
        return Err("--conns must be 1 to 19000 (one process holds them all)".into());
    }
    let (mut server, command, port) = start_server(
        spec,
        options.port,
        options.wait_quiet,
        options.start_timeout,
    )?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let requests = (0..options.conns as u64)
        .map(|id| padded_request(id, options.head_bytes))
        .collect::<Result<Vec<_>, _>>()?;
    let before = procfs::tree_usage(server.pid())?;
    let started = Instant::now();
    // Each connection sends its first byte at once: a listener that defers
    // accepting until data arrives then accepts it, instead of leaving it
    // in a queue that 10,000 silent connections would overflow.
    let mut conns = Vec::with_capacity(options.conns);
    for (request, _) in &requests {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.write_all(&request[..1])?;
        conns.push(stream);
    }
    // A connection the server closed (a handshake timeout shorter than the
    // trickle, say) stops being written and is not counted as upgraded.
    let mut alive = vec![true; conns.len()];
    for i in 1..options.head_bytes {
        for ((stream, (request, _)), alive) in conns.iter_mut().zip(&requests).zip(&mut alive) {
            *alive = *alive && stream.write_all(&request[i..=i]).is_ok();
        }
    }
    let timeout = Duration::from_secs(options.answer_timeout);
    let mut upgraded = 0;
    for ((stream, (_, key)), _) in conns
        .iter_mut()
        .zip(&requests)
        .zip(&alive)
        .filter(|(_, a)| **a)
    {
        stream.set_read_timeout(Some(timeout))?;
        if read_head(stream).is_ok_and(|head| handshake::check_response(&head, key, false).is_ok())
        {
            upgraded += 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let after = procfs::tree_usage(server.pid())?;
    let cpu = (after.cpu_ns - before.cpu_ns) as f64 / 1e9;
    let user = (after.user_ns - before.user_ns) as f64 / 1e9;
    server.stop();
    Ok(TrickleReport {
        command,
        conns: options.conns,
        head_bytes: options.head_bytes,
        upgraded,
        secs,
        server_cpu_secs: cpu,
        server_user_secs: user,
        server_us_per_conn: cpu * 1e6 / options.conns as f64,
        server_ns_per_byte: cpu * 1e9 / (options.conns * options.head_bytes) as f64,
    })
}

/// Reads one response head.
fn read_head(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 512];
    while handshake::head_len(&head).is_none() {
        let n = stream.read(&mut buf)?;
        if n == 0 || head.len() > 16 * 1024 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_requests_have_the_asked_size_and_stay_valid() {
        let (request, key) = padded_request(7, 1000).unwrap();
        assert_eq!(request.len(), 1000);
        assert_eq!(handshake::head_len(&request), Some(1000));
        let text = String::from_utf8(request).unwrap();
        assert!(text.starts_with("GET / HTTP/1.1\r\nX-Pad: aaa"));
        assert!(text.contains(&format!("Sec-WebSocket-Key: {key}\r\n")));
        assert!(padded_request(7, 10).is_err());
    }
}

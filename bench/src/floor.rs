//! The floor: the least a push server can do, as a reference measured in
//! the same run as the server under test.
//!
//! One thread, one epoll loop (mio). It accepts connections, answers the
//! upgrade (read the request head, hash the key, write the 101), then keeps
//! nothing per connection but the socket itself in a `Vec`, and no longer
//! watches it. Each line read from standard input is encoded once as an
//! unmasked text frame and `write()`n to every socket in a tight loop:
//! no per-connection WebSocket state, no queues. A socket that cannot take
//! the whole frame at once (its peer stopped reading, or is gone) is closed.
//!
//! Standard input is read by a helper thread that hands finished frames to
//! the loop through a channel and a `Waker`; EOF stops the reading, not the
//! server. The server runs until it is killed.

use std::collections::HashMap;
use std::io::{self, BufRead, Read, Write};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use socket2::{Domain, Socket, Type};

use crate::frame::{self, opcode};
use crate::handshake;

/// Listen backlog; the kernel caps it at `net.core.somaxconn`.
const BACKLOG: i32 = 4096;

const LISTENER: Token = Token(usize::MAX);
const STDIN: Token = Token(usize::MAX - 1);

/// A connection whose upgrade request is still arriving.
struct Upgrading {
    stream: TcpStream,
    head: Vec<u8>,
}

/// Runs the floor server on `listen`, broadcasting standard input, until
/// the process is killed.
pub fn run(listen: SocketAddr) -> io::Result<()> {
    let listener = bind(listen)?;
    eprintln!("floor listening on {}", listener.local_addr()?);
    serve(listener, io::stdin())
}

/// Serves `listener`, broadcasting each line of `input`; returns only on
/// an error of the poll itself.
fn serve(mut listener: TcpListener, input: impl Read + Send + 'static) -> io::Result<()> {
    let mut poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let waker = Waker::new(poll.registry(), STDIN)?;
    let (frames_tx, frames) = mpsc::channel();
    thread::Builder::new()
        .name("input".into())
        .spawn(move || read_lines(input, frames_tx, waker))?;

    let mut events = Events::with_capacity(1024);
    let mut upgrading: HashMap<Token, Upgrading> = HashMap::new();
    let mut open: Vec<TcpStream> = Vec::new();
    let mut next_token = 0;
    let mut buf = [0u8; 4096];
    loop {
        match poll.poll(&mut events, None) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for event in &events {
            match event.token() {
                LISTENER => loop {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            let token = Token(next_token);
                            next_token = (next_token + 1) % STDIN.0;
                            poll.registry()
                                .register(&mut stream, token, Interest::READABLE)?;
                            upgrading.insert(
                                token,
                                Upgrading {
                                    stream,
                                    head: Vec::new(),
                                },
                            );
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        // A connection that died in the backlog, or a
                        // descriptor limit: keep serving the others.
                        Err(e) => {
                            eprintln!("floor: accept: {e}");
                            break;
                        }
                    }
                },
                STDIN => {
                    for frame in frames.try_iter() {
                        broadcast(&mut open, &frame);
                    }
                }
                token => {
                    let Some(conn) = upgrading.get_mut(&token) else {
                        continue;
                    };
                    match read_upgrade(conn, &mut buf) {
                        Ok(false) => {}
                        Ok(true) => {
                            let mut conn = upgrading.remove(&token).expect("present");
                            // Nothing is read from an open connection: stop watching it.
                            poll.registry().deregister(&mut conn.stream)?;
                            open.push(conn.stream);
                        }
                        Err(_) => drop(upgrading.remove(&token)),
                    }
                }
            }
        }
    }
}

/// A non-blocking listener on `addr` with `SO_REUSEADDR` and a large backlog.
fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM.nonblocking(), None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// Reads what has arrived of the upgrade request; once the head is complete,
/// writes the 101 answer and returns `Ok(true)`.
fn read_upgrade(conn: &mut Upgrading, buf: &mut [u8]) -> io::Result<bool> {
    loop {
        let n = match conn.stream.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        conn.head.extend_from_slice(&buf[..n]);
        if let Some(end) = handshake::head_len(&conn.head) {
            let response = handshake::server_response(&conn.head[..end])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            // The first write to a fresh socket always fits whole.
            return match conn.stream.write(&response)? {
                n if n == response.len() => Ok(true),
                _ => Err(io::ErrorKind::WriteZero.into()),
            };
        }
        if conn.head.len() > handshake::MAX_HEAD {
            return Err(io::ErrorKind::InvalidData.into());
        }
    }
}

/// Writes `frame` to every open socket, closing those that can't take it whole.
fn broadcast(open: &mut Vec<TcpStream>, frame: &[u8]) {
    let before = open.len();
    open.retain_mut(|stream| matches!(stream.write(frame), Ok(n) if n == frame.len()));
    let dropped = before - open.len();
    if dropped > 0 {
        eprintln!("floor: closed {dropped} connections that could not take a frame");
    }
}

/// Reads `input` line by line, encodes each line (without its `\n` or
/// `\r\n`) as one text frame, and hands it to the loop.
fn read_lines(input: impl Read, frames: mpsc::Sender<Vec<u8>>, waker: Waker) {
    let mut input = io::BufReader::new(input);
    let mut line = Vec::new();
    loop {
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.last() == Some(&b'\n') {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        }
        let mut encoded = Vec::with_capacity(line.len() + 10);
        frame::encode(&mut encoded, opcode::TEXT, &line, None);
        if frames.send(encoded).is_err() || waker.wake().is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::Ipv4Addr;
    use std::os::unix::net::UnixStream;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::clients::Clients;
    use crate::message::{self, Stamp};
    use crate::sys;

    /// The floor and the client against each other: upgrade, three broadcasts,
    /// every one delivered once and in order.
    #[test]
    fn clients_receive_every_broadcast_from_the_floor() {
        const CONNS: usize = 50;
        let listener = bind((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
        let addr = listener.local_addr().unwrap();
        let (mut feed, input) = UnixStream::pair().unwrap();
        // The server thread is left running; it ends with the test process.
        thread::spawn(move || serve(listener, input));

        let mut clients = Clients::new(addr, vec![Ipv4Addr::new(127, 0, 0, 2)], 32).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let step_until = |clients: &mut Clients, done: &dyn Fn(&Clients) -> bool| {
            while !done(clients) {
                assert!(
                    Instant::now() < deadline,
                    "timed out: {:?}",
                    clients.tally()
                );
                clients.step(Duration::from_millis(10)).unwrap();
            }
        };
        clients.start(CONNS);
        step_until(&mut clients, &|c| c.open() == CONNS);
        for seq in 1..=3 {
            let sent_ns = sys::now_ns();
            clients.tally_mut().sent(seq, sent_ns, CONNS as u32);
            let mut line = message::encode(Stamp { seq, sent_ns }, 32).unwrap();
            line.push(b'\n');
            feed.write_all(&line).unwrap();
            step_until(&mut clients, &|c| {
                c.tally().message(seq).unwrap().received as usize == CONNS
            });
        }
        let tally = clients.tally();
        assert_eq!(tally.lost(), 0);
        assert_eq!(
            (tally.duplicates, tally.out_of_order, tally.corrupt),
            (0, 0, 0)
        );
        assert!(tally.failures.is_empty(), "{:?}", tally.failures);
        assert_eq!(tally.latency().len(), 3 * CONNS as u64);
    }
}

//! Shared helpers for the integration tests: an embedded server on port 0,
//! tungstenite clients, and raw TCP with hand-built frames for malformed input.
//!
//! The raw frame code here is written from RFC 6455 §5.2 independently of
//! the server's own codec, so the tests do not check the server against itself.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread::JoinHandle;
use std::time::Duration;

use tungstenite::stream::MaybeTlsStream;
use tungstenite::WebSocket;
use wspush::{ChannelName, ClientId, Config, Handle, Recipients, Server};

pub mod deflate;
pub mod sse;

/// The subscribers of `names` (valid channel names).
pub fn channels(names: &[&str]) -> Recipients {
    Recipients::Channels(names.iter().map(|n| channel(n)).collect())
}

/// A valid channel name.
pub fn channel(name: &str) -> ChannelName {
    ChannelName::new(name).expect("a valid channel name")
}

/// A valid client id.
pub fn client_id(id: &str) -> ClientId {
    ClientId::new(id).expect("a valid client id")
}

/// How long any single read in a test may block before the test fails
/// instead of hanging.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Makes room for `files` descriptors in this test process (its clients,
/// and an embedded server's sockets too): raises the soft limit to the hard
/// one, as wspush does when it starts (a fresh login's soft limit is often
/// 1,024), and fails with the fix when even the hard limit is lower.
pub fn need_open_files(files: u64) {
    let limit = wspush::sys::raise_open_file_limit().expect("raise RLIMIT_NOFILE");
    assert!(
        limit >= files,
        "this test needs {files} open files and the hard limit is {limit}: \
         raise it (as root: ulimit -Hn {files}; see tuning/README.md)"
    );
}

/// Steps a server driven by hand with `poll_once` until `done` holds;
/// panics after `IO_TIMEOUT`.
pub fn poll_until(server: &mut Server, what: &str, mut done: impl FnMut(&Server) -> bool) {
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    while !done(server) {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        server.poll_once(Some(Duration::from_millis(10))).unwrap();
    }
}

/// An embedded server running `run()` on its own thread; shut down on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    /// Where `/metrics` is served when the config gives it a listener.
    pub metrics_addr: Option<SocketAddr>,
    pub handle: Handle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    pub fn start(config: Config) -> TestServer {
        TestServer::from_server(Server::bind(config).expect("bind on port 0"))
    }

    /// Runs `server` on its thread.
    pub fn from_server(mut server: Server) -> TestServer {
        let addr = server.local_addr();
        let metrics_addr = server.metrics_addr();
        let handle = server.handle();
        let thread = std::thread::spawn(move || server.run());
        TestServer {
            addr,
            metrics_addr,
            handle,
            thread: Some(thread),
        }
    }

    pub fn echo() -> TestServer {
        TestServer::start(Config::default().with(|c| {
            c.echo = true;
        }))
    }

    /// Shuts the server down and waits for its loop to return.
    pub fn stop(mut self) {
        self.join();
    }

    fn join(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = self.handle.shutdown();
            thread
                .join()
                .expect("server thread panicked")
                .expect("server loop failed");
        }
    }

    /// Polls the server's metrics until `done` holds (the loop runs on
    /// another thread); panics after `IO_TIMEOUT`.
    pub fn wait_for(
        &self,
        what: &str,
        done: impl Fn(&wspush::MetricsSnapshot) -> bool,
    ) -> wspush::MetricsSnapshot {
        let deadline = std::time::Instant::now() + IO_TIMEOUT;
        loop {
            let metrics = self.handle.metrics();
            if done(&metrics) {
                return metrics;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}: {metrics:#?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.join();
        }
    }
}

pub type Client = WebSocket<MaybeTlsStream<TcpStream>>;

/// A tungstenite client connected to `path` (e.g. `/ws?id=1`), with a
/// small read buffer (thousands of them may be open) and room for 32 MiB
/// messages.
pub fn connect(addr: SocketAddr, path: &str) -> Client {
    let config = tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(4096)
        .max_message_size(Some(32 << 20));
    let (client, response) =
        tungstenite::client::connect_with_config(format!("ws://{addr}{path}"), Some(config), 0)
            .expect("WebSocket connect");
    assert_eq!(response.status(), 101);
    if let MaybeTlsStream::Plain(stream) = client.get_ref() {
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    }
    client
}

/// [`connect`] with a receive buffer of 4 KiB, set before the socket
/// connects (so the kernel holds little for it): a client that reads
/// slowly, or not at all for a while, soon has the server queue for it.
pub fn connect_slow_reader(addr: SocketAddr, path: &str) -> Client {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&addr.into()).expect("TCP connect");
    let stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let config = tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(4096)
        .max_message_size(Some(32 << 20));
    let (client, response) = tungstenite::client::client_with_config(
        format!("ws://{addr}{path}"),
        MaybeTlsStream::Plain(stream),
        Some(config),
    )
    .expect("WebSocket connect");
    assert_eq!(response.status(), 101);
    client
}

/// The next `n` messages `client` gets, each of which must be text.
pub fn texts(client: &mut Client, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| match client.read().expect("a message") {
            tungstenite::Message::Text(text) => text.to_string(),
            other => panic!("not text: {other:?}"),
        })
        .collect()
}

/// A plain TCP connection with read/write timeouts.
pub fn raw(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("TCP connect");
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

/// A valid upgrade request for `path`, with the RFC 6455 sample key.
pub fn upgrade_request(path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
}

/// The answer to an upgrade request for `target` with `extra` header
/// lines; a 401 must ask for a bearer token.
pub fn upgrade_answer(addr: SocketAddr, target: &str, extra: &str) -> HttpResponse {
    let mut stream = raw(addr);
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
    .unwrap();
    let response = read_response(&mut stream);
    if response.status == 401 {
        assert_eq!(response.header("WWW-Authenticate"), Some("Bearer"));
    }
    response
}

/// Reads an HTTP response head (and a body of Content-Length bytes).
pub fn read_response(stream: &mut TcpStream) -> HttpResponse {
    let mut data = Vec::new();
    let mut byte = [0u8; 1];
    while !data.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => data.push(byte[0]),
            other => panic!(
                "response ended early ({other:?}): {:?}",
                String::from_utf8_lossy(&data)
            ),
        }
    }
    let head = String::from_utf8(data).expect("ASCII response head");
    let status: u16 = head[9..12].parse().expect("status code");
    let headers: Vec<(String, String)> = head
        .lines()
        .skip(1)
        .filter_map(|line| line.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect();
    let length = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).expect("response body");
    HttpResponse {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A raw connection that has completed the upgrade.
pub fn raw_upgraded(addr: SocketAddr) -> TcpStream {
    let mut stream = raw(addr);
    stream.write_all(upgrade_request("/").as_bytes()).unwrap();
    assert_eq!(read_response(&mut stream).status, 101);
    stream
}

/// An upgraded raw client whose receive buffer is held at 64 KiB (no
/// autotuning), for tests of a client that stops reading: how much the
/// kernel buffers then does not depend on the machine's `tcp_rmem`
/// (32 MiB at most by default on recent kernels).
pub fn stalling_client(addr: SocketAddr) -> TcpStream {
    let stream = raw(addr);
    socket2::SockRef::from(&stream)
        .set_recv_buffer_size(64 * 1024)
        .unwrap();
    let mut stream = stream;
    stream.write_all(upgrade_request("/").as_bytes()).unwrap();
    assert_eq!(read_response(&mut stream).status, 101);
    stream
}

pub const MASK: [u8; 4] = [0x12, 0x34, 0x56, 0x78];

/// A client frame as RFC 6455 §5.2 lays it out: `first_byte` carries FIN,
/// RSV and opcode; the payload is masked with [`MASK`].
pub fn client_frame(first_byte: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![first_byte];
    let len = payload.len();
    if len < 126 {
        out.push(0x80 | len as u8);
    } else if len <= 0xFFFF {
        out.push(0x80 | 126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    out.extend_from_slice(&MASK);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
    out
}

/// Frame first bytes: FIN plus opcode.
pub const TEXT: u8 = 0x81;
pub const BINARY: u8 = 0x82;
pub const CLOSE: u8 = 0x88;
pub const PING: u8 = 0x89;
pub const PONG: u8 = 0x8A;
/// Without FIN.
pub const TEXT_START: u8 = 0x01;
pub const CONTINUATION: u8 = 0x00;
pub const CONTINUATION_END: u8 = 0x80;

/// A server frame read from a raw connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFrame {
    pub fin: bool,
    /// RSV1–3 (RSV1 is 0b100: a compressed message).
    pub rsv: u8,
    pub opcode: u8,
    pub payload: Vec<u8>,
}

impl ServerFrame {
    /// The status code of a close frame.
    pub fn close_code(&self) -> Option<u16> {
        (self.opcode == 0x8 && self.payload.len() >= 2)
            .then(|| u16::from_be_bytes([self.payload[0], self.payload[1]]))
    }
}

/// Reads one frame; `None` at EOF before a frame starts. Server frames
/// must not be masked.
pub fn read_frame(stream: &mut impl Read) -> Option<ServerFrame> {
    let mut head = [0u8; 2];
    match stream.read(&mut head[..1]) {
        Ok(0) => return None,
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
        Err(e) => panic!("reading a frame: {e}"),
    }
    stream.read_exact(&mut head[1..]).expect("frame header");
    assert_eq!(head[1] & 0x80, 0, "server frames are never masked");
    let len = match head[1] & 0x7F {
        126 => {
            let mut b = [0u8; 2];
            stream.read_exact(&mut b).unwrap();
            u16::from_be_bytes(b) as usize
        }
        127 => {
            let mut b = [0u8; 8];
            stream.read_exact(&mut b).unwrap();
            u64::from_be_bytes(b) as usize
        }
        n => n as usize,
    };
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).expect("frame payload");
    Some(ServerFrame {
        fin: head[0] & 0x80 != 0,
        rsv: (head[0] >> 4) & 0x07,
        opcode: head[0] & 0x0F,
        payload,
    })
}

/// Reads frames until a close frame; returns its code (`Some(0)` for a
/// close without a code). Panics if the connection ends first.
pub fn expect_close(stream: &mut TcpStream) -> u16 {
    loop {
        let frame = read_frame(stream).expect("connection ended before a close frame");
        if frame.opcode == 0x8 {
            return frame.close_code().unwrap_or(0);
        }
    }
}

/// Sends our close reply and checks the server then ends the TCP connection.
pub fn finish_close(stream: &mut TcpStream) {
    let _ = stream.write_all(&client_frame(CLOSE, &1000u16.to_be_bytes()));
    expect_eof(stream);
}

/// Reads until EOF, failing if any more frames arrive.
pub fn expect_eof(stream: &mut TcpStream) {
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "unexpected bytes after close: {rest:?}"),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("waiting for the server to close: {e}"),
    }
}

/// `GET path` as a plain HTTP request (no upgrade), with extra header lines.
pub fn http_get(addr: SocketAddr, path: &str, headers: &str) -> HttpResponse {
    let mut stream = raw(addr);
    // One write, so the request arrives whole.
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    read_response(&mut stream)
}

/// The value of one sample (`name` with its labels, as written) in a
/// Prometheus text page.
pub fn sample(page: &str, series: &str) -> u64 {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {series} in:\n{page}"))
        .parse()
        .expect("an integer sample")
}

/// Sends `signal` (`-TERM`, `-INT`, `-HUP` ...) to process `pid`.
pub fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

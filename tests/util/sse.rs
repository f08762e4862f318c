//! An event stream (SSE) client, reading as the HTML standard's event
//! stream interpretation does, written apart from the server's writer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use super::raw;

/// One dispatched event: its last event id, type and data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: String,
    pub kind: String,
    pub data: String,
}

/// An event stream read off a socket.
pub struct Stream {
    /// The socket it is read from.
    pub socket: TcpStream,
    /// Bytes read and not yet taken as lines.
    pub buf: Vec<u8>,
    /// The last event id set.
    pub last_id: String,
    /// The last `retry:` given, in milliseconds.
    pub retry: Option<u32>,
    /// The comments read (heartbeats).
    pub comments: usize,
}

impl Stream {
    /// Asks for an event stream at `target` with `extra` header lines;
    /// the response's status and head, and the stream if it is 200.
    pub fn open(addr: SocketAddr, target: &str, extra: &str) -> (u16, String, Option<Stream>) {
        let mut socket = raw(addr);
        write!(
            socket,
            "GET {target} HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n{extra}\r\n"
        )
        .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(socket.read(&mut byte).unwrap(), 1, "the head ended early");
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let status: u16 = head[9..12].parse().unwrap();
        if status != 200 {
            return (status, head, None);
        }
        let stream = Stream {
            socket,
            buf: Vec::new(),
            last_id: String::new(),
            retry: None,
            comments: 0,
        };
        (status, head, Some(stream))
    }

    /// The next line (without its end: CRLF, LF or CR).
    pub fn line(&mut self) -> String {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n' || b == b'\r') {
                let line = String::from_utf8(self.buf[..end].to_vec()).unwrap();
                let skip = match &self.buf[end..] {
                    [b'\r', b'\n', ..] => 2,
                    [b'\r'] => return self.more_then_line(),
                    _ => 1,
                };
                self.buf.drain(..end + skip);
                return line;
            }
            self.fill();
        }
    }

    fn more_then_line(&mut self) -> String {
        self.fill();
        self.line()
    }

    fn fill(&mut self) {
        let mut chunk = [0u8; 4096];
        let n = self.socket.read(&mut chunk).expect("more of the stream");
        assert!(n > 0, "the stream ended");
        self.buf.extend_from_slice(&chunk[..n]);
    }

    /// The next event dispatched (comments and retry fields are counted).
    pub fn event(&mut self) -> Event {
        let (mut data, mut kind, mut id) = (String::new(), String::new(), None);
        loop {
            let line = self.line();
            if line.is_empty() {
                if let Some(new) = id.take() {
                    self.last_id = new;
                }
                if !data.is_empty() {
                    data.pop();
                    let kind = if kind.is_empty() {
                        "message".into()
                    } else {
                        kind
                    };
                    return Event {
                        id: self.last_id.clone(),
                        kind,
                        data,
                    };
                }
                kind.clear();
                continue;
            }
            if line.starts_with(':') {
                self.comments += 1;
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" => {
                    data.push_str(value);
                    data.push('\n');
                }
                "event" => kind = value.to_string(),
                "id" => id = Some(value.to_string()),
                "retry" => self.retry = value.parse().ok(),
                _ => {}
            }
        }
    }
}

/// The `status` of a status event.
pub fn status_of(event: &Event) -> &str {
    assert_eq!(event.kind, "status", "{event:?}");
    let start = event.data.find(r#""status":""#).unwrap() + 10;
    &event.data[start..start + event.data[start..].find('"').unwrap()]
}

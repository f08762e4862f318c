//! The publish listener's HTTP/1.1, without I/O: requests read one after
//! another from a keep-alive connection's bytes as they come, checked,
//! and their answers written.
//!
//! - `POST /publish` with `Authorization: Bearer KEY` and a body of command
//!   lines (the `--input commands` grammar, whatever the input's mode):
//!   every line must parse, or none is taken (400 naming the first bad
//!   one).
//! - `POST /publish?VERB[=ARGS]` (`all`, `pub=CH[,CH…]`, `id=ID`,
//!   `conn=KEY`): the body is one message, the command `VERB ARGS BODY`;
//!   text (one line of UTF-8), or binary with
//!   `Content-Type: application/octet-stream` (any bytes, sent as
//!   `VERB:b64`).
//! - `GET /stats` with the key: what the server holds, as its owner says.
//! - `GET /presence?channel=CH` and `GET /clients?id=ID` with the key:
//!   who is connected (see [`presence`](crate::protocol::presence); a bad
//!   query is a 400 saying why).
//!
//! A body needs a `Content-Length` (411; chunked bodies are refused, 501)
//! of at most [`PublishLimits::max_body`] (413, and the connection is closed
//! rather than its body read). Each line is at most
//! [`PublishLimits::max_line`] (413 naming it).

use std::fmt::Write as _;
use std::mem::MaybeUninit;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use crate::protocol::auth::Tokens;
use crate::protocol::commands::Command;
use crate::protocol::presence::{BadQuery, Query};

/// The longest request head taken (431 past it).
pub const MAX_HEAD_BYTES: usize = 8 * 1024;

/// How many header lines a head may have.
const MAX_HEADERS: usize = 64;

/// How long a publisher is asked to wait after a 503, in seconds.
pub const RETRY_AFTER_SECS: u32 = 1;

/// What the listener takes.
#[derive(Debug, Clone, Copy)]
pub struct PublishLimits {
    /// The longest body.
    pub max_body: usize,
    /// The longest command line (a body's line, or the line a message
    /// makes).
    pub max_line: usize,
}

/// A request, read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Command lines to hand on: `lines` of them, each ending in `\n`.
    Publish {
        /// The lines.
        text: Vec<u8>,
        /// How many.
        lines: usize,
    },
    /// `GET /stats`.
    Stats,
    /// `GET /presence` or `GET /clients`.
    Presence(Query),
}

/// What [`parse`] found at the start of a connection's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// The request is not whole yet; pass `seen` to the next call (the
    /// bytes searched for the head's end in vain, or 0 once it is found).
    Partial {
        /// Where to go on searching.
        seen: usize,
    },
    /// A request, whole and good, and the bytes it took; `close`: the
    /// client asked to close after it (or spoke HTTP/1.0).
    Request {
        /// What it asks.
        request: Request,
        /// The bytes of the head and the body.
        used: usize,
        /// Close after answering.
        close: bool,
    },
    /// A request refused, and the bytes it took, if its body was read
    /// (`None`: the connection is to be closed after the answer).
    Refused {
        /// Why.
        refusal: Refusal,
        /// The bytes taken, when the next request can be read after it.
        used: Option<usize>,
    },
}

/// Why a request was refused: a status and the line its body gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status.
    pub status: u16,
    /// One line saying why.
    pub why: String,
}

impl Refusal {
    fn new(status: u16, why: impl Into<String>) -> Refusal {
        Refusal {
            status,
            why: why.into(),
        }
    }
}

/// Reads the request at the start of `buf`, given the `seen` of the
/// [`Parsed::Partial`] it was last found to be (0 the first time): while
/// the head is incomplete, only new bytes are searched for its end, so a
/// head that comes a byte at a time costs linear time. `keys`: the keys
/// a publisher may present.
pub fn parse(buf: &[u8], seen: usize, keys: &Tokens, limits: &PublishLimits) -> Parsed {
    let from = seen.saturating_sub(3);
    let Some(end) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > MAX_HEAD_BYTES {
            return refused(431, "request head larger than 8 KiB", None);
        }
        return Parsed::Partial { seen: buf.len() };
    };
    let head_len = from + end + 4;
    if head_len > MAX_HEAD_BYTES {
        return refused(431, "request head larger than 8 KiB", None);
    }
    let mut headers = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    match request.parse_with_uninit_headers(&buf[..head_len], &mut headers) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) | Err(_) => {
            return refused(400, "malformed HTTP request", None)
        }
    }
    let target = request.path.unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let head = Head::of(request.headers);
    let close = request.version == Some(0) || head.close;
    let body_len = match head.content_length {
        Some(Ok(len)) => len,
        Some(Err(())) => return refused(400, "Content-Length is not one number", None),
        None => 0,
    };
    let used = head_len.checked_add(body_len);
    // The answer to a refused request whose body is read whole (none,
    // without a length; not when it is chunked or too long), so that the
    // connection goes on.
    let after_body =
        |refusal: Refusal| match used.filter(|_| body_len <= limits.max_body && !head.chunked) {
            // The body is to be read past before the next request.
            Some(used) if used > buf.len() => Parsed::Partial { seen: 0 },
            used => Parsed::Refused { refusal, used },
        };
    let method = request.method.unwrap_or_default();
    match (method, path) {
        ("POST", "/publish") | ("GET", "/stats" | "/presence" | "/clients") => {}
        (_, "/publish") => return after_body(Refusal::new(405, "POST /publish")),
        (_, "/stats" | "/presence" | "/clients") => {
            return after_body(Refusal::new(405, format!("GET {path}")))
        }
        _ => {
            return after_body(Refusal::new(
                404,
                "POST /publish, GET /stats, GET /presence or GET /clients",
            ))
        }
    }
    let key = head.authorization.and_then(bearer);
    if key.and_then(|key| keys.find(key)).is_none() {
        return refused(401, "the publish key is required", None);
    }
    if method == "GET" {
        let request = match path {
            "/stats" => Request::Stats,
            _ => match Query::from_request(path, query) {
                Ok(query) => Request::Presence(query),
                Err(BadQuery(why)) => return after_body(Refusal::new(400, why)),
            },
        };
        return Parsed::Request {
            request,
            used: head_len,
            close,
        };
    }
    if head.chunked {
        return refused(
            501,
            "chunked bodies are not taken: send a Content-Length",
            None,
        );
    }
    if head.content_length.is_none() {
        return refused(411, "a body needs a Content-Length", None);
    }
    if body_len > limits.max_body {
        let why = format!(
            "a body of {body_len} bytes: at most {} are taken",
            limits.max_body
        );
        return refused(413, why, None);
    }
    let Some(used) = used.filter(|&used| used <= buf.len()) else {
        return Parsed::Partial { seen: 0 };
    };
    let body = &buf[head_len..used];
    let published = match query {
        "" => lines(body, limits),
        _ => message(query, head.binary, body, limits),
    };
    match published {
        Ok((text, lines)) => Parsed::Request {
            request: Request::Publish { text, lines },
            used,
            close,
        },
        Err(refusal) => Parsed::Refused {
            refusal,
            used: Some(used),
        },
    }
}

fn refused(status: u16, why: impl Into<String>, used: Option<usize>) -> Parsed {
    Parsed::Refused {
        refusal: Refusal::new(status, why),
        used,
    }
}

/// The key of an `Authorization: Bearer KEY` value.
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    let (scheme, key) = value.split_at(value.len().min(7));
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| key.trim_ascii())
}

/// The headers read.
#[derive(Debug, Default)]
struct Head<'a> {
    content_length: Option<Result<usize, ()>>,
    authorization: Option<&'a [u8]>,
    chunked: bool,
    close: bool,
    binary: bool,
}

impl<'a> Head<'a> {
    fn of(headers: &[httparse::Header<'a>]) -> Head<'a> {
        let mut head = Head::default();
        for header in headers {
            let name = header.name.as_bytes();
            let value = header.value.trim_ascii();
            if name.eq_ignore_ascii_case(b"Content-Length") {
                let len = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
                head.content_length = match (head.content_length, len) {
                    (None, Some(len)) => Some(Ok(len)),
                    (Some(Ok(was)), Some(len)) if was == len => Some(Ok(len)),
                    _ => Some(Err(())),
                };
            } else if name.eq_ignore_ascii_case(b"Authorization") {
                head.authorization = Some(value);
            } else if name.eq_ignore_ascii_case(b"Transfer-Encoding") {
                head.chunked = true;
            } else if name.eq_ignore_ascii_case(b"Connection") {
                head.close |= value
                    .split(|&b| b == b',')
                    .any(|v| v.trim_ascii().eq_ignore_ascii_case(b"close"));
            } else if name.eq_ignore_ascii_case(b"Content-Type") {
                head.binary = value.split(|&b| b == b';').next().is_some_and(|t| {
                    t.trim_ascii()
                        .eq_ignore_ascii_case(b"application/octet-stream")
                });
            }
        }
        head
    }
}

/// A body of command lines, each checked: the lines with their ends, and
/// how many. A last line without `\n` counts; a `\r` before a `\n` is
/// dropped, as the input's reader drops it.
fn lines(body: &[u8], limits: &PublishLimits) -> Result<(Vec<u8>, usize), Refusal> {
    let body = body.strip_suffix(b"\n").unwrap_or(body);
    if body.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let mut text = Vec::with_capacity(body.len() + 1);
    let mut count = 0;
    for (index, line) in body.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let number = index + 1;
        if line.len() > limits.max_line {
            let why = format!(
                "line {number}: longer than the {}-byte limit",
                limits.max_line
            );
            return Err(Refusal::new(413, why));
        }
        let line = std::str::from_utf8(line)
            .map_err(|_| Refusal::new(400, format!("line {number}: not UTF-8")))?;
        Command::parse(line).map_err(|e| Refusal::new(400, format!("line {number}: {e}")))?;
        text.extend_from_slice(line.as_bytes());
        text.push(b'\n');
        count += 1;
    }
    Ok((text, count))
}

/// The one command line a message's query (`VERB[=ARGS]`) and body make.
fn message(
    query: &str,
    binary: bool,
    body: &[u8],
    limits: &PublishLimits,
) -> Result<(Vec<u8>, usize), Refusal> {
    let (verb, args) = query.split_once('=').unwrap_or((query, ""));
    let takes_args = match verb {
        "all" => false,
        "pub" | "id" | "conn" => true,
        _ => {
            return Err(Refusal::new(
                400,
                "the query names whom: all, pub=CH[,CH…], id=ID or conn=KEY",
            ))
        }
    };
    if takes_args == args.is_empty() {
        return Err(Refusal::new(
            400,
            format!(
                "{verb} takes {}",
                if takes_args { "a value" } else { "none" }
            ),
        ));
    }
    let mut line = String::with_capacity(verb.len() + args.len() + body.len() * 4 / 3 + 8);
    line.push_str(verb);
    if binary {
        line.push_str(":b64");
    }
    if !args.is_empty() {
        line.push(' ');
        line.push_str(args);
    }
    line.push(' ');
    if binary {
        BASE64.encode_string(body, &mut line);
    } else {
        let text = std::str::from_utf8(body).map_err(|_| {
            Refusal::new(
                400,
                "a text message is UTF-8: send binary as application/octet-stream",
            )
        })?;
        if text.contains(['\n', '\r']) {
            return Err(Refusal::new(
                400,
                "a text message is one line: send several as command lines",
            ));
        }
        line.push_str(text);
    }
    if line.len() > limits.max_line {
        let why = format!(
            "the message makes a line longer than the {}-byte limit",
            limits.max_line
        );
        return Err(Refusal::new(413, why));
    }
    Command::parse(&line).map_err(|e| Refusal::new(400, e.to_string()))?;
    line.push('\n');
    Ok((line.into_bytes(), 1))
}

/// Writes the answer: `status` with `body` (JSON for a 200, else a line
/// of text), keeping the connection or closing it.
pub fn respond(out: &mut Vec<u8>, status: u16, body: &str, close: bool) {
    let (phrase, content_type) = match status {
        200 => ("OK", "application/json"),
        400 => ("Bad Request", "text/plain"),
        401 => ("Unauthorized", "text/plain"),
        404 => ("Not Found", "text/plain"),
        405 => ("Method Not Allowed", "text/plain"),
        411 => ("Length Required", "text/plain"),
        413 => ("Content Too Large", "text/plain"),
        431 => ("Request Header Fields Too Large", "text/plain"),
        501 => ("Not Implemented", "text/plain"),
        503 => ("Service Unavailable", "text/plain"),
        504 => ("Gateway Timeout", "text/plain"),
        _ => ("Error", "text/plain"),
    };
    let extra = match status {
        401 => "WWW-Authenticate: Bearer\r\n".to_string(),
        503 => format!("Retry-After: {RETRY_AFTER_SECS}\r\n"),
        _ => String::new(),
    };
    let connection = if close { "close" } else { "keep-alive" };
    let _ = write!(
        Buf(out),
        "HTTP/1.1 {status} {phrase}\r\n{extra}Content-Type: {content_type}\r\nContent-Length: {}\r\nConnection: {connection}\r\n\r\n{body}\n",
        body.len() + 1
    );
}

/// Writes into a `Vec<u8>` with `write!`.
struct Buf<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Buf<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: PublishLimits = PublishLimits {
        max_body: 1000,
        max_line: 100,
    };

    fn keys() -> Tokens {
        Tokens::new(["pub-key"]).unwrap()
    }

    fn post(target: &str, extra: &str, body: &str) -> String {
        format!(
            "POST {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer pub-key\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    fn parsed(request: &str) -> Parsed {
        parse(request.as_bytes(), 0, &keys(), &LIMITS)
    }

    fn refusal(request: &str) -> (u16, String, Option<usize>) {
        match parsed(request) {
            Parsed::Refused { refusal, used } => (refusal.status, refusal.why, used),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn command_lines_are_taken_whole_or_not_at_all() {
        let request = post("/publish", "", "all hello\r\npub news,chat hi\nid alice yo");
        assert_eq!(
            parsed(&request),
            Parsed::Request {
                request: Request::Publish {
                    text: b"all hello\npub news,chat hi\nid alice yo\n".to_vec(),
                    lines: 3,
                },
                used: request.len(),
                close: false,
            }
        );
        let bad = post("/publish", "", "all fine\nshout it\nall never");
        let (status, why, used) = refusal(&bad);
        assert_eq!((status, used), (400, Some(bad.len())));
        assert!(why.starts_with("line 2: "), "{why}");
        let empty = post("/publish", "", "");
        assert!(matches!(
            parsed(&empty),
            Parsed::Request {
                request: Request::Publish { lines: 0, .. },
                ..
            }
        ));
        let (status, why, _) = refusal(&post("/publish", "", "all ok\n\nall x"));
        assert_eq!(
            (status, why.as_str()),
            (400, "line 2: an empty line is not a command")
        );
    }

    #[test]
    fn one_message_takes_its_recipients_from_the_query() {
        let cases = [
            ("/publish?all", "", "hello there", "all hello there\n"),
            ("/publish?pub=news,chat", "", "hi", "pub news,chat hi\n"),
            ("/publish?id=alice", "", "", "id alice \n"),
            (
                "/publish?pub=raw",
                "Content-Type: application/octet-stream\r\n",
                "a\nb\r",
                "pub:b64 raw YQpiDQ==\n",
            ),
        ];
        for (target, extra, body, line) in cases {
            match parsed(&post(target, extra, body)) {
                Parsed::Request {
                    request: Request::Publish { text, lines: 1 },
                    ..
                } => assert_eq!(String::from_utf8(text).unwrap(), line, "{target}"),
                other => panic!("{target}: {other:?}"),
            }
        }
        for (target, body, why) in [
            ("/publish?all", "two\nlines", "a text message is one line"),
            ("/publish?shout", "x", "the query names whom"),
            ("/publish?all=x", "x", "all takes none"),
            ("/publish?pub=", "x", "pub takes a value"),
            ("/publish?pub=a%20b", "x", "channel holds '%'"),
        ] {
            let (status, got, _) = refusal(&post(target, "", body));
            assert_eq!(status, 400, "{target}");
            assert!(got.starts_with(why), "{target}: {got}");
        }
    }

    #[test]
    fn each_status_is_the_one_documented() {
        let no_key = "POST /publish HTTP/1.1\r\nContent-Length: 5\r\n\r\nall x";
        assert_eq!(refusal(no_key).0, 401);
        let wrong = no_key.replace("\r\n\r\n", "\r\nAuthorization: Bearer nope\r\n\r\n");
        assert_eq!(refusal(&wrong).0, 401);
        assert_eq!(refusal(&post("/other", "", "")).0, 404);
        let get = "GET /publish HTTP/1.1\r\n\r\n";
        assert_eq!(refusal(get), (405, "POST /publish".into(), Some(get.len())));
        // A refused request's body is read past, once it has come.
        let put = "PUT /publish HTTP/1.1\r\nContent-Length: 4\r\n\r\nab";
        assert_eq!(parsed(put), Parsed::Partial { seen: 0 });
        assert_eq!(refusal(&format!("{put}cd")).2, Some(put.len() + 2));
        let no_length = "POST /publish HTTP/1.1\r\nAuthorization: Bearer pub-key\r\n\r\n";
        assert_eq!(
            refusal(no_length),
            (411, "a body needs a Content-Length".into(), None)
        );
        let chunked = no_length.replace("\r\n\r\n", "\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(refusal(&chunked).0, 501);
        let big = format!(
            "POST /publish HTTP/1.1\r\nAuthorization: Bearer pub-key\r\nContent-Length: {}\r\n\r\n",
            LIMITS.max_body + 1
        );
        assert_eq!(refusal(&big).0, 413);
        let (status, why, used) =
            refusal(&post("/publish", "", &format!("all {}", "x".repeat(200))));
        assert_eq!(
            (status, why.as_str(), used.is_some()),
            (413, "line 1: longer than the 100-byte limit", true)
        );
        let twice = post("/publish", "Content-Length: 9\r\n", "all x");
        assert_eq!(refusal(&twice).0, 400);
        let huge = format!(
            "GET /stats HTTP/1.1\r\nX: {}\r\n\r\n",
            "y".repeat(MAX_HEAD_BYTES)
        );
        assert_eq!(refusal(&huge).0, 431);
        let stats =
            "GET /stats HTTP/1.1\r\nAuthorization: Bearer pub-key\r\nConnection: close\r\n\r\n";
        assert_eq!(
            parsed(stats),
            Parsed::Request {
                request: Request::Stats,
                used: stats.len(),
                close: true
            }
        );
        let get = |target: &str| {
            parsed(&format!(
                "GET {target} HTTP/1.1\r\nAuthorization: Bearer pub-key\r\n\r\n"
            ))
        };
        assert!(matches!(
            get("/presence?channel=news"),
            Parsed::Request {
                request: Request::Presence(Query::Channel { .. }),
                ..
            }
        ));
        assert!(matches!(
            get("/clients?id=bob"),
            Parsed::Request {
                request: Request::Presence(Query::Client { .. }),
                ..
            }
        ));
        match get("/presence?channel=a%20b") {
            Parsed::Refused { refusal, used } => {
                assert_eq!(refusal.status, 400);
                assert!(refusal.why.contains("a%20b"), "{}", refusal.why);
                assert!(used.is_some());
            }
            other => panic!("{other:?}"),
        }
        let unkeyed = "GET /presence?channel=news HTTP/1.1\r\n\r\n";
        assert_eq!(refusal(unkeyed).0, 401);
        let posted = post("/clients", "", "x");
        assert_eq!(refusal(&posted).0, 405);
    }

    #[test]
    fn a_request_split_at_every_byte_is_read_the_same() {
        let requests = [
            post("/publish", "", "all one\npub news two\n"),
            post("/publish?id=alice", "", "three"),
            post("/publish", "", "shout"),
        ];
        let stream: String = requests.concat();
        let whole: Vec<Parsed> = {
            let mut at = 0;
            let mut out = Vec::new();
            while at < stream.len() {
                let got = parse(&stream.as_bytes()[at..], 0, &keys(), &LIMITS);
                let used = match &got {
                    Parsed::Request { used, .. } => *used,
                    Parsed::Refused { used, .. } => used.unwrap(),
                    Parsed::Partial { .. } => panic!("partial"),
                };
                out.push(got);
                at += used;
            }
            out
        };
        assert_eq!(whole.len(), 3);
        // Fed a byte at a time, each request is partial until its last
        // byte, then read as it was whole.
        let bytes = stream.as_bytes();
        let (mut start, mut seen, mut got) = (0, 0, Vec::new());
        for end in 1..=bytes.len() {
            match parse(&bytes[start..end], seen, &keys(), &LIMITS) {
                Parsed::Partial { seen: now } => seen = now,
                parsed => {
                    start = end;
                    seen = 0;
                    got.push(parsed);
                }
            }
        }
        assert_eq!(got, whole);
    }

    #[test]
    fn answers_say_their_length_and_whether_the_connection_stays() {
        let mut out = Vec::new();
        respond(&mut out, 200, r#"{"lines":3}"#, false);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(
            text.contains("Content-Length: 12\r\n") && text.ends_with("\r\n\r\n{\"lines\":3}\n")
        );
        assert!(text.contains("Connection: keep-alive"));
        let mut out = Vec::new();
        respond(&mut out, 503, "busy", true);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("Retry-After: 1\r\n") && text.contains("Connection: close"));
    }
}

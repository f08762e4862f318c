//! The opening handshake (RFC 6455 §4.2): the HTTP/1.1 upgrade request, the
//! accept key and every response the server writes before the upgrade.
//!
//! Pure and allocation-free like httparse, which it wraps: headers are
//! parsed into stack storage, results borrow the input, and an incomplete
//! request is [`HeadStatus::Partial`], not an error.

use std::io::Write;
use std::mem::MaybeUninit;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use sha1::{Digest, Sha1};

use crate::protocol::auth::{self, Tokens, MAX_PRESENTED_LEN};
use crate::protocol::deflate;
use crate::protocol::jwt::{Claims, Verifier};
use crate::protocol::sse;

/// The GUID every server appends to the client's key (§1.3).
const WEBSOCKET_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// How many request header lines a head may have (hyper allows 100); more
/// is 431. They are parsed into stack storage of this many entries.
pub const MAX_HEADERS: usize = 128;

/// The longest response this module writes (a 101 with the
/// permessage-deflate answer is the longest).
pub const MAX_RESPONSE_LEN: usize = 320;

/// A valid request for a stream of messages: a WebSocket upgrade, or an
/// event stream (SSE) asked for by a `GET` that accepts one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgrade<'a> {
    /// The request target: path and query, e.g. `/ws?id=01`.
    pub target: &'a str,
    /// The token it presented, found good, when tokens are required.
    pub credential: Option<Credential>,
    /// What the stream is, and what that protocol agreed.
    pub protocol: Protocol<'a>,
}

/// What a stream's protocol is, and what the request said of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol<'a> {
    /// WebSocket (RFC 6455).
    WebSocket {
        /// The `Sec-WebSocket-Accept` value answering the client's key.
        accept: [u8; 28],
        /// The permessage-deflate terms agreed, if the client offered it
        /// and the server takes it.
        deflate: Option<deflate::Agreed>,
    },
    /// An event stream (`text/event-stream`).
    EventStream {
        /// The request's `Origin`, when origins are checked and it is an
        /// allowed one (the response lets that page read the stream).
        origin: Option<&'a [u8]>,
        /// Its `Last-Event-ID`: what a reconnecting `EventSource` resumes
        /// after.
        last_event_id: Option<&'a str>,
    },
}

/// The token a request presented, as the server found it good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A token of the token file: its place there (see [`Tokens::grant`]).
    Listed(usize),
    /// A signed token, and what it claims.
    Signed(Claims),
}

/// What [`parse_request`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadStatus<'a> {
    /// The request head is not complete yet.
    Partial,
    /// A valid upgrade (or event stream); the head took this many bytes,
    /// and whatever follows them already belongs to the stream.
    Upgrade(Upgrade<'a>, usize),
    /// A plain request for one of the server's own endpoints, by `GET`
    /// or `HEAD`; the head took this many bytes.
    Endpoint(Endpoint, Method, usize),
}

/// How a plain request asks for an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// The head and the body.
    Get,
    /// The head alone, as `GET` would have it (RFC 9110 §9.3.2).
    Head,
}

impl Method {
    /// The method a request (whole or not, valid or not) begins with,
    /// after the empty lines a parser skips, if it is one of these.
    pub fn of(request: &[u8]) -> Option<Method> {
        let request = request.trim_ascii_start();
        match () {
            _ if request.starts_with(b"GET ") => Some(Method::Get),
            _ if request.starts_with(b"HEAD ") => Some(Method::Head),
            _ => None,
        }
    }
}

/// The length of a response's head, up to and with its blank line (all
/// of `response` if it has none).
pub fn head_len(response: &[u8]) -> usize {
    response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(response.len(), |at| at + 4)
}

/// Why a request is refused; each maps to one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// 400: malformed request or a missing/invalid WebSocket header.
    BadRequest(&'static str),
    /// 404: the path is not the one served.
    NotFound,
    /// 405: not a GET (nor a HEAD of an endpoint).
    MethodNotAllowed,
    /// 401: tokens are required and the request had none, or one that is
    /// not good; it says why.
    Unauthorized(&'static str),
    /// 403: the `Origin`, a channel or the client id is not allowed; it
    /// says which.
    Forbidden(&'static str),
    /// 426: missing or unsupported `Sec-WebSocket-Version`.
    UpgradeRequired,
    /// 431: the request head is larger than this many bytes (the limit).
    HeadTooLarge(usize),
    /// 431: the request head has more than [`MAX_HEADERS`] header lines.
    TooManyHeaders,
    /// 429: the client's IP address holds its maximum number of connections.
    TooManyRequests,
    /// 503: the server holds its maximum number of connections.
    ServiceUnavailable,
    /// 400: the query asks for more channels than a connection may have
    /// (the limit).
    TooManyChannels(usize),
    /// 503: the channels asked for would be more than the server holds.
    ChannelLimit,
}

impl Rejection {
    /// The HTTP status code.
    pub fn status(self) -> u16 {
        match self {
            Rejection::BadRequest(_) | Rejection::TooManyChannels(_) => 400,
            Rejection::Unauthorized(_) => 401,
            Rejection::Forbidden(_) => 403,
            Rejection::NotFound => 404,
            Rejection::MethodNotAllowed => 405,
            Rejection::UpgradeRequired => 426,
            Rejection::HeadTooLarge(_) | Rejection::TooManyHeaders => 431,
            Rejection::TooManyRequests => 429,
            Rejection::ServiceUnavailable | Rejection::ChannelLimit => 503,
        }
    }

    /// The reason phrase and the one-line explanation sent as the body.
    fn text(self) -> (&'static str, &'static str) {
        const TOO_LARGE: &str = "Request Header Fields Too Large";
        match self {
            Rejection::BadRequest(why) => ("Bad Request", why),
            Rejection::Unauthorized(why) => ("Unauthorized", why),
            Rejection::Forbidden(why) => ("Forbidden", why),
            Rejection::NotFound => ("Not Found", "no WebSocket endpoint at this path"),
            Rejection::MethodNotAllowed => {
                ("Method Not Allowed", "a WebSocket upgrade must be a GET")
            }
            Rejection::UpgradeRequired => {
                ("Upgrade Required", "only WebSocket version 13 is supported")
            }
            // `write_response` follows these two with the limit's figure.
            Rejection::HeadTooLarge(_) => (TOO_LARGE, "request head larger than the limit"),
            Rejection::TooManyHeaders => (TOO_LARGE, "more header lines than the limit"),
            Rejection::TooManyRequests => (
                "Too Many Requests",
                "too many connections from this address",
            ),
            Rejection::ServiceUnavailable => {
                ("Service Unavailable", "server at its connection limit")
            }
            Rejection::TooManyChannels(_) => ("Bad Request", "more channels than the limit"),
            Rejection::ChannelLimit => ("Service Unavailable", "server at its channel limit"),
        }
    }

    /// Writes the complete response into `out` and returns its length.
    pub fn write_response(self, out: &mut [u8; MAX_RESPONSE_LEN]) -> usize {
        let (phrase, text) = self.text();
        let extra = match self {
            Rejection::UpgradeRequired => "Sec-WebSocket-Version: 13\r\n",
            Rejection::MethodNotAllowed => "Allow: GET\r\n",
            Rejection::Unauthorized(_) => "WWW-Authenticate: Bearer\r\n",
            _ => "",
        };
        let mut body = [0u8; MAX_RESPONSE_LEN];
        let body_len = match self {
            Rejection::HeadTooLarge(limit) => {
                write_into(&mut body, format_args!("{text}: {limit} bytes\n"))
            }
            Rejection::TooManyHeaders => {
                write_into(&mut body, format_args!("{text}: {MAX_HEADERS}\n"))
            }
            Rejection::TooManyChannels(limit) => {
                write_into(&mut body, format_args!("{text}: {limit}\n"))
            }
            _ => write_into(&mut body, format_args!("{text}\n")),
        };
        let head = write_into(
            out,
            format_args!(
                "HTTP/1.1 {} {phrase}\r\n{extra}Connection: close\r\nContent-Type: text/plain\r\nContent-Length: {body_len}\r\n\r\n",
                self.status(),
            ),
        );
        out[head..head + body_len].copy_from_slice(&body[..body_len]);
        head + body_len
    }
}

/// Writes the `101 Switching Protocols` response into `out`, with the
/// permessage-deflate answer when `deflate` was agreed. Plain byte copies:
/// this runs once per connection, and formatting cost more than the rest
/// of the response together.
pub fn write_accept_response(
    accept: &[u8; 28],
    deflate: Option<&deflate::Agreed>,
    out: &mut [u8; MAX_RESPONSE_LEN],
) -> usize {
    const HEAD: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ";
    const CRLF: &[u8] = b"\r\n";
    let extension = deflate.map(deflate::response_line);
    let extension = extension.as_ref().map_or(&[][..], |line| line.as_bytes());
    let mut len = 0;
    for part in [HEAD, accept, CRLF, extension, CRLF] {
        out[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    }
    len
}

/// The status of a page the server answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageStatus {
    /// `200 OK`.
    Ok,
    /// `503 Service Unavailable` (`/healthz` of a degraded server, if so
    /// configured).
    Unavailable,
}

/// Writes the head of a response with `status` whose body of `body_len`
/// bytes follows; the connection closes after it.
pub fn write_page_head(
    status: PageStatus,
    content_type: &str,
    body_len: usize,
    out: &mut [u8; MAX_RESPONSE_LEN],
) -> usize {
    let status = match status {
        PageStatus::Ok => "200 OK",
        PageStatus::Unavailable => "503 Service Unavailable",
    };
    write_into(
        out,
        format_args!(
            "HTTP/1.1 {status}\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {body_len}\r\n\r\n"
        ),
    )
}

fn write_into(out: &mut [u8; MAX_RESPONSE_LEN], args: std::fmt::Arguments<'_>) -> usize {
    let mut cursor = &mut out[..];
    cursor
        .write_fmt(args)
        .expect("bug: responses fit MAX_RESPONSE_LEN");
    MAX_RESPONSE_LEN - cursor.len()
}

/// The `Sec-WebSocket-Accept` value for a client key (§4.2.2): base64 of
/// SHA-1 of the key followed by the WebSocket GUID.
pub fn accept_key(key: &[u8]) -> [u8; 28] {
    let digest = Sha1::new()
        .chain_update(key)
        .chain_update(WEBSOCKET_GUID)
        .finalize();
    let mut out = [0u8; 28];
    let written = BASE64
        .encode_slice(digest, &mut out)
        .expect("bug: 20 bytes encode to 28");
    debug_assert_eq!(written, 28);
    out
}

/// What a listener serves besides WebSocket upgrades.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoints {
    /// WebSocket upgrades are served (not on a metrics-only listener).
    pub websocket: bool,
    /// `GET /metrics` is served. `GET /healthz` always is.
    pub metrics: bool,
    /// A plain `GET /` gets the [`DEMO_PAGE`] (`--demo`).
    pub demo: bool,
}

/// The demo page: self-contained HTML that opens a WebSocket back to the
/// host and port it came from, on `/` with the page's own query (so
/// `/?token=…` passes a token on), and lists what arrives.
pub const DEMO_PAGE: &str = include_str!("demo.html");

/// The JavaScript client (`GET /wspush.js`): it reconnects with backoff
/// and resumes with the last position it saw.
pub const CLIENT_SCRIPT: &str = include_str!("wspush.js");

/// A plain HTTP request the server answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET /healthz`: 200 `ok`.
    Health,
    /// `GET /metrics`: the counters in Prometheus text format.
    Metrics,
    /// `GET /` where the demo is on: the [`DEMO_PAGE`].
    Demo,
    /// `GET /wspush.js`: the [`CLIENT_SCRIPT`].
    Client,
}

/// What the server accepts, as the handshake parser needs it.
#[derive(Debug, Clone, Copy)]
pub struct HandshakeRules<'a> {
    /// The largest request head, in bytes.
    pub max_head_bytes: usize,
    /// The only path served, if set (compared without the query).
    pub path: Option<&'a str>,
    /// `Origin` values allowed (empty: any); see [`auth::origin_allowed`].
    pub origins: &'a [String],
    /// Tokens one of which a client must present, if set (or else a
    /// signed token, if `jwt` is set too).
    pub tokens: Option<&'a Tokens>,
    /// What signed tokens are checked against, if clients may (or, with
    /// no `tokens`, must) present one.
    pub jwt: Option<&'a Verifier>,
    /// The time, in Unix seconds, for signed tokens' `exp` and `nbf`.
    pub now: i64,
    /// A token may come in the [`auth::TOKEN_COOKIE`] (origins are checked).
    pub cookie: bool,
    /// What this listener serves.
    pub endpoints: Endpoints,
    /// permessage-deflate is offered to clients that ask for it.
    pub deflate: bool,
}

/// Parses and validates a request at the start of `buf`: a WebSocket
/// upgrade, or a plain `GET` of one of the [`Endpoint`]s.
///
/// Checks, in order: well-formed HTTP (400) within the size limit (431),
/// `GET` or `HEAD` (405), `HTTP/1.1` (400), no header repeated that must
/// come once (400); then a request without `Upgrade` for
/// `/healthz`, `/metrics` or `/wspush.js`, or for `/` with the demo on, is
/// an endpoint (`/metrics` needs the token when tokens are set: 401; where
/// it has a listener of its own: 404). Anything else is an upgrade, which
/// must be a `GET` (405). For an upgrade: the path (404), `Host`,
/// `Upgrade: websocket` and `Connection: upgrade` (400),
/// `Sec-WebSocket-Version: 13` (426), a `Sec-WebSocket-Key` that is base64
/// of 16 bytes (400), the `Origin` (403), and the token (401).
#[cfg(any(test, feature = "internals"))]
pub fn parse_request<'a>(
    buf: &'a [u8],
    rules: &HandshakeRules<'_>,
) -> Result<HeadStatus<'a>, Rejection> {
    parse_request_after(buf, 0, rules)
}

/// [`parse_request`] for a head that grows: `buf[..seen]` was given to an
/// earlier call that found it [`HeadStatus::Partial`]. Until the blank
/// line that ends the head arrives, only the new bytes are looked at, for
/// it, and the head is parsed once, when it is complete: a head that comes
/// a byte at a time costs linear time, not quadratic.
pub fn parse_request_after<'a>(
    buf: &'a [u8],
    seen: usize,
    rules: &HandshakeRules<'_>,
) -> Result<HeadStatus<'a>, Rejection> {
    let too_large = Rejection::HeadTooLarge(rules.max_head_bytes);
    if !has_blank_line(buf, seen) {
        return if buf.len() < rules.max_head_bytes {
            Ok(HeadStatus::Partial)
        } else {
            Err(too_large)
        };
    }
    let mut headers = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let head_len = match request.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(len)) if len <= rules.max_head_bytes => len,
        Ok(httparse::Status::Partial) if buf.len() < rules.max_head_bytes => {
            return Ok(HeadStatus::Partial)
        }
        Ok(_) => return Err(too_large),
        Err(httparse::Error::TooManyHeaders) => return Err(Rejection::TooManyHeaders),
        Err(_) => return Err(Rejection::BadRequest("malformed HTTP request")),
    };
    let method = match request.method {
        Some("GET") => Method::Get,
        Some("HEAD") => Method::Head,
        _ => return Err(Rejection::MethodNotAllowed),
    };
    if request.version != Some(1) {
        return Err(Rejection::BadRequest("HTTP/1.1 required"));
    }
    let target = request.path.unwrap_or("/");
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    let headers = KnownHeaders::of(request.headers);
    if let Some(repeated) = headers.repeated {
        return Err(Rejection::BadRequest(repeated));
    }
    if !headers.upgrade {
        // An `EventSource` asks for a stream, even where the demo page is.
        let event_stream = headers.accept.is_some_and(sse::accepts_event_stream);
        let endpoint = match path {
            "/healthz" => Some(Endpoint::Health),
            "/metrics" if rules.endpoints.metrics => {
                // The operator's: a listed token, never a client's signed one.
                if let Some(tokens) = rules.tokens {
                    let mut scratch = [0; MAX_PRESENTED_LEN];
                    presented(&headers, target, rules, &mut scratch)
                        .and_then(|token| tokens.find(token))
                        .ok_or(Rejection::Unauthorized(NO_TOKEN))?;
                }
                Some(Endpoint::Metrics)
            }
            "/metrics" => return Err(Rejection::NotFound),
            "/" if rules.endpoints.demo && !event_stream => Some(Endpoint::Demo),
            "/wspush.js" if rules.endpoints.websocket => Some(Endpoint::Client),
            _ => None,
        };
        if let Some(endpoint) = endpoint {
            return Ok(HeadStatus::Endpoint(endpoint, method, head_len));
        }
        if event_stream {
            return event_stream_request(&headers, target, path, method, rules, head_len);
        }
    }
    if method != Method::Get {
        return Err(Rejection::MethodNotAllowed);
    }
    if !rules.endpoints.websocket || rules.path.is_some_and(|served| path != served) {
        return Err(Rejection::NotFound);
    }
    if headers.host.is_none() {
        return Err(Rejection::BadRequest("missing Host header"));
    }
    if !headers.upgrade_websocket {
        return Err(Rejection::BadRequest("missing Upgrade: websocket header"));
    }
    if !headers.connection_upgrade {
        return Err(Rejection::BadRequest("missing Connection: upgrade header"));
    }
    if headers.version.map(trim) != Some(b"13") {
        return Err(Rejection::UpgradeRequired);
    }
    let key = headers
        .key
        .map(trim)
        .ok_or(Rejection::BadRequest("missing Sec-WebSocket-Key header"))?;
    if !is_valid_key(key) {
        return Err(Rejection::BadRequest(
            "Sec-WebSocket-Key is not base64 of 16 bytes",
        ));
    }
    if !auth::origin_allowed(headers.origin, rules.origins) {
        return Err(Rejection::Forbidden("origin not allowed"));
    }
    let credential = credential(&headers, target, rules)?;
    let deflate = rules
        .deflate
        .then(|| {
            let offers = request.headers.iter().filter_map(|h| {
                h.name
                    .eq_ignore_ascii_case("Sec-WebSocket-Extensions")
                    .then_some(h.value)
            });
            deflate::negotiate(offers)
        })
        .flatten();
    Ok(HeadStatus::Upgrade(
        Upgrade {
            target,
            credential,
            protocol: Protocol::WebSocket {
                accept: accept_key(key),
                deflate,
            },
        },
        head_len,
    ))
}

/// A `GET` for an event stream on the served path: checked as an upgrade
/// is, for the path (404), the `Origin` (403) and the token (401).
fn event_stream_request<'a>(
    headers: &KnownHeaders<'a>,
    target: &'a str,
    path: &str,
    method: Method,
    rules: &HandshakeRules<'_>,
    head_len: usize,
) -> Result<HeadStatus<'a>, Rejection> {
    if method != Method::Get {
        return Err(Rejection::MethodNotAllowed);
    }
    if !rules.endpoints.websocket || rules.path.is_some_and(|served| path != served) {
        return Err(Rejection::NotFound);
    }
    if !auth::origin_allowed(headers.origin, rules.origins) {
        return Err(Rejection::Forbidden("origin not allowed"));
    }
    let credential = credential(headers, target, rules)?;
    let origin = headers.origin.filter(|_| !rules.origins.is_empty());
    Ok(HeadStatus::Upgrade(
        Upgrade {
            target,
            credential,
            protocol: Protocol::EventStream {
                origin,
                last_event_id: sse::last_event_id(headers.last_event_id),
            },
        },
        head_len,
    ))
}

/// The body of a 401 for a request without a token, or with one that is
/// neither listed nor signed.
const NO_TOKEN: &str = "a valid token is required";

/// The token a request presents (see [`auth::presented_token`]; the
/// cookie only where `rules` say), decoded into `scratch` if it must be.
fn presented<'a>(
    headers: &KnownHeaders<'a>,
    target: &'a str,
    rules: &HandshakeRules<'_>,
    scratch: &'a mut [u8; MAX_PRESENTED_LEN],
) -> Option<&'a [u8]> {
    let cookie = headers.cookie.filter(|_| rules.cookie);
    auth::presented_token(headers.authorization, target, cookie, scratch)
}

/// The credential an upgrade's token is, when tokens are required (none
/// is looked for otherwise): a listed token, else a signed one (whose
/// refusal says why).
fn credential(
    headers: &KnownHeaders<'_>,
    target: &str,
    rules: &HandshakeRules<'_>,
) -> Result<Option<Credential>, Rejection> {
    if rules.tokens.is_none() && rules.jwt.is_none() {
        return Ok(None);
    }
    let mut scratch = [0; MAX_PRESENTED_LEN];
    let presented =
        presented(headers, target, rules, &mut scratch).ok_or(Rejection::Unauthorized(NO_TOKEN))?;
    if let Some(index) = rules.tokens.and_then(|tokens| tokens.find(presented)) {
        return Ok(Some(Credential::Listed(index)));
    }
    let jwt = rules.jwt.ok_or(Rejection::Unauthorized(NO_TOKEN))?;
    match jwt.verify(presented, rules.now) {
        Ok(claims) => Ok(Some(Credential::Signed(claims))),
        Err(refusal) => Err(Rejection::Unauthorized(refusal.reason())),
    }
}

/// Whether `buf` has an empty line (`\n\n` or `\n\r\n`, the end of an
/// HTTP head; httparse accepts both) that is not wholly inside
/// `buf[..seen]`. Empty lines before the request line end nothing
/// (httparse skips them), so only a line end after its first byte counts;
/// finding that byte scans just the line ends before it.
fn has_blank_line(buf: &[u8], seen: usize) -> bool {
    let Some(start) = buf.iter().position(|&b| b != b'\r' && b != b'\n') else {
        return false;
    };
    let from = seen.saturating_sub(2).max(start).min(buf.len());
    buf[from..]
        .iter()
        .enumerate()
        .filter(|&(_, &b)| b == b'\n')
        .any(|(i, _)| matches!(&buf[from + i + 1..], [b'\n', ..] | [b'\r', b'\n', ..]))
}

/// The request headers the handshake reads, found in one pass (names
/// compare case-insensitively). `Upgrade` and `Connection` are lists, which
/// may be split over several lines (RFC 7230 §3.2.2); the others must come
/// once (RFC 7230 §5.4 for `Host`, RFC 6455 §11.3 for the `Sec-WebSocket-`
/// ones, and `Origin` and `Authorization` are not lists either).
#[derive(Debug, Default)]
struct KnownHeaders<'a> {
    host: Option<&'a [u8]>,
    /// Any `Upgrade` header came.
    upgrade: bool,
    /// An `Upgrade` header lists `websocket`.
    upgrade_websocket: bool,
    /// A `Connection` header lists `upgrade`.
    connection_upgrade: bool,
    version: Option<&'a [u8]>,
    key: Option<&'a [u8]>,
    origin: Option<&'a [u8]>,
    authorization: Option<&'a [u8]>,
    cookie: Option<&'a [u8]>,
    accept: Option<&'a [u8]>,
    last_event_id: Option<&'a [u8]>,
    /// The rejection for the first header that came twice but may come once.
    repeated: Option<&'static str>,
}

impl<'a> KnownHeaders<'a> {
    fn of(headers: &[httparse::Header<'a>]) -> KnownHeaders<'a> {
        let mut known = KnownHeaders::default();
        for header in headers {
            let name = header.name.as_bytes();
            let (slot, repeated) = match name {
                _ if name.eq_ignore_ascii_case(b"Upgrade") => {
                    known.upgrade = true;
                    known.upgrade_websocket |= has_token(header.value, "websocket");
                    continue;
                }
                _ if name.eq_ignore_ascii_case(b"Connection") => {
                    known.connection_upgrade |= has_token(header.value, "upgrade");
                    continue;
                }
                _ if name.eq_ignore_ascii_case(b"Host") => {
                    (&mut known.host, "Host header repeated")
                }
                _ if name.eq_ignore_ascii_case(b"Sec-WebSocket-Version") => {
                    (&mut known.version, "Sec-WebSocket-Version header repeated")
                }
                _ if name.eq_ignore_ascii_case(b"Sec-WebSocket-Key") => {
                    (&mut known.key, "Sec-WebSocket-Key header repeated")
                }
                _ if name.eq_ignore_ascii_case(b"Origin") => {
                    (&mut known.origin, "Origin header repeated")
                }
                _ if name.eq_ignore_ascii_case(b"Authorization") => {
                    (&mut known.authorization, "Authorization header repeated")
                }
                _ if name.eq_ignore_ascii_case(b"Cookie") => {
                    (&mut known.cookie, "Cookie header repeated")
                }
                _ if name.eq_ignore_ascii_case(b"Accept") => {
                    (&mut known.accept, "Accept header repeated")
                }
                _ if name.eq_ignore_ascii_case(b"Last-Event-ID") => {
                    (&mut known.last_event_id, "Last-Event-ID header repeated")
                }
                _ => continue,
            };
            if slot.replace(header.value).is_some() {
                known.repeated.get_or_insert(repeated);
            }
        }
        known
    }
}

/// Whether a comma-separated header value lists `token` (case-insensitive).
fn has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|item| trim(item).eq_ignore_ascii_case(token.as_bytes()))
}

fn trim(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

/// A key is valid when it is the base64 encoding of exactly 16 bytes (§4.1).
fn is_valid_key(key: &[u8]) -> bool {
    let mut decoded = [0u8; 18];
    key.len() == 24 && BASE64.decode_slice(key, &mut decoded) == Ok(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: HandshakeRules<'static> = HandshakeRules {
        max_head_bytes: 8192,
        path: None,
        origins: &[],
        tokens: None,
        jwt: None,
        now: 0,
        cookie: false,
        endpoints: Endpoints {
            websocket: true,
            metrics: true,
            demo: false,
        },
        deflate: false,
    };

    const GOOD: &str = "GET /ws?id=01 HTTP/1.1\r\nHost: example.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

    fn parse(req: &str) -> Result<HeadStatus<'_>, Rejection> {
        parse_request(req.as_bytes(), &RULES)
    }

    fn status(req: &str, rules: &HandshakeRules<'_>) -> u16 {
        parse_request(req.as_bytes(), rules)
            .expect_err("should be rejected")
            .status()
    }

    #[test]
    fn rfc_6455_accept_key_vector() {
        assert_eq!(
            &accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn accepts_a_valid_request_at_every_split_point_and_keeps_the_target() {
        let mut wire = GOOD.as_bytes().to_vec();
        let head_len = wire.len();
        wire.extend_from_slice(b"\x81\x85pipelined frame");
        for cut in 0..head_len {
            assert_eq!(
                parse_request(&wire[..cut], &RULES),
                Ok(HeadStatus::Partial),
                "cut {cut}"
            );
        }
        for end in [head_len, wire.len()] {
            match parse_request(&wire[..end], &RULES) {
                Ok(HeadStatus::Upgrade(upgrade, len)) => {
                    assert_eq!(len, head_len);
                    assert_eq!(upgrade.target, "/ws?id=01");
                    let Protocol::WebSocket { accept, .. } = upgrade.protocol else {
                        panic!("not a WebSocket upgrade: {upgrade:?}");
                    };
                    assert_eq!(&accept, b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn header_names_and_tokens_are_case_insensitive_lists() {
        let req = GOOD
            .replace("Upgrade: websocket", "upgrade: h2c, WebSocket")
            .replace("Connection: Upgrade", "CONNECTION: keep-alive, upgrade");
        assert!(matches!(parse(&req), Ok(HeadStatus::Upgrade(..))));
    }

    #[test]
    fn list_headers_may_be_split_over_several_lines() {
        let req = GOOD
            .replace("Upgrade: websocket", "Upgrade: h2c\r\nupgrade: websocket")
            .replace(
                "Connection: Upgrade",
                "Connection: keep-alive\r\nConnection: Upgrade",
            );
        assert!(matches!(parse(&req), Ok(HeadStatus::Upgrade(..))));
    }

    #[test]
    fn a_header_that_must_come_once_is_400_when_repeated() {
        for (header, twice) in [
            ("Host: example.com", "Host: example.com\r\nhost: other.example"),
            (
                "Sec-WebSocket-Version: 13",
                "Sec-WebSocket-Version: 13\r\nsec-websocket-version: 13",
            ),
            (
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Key: AQIDBAUGBwgJCgsMDQ4PEA==",
            ),
            (
                "Host: example.com",
                "Host: example.com\r\nOrigin: https://a.example\r\nOrigin: https://b.example",
            ),
        ] {
            let req = GOOD.replace(header, twice);
            assert!(
                matches!(parse(&req), Err(Rejection::BadRequest(why)) if why.ends_with("repeated")),
                "{req}"
            );
        }
    }

    #[test]
    fn each_rejection_has_its_status() {
        let with_path = HandshakeRules {
            path: Some("/ws"),
            ..RULES
        };
        let cases: Vec<(String, &HandshakeRules<'_>, u16)> = vec![
            ("garbage\r\n\r\n".into(), &RULES, 400),
            (GOOD.replace("GET", "POST"), &RULES, 405),
            (GOOD.replace("HTTP/1.1", "HTTP/1.0"), &RULES, 400),
            (GOOD.replace("/ws?id=01", "/other?id=01"), &with_path, 404),
            (GOOD.replace("Host: example.com\r\n", ""), &RULES, 400),
            (GOOD.replace("Upgrade: websocket\r\n", ""), &RULES, 400),
            (
                GOOD.replace("Upgrade: websocket", "Upgrade: h2c"),
                &RULES,
                400,
            ),
            (
                GOOD.replace("Connection: Upgrade", "Connection: keep-alive"),
                &RULES,
                400,
            ),
            (
                GOOD.replace("Sec-WebSocket-Version: 13\r\n", ""),
                &RULES,
                426,
            ),
            (GOOD.replace("Version: 13", "Version: 8"), &RULES, 426),
            (
                GOOD.replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", ""),
                &RULES,
                400,
            ),
            (
                GOOD.replace("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZQ=="),
                &RULES,
                400,
            ),
            (
                GOOD.replace("dGhlIHNhbXBsZSBub25jZQ==", "!!!!!!!!!!!!!!!!!!!!!!=="),
                &RULES,
                400,
            ),
            (
                GOOD.replace("Host", &format!("X-Big: {}\r\nHost", "a".repeat(9000))),
                &RULES,
                431,
            ),
        ];
        for (req, rules, expected) in cases {
            assert_eq!(status(&req, rules), expected, "{req:.80}");
        }
        assert!(matches!(
            parse_request(GOOD.as_bytes(), &with_path),
            Ok(HeadStatus::Upgrade(..))
        ));
    }

    #[test]
    fn origins_and_tokens_guard_the_upgrade() {
        let origins = ["https://app.example".to_string()];
        let tokens = Tokens::new(["t0ken"]).unwrap();
        let guarded = HandshakeRules {
            origins: &origins,
            tokens: Some(&tokens),
            ..RULES
        };
        let with = |extra: &str, target: &str| {
            GOOD.replace("Host:", &format!("{extra}Host:"))
                .replace("/ws?id=01", target)
        };
        let cases = [
            (
                with("Origin: https://evil.example\r\n", "/ws?token=t0ken"),
                Some(403),
            ),
            (with("Origin: https://app.example\r\n", "/ws"), Some(401)),
            (with("", "/ws?token=wrong"), Some(401)),
            (
                with("Authorization: Bearer wrong\r\n", "/ws?token=t0ken"),
                Some(401),
            ),
            (
                with("Origin: https://app.example\r\n", "/ws?token=t0ken"),
                None,
            ),
            (with("Authorization: Bearer t0ken\r\n", "/ws"), None),
        ];
        for (req, want) in cases {
            let got = parse_request(req.as_bytes(), &guarded)
                .err()
                .map(Rejection::status);
            assert_eq!(got, want, "{req:.120}");
        }
    }

    #[test]
    fn plain_gets_reach_the_endpoints_this_listener_serves() {
        let tokens = Tokens::new(["t0ken"]).unwrap();
        let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
        let endpoint =
            |req: &str, rules: &HandshakeRules<'_>| match parse_request(req.as_bytes(), rules) {
                Ok(HeadStatus::Endpoint(endpoint, Method::Get, len)) => {
                    assert_eq!(len, req.len());
                    Ok(endpoint)
                }
                Ok(other) => panic!("{other:?}"),
                Err(rejection) => Err(rejection.status()),
            };
        assert_eq!(endpoint(&get("/healthz"), &RULES), Ok(Endpoint::Health));
        assert_eq!(endpoint(&get("/metrics"), &RULES), Ok(Endpoint::Metrics));
        let guarded = HandshakeRules {
            tokens: Some(&tokens),
            ..RULES
        };
        assert_eq!(endpoint(&get("/metrics"), &guarded), Err(401));
        assert_eq!(
            endpoint(&get("/metrics?token=t0ken"), &guarded),
            Ok(Endpoint::Metrics)
        );
        assert_eq!(endpoint(&get("/healthz"), &guarded), Ok(Endpoint::Health));
        let elsewhere = HandshakeRules {
            endpoints: Endpoints {
                metrics: false,
                ..RULES.endpoints
            },
            ..RULES
        };
        assert_eq!(endpoint(&get("/metrics"), &elsewhere), Err(404));
        let metrics_only = HandshakeRules {
            endpoints: Endpoints {
                websocket: false,
                ..RULES.endpoints
            },
            ..RULES
        };
        assert_eq!(
            endpoint(&get("/metrics"), &metrics_only),
            Ok(Endpoint::Metrics)
        );
        assert_eq!(status(GOOD, &metrics_only), 404);
        assert_eq!(status(&get("/other"), &RULES), 400);
    }

    #[test]
    fn the_javascript_client_is_served_where_upgrades_are_and_is_small() {
        let get = "GET /wspush.js HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(
            parse_request(get.as_bytes(), &RULES),
            Ok(HeadStatus::Endpoint(
                Endpoint::Client,
                Method::Get,
                get.len()
            ))
        );
        let head = get.replace("GET", "HEAD");
        assert_eq!(
            parse_request(head.as_bytes(), &RULES),
            Ok(HeadStatus::Endpoint(
                Endpoint::Client,
                Method::Head,
                head.len()
            )),
            "HEAD: answered as GET is, without the body"
        );
        let head_upgrade = GOOD.replacen("GET", "HEAD", 1);
        assert_eq!(status(&head_upgrade, &RULES), 405, "an upgrade is a GET");
        let metrics_only = HandshakeRules {
            endpoints: Endpoints {
                websocket: false,
                ..RULES.endpoints
            },
            ..RULES
        };
        assert_eq!(status(get, &metrics_only), 404);
        assert!(
            CLIENT_SCRIPT.len() <= 6 << 10,
            "{} bytes",
            CLIENT_SCRIPT.len()
        );
        assert!(DEMO_PAGE.contains(r#"<script src="/wspush.js">"#));
    }

    #[test]
    fn with_the_demo_on_a_plain_get_of_the_root_is_the_page_and_an_upgrade_stays_one() {
        let tokens = Tokens::new(["t0ken"]).unwrap();
        let origins = ["https://app.example".to_string()];
        let demo = HandshakeRules {
            endpoints: Endpoints {
                demo: true,
                ..RULES.endpoints
            },
            ..RULES
        };
        let guarded = HandshakeRules {
            tokens: Some(&tokens),
            origins: &origins,
            ..demo
        };
        let get = |target: &str| format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n");
        for (req, rules) in [
            (get("/"), &demo),
            (get("/?token=t0ken"), &demo),
            // The page holds no data: it needs neither token nor origin.
            (get("/"), &guarded),
            (
                get("/").replace("Host: x", "Host: x\r\nOrigin: https://evil.example"),
                &guarded,
            ),
        ] {
            assert_eq!(
                parse_request(req.as_bytes(), rules),
                Ok(HeadStatus::Endpoint(Endpoint::Demo, Method::Get, req.len())),
                "{req}"
            );
        }
        let upgrade = GOOD.replace("/ws?id=01", "/");
        assert!(matches!(
            parse_request(upgrade.as_bytes(), &demo),
            Ok(HeadStatus::Upgrade(Upgrade { target: "/", .. }, _))
        ));
        // The upgrade on / is still guarded.
        assert_eq!(status(&upgrade, &guarded), 401);
        assert_eq!(status(&get("/other"), &demo), 400);
        assert_eq!(
            parse_request(get("/healthz").as_bytes(), &demo),
            Ok(HeadStatus::Endpoint(
                Endpoint::Health,
                Method::Get,
                get("/healthz").len()
            ))
        );
        // Without the demo, / is what it always was: an upgrade without
        // its headers.
        assert_eq!(status(&get("/"), &RULES), 400);
        let metrics_only = HandshakeRules {
            endpoints: Endpoints {
                websocket: false,
                ..RULES.endpoints
            },
            ..RULES
        };
        assert_eq!(status(&get("/"), &metrics_only), 404);
    }

    #[test]
    fn oversized_heads_fail_without_waiting_for_the_end() {
        let endless = format!("GET / HTTP/1.1\r\nX-Pad: {}", "a".repeat(8200));
        assert_eq!(parse(&endless), Err(Rejection::HeadTooLarge(8192)));
        let many: String = (0..MAX_HEADERS - 5)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        assert_eq!(
            parse(&GOOD.replace("Host", &format!("{many}X-Last: v\r\nHost"))),
            Err(Rejection::TooManyHeaders)
        );
    }

    /// A legal head of 106 header lines and 6,338 bytes (a browser behind
    /// a few proxies sends such) is an upgrade; up to `MAX_HEADERS` lines
    /// are.
    #[test]
    fn heads_with_many_headers_within_the_byte_limit_are_accepted() {
        let lines = |n: usize, value: &str| -> String {
            (0..n)
                .map(|i| format!("X-Proxy-{i}: {value}\r\n"))
                .collect()
        };
        let big = GOOD
            .replace("/ws?id=01", &format!("/ws?id=01&p={}", "x".repeat(25)))
            .replace("Host", &format!("{}Host", lines(101, &"v".repeat(47))));
        assert_eq!((big.len(), big.lines().count() - 2), (6338, 106));
        assert!(matches!(parse(&big), Ok(HeadStatus::Upgrade(..))));
        let most = GOOD.replace("Host", &format!("{}Host", lines(MAX_HEADERS - 6, "v")));
        assert!(matches!(parse(&most), Ok(HeadStatus::Upgrade(..))));
    }

    #[test]
    fn the_431_body_names_the_limit_that_was_hit() {
        let body = |rejection: Rejection| {
            let mut out = [0u8; MAX_RESPONSE_LEN];
            let len = rejection.write_response(&mut out);
            let text = std::str::from_utf8(&out[..len]).unwrap().to_string();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
            assert!(head.ends_with(&format!("Content-Length: {}", body.len())));
            body.to_string()
        };
        assert_eq!(
            body(Rejection::HeadTooLarge(8192)),
            "request head larger than the limit: 8192 bytes\n"
        );
        assert_eq!(
            body(Rejection::TooManyHeaders),
            format!("more header lines than the limit: {MAX_HEADERS}\n")
        );
    }

    /// Fed a byte at a time, with `seen` the bytes already given, a head
    /// is partial until its last byte and then the same upgrade as when
    /// parsed whole; the blank line is found across the split, with bare
    /// `\n` line ends too.
    #[test]
    fn a_head_fed_a_byte_at_a_time_is_parsed_once_complete() {
        let lf = GOOD.replace("\r\n", "\n");
        for req in [GOOD, lf.as_str()] {
            let bytes = req.as_bytes();
            let whole = parse_request(bytes, &RULES).unwrap();
            for end in 1..bytes.len() {
                let got = parse_request_after(&bytes[..end], end - 1, &RULES);
                assert_eq!(got, Ok(HeadStatus::Partial), "{end}");
            }
            let last = parse_request_after(bytes, bytes.len() - 1, &RULES);
            assert_eq!(last, Ok(whole));
        }
        assert!(!has_blank_line(b"GET / HTTP/1.1\r\n\r\n", 19));
        assert!(has_blank_line(b"GET / HTTP/1.1\r\n\r\n", 16));
        let endless = format!("GET / HTTP/1.1\r\nX-Pad: {}", "a".repeat(8200));
        assert_eq!(
            parse_request_after(endless.as_bytes(), 8000, &RULES),
            Err(Rejection::HeadTooLarge(8192))
        );
    }

    /// Empty lines before the request line (httparse skips them) end no
    /// head: fed a byte at a time after them, a request is answered as
    /// when parsed whole, at the same byte.
    #[test]
    fn empty_lines_before_the_request_line_end_no_head() {
        let malformed: &[u8] = b"\n\r\nU\x82gr Socket-\nT\r\n\r\n";
        let good = format!("\r\n\n{GOOD}");
        for req in [malformed, good.as_bytes()] {
            for end in 1..=req.len() {
                let whole = parse_request(&req[..end], &RULES);
                let fed = parse_request_after(&req[..end], end - 1, &RULES);
                assert_eq!(fed, whole, "{end}");
                if whole != Ok(HeadStatus::Partial) {
                    assert_eq!(end, req.len(), "answered before the head ended");
                    break;
                }
            }
        }
        assert_eq!(
            parse_request(malformed, &RULES),
            Err(Rejection::BadRequest("malformed HTTP request"))
        );
        assert!(matches!(
            parse_request(good.as_bytes(), &RULES),
            Ok(HeadStatus::Upgrade(_, len)) if len == good.len()
        ));
    }

    #[test]
    fn deflate_is_agreed_only_when_on_and_offered_acceptably() {
        let offering = |offers: &[&str]| {
            let mut request = String::from(
                "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                 Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n",
            );
            for offer in offers {
                request.push_str(&format!("sec-websocket-extensions: {offer}\r\n"));
            }
            request + "\r\n"
        };
        let on = HandshakeRules {
            deflate: true,
            ..RULES
        };
        let agreed = |request: &str, rules| match parse_request(request.as_bytes(), rules) {
            Ok(HeadStatus::Upgrade(
                Upgrade {
                    protocol: Protocol::WebSocket { deflate, .. },
                    ..
                },
                _,
            )) => deflate,
            other => panic!("{other:?}"),
        };
        let browser = offering(&["permessage-deflate; client_max_window_bits"]);
        let whole = Some(deflate::Agreed {
            server_window_bits: 15,
            server_window_asked: false,
        });
        assert_eq!(agreed(&browser, &on), whole);
        assert_eq!(agreed(&browser, &RULES), None, "off");
        assert_eq!(agreed(&offering(&[]), &on), None);
        let split = offering(&["x-foo", "permessage-deflate; bad, permessage-deflate"]);
        assert_eq!(agreed(&split, &on), whole, "offers over several headers");
    }

    #[test]
    fn responses_are_complete_http() {
        let mut out = [0u8; MAX_RESPONSE_LEN];
        let accept = accept_key(b"dGhlIHNhbXBsZSBub25jZQ==");
        let len = write_accept_response(&accept, None, &mut out);
        let text = std::str::from_utf8(&out[..len]).unwrap();
        assert!(text.starts_with("HTTP/1.1 101 Switching Protocols\r\n"));
        assert!(
            text.contains("\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n")
                && text.ends_with("\r\n\r\n")
        );
        assert!(!text.contains("Extensions"));
        // The longest: permessage-deflate with a window asked for.
        let agreed = deflate::Agreed {
            server_window_bits: 10,
            server_window_asked: true,
        };
        let len = write_accept_response(&accept, Some(&agreed), &mut out);
        let text = std::str::from_utf8(&out[..len]).unwrap();
        assert!(text.ends_with(
            "\r\nSec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; \
             client_no_context_takeover; server_max_window_bits=10\r\n\r\n"
        ));

        let len = Rejection::UpgradeRequired.write_response(&mut out);
        let text = std::str::from_utf8(&out[..len]).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 426 Upgrade Required\r\n")
                && text.contains("Sec-WebSocket-Version: 13\r\n")
        );
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
    }

    /// Mutated requests are answered (101 or a status), never a panic.
    #[test]
    fn arbitrary_requests_never_panic() {
        let mut rng = crate::testing::XorShift(0x2545_F491_4F6C_DD1Du64);
        let mut next = move || rng.next();
        for _ in 0..20_000 {
            let mut req = GOOD.as_bytes().to_vec();
            for _ in 0..1 + next() % 6 {
                let at = (next() as usize) % req.len();
                req[at] = next() as u8;
            }
            let cut = (next() as usize) % (req.len() + 1);
            let _ = parse_request(&req[..cut], &RULES);
        }
    }
}

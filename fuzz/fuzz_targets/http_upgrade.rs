//! The opening handshake parser, whole and fed in pieces.
//!
//! Input: `[flags, n, size_1 .. size_n, request ..]`. `flags` picks the
//! rules (bit 0: path `/ws`; bit 1: tokens; bit 2: allowed origins; bit 3:
//! no `/metrics`; bit 4: no WebSocket; bits 5-7: the head limit), and so
//! do bits 3-6 of `n` (3: the demo page at `/`; 4: deflate; 5: signed
//! tokens, HS256; 6: the token cookie); the request is fed in chunks of
//! `size_i + 1` bytes, cycling, or whole when `n % 8` is 0.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use wspush::protocol::http::{
    self, Endpoint, Endpoints, HandshakeRules, HeadStatus, Protocol, Rejection, MAX_RESPONSE_LEN,
};
use wspush::{Algorithm, Tokens, Verifier};

const HEAD_LIMITS: [usize; 8] = [8192, 16, 64, 100, 128, 256, 1024, 4096];

fn tokens() -> &'static Tokens {
    static TOKENS: OnceLock<Tokens> = OnceLock::new();
    TOKENS.get_or_init(|| Tokens::new(["t0ken", "s3cret"]).expect("valid tokens"))
}

fn verifier() -> &'static Verifier {
    static VERIFIER: OnceLock<Verifier> = OnceLock::new();
    VERIFIER.get_or_init(|| {
        let mut verifier = Verifier::new(Algorithm::HS256, 5);
        verifier
            .add_key(b"0123456789abcdef0123456789abcdef")
            .expect("a valid secret");
        verifier
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&[flags, count], rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let demo = count & 8 != 0;
    let deflate = count & 16 != 0;
    let jwt = (count & 32 != 0).then(verifier);
    let cookie = count & 64 != 0;
    let count = usize::from(count % 8);
    if rest.len() < count {
        return;
    }
    let (sizes, request) = rest.split_at(count);
    let origins = if flags & 4 != 0 {
        vec!["https://app.example".to_string()]
    } else {
        Vec::new()
    };
    let rules = HandshakeRules {
        max_head_bytes: HEAD_LIMITS[usize::from(flags >> 5)],
        path: (flags & 1 != 0).then_some("/ws"),
        origins: &origins,
        tokens: (flags & 2 != 0).then(tokens),
        jwt,
        now: 1_800_000_000,
        cookie,
        endpoints: Endpoints {
            websocket: flags & 16 == 0,
            metrics: flags & 8 == 0,
            demo,
        },
        deflate,
    };
    check_incremental(request, sizes, &rules);
});

/// Feeds `request` in chunks the way a connection does, telling the parser
/// how much it saw before, while the head is partial; each answer must be
/// the one for the whole prefix, and the last agrees with the whole input.
fn check_incremental(request: &[u8], sizes: &[u8], rules: &HandshakeRules<'_>) {
    let mut chunks = sizes.iter().map(|&size| usize::from(size) + 1).cycle();
    let mut seen = 0;
    let last = loop {
        let end = chunks
            .next()
            .map_or(request.len(), |size| (seen + size).min(request.len()));
        let prefix = &request[..end];
        let got = http::parse_request_after(prefix, seen, rules);
        assert_eq!(
            got,
            http::parse_request(prefix, rules),
            "fed {end} bytes after {seen}"
        );
        check_result(prefix, &got, rules);
        if got != Ok(HeadStatus::Partial) || end == request.len() {
            break got;
        }
        seen = end;
    };
    match http::parse_request(request, rules) {
        Ok(HeadStatus::Partial) => assert_eq!(last, Ok(HeadStatus::Partial)),
        whole @ Ok(_) => assert_eq!(last, whole, "a complete head ends the same fed in pieces"),
        // A longer input may be rejected for another reason (431 for a
        // prefix at the limit, 400 once the malformed rest has come).
        Err(_) => assert!(last.is_err(), "{last:?}"),
    }
}

/// What holds for every answer to `buf`.
fn check_result(
    buf: &[u8],
    result: &Result<HeadStatus<'_>, Rejection>,
    rules: &HandshakeRules<'_>,
) {
    match result {
        Ok(HeadStatus::Partial) => assert!(buf.len() < rules.max_head_bytes),
        Ok(HeadStatus::Upgrade(upgrade, head_len)) => {
            check_head(buf, *head_len, result, rules);
            assert!(rules.endpoints.websocket);
            let path = upgrade.target.split('?').next().unwrap_or_default();
            assert!(rules.path.is_none_or(|served| path == served), "{path}");
            let range = buf.as_ptr_range();
            assert!(range.contains(&upgrade.target.as_ptr()));
            let (accept, deflate) = match &upgrade.protocol {
                Protocol::WebSocket { accept, deflate } => (accept, deflate),
                Protocol::EventStream { origin, .. } => {
                    // Only an allowed origin is echoed back.
                    assert!(origin.is_none() || !rules.origins.is_empty());
                    return;
                }
            };
            assert!(
                accept[..27]
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
                    && accept[27] == b'=',
                "{accept:?}"
            );
            assert!(
                rules.deflate || deflate.is_none(),
                "deflate agreed while off"
            );
            let mut out = [0u8; MAX_RESPONSE_LEN];
            let len = http::write_accept_response(accept, deflate.as_ref(), &mut out);
            check_response(&out[..len], 101, false);
        }
        Ok(HeadStatus::Endpoint(endpoint, method, head_len)) => {
            check_head(buf, *head_len, result, rules);
            let asked = match method {
                http::Method::Get => &b"GET "[..],
                http::Method::Head => b"HEAD ",
            };
            // httparse skips empty lines before the request line.
            let start = buf.iter().position(|b| !b"\r\n".contains(b));
            assert!(buf[start.unwrap_or(0)..].starts_with(asked), "{method:?}");
            let served = match endpoint {
                Endpoint::Health => true,
                Endpoint::Metrics => rules.endpoints.metrics,
                Endpoint::Demo => rules.endpoints.demo,
                Endpoint::Client => rules.endpoints.websocket,
            };
            assert!(served, "{endpoint:?} is not served");
        }
        Err(rejection) => {
            let mut out = [0u8; MAX_RESPONSE_LEN];
            let len = rejection.write_response(&mut out);
            check_response(&out[..len], rejection.status(), true);
            if let Rejection::HeadTooLarge(limit) = rejection {
                assert_eq!(*limit, rules.max_head_bytes);
            }
        }
    }
}

/// A complete head lies within the input and the limit, ends in its blank
/// line, is answered the same alone, and is partial a byte short.
fn check_head(
    buf: &[u8],
    head_len: usize,
    result: &Result<HeadStatus<'_>, Rejection>,
    rules: &HandshakeRules<'_>,
) {
    assert!(head_len <= buf.len() && head_len <= rules.max_head_bytes);
    assert!(buf[..head_len].ends_with(b"\n"));
    assert_eq!(&http::parse_request(&buf[..head_len], rules), result);
    assert_eq!(
        http::parse_request(&buf[..head_len - 1], rules),
        Ok(HeadStatus::Partial)
    );
}

/// A response is one complete HTTP/1.1 head with `status`; one with a
/// body has a correct `Content-Length` and a line of text.
fn check_response(response: &[u8], status: u16, has_body: bool) {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut parsed = httparse::Response::new(&mut headers);
    let head_len = match parsed.parse(response) {
        Ok(httparse::Status::Complete(len)) => len,
        other => panic!("{other:?}: {:?}", String::from_utf8_lossy(response)),
    };
    assert_eq!((parsed.version, parsed.code), (Some(1), Some(status)));
    let lengths: Vec<&[u8]> = parsed
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("Content-Length"))
        .map(|h| h.value)
        .collect();
    let body_text = &response[head_len..];
    if has_body {
        assert_eq!(lengths, [body_text.len().to_string().as_bytes()]);
        let text = std::str::from_utf8(body_text).expect("the body is text");
        assert!(text.ends_with('\n') && text.len() > 1, "{text:?}");
    } else {
        assert!(lengths.is_empty() && body_text.is_empty());
    }
}

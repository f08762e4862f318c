//! Signed tokens (JWT) over real upgrades: each claim's accept and refuse
//! case with the reason in the 401's body, a token's id and channels,
//! the algorithm confusion attack and `alg: none`, two keys at once, the
//! close with 4001 before `exp` and the resume with a new token after it,
//! `require_token_id`, and the cookie.
//!
//! Tokens are signed here with `ring` directly and keys from
//! `tests/keys/` (test keys, never to be used elsewhere); tokens from an
//! independent signer (Python's PyJWT) are tested by
//! `tests/tokens/pyjwt.sh`, and in a browser by `tests/browser/run.sh`.

mod util;

use std::io::{Read, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, RsaKeyPair};
use serde_json::json;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::Message;
use util::{client_id, TestServer};
use wspush::{Algorithm, Config, MessageKind, Recipients, Verifier};

const SECRET: &str = "a-shared-secret-of-at-least-32-bytes";
const KEYS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/keys");

fn key_file(name: &str) -> Vec<u8> {
    std::fs::read(format!("{KEYS}/{name}")).expect("a test key")
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The DER of a PEM file's one block.
fn der(pem: &[u8]) -> Vec<u8> {
    let text = std::str::from_utf8(pem).unwrap();
    let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
    STANDARD.decode(body).unwrap()
}

/// What signs a token.
enum Signer<'a> {
    /// The test key of the algorithm the header names.
    TestKey,
    /// HMAC-SHA256 with these bytes, whatever the header names.
    Hmac(&'a [u8]),
}

/// A token with header `{"alg": alg}` over `claims`, signed by `signer`.
fn signed_as(alg: &str, claims: &serde_json::Value, signer: Signer<'_>) -> String {
    let header = json!({ "alg": alg, "typ": "JWT" });
    let signing_input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let rng = SystemRandom::new();
    let signature = match (alg, signer) {
        (_, Signer::Hmac(secret)) => {
            let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
            ring::hmac::sign(&key, signing_input.as_bytes())
                .as_ref()
                .to_vec()
        }
        ("RS256", Signer::TestKey) => {
            let pair = RsaKeyPair::from_pkcs8(&der(&key_file("rsa-private.pem"))).unwrap();
            let mut out = vec![0; pair.public().modulus_len()];
            pair.sign(
                &signature::RSA_PKCS1_SHA256,
                &rng,
                signing_input.as_bytes(),
                &mut out,
            )
            .unwrap();
            out
        }
        ("ES256", Signer::TestKey) => {
            let pair = EcdsaKeyPair::from_pkcs8(
                &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                &der(&key_file("ec-private.pem")),
                &rng,
            )
            .unwrap();
            pair.sign(&rng, signing_input.as_bytes())
                .unwrap()
                .as_ref()
                .to_vec()
        }
        (other, Signer::TestKey) => panic!("no test key for {other}"),
    };
    format!("{signing_input}.{}", b64(&signature))
}

fn hs256(claims: &serde_json::Value) -> String {
    signed_as("HS256", claims, Signer::Hmac(SECRET.as_bytes()))
}

fn verifier(algorithm: Algorithm, keys: &[&[u8]]) -> Verifier {
    let mut verifier = Verifier::new(algorithm, 0);
    for key in keys {
        verifier.add_key(key).unwrap();
    }
    verifier
}

fn server(verifier: Verifier, more: impl FnOnce(&mut Config)) -> TestServer {
    TestServer::start(Config::default().with(|c| {
        c.jwt = Some(verifier);
        more(c);
    }))
}

/// The status and body of the answer to an upgrade for `target` with
/// `extra` header lines.
fn upgrade(server: &TestServer, target: &str, extra: &str) -> (u16, String) {
    let response = util::upgrade_answer(server.addr, target, extra);
    (response.status, response.body.trim_end().to_string())
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}\r\n")
}

#[test]
fn each_claim_is_taken_or_refused_with_its_reason() {
    let mut jwt = verifier(Algorithm::HS256, &[SECRET.as_bytes()]);
    jwt.require_audience("push");
    jwt.require_issuer("https://app.example");
    let server = server(jwt, |_| {});
    let t = now();
    let good =
        || json!({"sub": "alice", "exp": t + 60, "aud": "push", "iss": "https://app.example"});
    let with = |key: &str, value: serde_json::Value| {
        let mut claims = good();
        claims[key] = value;
        claims
    };
    let without = |key: &str| {
        let mut claims = good();
        claims.as_object_mut().unwrap().remove(key);
        claims
    };
    let other_secret = b"another-secret-nobody-configured-here";
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("good", hs256(&good()), 101, ""),
        (
            "no exp",
            hs256(&without("exp")),
            401,
            "malformed token: exp is required",
        ),
        (
            "exp as text",
            hs256(&with("exp", json!("4000000000"))),
            401,
            "malformed token: claims",
        ),
        (
            "expired",
            hs256(&with("exp", json!(t - 1))),
            401,
            "token refused: expired",
        ),
        (
            "negative exp",
            hs256(&with("exp", json!(-1))),
            401,
            "token refused: expired",
        ),
        (
            "a million years",
            hs256(&with("exp", json!(t + 31_557_600_000_000))),
            101,
            "",
        ),
        ("nbf past", hs256(&with("nbf", json!(t - 10))), 101, ""),
        (
            "nbf future",
            hs256(&with("nbf", json!(t + 30))),
            401,
            "token refused: not yet valid (nbf)",
        ),
        (
            "aud in a list",
            hs256(&with("aud", json!(["web", "push"]))),
            101,
            "",
        ),
        (
            "wrong aud",
            hs256(&with("aud", json!("web"))),
            401,
            "token refused: wrong audience",
        ),
        (
            "no aud",
            hs256(&without("aud")),
            401,
            "token refused: wrong audience",
        ),
        (
            "wrong iss",
            hs256(&with("iss", json!("https://evil.example"))),
            401,
            "token refused: wrong issuer",
        ),
        (
            "no iss",
            hs256(&without("iss")),
            401,
            "token refused: wrong issuer",
        ),
        (
            "bad signature",
            signed_as("HS256", &good(), Signer::Hmac(other_secret)),
            401,
            "token refused: bad signature",
        ),
        (
            "HS512",
            signed_as("HS512", &good(), Signer::Hmac(SECRET.as_bytes())),
            401,
            "token refused: wrong algorithm",
        ),
        (
            "not a token",
            "abc".into(),
            401,
            "malformed token: not three parts",
        ),
        (
            "bad sub",
            hs256(&with("sub", json!("a|b"))),
            401,
            "malformed token: sub is not a client id",
        ),
    ];
    for (what, token, status, reason) in &cases {
        let (got, body) = upgrade(&server, &format!("/ws?token={token}"), "");
        assert_eq!(got, *status, "{what}: {body}");
        assert!(body.starts_with(reason), "{what}: {body:?}");
    }
    // alg none: a header, claims and no signature.
    let unsigned = format!(
        "{}.{}.",
        b64(br#"{"alg":"none"}"#),
        b64(good().to_string().as_bytes())
    );
    let (status, body) = upgrade(&server, "/ws", &bearer(&unsigned));
    assert_eq!(
        (status, body.as_str()),
        (401, "token refused: wrong algorithm")
    );
    // Nothing crashed: a good token still upgrades, by header too.
    assert_eq!(upgrade(&server, "/ws", &bearer(&hs256(&good()))).0, 101);
    let refused = cases.iter().filter(|c| c.2 == 401).count() as u64 + 1;
    server.wait_for("the refusals counted", |m| m.rejected_401 == refused);
}

/// A `null` claim is no absent claim: a signer that writes a missing value
/// as `null` would otherwise hand out tokens bound to no id and no
/// channel. Here no audience, issuer or channel list is configured, so
/// absence would be taken.
#[test]
fn a_null_claim_makes_the_token_malformed() {
    let server = server(verifier(Algorithm::HS256, &[SECRET.as_bytes()]), |_| {});
    let exp = now() + 60;
    let taken_wrongly: Vec<String> = ["sub", "channels", "nbf", "exp", "aud", "iss"]
        .into_iter()
        .filter_map(|claim| {
            let mut claims = json!({ "exp": exp });
            claims[claim] = serde_json::Value::Null;
            let token = hs256(&claims);
            // What a hostile bearer would ask for if `null` read as absent.
            let target = format!("/?id=bob&channel=anything&token={token}");
            let answer = upgrade(&server, &target, "");
            let refusal = (401, format!("malformed token: {claim} is null"));
            (answer != refusal).then(|| format!("{claim}: {answer:?}"))
        })
        .collect();
    assert!(taken_wrongly.is_empty(), "{taken_wrongly:?}");
    // The same token without the null claims binds nothing and is taken.
    let (status, _) = upgrade(
        &server,
        &format!("/?id=bob&token={}", hs256(&json!({ "exp": exp }))),
        "",
    );
    assert_eq!(status, 101);
    server.wait_for("the refusals counted", |m| m.rejected_401 == 6);
}

/// Opens `n` connections with `token` and returns when each one's close
/// (4001) arrived, as time since the Unix epoch.
fn expiry_closes(server: &TestServer, token: &str, n: usize) -> Vec<Duration> {
    let readers: Vec<_> = (0..n)
        .map(|_| {
            let mut client = util::connect(server.addr, &format!("/?token={token}"));
            std::thread::spawn(move || match client.read().expect("a close") {
                Message::Close(Some(frame)) => {
                    assert_eq!(frame.code, CloseCode::from(4001));
                    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
                }
                other => panic!("not a close: {other:?}"),
            })
        })
        .collect();
    readers.into_iter().map(|r| r.join().unwrap()).collect()
}

/// Sixty connections whose tokens share one `exp`, closed over the last
/// tenth of what they had left: every close (4001) arrives before `exp`
/// plus `leeway`, whatever the timer wheel's resolution.
fn expiry_closes_arrive_before_the_deadline(leeway: u64) {
    let mut jwt = Verifier::new(Algorithm::HS256, leeway);
    jwt.add_key(SECRET.as_bytes()).unwrap();
    let server = server(jwt, |_| {});
    // Good for two to three seconds more, whatever the leeway.
    let deadline = now() + 3;
    let token = hs256(&json!({ "exp": deadline - leeway as i64 }));
    let closed = expiry_closes(&server, &token, 60);
    let deadline = Duration::from_secs(deadline as u64);
    let late: Vec<Duration> = closed
        .into_iter()
        .filter(|&closed| closed >= deadline)
        .map(|closed| closed - deadline)
        .collect();
    assert!(
        late.is_empty(),
        "{} of 60 closed late, by {late:?}",
        late.len()
    );
    server.wait_for("the expiries counted", |m| m.closed_token_expired == 60);
}

#[test]
fn expiry_closes_arrive_before_exp_plus_a_leeway_of_1s() {
    expiry_closes_arrive_before_the_deadline(1);
}

#[test]
fn expiry_closes_arrive_before_exp_plus_the_default_leeway() {
    expiry_closes_arrive_before_the_deadline(Verifier::DEFAULT_LEEWAY);
}

#[test]
fn a_token_binds_its_bearer_to_its_id_and_channels() {
    let server = server(verifier(Algorithm::HS256, &[SECRET.as_bytes()]), |_| {});
    let exp = now() + 600;
    let alice = hs256(&json!({"sub": "alice", "exp": exp, "channels": ["news.*"]}));
    let bob = hs256(&json!({"sub": "bob", "exp": exp}));
    let refused = |target: String, why: &str| {
        let (status, body) = upgrade(&server, &target, "");
        assert_eq!((status, body.as_str()), (403, why), "{target}");
    };
    refused(
        format!("/?id=alice&token={bob}"),
        "id not allowed for this token",
    );
    refused(
        format!("/?channel=chat&token={alice}"),
        "channel not allowed",
    );
    let mut as_alice = util::connect(server.addr, &format!("/?channel=news.eu&token={alice}"));
    let mut as_bob = util::connect(server.addr, &format!("/?token={bob}"));
    server.wait_for("both open", |m| m.connections_open == 2);
    let handle = &server.handle;
    handle
        .send(
            Recipients::Id(client_id("alice")),
            MessageKind::Text,
            "for alice",
        )
        .unwrap();
    handle
        .send(util::channels(&["news.eu"]), MessageKind::Text, "news")
        .unwrap();
    handle
        .send(
            Recipients::Id(client_id("bob")),
            MessageKind::Text,
            "for bob",
        )
        .unwrap();
    assert_eq!(util::texts(&mut as_alice, 2), ["for alice", "news"]);
    assert_eq!(util::texts(&mut as_bob, 1), ["for bob"]);
}

#[test]
fn the_algorithm_is_pinned_whatever_a_token_says() {
    let public = key_file("rsa-public.pem");
    let server = server(verifier(Algorithm::RS256, &[&public]), |_| {});
    let claims = json!({"sub": "alice", "exp": now() + 60});
    // The confusion attack: the server's public key used as an HMAC secret.
    for alg in ["HS256", "RS256"] {
        let forged = signed_as(alg, &claims, Signer::Hmac(&public));
        let (status, body) = upgrade(&server, "/ws", &bearer(&forged));
        assert_eq!(status, 401, "{alg}");
        assert!(
            body == "token refused: wrong algorithm" || body == "token refused: bad signature",
            "{alg}: {body}"
        );
    }
    let by = |alg| bearer(&signed_as(alg, &claims, Signer::TestKey));
    assert_eq!(upgrade(&server, "/ws", &by("ES256")).0, 401);
    assert_eq!(upgrade(&server, "/ws", &by("RS256")).0, 101);

    let ec = server_with_key(Algorithm::ES256, "ec-public.pem");
    assert_eq!(upgrade(&ec, "/ws", &by("ES256")).0, 101);
    assert_eq!(upgrade(&ec, "/ws", &by("RS256")).0, 401);
}

fn server_with_key(algorithm: Algorithm, file: &str) -> TestServer {
    server(verifier(algorithm, &[&key_file(file)]), |_| {})
}

#[test]
fn two_keys_take_tokens_signed_with_either() {
    let next = b"the-next-secret-while-the-keys-roll";
    let server = server(
        verifier(Algorithm::HS256, &[SECRET.as_bytes(), next]),
        |_| {},
    );
    let claims = json!({"exp": now() + 60});
    for secret in [SECRET.as_bytes(), next] {
        let token = signed_as("HS256", &claims, Signer::Hmac(secret));
        let (status, body) = upgrade(&server, "/ws", &bearer(&token));
        assert_eq!(status, 101, "{body}");
    }
    let retired = signed_as(
        "HS256",
        &claims,
        Signer::Hmac(b"a-retired-secret-no-longer-configured"),
    );
    assert_eq!(upgrade(&server, "/ws", &bearer(&retired)).0, 401);
}

#[test]
fn a_connection_closes_with_4001_before_exp_and_resumes_with_a_new_token() {
    let server = server(verifier(Algorithm::HS256, &[SECRET.as_bytes()]), |_| {});
    // Good for two to three seconds: closed within its last tenth.
    let exp = now() + 3;
    let token = hs256(&json!({"sub": "alice", "exp": exp}));
    let mut client = util::connect(server.addr, &format!("/?positions=1&token={token}"));
    let status = util::texts(&mut client, 1);
    assert!(status[0].contains(r#""status":"position""#), "{status:?}");
    server.handle.broadcast_text("before").unwrap();
    let before = util::texts(&mut client, 1).remove(0);
    let (position, payload) = before.split_once(' ').unwrap();
    assert_eq!(payload, "before");
    let close = match client.read().expect("a close") {
        Message::Close(Some(frame)) => frame,
        other => panic!("not a close: {other:?}"),
    };
    let closed_at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    assert_eq!(close.code, CloseCode::from(4001));
    assert_eq!(close.reason.as_str(), "token expired");
    let exp = Duration::from_secs(exp as u64);
    assert!(closed_at < exp, "{closed_at:?} at or after {exp:?}");
    assert!(
        closed_at + Duration::from_millis(600) >= exp,
        "{closed_at:?} long before {exp:?}"
    );
    drop(client);
    // Sent while it was away; the new token's connection resumes.
    server.handle.broadcast_text("while away").unwrap();
    let fresh = hs256(&json!({"sub": "alice", "exp": now() + 600}));
    let mut again = util::connect(server.addr, &format!("/?since={position}&token={fresh}"));
    let got = util::texts(&mut again, 2);
    assert!(got[0].contains(r#""status":"recovered""#), "{got:?}");
    assert!(got[1].ends_with(" while away"), "{got:?}");
    server.wait_for("the expiry counted", |m| m.closed_token_expired == 1);
}

#[test]
fn an_event_stream_is_told_its_token_expired_and_its_url_is_refused_after() {
    let server = server(verifier(Algorithm::HS256, &[SECRET.as_bytes()]), |_| {});
    let token = hs256(&json!({"sub": "alice", "exp": now() + 2}));
    let request =
        format!("GET /?token={token} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n");
    let mut socket = util::raw(server.addr);
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    socket.write_all(request.as_bytes()).unwrap();
    // The stream runs until the token expires, then ends after saying so.
    let mut stream = Vec::new();
    socket.read_to_end(&mut stream).unwrap();
    let stream = String::from_utf8(stream).unwrap();
    assert!(stream.starts_with("HTTP/1.1 200"), "{stream}");
    let closed = r#"{"status":"closed","code":4001,"reason":"token expired"}"#;
    assert!(
        stream.ends_with(&format!("event: status\ndata: {closed}\n\n")),
        "{stream}"
    );
    server.wait_for("the expiry counted", |m| m.closed_token_expired == 1);
    // An `EventSource` asks again for the same URL: refused, so it stops.
    let mut again = util::raw(server.addr);
    again.write_all(request.as_bytes()).unwrap();
    let answer = util::read_response(&mut again);
    assert_eq!(answer.status, 401);
    assert_eq!(answer.body.trim_end(), "token refused: expired");
}

#[test]
fn expiries_in_the_same_second_are_spread_over_its_last_tenth() {
    let server = server(verifier(Algorithm::HS256, &[SECRET.as_bytes()]), |_| {});
    // Good for four to five seconds: closed over its last 400-500 ms.
    let exp = now() + 5;
    let token = hs256(&json!({"exp": exp}));
    let closed = expiry_closes(&server, &token, 40);
    let first = closed.iter().min().unwrap();
    let last = closed.iter().max().unwrap();
    let spread = *last - *first;
    assert!(
        spread >= Duration::from_millis(200),
        "all within {spread:?}"
    );
}

#[test]
fn with_ids_required_from_tokens_an_unbound_id_is_refused() {
    let server = server(verifier(Algorithm::HS256, &[SECRET.as_bytes()]), |c| {
        c.require_token_id = true;
    });
    let exp = now() + 60;
    let anonymous = hs256(&json!({"exp": exp}));
    let alice = hs256(&json!({"sub": "alice", "exp": exp}));
    let (status, body) = upgrade(&server, &format!("/?id=alice&token={anonymous}"), "");
    assert_eq!((status, body.as_str()), (403, "id not bound by a token"));
    assert_eq!(upgrade(&server, &format!("/?token={anonymous}"), "").0, 101);
    assert_eq!(
        upgrade(&server, &format!("/?id=alice&token={alice}"), "").0,
        101
    );
}

#[test]
fn the_cookie_is_read_only_where_origins_are_checked() {
    let token = hs256(&json!({"sub": "alice", "exp": now() + 60}));
    let cookie = format!("Cookie: theme=dark; wspush_token={token}\r\n");
    let open = server(verifier(Algorithm::HS256, &[SECRET.as_bytes()]), |_| {});
    let (status, body) = upgrade(&open, "/ws", &cookie);
    assert_eq!((status, body.as_str()), (401, "a valid token is required"));
    let origin = "https://app.example";
    let checked = server(verifier(Algorithm::HS256, &[SECRET.as_bytes()]), |c| {
        c.allowed_origins = vec![origin.into()];
    });
    let from_page = format!("Origin: {origin}\r\n{cookie}");
    assert_eq!(upgrade(&checked, "/ws", &from_page).0, 101);
    let elsewhere = format!("Origin: https://evil.example\r\n{cookie}");
    assert_eq!(upgrade(&checked, "/ws", &elsewhere).0, 403);
}

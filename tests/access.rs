//! Access control: `--allow-origin` (403), tokens by header or query
//! (401), and tokens never kept (the binary's tests check that none is
//! logged).

mod util;

use util::{http_get, TestServer};
use wspush::{Config, Tokens};

const ORIGIN: &str = "https://app.example.com";

fn guarded() -> TestServer {
    TestServer::start(Config::default().with(|c| {
        c.allowed_origins = vec![ORIGIN.into()];
        c.tokens = Some(Tokens::new(["s3cret-token", "second"]).unwrap());
    }))
}

/// Sends an upgrade request for `target` with `extra` header lines and
/// returns the status.
fn upgrade_status(server: &TestServer, target: &str, extra: &str) -> u16 {
    util::upgrade_answer(server.addr, target, extra).status
}

#[test]
fn wrong_origins_get_403_and_missing_or_wrong_tokens_401() {
    let server = guarded();
    let origin = format!("Origin: {ORIGIN}\r\n");
    let cases = [
        (
            "/ws?token=s3cret-token",
            "Origin: https://evil.example\r\n".to_string(),
            403,
        ),
        (
            "/ws?token=s3cret-token",
            "Origin: https://app.example.com.evil\r\n".into(),
            403,
        ),
        ("/ws", origin.clone(), 401),
        ("/ws?token=", origin.clone(), 401),
        ("/ws?token=s3cret", origin.clone(), 401),
        (
            "/ws?token=s3cret-token",
            format!("{origin}Authorization: Bearer wrong\r\n"),
            401,
        ),
        ("/ws?token=s3cret-token", origin.clone(), 101),
        ("/ws?id=1&token=second", origin.clone(), 101),
        (
            "/ws",
            format!("{origin}Authorization: Bearer s3cret-token\r\n"),
            101,
        ),
        // Not from a browser: no Origin to check, the token decides.
        ("/ws", "Authorization: Bearer second\r\n".into(), 101),
    ];
    for (target, extra, want) in &cases {
        assert_eq!(
            upgrade_status(&server, target, extra),
            *want,
            "{target} {extra:?}"
        );
    }
    // A refused connection is counted closed once the client has gone,
    // after its answer: wait for those too.
    let m = server.wait_for("every request counted", |m| {
        m.rejected_403 == 2 && m.rejected_401 == 4 && m.upgrades == 4 && m.closed_rejected >= 6
    });
    assert_eq!(m.closed_rejected, 6, "one close per refusal");
}

#[test]
fn metrics_need_the_token_when_tokens_are_set_and_health_does_not() {
    let server = guarded();
    assert_eq!(http_get(server.addr, "/metrics", "").status, 401);
    let page = http_get(server.addr, "/metrics", "Authorization: Bearer second\r\n");
    assert_eq!(page.status, 200);
    assert!(page
        .body
        .contains("wspush_requests_rejected_total{status=\"401\"} 1"));
    let health = http_get(server.addr, "/healthz", "");
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
}

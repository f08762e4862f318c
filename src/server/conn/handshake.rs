//! The handshake phase of a connection: its request head parsed, then
//! answered with 101, an endpoint's response (`/healthz`, `/metrics`, the
//! demo page) or an HTTP error.

use super::{CloseReason, Conn, Ctx, Phase, Verdict};
use crate::ops::metrics::{self, Metrics};
use crate::protocol::auth;
use crate::protocol::http::{
    self, Endpoint, Endpoints, HandshakeRules, HeadStatus, Rejection, MAX_RESPONSE_LEN,
};
use crate::protocol::target::RequestTarget;
use crate::protocol::ws::Decoder;
use crate::server::heartbeat::Liveness;
use crate::server::ConnKey;

impl Conn {
    /// Parses the request (of which `bytes[..seen]` was found partial
    /// before); answers it with 101, an endpoint's response or an HTTP
    /// error.
    pub(super) fn handshake(
        &mut self,
        key: ConnKey,
        endpoints: Endpoints,
        bytes: &[u8],
        seen: usize,
        ctx: &mut Ctx<'_>,
    ) -> (usize, Verdict) {
        let config = ctx.config;
        let rules = HandshakeRules {
            max_head_bytes: config.max_head_bytes,
            path: config.path.as_deref(),
            origins: &config.allowed_origins,
            tokens: config.tokens.as_ref(),
            endpoints,
        };
        let mut response = [0u8; MAX_RESPONSE_LEN];
        match http::parse_request_after(bytes, seen, &rules) {
            Ok(HeadStatus::Partial) => (0, Verdict::Keep),
            Ok(HeadStatus::Upgrade(upgrade, head_len)) => {
                let len = http::write_accept_response(&upgrade.accept, &mut response);
                // The token, if any, is neither kept nor logged.
                self.target = RequestTarget::from_parts(auth::without_token(upgrade.target));
                self.phase = Phase::Open(Decoder::default());
                self.out.set_next_batch(ctx.next_batch);
                self.liveness = Liveness::default();
                self.deadline.clear(ctx.timers);
                Metrics::incr(&ctx.metrics.upgrades);
                Metrics::decr(&ctx.metrics.connections_http);
                Metrics::incr(&ctx.metrics.connections_open);
                log::debug!("upgraded {}", self.target());
                (head_len, self.send_bytes(&[&response[..len]], ctx))
            }
            Ok(HeadStatus::Endpoint(endpoint, head_len)) => {
                (head_len, self.answer(key, endpoint, ctx))
            }
            Err(rejection) => (bytes.len(), self.reject(key, rejection, ctx)),
        }
    }

    /// Answers `/healthz`, `/metrics` or the demo page and lingers until
    /// the client goes.
    fn answer(&mut self, key: ConnKey, endpoint: Endpoint, ctx: &mut Ctx<'_>) -> Verdict {
        let mut head = [0u8; MAX_RESPONSE_LEN];
        self.linger(key, CloseReason::Http, ctx);
        match endpoint {
            Endpoint::Health => {
                Metrics::incr(&ctx.metrics.http_healthz);
                let body = b"ok\n";
                let len = http::write_ok_head("text/plain", body.len(), &mut head);
                self.send_bytes(&[&head[..len], body], ctx)
            }
            Endpoint::Demo => {
                Metrics::incr(&ctx.metrics.http_demo);
                let body = http::DEMO_PAGE.as_bytes();
                let len = http::write_ok_head("text/html; charset=utf-8", body.len(), &mut head);
                self.send_bytes(&[&head[..len], body], ctx)
            }
            Endpoint::Metrics => {
                Metrics::incr(&ctx.metrics.http_metrics);
                // Include what this loop iteration has gathered so far.
                ctx.metrics.publish(ctx.tally);
                let mut body = Vec::with_capacity(8 * 1024);
                metrics::render_prometheus(&ctx.metrics.snapshot(), ctx.loop_histogram, &mut body);
                let len = http::write_ok_head(
                    "text/plain; version=0.0.4; charset=utf-8",
                    body.len(),
                    &mut head,
                );
                self.send_bytes(&[&head[..len], &body], ctx)
            }
        }
    }

    /// Answers with an HTTP error and lingers until the client goes.
    fn reject(&mut self, key: ConnKey, rejection: Rejection, ctx: &mut Ctx<'_>) -> Verdict {
        Metrics::incr(ctx.metrics.rejected(rejection.status()));
        log::debug!("handshake rejected: {rejection:?}");
        let mut response = [0u8; MAX_RESPONSE_LEN];
        let len = rejection.write_response(&mut response);
        self.linger(key, CloseReason::Rejected, ctx);
        self.send_bytes(&[&response[..len]], ctx)
    }
}

//! The handshake phase of a connection: its request head parsed, then
//! answered with 101 or an HTTP error, or handed to the loop to answer
//! (`/healthz`, `/metrics`, the demo page: see [`Verdict::Serve`]).

use super::{CloseReason, Conn, Ctx, Outgoing, Phase, Verdict};
use crate::ops::metrics::Metrics;
use crate::protocol::auth;
use crate::protocol::http::{
    self, Endpoints, HandshakeRules, HeadStatus, Rejection, MAX_RESPONSE_LEN,
};
use crate::protocol::target::RequestTarget;
use crate::protocol::ws::Decoder;
use crate::server::heartbeat::Liveness;
use crate::server::key::ConnKey;

impl Conn {
    /// Parses the request (of which `bytes[..seen]` was found partial
    /// before); answers it with 101 or an HTTP error, or lingers and asks
    /// the loop to answer an endpoint.
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
                let sent = self.send(Outgoing::Response(&response[..len], &[]), ctx);
                (head_len, Verdict::after(sent))
            }
            Ok(HeadStatus::Endpoint(endpoint, head_len)) => {
                self.linger(key, CloseReason::Http, ctx);
                (head_len, Verdict::Serve(endpoint))
            }
            Err(rejection) => (bytes.len(), self.reject(key, rejection, ctx)),
        }
    }

    /// Answers with an HTTP error and lingers until the client goes.
    fn reject(&mut self, key: ConnKey, rejection: Rejection, ctx: &mut Ctx<'_>) -> Verdict {
        Metrics::incr(ctx.metrics.rejected(rejection.status()));
        log::debug!("handshake rejected: {rejection:?}");
        let mut response = [0u8; MAX_RESPONSE_LEN];
        let len = rejection.write_response(&mut response);
        self.linger(key, CloseReason::Rejected, ctx);
        Verdict::after(self.send(Outgoing::Response(&response[..len], &[]), ctx))
    }
}

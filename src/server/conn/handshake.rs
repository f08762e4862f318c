//! The handshake phase of a connection: its request head parsed, then
//! answered with 101 or an HTTP error, or handed to the loop to answer
//! (`/healthz`, `/metrics`, the demo page: see [`Verdict::Serve`]).

use super::wire::{Outgoing, OwnMessage, Wire, MAX_OWN_HEAD};
use super::{CloseReason, Conn, Ctx, Flags, Phase, Verdict};
use crate::ops::metrics::Metrics;
use crate::protocol::http::{
    self, Credential, Endpoints, HandshakeRules, HeadStatus, Rejection, MAX_RESPONSE_LEN,
};
use crate::protocol::jwt;
use crate::protocol::names::ClientIdRef;
use crate::protocol::position::Status;
use crate::protocol::query::{self, Resume, UpgradeLimits};
use crate::protocol::target::RequestTarget;
use crate::protocol::ws::Decoder;
use crate::protocol::ws::OpCode;
use crate::server::history::{Filter, Replay};
use crate::server::key::ConnKey;
use crate::server::time::heartbeat::Liveness;
use crate::server::time::unix_now;
use std::sync::Arc;

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
            jwt: config.jwt.as_ref(),
            now: config
                .jwt
                .as_ref()
                .map_or(0, |_| unix_now().as_secs() as i64),
            cookie: !config.allowed_origins.is_empty(),
            endpoints,
            deflate: config.deflate,
        };
        match http::parse_request_after(bytes, seen, &rules) {
            Ok(HeadStatus::Partial) => (0, Verdict::Keep),
            Ok(HeadStatus::Upgrade(upgrade, head_len)) => {
                let resume = match self.join(key, &upgrade, ctx) {
                    Ok(resume) => resume,
                    Err(rejection) => {
                        return (bytes.len(), self.reject(key, rejection, bytes, ctx))
                    }
                };
                let mut head = Vec::new();
                let retry_ms = || self.retry_ms(key, ctx);
                self.wire = Wire::answer(
                    &upgrade.protocol,
                    retry_ms,
                    &mut head,
                    &ctx.counters.metrics,
                );
                self.phase = Phase::Open(Decoder::default());
                self.next_batch = ctx.next_batch;
                self.liveness = Liveness::default();
                self.deadline.clear(ctx.timers);
                if let Some(Credential::Signed(claims)) = &upgrade.credential {
                    self.arm_expiry(key, claims.valid_until, ctx);
                }
                Metrics::incr(&ctx.counters.metrics.upgrades);
                Metrics::decr(&ctx.counters.metrics.connections_http);
                Metrics::incr(&ctx.counters.metrics.connections_open);
                log::debug!("upgraded {}", self.target());
                let (status, replay) = self.resume(resume, ctx);
                let sent = self.send(key, Outgoing::Response(&head, &status), ctx);
                match (Verdict::after(sent), replay) {
                    (Verdict::Keep, Some(replay)) => (head_len, Verdict::Replay(Box::new(replay))),
                    (verdict, _) => (head_len, verdict),
                }
            }
            Ok(HeadStatus::Endpoint(endpoint, method, head_len)) => {
                self.linger(key, CloseReason::Http, ctx);
                (head_len, Verdict::Serve(endpoint, method))
            }
            Err(rejection) => (bytes.len(), self.reject(key, rejection, bytes, ctx)),
        }
    }

    /// The `retry:` an event stream begins with: the ping interval, less a
    /// part of its own of up to a half, so that the clients of a server
    /// that went away come back spread over it.
    fn retry_ms(&self, key: ConnKey, ctx: &Ctx<'_>) -> u32 {
        let interval = ctx.config.ping_interval.as_millis().min(60_000) as u32;
        let point = u64::from(key.own_point(self.serial));
        interval / 2 + ((u64::from(interval / 2) * point) >> 32) as u32
    }

    /// Arms the deadline that closes it (4001) before its signed token's
    /// validity ends, at a point of its own (see [`jwt::close_after`]),
    /// on the last tick before that point.
    fn arm_expiry(&mut self, key: ConnKey, valid_until: i64, ctx: &mut Ctx<'_>) {
        let spread = f64::from(key.own_point(self.serial)) / f64::from(u32::MAX);
        if let Some(after) = jwt::close_after(valid_until, unix_now(), spread) {
            self.arm_within(key, after, ctx);
        }
    }

    /// Takes the client id and channels the upgrade asks for, if they are
    /// valid and allowed, and enters them in the routes; keeps the target
    /// without the token (never kept or logged) and the channels. Returns
    /// what it asks of positions, with the id and channels a replay
    /// follows.
    fn join(
        &mut self,
        key: ConnKey,
        upgrade: &http::Upgrade<'_>,
        ctx: &mut Ctx<'_>,
    ) -> Result<(Resume, Filter), Rejection> {
        let config = ctx.config;
        let grant = match &upgrade.credential {
            None => None,
            Some(Credential::Signed(claims)) => Some(&claims.grant),
            Some(Credential::Listed(index)) => config.tokens.as_ref().map(|t| t.grant(*index)),
        };
        let limits = UpgradeLimits {
            max_channels: config.max_channels_per_connection,
            allowed: &config.allowed_channels,
            require_token_id: config.require_token_id,
        };
        let mut asked = query::asked(upgrade.target, grant, &limits)?;
        asked.resume = Wire::resume(&upgrade.protocol, asked.resume);
        let mut target = RequestTarget::kept(upgrade.target, None);
        if target.id().is_none() && asked.id.is_some() {
            // The id came from the token.
            target = RequestTarget::kept(upgrade.target, asked.id);
        }
        let slot = key.slot();
        ctx.routes.join(slot, asked.id);
        for &channel in &asked.channels {
            if ctx.routes.subscribe(slot, channel).is_err() {
                ctx.routes.leave(slot, asked.id);
                return Err(Rejection::ChannelLimit);
            }
        }
        if let Some(upstream) = ctx.upstream.as_deref_mut() {
            let conn = self.conn_ref(key, config.instance);
            let wire = Wire::of(&upgrade.protocol).upstream_name();
            let channels = asked.channels.iter().map(|c| c.as_str());
            upstream.opened(conn, asked.id.map(ClientIdRef::as_str), channels, wire);
        }
        self.target = target;
        let filter = match asked.resume {
            Resume::Since(_) => Filter {
                id: asked.id.map(ClientIdRef::owned),
                channels: asked.channels.iter().map(|c| c.owned()).collect(),
            },
            Resume::Off | Resume::Positions => Filter::default(),
        };
        Ok((asked.resume, filter))
    }

    /// A connection that asked for positions gets them from now on, and
    /// its status message (the frame returned, empty for one that did
    /// not ask); one resuming is given a replay (returned too), for the
    /// loop to address to it before anything live.
    fn resume(
        &mut self,
        (asked, filter): (Resume, Filter),
        ctx: &mut Ctx<'_>,
    ) -> (Vec<u8>, Option<Replay>) {
        let history = ctx.history;
        let (status, replay) = match asked {
            Resume::Off => return (Vec::new(), None),
            Resume::Positions => (
                Status::Position {
                    current: history.current(),
                },
                None,
            ),
            Resume::Since(since) => history.resume(since, ctx.now),
        };
        self.flags.set(Flags::POSITIONS, true);
        let metrics = &ctx.counters.metrics;
        Metrics::incr(match status {
            Status::Position { .. } => &metrics.resumes_position,
            Status::Recovered { .. } => &metrics.resumes_recovered,
            Status::Gap { .. } => &metrics.resumes_gap,
            Status::Unknown { .. } => &metrics.resumes_unknown,
        });
        let replay = replay.map(|(from, through)| Replay {
            from,
            through,
            filter: Arc::new(filter),
        });
        let message = status.message();
        let mut head = [0u8; MAX_OWN_HEAD];
        let message = OwnMessage::plain(OpCode::Text, message.as_bytes());
        let (len, payload, tail) = self.wire.wrap(message, &mut head);
        ([&head[..len], payload, tail].concat(), replay)
    }

    /// Answers `request` with an HTTP error (its head alone to a `HEAD`)
    /// and lingers until the client goes.
    fn reject(
        &mut self,
        key: ConnKey,
        rejection: Rejection,
        request: &[u8],
        ctx: &mut Ctx<'_>,
    ) -> Verdict {
        Metrics::incr(ctx.counters.metrics.rejected(rejection.status()));
        log::debug!("handshake rejected: {rejection:?}");
        let mut response = [0u8; MAX_RESPONSE_LEN];
        let mut len = rejection.write_response(&mut response);
        if http::Method::of(request) == Some(http::Method::Head) {
            len = http::head_len(&response[..len]);
        }
        self.linger(key, CloseReason::Rejected, ctx);
        Verdict::after(self.send(key, Outgoing::Response(&response[..len], &[]), ctx))
    }
}

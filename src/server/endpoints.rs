//! The plain HTTP endpoints the loop answers itself: `/healthz`,
//! `/metrics`, the demo page and the JavaScript client. A connection that asks for one hands it
//! over ([`Verdict::Serve`](crate::server::conn::Verdict::Serve)); the loop, which holds what the answers
//! report, renders the body here and gives it back to the connection.

use std::sync::atomic::Ordering::Relaxed;

use crate::config::Degraded;
use crate::ops::board::Board;
use crate::ops::exposition::render_own;
use crate::ops::metrics::Metrics;
use crate::protocol::http::{self, Endpoint, PageStatus};
use crate::server::handle::Shared;

/// The media type of `/metrics` (Prometheus text format).
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An endpoint's answer.
#[derive(Debug)]
pub(super) struct Answer<'a> {
    pub(super) status: PageStatus,
    pub(super) content_type: &'static str,
    pub(super) body: &'a [u8],
}

/// Answers `endpoint` from what `shared` holds (the metrics published
/// already), rendering `/metrics` into `page` (the host's, from its
/// metrics board, if one is given with whether per instance too); counts
/// the request.
pub(super) fn answer<'a>(
    endpoint: Endpoint,
    (shared, host): (&Shared, Option<&(Board, bool)>),
    degraded: Degraded,
    page: &'a mut Vec<u8>,
) -> Answer<'a> {
    page.clear();
    let counter = {
        let metrics = &shared.counters.metrics;
        match endpoint {
            Endpoint::Health => &metrics.http_healthz,
            Endpoint::Demo => &metrics.http_demo,
            Endpoint::Client => &metrics.http_client,
            Endpoint::Metrics => &metrics.http_metrics,
        }
    };
    Metrics::incr(counter);
    let mut status = PageStatus::Ok;
    let (content_type, body) = match endpoint {
        Endpoint::Health if shared.counters.metrics.draining.load(Relaxed) == 1 => {
            status = PageStatus::Unavailable;
            ("text/plain", &b"draining\n"[..])
        }
        Endpoint::Health if shared.counters.metrics.feeds_down.load(Relaxed) == 0 => {
            ("text/plain", &b"ok\n"[..])
        }
        Endpoint::Health => {
            if degraded == Degraded::Unavailable {
                status = PageStatus::Unavailable;
            }
            ("text/plain", &b"degraded: an input feed is lost\n"[..])
        }
        Endpoint::Demo => ("text/html; charset=utf-8", http::DEMO_PAGE.as_bytes()),
        Endpoint::Client => (
            "text/javascript; charset=utf-8",
            http::CLIENT_SCRIPT.as_bytes(),
        ),
        Endpoint::Metrics => {
            match host {
                Some((board, per_instance)) => board.render(*per_instance, page),
                None => render_own(&shared.counters, &shared.snapshot(), page),
            }
            (PROMETHEUS_TEXT, &page[..])
        }
    };
    Answer {
        status,
        content_type,
        body,
    }
}

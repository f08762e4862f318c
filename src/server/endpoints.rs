//! The plain HTTP endpoints the loop answers itself: `/healthz`,
//! `/metrics`, the demo page and the JavaScript client. A connection that asks for one hands it
//! over ([`Verdict::Serve`](crate::server::conn::Verdict::Serve)); the loop, which holds what the answers
//! report, renders the body here and gives it back to the connection.

use std::sync::atomic::Ordering::Relaxed;

use crate::config::Degraded;
use crate::ops::metrics::{self, Metrics};
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
/// already), rendering `/metrics` into `page`; counts the request.
pub(super) fn answer<'a>(
    endpoint: Endpoint,
    shared: &Shared,
    degraded: Degraded,
    page: &'a mut Vec<u8>,
) -> Answer<'a> {
    page.clear();
    let counter = {
        let metrics = &shared.metrics;
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
        Endpoint::Health if shared.metrics.draining.load(Relaxed) == 1 => {
            status = PageStatus::Unavailable;
            ("text/plain", &b"draining\n"[..])
        }
        Endpoint::Health if shared.metrics.feeds_down.load(Relaxed) == 0 => {
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
            metrics::render_prometheus(&shared.snapshot(), &shared.loop_histogram, page);
            (PROMETHEUS_TEXT, &page[..])
        }
    };
    Answer {
        status,
        content_type,
        body,
    }
}

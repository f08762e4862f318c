//! The plain HTTP endpoints the loop answers itself: `/healthz`,
//! `/metrics`, the demo page and the JavaScript client. A connection that asks for one hands it
//! over ([`Verdict::Serve`]); the loop, which holds what the answers
//! report, renders the body here and gives it back to the connection.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use crate::config::Degraded;
use crate::ops::metrics::{self, Metrics};
use crate::protocol::http::{self, Endpoint, PageStatus};
use crate::server::conn::Verdict;
use crate::server::key::ConnKey;
use crate::server::Server;

/// The media type of `/metrics` (Prometheus text format).
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Server {
    /// Answers `endpoint` on connection `key`, counting the request.
    pub(super) fn serve(&mut self, key: ConnKey, endpoint: Endpoint) -> Verdict {
        let mut page = std::mem::take(&mut self.page);
        page.clear();
        let counter = {
            let metrics = &self.shared.metrics;
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
            Endpoint::Health if self.shared.metrics.feeds_down.load(Relaxed) == 0 => {
                ("text/plain", &b"ok\n"[..])
            }
            Endpoint::Health => {
                if self.config.degraded == Degraded::Unavailable {
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
                // Include what this loop iteration has gathered so far.
                self.publish_metrics(Instant::now());
                let shared = &self.shared;
                metrics::render_prometheus(&shared.snapshot(), &shared.loop_histogram, &mut page);
                (PROMETHEUS_TEXT, &page[..])
            }
        };
        let parts = self.parts(Instant::now());
        let mut ctx = parts.ctx;
        let verdict = match parts.conns.get_mut(key.0) {
            Some(conn) => conn.respond(status, content_type, body, &mut ctx),
            None => Verdict::Keep,
        };
        self.page = page;
        verdict
    }
}

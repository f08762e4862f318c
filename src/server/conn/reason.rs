//! Why a connection ended: one reason per counter, and the close code
//! each reason ends a WebSocket connection with.

use crate::ops::metrics::Metrics;
use crate::protocol::ws::CloseCode;

/// Why a connection ended; each reason has its own counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The close handshake completed; the client's code (1005: it gave
    /// none). Or an event stream's client went (1000).
    Normal(CloseCode),
    /// The server failed the connection with this code (1002, 1007, 1009).
    Failed(CloseCode),
    /// The output queue went over its limit (1008).
    SlowConsumer,
    /// Nothing was heard from the client for the idle timeout (1001).
    IdleTimeout,
    /// The upgrade request did not arrive in time.
    HandshakeTimeout,
    /// The upgrade request was refused with an HTTP error.
    Rejected,
    /// A plain HTTP request (`/healthz`, `/metrics`, the demo page) was answered.
    Http,
    /// The server is shutting down (1001).
    Shutdown,
    /// A drain closed it at its pace (1012, Service Restart).
    Drain,
    /// Its signed token expired (4001).
    TokenExpired,
    /// It resumed from a position this server did not reach within the
    /// handshake timeout (1013, Try Again Later).
    Ahead,
    /// A publisher closed it (`close`, or `Handle::close`) with this code.
    Publisher(CloseCode),
    /// The TCP connection ended without a close handshake.
    Abnormal,
}

impl CloseReason {
    /// The counter this reason is recorded in.
    pub fn counter(self, metrics: &Metrics) -> &std::sync::atomic::AtomicU64 {
        match self {
            CloseReason::Normal(_) => &metrics.closed_normal,
            CloseReason::Failed(CloseCode::INVALID_PAYLOAD) => &metrics.closed_invalid_payload,
            CloseReason::Failed(CloseCode::MESSAGE_TOO_BIG) => &metrics.closed_message_too_big,
            CloseReason::Failed(_) => &metrics.closed_protocol_error,
            CloseReason::SlowConsumer => &metrics.closed_slow_consumer,
            CloseReason::IdleTimeout => &metrics.closed_idle_timeout,
            CloseReason::Http => &metrics.closed_http,
            CloseReason::HandshakeTimeout => &metrics.closed_handshake_timeout,
            CloseReason::Rejected => &metrics.closed_rejected,
            CloseReason::Shutdown => &metrics.closed_shutdown,
            CloseReason::Drain => &metrics.closed_drain,
            CloseReason::TokenExpired => &metrics.closed_token_expired,
            CloseReason::Ahead => &metrics.closed_ahead,
            CloseReason::Publisher(_) => &metrics.closed_publisher,
            CloseReason::Abnormal => &metrics.closed_abnormal,
        }
    }
}

impl CloseReason {
    /// The close code a WebSocket connection ended with, as upstream
    /// `close` lines give it: the one sent or received, 1006 when the
    /// connection just ended.
    pub fn code(self) -> CloseCode {
        match self {
            CloseReason::Normal(code)
            | CloseReason::Failed(code)
            | CloseReason::Publisher(code) => code,
            CloseReason::SlowConsumer => CloseCode::POLICY_VIOLATION,
            CloseReason::IdleTimeout | CloseReason::Shutdown => CloseCode::GOING_AWAY,
            CloseReason::Drain => CloseCode::SERVICE_RESTART,
            CloseReason::TokenExpired => CloseCode::TOKEN_EXPIRED,
            CloseReason::Ahead => CloseCode::TRY_AGAIN_LATER,
            CloseReason::HandshakeTimeout
            | CloseReason::Rejected
            | CloseReason::Http
            | CloseReason::Abnormal => CloseCode(1006),
        }
    }
}

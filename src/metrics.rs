//! Counters the loop keeps, readable from any thread through a
//! [`Handle`](crate::Handle). Nothing is lost silently: every dropped
//! message and every closed or refused connection is counted by reason.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident, )*) => {
        /// Live counters. Only the loop thread writes them (relaxed atomics,
        /// uncontended); other threads take a [`MetricsSnapshot`].
        #[derive(Debug, Default)]
        pub struct Metrics {
            $( $(#[$doc])* pub $name: AtomicU64, )*
        }

        /// A copy of every counter at one moment.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct MetricsSnapshot {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl Metrics {
            /// Reads every counter.
            pub fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }

        impl MetricsSnapshot {
            /// Every counter as `(name, value)`, in declaration order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![ $( (stringify!($name), self.$name), )* ]
            }
        }
    };
}

counters! {
    /// TCP connections accepted.
    connections_accepted,
    /// Connections currently held (any phase).
    connections_open,
    /// Handshakes completed with `101 Switching Protocols`.
    upgrades,
    /// Connections refused at accept because `max_connections` was reached (503).
    rejected_at_capacity,
    /// Handshakes answered with 400.
    rejected_400,
    /// Handshakes answered with 404.
    rejected_404,
    /// Handshakes answered with 405.
    rejected_405,
    /// Handshakes answered with 426.
    rejected_426,
    /// Handshakes answered with 431.
    rejected_431,
    /// Closed after a completed close handshake (either side began it).
    closed_normal,
    /// Closed after the server failed the connection for a protocol error (1002).
    closed_protocol_error,
    /// Closed after invalid UTF-8 (1007).
    closed_invalid_payload,
    /// Closed after a message over the size limit (1009).
    closed_message_too_big,
    /// Closed because the output queue was over its limit (1008).
    closed_slow_consumer,
    /// Closed because a handshake did not complete in time.
    closed_handshake_timeout,
    /// Closed after an HTTP rejection was sent.
    closed_rejected,
    /// Closed during server shutdown (1001).
    closed_shutdown,
    /// The peer vanished without a close handshake (EOF, reset or I/O error).
    closed_abnormal,
    /// Broadcast messages encoded (each once).
    broadcasts,
    /// Broadcast messages refused (larger than the message limit).
    broadcasts_rejected,
    /// Input lines not broadcast (invalid UTF-8, or over the message limit).
    input_lines_rejected,
    /// Broadcast frames handed to connections (written or queued).
    broadcast_deliveries,
    /// Broadcast frames a connection did not get because its queue was full
    /// (slow-consumer policy `drop`).
    slow_consumer_drops,
    /// Frames that could not be written whole at once and were queued.
    write_would_block,
    /// Data messages received from clients.
    messages_received,
    /// Messages echoed back (echo mode).
    messages_echoed,
    /// Pings answered with a pong.
    pings_received,
    /// Buffers lent from the pool right now (partial input, echo messages).
    buffers_lent,
    /// Free buffers the pool holds for reuse right now.
    buffers_idle,
    /// Accept errors other than running out of file descriptors.
    accept_errors,
    /// Times accepting was paused because file descriptors ran out.
    accept_pauses,
}

impl Metrics {
    /// Adds one to a counter.
    pub fn incr(counter: &AtomicU64) {
        Metrics::add(counter, 1);
    }

    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Sets a gauge.
    pub fn set(gauge: &AtomicU64, value: u64) {
        gauge.store(value, Ordering::Relaxed);
    }

    /// Subtracts one from a gauge.
    pub fn decr(counter: &AtomicU64) {
        counter.fetch_sub(1, Ordering::Relaxed);
    }

    /// The counter for a handshake rejected with `status`.
    pub fn rejected(&self, status: u16) -> &AtomicU64 {
        match status {
            404 => &self.rejected_404,
            405 => &self.rejected_405,
            426 => &self.rejected_426,
            431 => &self.rejected_431,
            503 => &self.rejected_at_capacity,
            _ => &self.rejected_400,
        }
    }
}

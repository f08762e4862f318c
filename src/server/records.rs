//! What the loop knows of its connections and of what it sent: the
//! routes (client ids, channel subscriptions) and the history of
//! positioned messages.

use std::io;
use std::time::Instant;

use slab::Slab;

use crate::config::Config;
use crate::ops::metrics::Metrics;
use crate::ops::sys;
use crate::server::conn::Conn;
use crate::server::history::{fresh_epoch, Bounds, History};
use crate::server::routes::Routes;

/// The history's bounds `config` asks for.
pub(super) fn bounds(config: &Config) -> Bounds {
    Bounds {
        messages: config.history_messages,
        bytes: config.history_bytes,
        age: config.history_age,
    }
}

/// The routes and the history.
#[derive(Debug)]
pub(super) struct Records {
    /// Client ids and channel subscriptions.
    pub(super) routes: Routes,
    /// The positions given out and the history kept (see
    /// [`Ctx::history`](crate::server::conn::Ctx::history)).
    pub(super) history: History,
}

impl Records {
    /// Empty routes, and the history `config` asks for: a ring of its
    /// own, or the one a supervisor shares.
    pub(super) fn new(config: &Config) -> io::Result<Records> {
        let history = match &config.history_fd {
            Some(fd) => History::shared(fd.try_clone()?, config.first_position)?,
            None => {
                let epoch = config.epoch.unwrap_or_else(fresh_epoch);
                History::new(epoch, config.first_position, bounds(config))?
            }
        };
        Ok(Records::on(config, history))
    }

    /// Empty routes, and `history` (as an earlier image of this process
    /// kept it).
    pub(super) fn on(config: &Config, mut history: History) -> Records {
        if config.epoch.is_some() {
            history = history.given_elsewhere();
        }
        Records {
            routes: Routes::new(config.max_channels),
            history,
        }
    }

    /// Drops the history's messages past its bounds, files the client ids
    /// that joined while their index was full (`conns` gives each
    /// holder's id), and gives the allocator back the table a grown index
    /// left free.
    pub(super) fn upkeep(&mut self, now: Instant, conns: &Slab<Conn>) {
        self.history.evict(now);
        self.routes
            .make_room(|slot| conns.get(slot as usize).and_then(Conn::id));
        if self.routes.take_grown() {
            // A grown index left its old, smaller table free.
            sys::release_free_memory();
        }
    }

    /// Sets the gauges of the routes and the history.
    pub(super) fn publish(&self, metrics: &Metrics) {
        Metrics::set(&metrics.channels, self.routes.channel_count() as u64);
        Metrics::set(
            &metrics.subscriptions,
            self.routes.subscription_count() as u64,
        );
        Metrics::set(&metrics.connections_with_id, self.routes.id_count() as u64);
        let (messages, bytes) = self.history.held();
        Metrics::set(&metrics.history_messages, messages);
        Metrics::set(&metrics.history_bytes, bytes);
        Metrics::set(&metrics.history_refused, self.history.refused());
    }
}

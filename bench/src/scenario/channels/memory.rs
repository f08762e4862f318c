//! `memory`: server memory per idle connection for each URL variant, each
//! in a server of its own, with the subscriptions from `/metrics`.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::options::{ChannelsOptions, Variant};
use super::stage::{render_warnings, SetupReport, Stage};
use crate::observe::format::{bytes, failures, grouped, render_columns};
use crate::observe::procfs::Usage;
use crate::observe::scrape::{fetch_metrics, metric};
use crate::target::Target;
use crate::Error;

/// One variant of a `memory` run.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    /// The variant.
    pub variant: Variant,
    /// An example of its paths (connection 0's).
    pub example_path: String,
    /// The setup.
    pub setup: SetupReport,
    /// Server memory before the connections.
    pub baseline: crate::report::Memory,
    /// Server memory with them open and idle.
    pub open: crate::report::Memory,
    /// RSS growth per open connection, in bytes.
    pub rss_per_conn: f64,
    /// PSS growth per open connection, in bytes.
    pub pss_per_conn: f64,
    /// `wspush_subscriptions` from `/metrics`.
    pub subscriptions: Option<f64>,
    /// `wspush_channels`.
    pub channels: Option<f64>,
    /// `wspush_connections_with_id`.
    pub connections_with_id: Option<f64>,
    /// Subscriptions the connections asked for.
    pub subscriptions_expected: u64,
}

/// A `memory` run.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRun {
    /// Connections per variant.
    pub conns: u64,
    /// Each variant, in order.
    pub rows: Vec<MemoryRow>,
    /// (RSS per connection with 10 channels − with 1) / 9, in bytes.
    pub rss_per_subscription: Option<f64>,
    /// The same from PSS.
    pub pss_per_subscription: Option<f64>,
    /// Conditions that make the numbers less trustworthy.
    pub warnings: Vec<String>,
}

pub(super) fn memory(o: &ChannelsOptions) -> Result<MemoryRun, Error> {
    let settle = Duration::from_millis(o.settle_ms);
    let mut rows = Vec::new();
    let mut warnings = Vec::new();
    for &variant in &o.variants {
        let label = format!("wspush {}", variant.name());
        let mut stage = Stage::start(o, &label, &o.wspush_command(None)?)?;
        stage.idle(settle)?;
        let baseline = stage.server.usage()?;
        stage.connect(o, variant.paths(), o.conns)?;
        let before = stage.mark()?;
        stage.pump(settle)?;
        stage.warn_if_busy(&before, "while the connections settled")?;
        let open = stage.server.usage()?;
        let page = match fetch_metrics(stage.addr) {
            Ok(page) => Some(page),
            Err(e) => {
                stage.warnings.push(format!("[{label}] /metrics: {e}"));
                None
            }
        };
        let get = |name| page.as_deref().and_then(|p| metric(p, name));
        let n = stage.setup.open.max(1) as f64;
        let growth = |f: fn(&Usage) -> u64| (f(&open) as f64 - f(&baseline) as f64) / n;
        rows.push(MemoryRow {
            variant,
            example_path: variant.paths().path(0),
            setup: stage.setup_report()?,
            baseline: baseline.into(),
            open: open.into(),
            rss_per_conn: growth(|u| u.rss_bytes),
            pss_per_conn: growth(|u| u.pss_bytes),
            subscriptions: get("wspush_subscriptions"),
            channels: get("wspush_channels"),
            connections_with_id: get("wspush_connections_with_id"),
            subscriptions_expected: stage.setup.open * variant.channels_per_conn(),
        });
        warnings.extend(stage.finish());
    }
    let per_sub = |f: fn(&MemoryRow) -> f64| {
        let find = |v| rows.iter().find(|r| r.variant == v).map(f);
        Some((find(Variant::IdTenChannels)? - find(Variant::IdChannel)?) / 9.0)
    };
    Ok(MemoryRun {
        conns: o.conns,
        rss_per_subscription: per_sub(|r| r.rss_per_conn),
        pss_per_subscription: per_sub(|r| r.pss_per_conn),
        rows,
        warnings,
    })
}

impl MemoryRun {
    /// The report as text.
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "channels memory: {} idle connections per variant, each in a server of its own\n",
            grouped(self.conns)
        );
        let metric = |v: Option<f64>| v.map_or("-".into(), |v| grouped(v as u64));
        let rows: Vec<Vec<(&str, String)>> = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    ("  variant", format!("  {}", r.variant.name())),
                    ("open", grouped(r.setup.open)),
                    ("RSS/conn", bytes(r.rss_per_conn as i64)),
                    ("PSS/conn", bytes(r.pss_per_conn as i64)),
                    ("RSS open", bytes(r.open.rss_bytes as i64)),
                    ("subscriptions", metric(r.subscriptions)),
                    ("(asked)", grouped(r.subscriptions_expected)),
                    ("channels", metric(r.channels)),
                    ("with id", metric(r.connections_with_id)),
                    ("setup", format!("{:.1} s", r.setup.setup_secs)),
                ]
            })
            .collect();
        out.push_str(&render_columns(&rows));
        for r in &self.rows {
            let _ = writeln!(out, "  {}: e.g. {}", r.variant.name(), r.example_path);
            if !r.setup.failures.is_empty() {
                let _ = writeln!(out, "    failures: {}", failures(&r.setup.failures));
            }
        }
        if let (Some(rss), Some(pss)) = (self.rss_per_subscription, self.pss_per_subscription) {
            let _ = writeln!(
                out,
                "  per subscription: {rss:.0} B RSS, {pss:.0} B PSS  [(per conn with 10 channels - with 1) / 9]"
            );
        }
        if let Some(r) = self.rows.first() {
            let _ = writeln!(out, "  command: {}", r.setup.command);
        }
        render_warnings(&mut out, &self.warnings);
        out
    }
}

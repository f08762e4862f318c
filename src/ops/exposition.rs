//! The Prometheus text exposition (version 0.0.4) of a process's
//! [`Counters`], or of several summed: every word of them is described by
//! a row (its family, labels and kind), in the order they are rendered.
//! A process's description goes with its counters into its host's
//! metrics board (see `board`), so that a reader of another build (during
//! an upgrade) renders them as well.

use std::io::Write;
use std::sync::OnceLock;

use crate::ops::metrics::{
    self, Counters, Kind, MetricsSnapshot, EVENT_STREAM_LATENCY_AT, LATENCY_BUCKETS_US,
    LOOP_BUCKETS_AT, LOOP_BUCKETS_US, WEBSOCKET_LATENCY_AT,
};

/// What a word is, as exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowKind {
    /// A counter: it only grows. Summed.
    Counter,
    /// A gauge: a level now. Summed over the processes running.
    Gauge,
    /// A counter of what every instance sees alike (the host's input):
    /// an instance's is its processes' sum, the host's the largest
    /// instance's.
    HostCounter,
    /// A gauge of what every instance sees alike, or of a worst case:
    /// the host's is the largest.
    HostGauge,
    /// A gauge of nanoseconds, exported in seconds: the largest is the
    /// host's.
    Max,
    /// A histogram's bucket (its labels end with `le`), counted apart (not
    /// cumulative). Summed.
    Bucket,
    /// A histogram's count (its `+Inf` bucket). Summed.
    Count,
    /// A histogram's sum, in nanoseconds, exported in seconds. Summed.
    Sum,
}

impl RowKind {
    /// Whether a process's value is kept for its instance once it is gone
    /// (it only grows): so that no sum goes backwards.
    pub fn grows(self) -> bool {
        !matches!(self, RowKind::Gauge | RowKind::HostGauge | RowKind::Max)
    }

    /// Whether the host's value is the largest instance's (else their
    /// sum).
    pub fn largest_on_host(self) -> bool {
        matches!(
            self,
            RowKind::HostCounter | RowKind::HostGauge | RowKind::Max
        )
    }

    /// Its letter in a description.
    fn letter(self) -> &'static str {
        match self {
            RowKind::Counter => "c",
            RowKind::Gauge => "g",
            RowKind::HostCounter => "C",
            RowKind::HostGauge => "G",
            RowKind::Max => "m",
            RowKind::Bucket => "b",
            RowKind::Count => "n",
            RowKind::Sum => "s",
        }
    }

    fn of_letter(letter: &str) -> Option<RowKind> {
        let kinds = [
            RowKind::Counter,
            RowKind::Gauge,
            RowKind::HostCounter,
            RowKind::HostGauge,
            RowKind::Max,
            RowKind::Bucket,
            RowKind::Count,
            RowKind::Sum,
        ];
        kinds.into_iter().find(|kind| kind.letter() == letter)
    }

    /// Its family's type.
    fn family_type(self) -> &'static str {
        match self {
            RowKind::Counter | RowKind::HostCounter => "counter",
            RowKind::Gauge | RowKind::HostGauge | RowKind::Max => "gauge",
            RowKind::Bucket | RowKind::Count | RowKind::Sum => "histogram",
        }
    }
}

/// How one word of a process's counters is exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The word, in [`Counters`]' order.
    pub word: usize,
    /// Its family's name.
    pub family: String,
    /// Its labels, without braces (`reason="normal"`; a bucket's `le`
    /// last), or none.
    pub labels: String,
    /// What it is.
    pub kind: RowKind,
    /// The family's help, on its first row (else empty).
    pub help: String,
}

/// The rows of this build's counters, in the order they are rendered.
pub fn rows() -> &'static [Row] {
    static ROWS: OnceLock<Vec<Row>> = OnceLock::new();
    ROWS.get_or_init(build_rows)
}

/// [`rows`] as text: a line each, `word kind family labels help`, tab-separated.
pub fn description() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let mut text = String::new();
        for row in rows() {
            let kind = row.kind.letter();
            let Row {
                word,
                family,
                labels,
                help,
                ..
            } = row;
            text.push_str(&format!("{word}\t{kind}\t{family}\t{labels}\t{help}\n"));
        }
        text
    })
}

/// The rows a [`description`] says (of any build), if it is one.
pub fn parse(text: &str) -> Option<Vec<Row>> {
    text.lines()
        .map(|line| {
            let mut fields = line.split('\t');
            let mut next = || fields.next();
            Some(Row {
                word: next()?.parse().ok()?,
                kind: RowKind::of_letter(next()?)?,
                family: next()?.to_string(),
                labels: next()?.to_string(),
                help: next()?.to_string(),
            })
        })
        .collect()
}

fn build_rows() -> Vec<Row> {
    let row = |word, family: &str, labels: String, kind, help: &str| Row {
        word,
        family: family.to_string(),
        labels,
        kind,
        help: help.to_string(),
    };
    let mut rows = Vec::new();
    for (word, (family, labels, kind, help)) in metrics::table().enumerate() {
        let kind = match kind {
            Kind::Counter => RowKind::Counter,
            Kind::Gauge => RowKind::Gauge,
            Kind::HostCounter => RowKind::HostCounter,
            Kind::HostGauge => RowKind::HostGauge,
            Kind::Apart => continue,
        };
        let labels = labels.trim_start_matches('{').trim_end_matches('}');
        rows.push(row(word, family, labels.to_string(), kind, help));
    }
    let seconds = |us: u64| us as f64 / 1e6;
    let (iterations, busy, max) = metrics::loop_words();
    let family = "wspush_loop_iteration_seconds";
    for (i, bound) in LOOP_BUCKETS_US.iter().enumerate() {
        let help = match i {
            0 => "Time the loop spent per iteration, not counting the wait.",
            _ => "",
        };
        let labels = format!("le=\"{}\"", seconds(*bound));
        rows.push(row(
            LOOP_BUCKETS_AT + i,
            family,
            labels,
            RowKind::Bucket,
            help,
        ));
    }
    rows.push(row(iterations, family, String::new(), RowKind::Count, ""));
    rows.push(row(busy, family, String::new(), RowKind::Sum, ""));
    rows.push(row(
        max,
        "wspush_loop_iteration_max_seconds",
        String::new(),
        RowKind::Max,
        "Longest loop iteration in the last 10 to 20 seconds.",
    ));
    let family = "wspush_delivery_latency_seconds";
    let help = "Time from a message's input (its line, entry or request read) to the \
                socket write that completed it, by transport; each batch observed once, \
                weighted by its messages.";
    for (at, transport) in [
        (WEBSOCKET_LATENCY_AT, "websocket"),
        (EVENT_STREAM_LATENCY_AT, "event_stream"),
    ] {
        let transport = format!("transport=\"{transport}\"");
        for (i, bound) in LATENCY_BUCKETS_US.iter().enumerate() {
            let help = match (at, i) {
                (WEBSOCKET_LATENCY_AT, 0) => help,
                _ => "",
            };
            let labels = format!("{transport},le=\"{}\"", seconds(*bound));
            rows.push(row(at + i, family, labels, RowKind::Bucket, help));
        }
        let after = at + LATENCY_BUCKETS_US.len();
        rows.push(row(after, family, transport.clone(), RowKind::Count, ""));
        rows.push(row(after + 1, family, transport, RowKind::Sum, ""));
    }
    rows
}

/// One sample to render: a row's value, for one instance (labelled
/// `instance`) or for the whole.
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    /// The row.
    pub row: &'a Row,
    /// The instance it is of, if it is one's.
    pub instance: Option<usize>,
    /// Its value (a [`RowKind::Bucket`]'s own count, not cumulative).
    pub value: u64,
}

/// Renders `samples`, given in order: a family's samples adjacent, and a
/// histogram's series (its rows for one instance, or the whole) adjacent,
/// its buckets in order, then its count, then its sum.
pub fn render<'a>(samples: impl IntoIterator<Item = Sample<'a>>, out: &mut Vec<u8>) {
    let mut family = "";
    let mut cumulative = 0;
    for Sample {
        row,
        instance,
        value,
    } in samples
    {
        if row.family != family {
            family = &row.family;
            cumulative = 0;
            if !row.help.is_empty() {
                let _ = writeln!(out, "# HELP {family} {}", row.help);
            }
            let _ = writeln!(out, "# TYPE {family} {}", row.kind.family_type());
        }
        let labels = |extra: &str| {
            let parts = [
                instance.map(|k| format!("instance=\"{k}\"")),
                (!row.labels.is_empty()).then(|| row.labels.clone()),
                (!extra.is_empty()).then(|| extra.to_string()),
            ];
            let labels: Vec<String> = parts.into_iter().flatten().collect();
            match labels.is_empty() {
                true => String::new(),
                false => format!("{{{}}}", labels.join(",")),
            }
        };
        let seconds = |ns: u64| ns as f64 / 1e9;
        let _ = match row.kind {
            RowKind::Counter | RowKind::Gauge | RowKind::HostCounter | RowKind::HostGauge => {
                writeln!(out, "{family}{} {value}", labels(""))
            }
            RowKind::Max => writeln!(out, "{family}{} {}", labels(""), seconds(value)),
            RowKind::Bucket => {
                cumulative += value;
                writeln!(out, "{family}_bucket{} {cumulative}", labels(""))
            }
            RowKind::Count => {
                cumulative = 0;
                let inf = labels("le=\"+Inf\"");
                writeln!(out, "{family}_bucket{inf} {value}")
                    .and_then(|()| writeln!(out, "{family}_count{} {value}", labels("")))
            }
            RowKind::Sum => writeln!(out, "{family}_sum{} {}", labels(""), seconds(value)),
        };
    }
}

/// Renders one process's counters, the table's as `metrics` has them.
pub fn render_own(counters: &Counters, metrics: &MetricsSnapshot, out: &mut Vec<u8>) {
    let words = counters.words(metrics);
    let samples = rows().iter().map(|row| Sample {
        row,
        instance: None,
        value: words[row.word],
    });
    render(samples, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::metrics::{Metrics, COUNTERS_WORDS};

    /// The operations guide lists every metric family `/metrics` exports,
    /// with its type, and no other.
    #[test]
    fn the_operations_guide_lists_every_family() {
        let mut page = Vec::new();
        let counters = Counters::default();
        render_own(&counters, &MetricsSnapshot::default(), &mut page);
        let mut exported: Vec<(String, String)> = String::from_utf8(page)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| {
                let (name, kind) = l.split_once(' ').unwrap();
                (name.to_string(), kind.to_string())
            })
            .collect();
        let guide = include_str!("../../docs/OPERATIONS.md");
        let mut documented: Vec<(String, String)> = guide
            .lines()
            .filter_map(|l| l.strip_prefix("| `wspush_"))
            .map(|l| {
                let (name, rest) = l.split_once('`').unwrap();
                let name = name.split('{').next().unwrap();
                let kind = rest.trim_start_matches(" |").split('|').next().unwrap();
                (format!("wspush_{name}"), kind.trim().to_string())
            })
            .collect();
        exported.sort();
        documented.sort();
        assert_eq!(documented, exported);
    }

    /// The table's families are adjacent rows, each named, typed and
    /// explained once; the lookups find their rows.

    #[test]
    fn prometheus_text_has_one_type_per_family_and_every_sample_parses() {
        let counters = Counters::default();
        let metrics = &counters.metrics;
        Metrics::add(&metrics.connections_open, 3);
        Metrics::add(&metrics.closed_invalid_payload, 2);
        Metrics::add(&metrics.rejected_429, 1);
        Metrics::add(&metrics.loop_iterations, 3);
        Metrics::add(&metrics.loop_busy_ns, 1_500_000);
        for ns in [5_000, 700_000, 2_000_000_000] {
            counters.loop_histogram.record(ns);
        }
        let mut out = Vec::new();
        render_own(&counters, &metrics.snapshot(), &mut out);
        let text = String::from_utf8(out).unwrap();
        let mut families = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert!(families.insert(name.to_string()), "{name} typed twice");
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect(line);
            assert!(value.parse::<f64>().is_ok(), "{line}");
            let name = series.split('{').next().unwrap();
            let family = name
                .strip_suffix("_bucket")
                .or(name.strip_suffix("_sum"))
                .or(name.strip_suffix("_count"))
                .unwrap_or(name);
            assert!(families.contains(family), "{line} before its # TYPE");
        }
        for expected in [
            "wspush_connections_open 3",
            "wspush_connections_closed_total{reason=\"protocol_error\",code=\"1007\"} 2",
            "wspush_requests_rejected_total{status=\"429\"} 1",
            "wspush_loop_iteration_seconds_bucket{le=\"0.00001\"} 1",
            "wspush_loop_iteration_seconds_bucket{le=\"0.001\"} 2",
            "wspush_loop_iteration_seconds_bucket{le=\"1\"} 2",
            "wspush_loop_iteration_seconds_bucket{le=\"+Inf\"} 3",
            "wspush_loop_iteration_seconds_sum 0.0015",
        ] {
            assert!(
                text.lines().any(|l| l == expected),
                "missing {expected}\n{text}"
            );
        }
    }

    #[test]
    fn a_description_reads_back_as_its_rows_and_names_every_word_once() {
        assert_eq!(parse(description()).as_deref(), Some(rows()));
        let mut words: Vec<usize> = rows().iter().map(|row| row.word).collect();
        words.sort();
        assert_eq!(words, (0..COUNTERS_WORDS).collect::<Vec<_>>());
        assert_eq!(parse("1\tc\twspush_x"), None, "a line cut short");
        assert_eq!(parse("1\tq\twspush_x\t\t"), None, "an unknown kind");
    }

    #[test]
    fn histograms_render_cumulative_buckets_per_series_and_the_instance_label_first() {
        let counters = Counters::default();
        counters.websocket_latency.observe(300_000, 3);
        counters.websocket_latency.observe(40_000_000_000, 1);
        counters.event_stream_latency.observe(1_000, 2);
        Metrics::add(&counters.metrics.rejected_429, 1);
        let words = counters.words(&counters.metrics.snapshot());
        let mut out = Vec::new();
        let samples = rows().iter().map(|row| Sample {
            row,
            instance: Some(3),
            value: words[row.word],
        });
        render(samples, &mut out);
        let text = String::from_utf8(out).unwrap();
        for expected in [
            "wspush_requests_rejected_total{instance=\"3\",status=\"429\"} 1",
            "wspush_delivery_latency_seconds_bucket{instance=\"3\",transport=\"websocket\",le=\"0.00025\"} 0",
            "wspush_delivery_latency_seconds_bucket{instance=\"3\",transport=\"websocket\",le=\"0.0005\"} 3",
            "wspush_delivery_latency_seconds_bucket{instance=\"3\",transport=\"websocket\",le=\"30\"} 3",
            "wspush_delivery_latency_seconds_bucket{instance=\"3\",transport=\"websocket\",le=\"+Inf\"} 4",
            "wspush_delivery_latency_seconds_count{instance=\"3\",transport=\"websocket\"} 4",
            "wspush_delivery_latency_seconds_sum{instance=\"3\",transport=\"websocket\"} 40.0009",
            "wspush_delivery_latency_seconds_bucket{instance=\"3\",transport=\"event_stream\",le=\"0.00025\"} 2",
            "wspush_delivery_latency_seconds_count{instance=\"3\",transport=\"event_stream\"} 2",
        ] {
            assert!(text.lines().any(|l| l == expected), "no {expected}\n{text}");
        }
        assert_eq!(
            text.matches("# TYPE wspush_delivery_latency_seconds histogram")
                .count(),
            1
        );
    }
}

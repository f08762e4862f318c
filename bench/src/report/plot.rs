//! `--plot FILE.svg`: the connection ramp and the latency CDF of one or
//! more runs, side by side, as a hand-written SVG (no plotting crate).

use std::fmt::Write as _;

use crate::report::RunReport;

/// Size of the whole picture and of each panel's plotting area, in px.
const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 420.0;
const PANEL_WIDTH: f64 = 380.0;
const PANEL_HEIGHT: f64 = 300.0;
/// Left edges of the two panels' plotting areas, and their common top.
const LEFT: [f64; 2] = [80.0, 580.0];
const TOP: f64 = 70.0;

/// Colours of the series, in order.
const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Legend entries per line, and the width of each.
const LEGEND_PER_LINE: usize = 5;
const LEGEND_WIDTH: f64 = 195.0;

/// One panel: a title, axis labels and one polyline per series.
struct Panel<'a> {
    left: f64,
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    x_max: f64,
    y_max: f64,
    series: Vec<Vec<(f64, f64)>>,
}

/// How a run's lines look: one colour per server, dashed after round 1.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Style {
    colour: &'static str,
    dashed: bool,
}

impl Style {
    /// The style of each run, in order.
    fn of(runs: &[&RunReport]) -> Vec<Style> {
        let mut servers: Vec<&str> = Vec::new();
        runs.iter()
            .map(|run| {
                let index = servers
                    .iter()
                    .position(|&s| s == run.server)
                    .unwrap_or_else(|| {
                        servers.push(&run.server);
                        servers.len() - 1
                    });
                Style {
                    colour: PALETTE[index % PALETTE.len()],
                    dashed: run.round > 1,
                }
            })
            .collect()
    }

    fn attributes(self) -> String {
        let dash = if self.dashed {
            r#" stroke-dasharray="6 3""#
        } else {
            ""
        };
        format!(r#"stroke="{}"{dash}"#, self.colour)
    }
}

/// The SVG document for `runs`: connections open over the setup (left)
/// and the fraction of deliveries within a latency (right). Each server
/// has a colour; rounds after the first are dashed.
pub fn svg(runs: &[&RunReport]) -> String {
    let styles = Style::of(runs);
    let ramps: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .map(|r| {
            r.connections
                .ramp
                .iter()
                .map(|&(t, n)| (t, n as f64))
                .collect()
        })
        .collect();
    // Latency in ms, or in s when the slowest delivery took 10 s or more.
    let slowest_us = runs.iter().map(|r| r.latency.max_us).fold(0.0, f64::max);
    let (latency_unit, us_per_unit) = if slowest_us >= 1e7 {
        ("latency, s", 1e6)
    } else {
        ("latency, ms", 1e3)
    };
    let cdfs: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .map(|r| {
            r.latency
                .cdf
                .iter()
                .map(|&(q, us)| (us / us_per_unit, q))
                .collect()
        })
        .collect();
    let max = |series: &[Vec<(f64, f64)>], pick: fn(&(f64, f64)) -> f64| {
        series
            .iter()
            .flatten()
            .map(pick)
            .fold(0.0, f64::max)
            .max(1e-9)
    };
    let panels = [
        Panel {
            left: LEFT[0],
            title: "Connection ramp",
            x_label: "seconds since the first connect",
            y_label: "connections open",
            x_max: max(&ramps, |p| p.0),
            y_max: max(&ramps, |p| p.1),
            series: ramps,
        },
        Panel {
            left: LEFT[1],
            title: "Broadcast latency CDF (send to receipt)",
            x_label: latency_unit,
            y_label: "fraction of deliveries",
            x_max: max(&cdfs, |p| p.0),
            y_max: 1.0,
            series: cdfs,
        },
    ];
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    for panel in &panels {
        draw_panel(&mut out, panel, &styles);
    }
    for (i, (run, style)) in runs.iter().zip(&styles).enumerate() {
        let x = 20.0 + LEGEND_WIDTH * (i % LEGEND_PER_LINE) as f64;
        let y = 12.0 + 13.0 * (i / LEGEND_PER_LINE) as f64;
        let _ = writeln!(
            out,
            r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke-width="2" {}/><text x="{}" y="{}">{}</text>"#,
            x + 20.0,
            style.attributes(),
            x + 24.0,
            y + 4.0,
            escape(&format!("{} (round {})", run.server, run.round))
        );
    }
    out.push_str("</svg>\n");
    out
}

fn draw_panel(out: &mut String, p: &Panel<'_>, styles: &[Style]) {
    let bottom = TOP + PANEL_HEIGHT;
    let x_ticks = nice_ticks(p.x_max);
    let y_ticks = nice_ticks(p.y_max);
    let x_end = *x_ticks.last().expect("at least two ticks");
    let y_end = *y_ticks.last().expect("at least two ticks");
    let sx = |x: f64| p.left + x / x_end * PANEL_WIDTH;
    let sy = |y: f64| bottom - y / y_end * PANEL_HEIGHT;
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="14" text-anchor="middle">{}</text>"#,
        p.left + PANEL_WIDTH / 2.0,
        TOP - 12.0,
        escape(p.title)
    );
    for &t in &x_ticks {
        let x = sx(t);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{bottom}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            bottom + 16.0,
            tick_label(t)
        );
    }
    for &t in &y_ticks {
        let y = sy(t);
        let _ = writeln!(
            out,
            r##"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            p.left,
            p.left + PANEL_WIDTH,
            p.left - 6.0,
            y + 4.0,
            tick_label(t)
        );
    }
    let _ = writeln!(
        out,
        r#"<rect x="{}" y="{TOP}" width="{PANEL_WIDTH}" height="{PANEL_HEIGHT}" fill="none" stroke="black"/>"#,
        p.left
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        p.left + PANEL_WIDTH / 2.0,
        bottom + 36.0,
        escape(p.x_label)
    );
    let _ = writeln!(
        out,
        r#"<text transform="translate({},{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        p.left - 58.0,
        TOP + PANEL_HEIGHT / 2.0,
        escape(p.y_label)
    );
    for (series, style) in p.series.iter().zip(styles) {
        let points: Vec<String> = series
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke-width="1.5" {} points="{}"/>"#,
            style.attributes(),
            points.join(" ")
        );
    }
}

/// Round tick values from 0 to at least `max`: steps of 1, 2 or 5 times a
/// power of ten, four to ten of them.
pub fn nice_ticks(max: f64) -> Vec<f64> {
    let max = if max > 0.0 { max } else { 1.0 };
    let raw = max / 5.0;
    let exponent = raw.log10().floor() as i32;
    let magnitude = 10f64.powi(exponent);
    let mantissa = [1u32, 2, 5, 10]
        .into_iter()
        .find(|&m| f64::from(m) * magnitude >= raw)
        .expect("10 × magnitude ≥ raw");
    let step = f64::from(mantissa) * magnitude;
    let count = (max / step).ceil() as u32;
    // Multiples of the mantissa scaled by an exact power of ten: no float noise.
    let value = |i: u32| {
        let units = f64::from(i * mantissa);
        if exponent < 0 {
            units / 10f64.powi(-exponent)
        } else {
            units * magnitude
        }
    };
    (0..=count).map(value).collect()
}

/// A tick value without float noise: `0.3`, `250`, `1.5M`.
fn tick_label(v: f64) -> String {
    let (v, suffix) = match v.abs() {
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e4 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let text = format!("{v:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}{suffix}")
}

/// Text escaped for XML.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_maximum() {
        assert_eq!(nice_ticks(1.0), vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
        assert_eq!(nice_ticks(73.0), vec![0.0, 20.0, 40.0, 60.0, 80.0]);
        assert_eq!(
            nice_ticks(1_000_000.0),
            vec![0.0, 200_000.0, 400_000.0, 600_000.0, 800_000.0, 1_000_000.0]
        );
        assert_eq!(nice_ticks(0.0), nice_ticks(1.0));
        for max in [0.003, 7.0, 12.5, 999.0, 31_415.0] {
            let t = nice_ticks(max);
            assert!(
                *t.last().unwrap() >= max && t.len() >= 4 && t.len() <= 11,
                "{max}: {t:?}"
            );
        }
    }

    #[test]
    fn tick_labels() {
        assert_eq!(tick_label(0.0), "0");
        assert_eq!(tick_label(0.30000000000000004), "0.3");
        assert_eq!(tick_label(250.0), "250");
        assert_eq!(tick_label(40_000.0), "40k");
        assert_eq!(tick_label(1_500_000.0), "1.5M");
    }

    #[test]
    fn draws_both_panels_for_every_run() {
        let a = crate::report::sample("floor", 1, [1.0, 2.0, 3.0]);
        let b = crate::report::sample("<wspush>", 1, [1.0, 2.0, 3.0]);
        let svg = svg(&[&a, &b]);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("&lt;wspush&gt; (round 1)"));
        assert!(svg.contains("Connection ramp") && svg.contains("latency, ms"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        // Balanced elements: every opened text is closed.
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    }

    #[test]
    fn a_server_keeps_its_colour_and_later_rounds_are_dashed() {
        let a1 = crate::report::sample("floor", 1, [1.0; 3]);
        let b1 = crate::report::sample("wspush", 1, [1.0; 3]);
        let a2 = crate::report::sample("floor", 2, [1.0; 3]);
        let styles = Style::of(&[&a1, &b1, &a2]);
        assert_eq!(styles[0].colour, styles[2].colour);
        assert_ne!(styles[0].colour, styles[1].colour);
        assert_eq!(
            styles.iter().map(|s| s.dashed).collect::<Vec<_>>(),
            [false, false, true]
        );
    }

    #[test]
    fn escapes_labels() {
        assert_eq!(escape("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
    }
}

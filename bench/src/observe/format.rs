//! How the bench writes numbers and tables: units, digit groups, and the
//! column layout every table it prints shares.

use std::collections::BTreeMap;

/// Nanoseconds in µs.
pub fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// A byte count with a binary unit, e.g. `4.3 MiB`.
pub fn bytes(n: i64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A duration given in µs: in µs below 10 ms, in ms below 10 s, else in s.
pub fn duration_us(value: f64) -> String {
    if value >= 10_000_000.0 {
        format!("{:.2} s", value / 1e6)
    } else if value >= 10_000.0 {
        format!("{:.1} ms", value / 1e3)
    } else {
        format!("{value:.1} µs")
    }
}

/// An integer with thin groups of three digits: `1,000,000`.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `3 refused, 1 timeout`, or `none`.
pub fn failures(failures: &BTreeMap<String, u64>) -> String {
    if failures.is_empty() {
        return "none".into();
    }
    let parts: Vec<String> = failures
        .iter()
        .map(|(kind, n)| format!("{} {kind}", grouped(*n)))
        .collect();
    parts.join(", ")
}

/// Lays out rows of `(column title, cell)` as a table with a header line:
/// the first column left-aligned, the others right-aligned.
pub fn render_columns(rows: &[Vec<(&str, String)>]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let header: Vec<String> = first.iter().map(|(title, _)| title.to_string()).collect();
    let cells: Vec<Vec<&str>> = std::iter::once(header.iter().map(String::as_str).collect())
        .chain(
            rows.iter()
                .map(|r| r.iter().map(|(_, cell)| cell.as_str()).collect()),
        )
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|col| {
            cells
                .iter()
                .map(|r| r[col].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in cells {
        let padded: Vec<String> = line
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(col, (cell, &w))| {
                let pad = " ".repeat(w - cell.chars().count());
                if col == 0 {
                    format!("{cell}{pad}")
                } else {
                    format!("{pad}{cell}")
                }
            })
            .collect();
        out.push_str(padded.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 * 1024 / 2), "1.5 MiB");
        assert_eq!(bytes(-2048), "-2.0 KiB");
        assert_eq!(duration_us(12.34), "12.3 µs");
        assert_eq!(duration_us(250_000.0), "250.0 ms");
        assert_eq!(duration_us(12_500_000.0), "12.50 s");
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000), "1,000");
        assert_eq!(grouped(1_234_567), "1,234,567");
    }

    #[test]
    fn columns_align() {
        let rows = vec![
            vec![("name", "a".to_string()), ("n", "1".to_string())],
            vec![("name", "longer".to_string()), ("n", "1000".to_string())],
        ];
        assert_eq!(
            render_columns(&rows),
            "name       n\na          1\nlonger  1000\n"
        );
        assert_eq!(render_columns(&[]), "");
    }
}

//! The benchmark report: one row per metric, one column per target, as the published table.

use serde::Serialize;

/// How a metric's values read and compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Higher,
    Lower,
    /// Neither: counts and shares, shown without ratios to the references.
    Neither,
}

/// One metric: its label, unit, and the value for each target (`None`: not measured).
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub metric: &'static str,
    pub unit: &'static str,
    pub better: Better,
    pub values: Vec<Option<f64>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub targets: Vec<String>,
    pub rounds: usize,
    pub scale: f64,
    pub rows: Vec<Row>,
    /// Free-form lines printed under the table (verification results, notes).
    pub notes: Vec<String>,
}

pub(crate) fn format_value(v: f64, unit: &str) -> String {
    // Rates read as whole numbers; times and sizes keep two or three significant digits.
    let digits = match unit {
        "ms" | "s" | "MiB" | "s/GiB" if v < 10.0 => 2,
        "ms" | "s" | "MiB" | "s/GiB" if v < 100.0 => 1,
        "%" => 1,
        _ => 0,
    };
    let text = format!("{v:.digits$}");
    // Thousands separators on the integer part, as the published table.
    let (int, frac) = text
        .split_once('.')
        .map_or((text.as_str(), None), |(i, f)| (i, Some(f)));
    let (sign, int) = int.strip_prefix('-').map_or(("", int), |i| ("-", i));
    let mut grouped = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

impl Report {
    /// The Markdown table. Each cell shows its ratio to the references present, other than
    /// itself: the null baseline (`baseline`) and the disk floor (`disk floor`), as a
    /// percentage where more is better and as a multiple where less is.
    pub fn to_markdown(&self) -> String {
        let references: Vec<(usize, &str)> = [("baseline", "null"), (FLOOR, "disk")]
            .into_iter()
            .filter_map(|(label, short)| {
                self.targets
                    .iter()
                    .position(|t| t == label)
                    .map(|i| (i, short))
            })
            .collect();
        let mut out = String::new();
        out.push_str("| metric |");
        for t in &self.targets {
            out.push_str(&format!(" {t} |"));
        }
        out.push('\n');
        out.push_str("|---|");
        for _ in &self.targets {
            out.push_str("---:|");
        }
        out.push('\n');
        for row in &self.rows {
            out.push_str(&format!("| {} ({}) |", row.metric, row.unit));
            for (i, v) in row.values.iter().enumerate() {
                let Some(v) = v else {
                    out.push_str(" – |");
                    continue;
                };
                let ratios: Vec<String> = references
                    .iter()
                    .filter(|(r, _)| *r != i)
                    .filter_map(|(r, short)| {
                        let base = row.values[*r].filter(|b| *b > 0.0)?;
                        match row.better {
                            Better::Higher => Some(format!("{:.0}% {short}", 100.0 * v / base)),
                            Better::Lower => Some(format!("{:.1}× {short}", v / base)),
                            Better::Neither => None,
                        }
                    })
                    .collect();
                let cell = if ratios.is_empty() {
                    format_value(*v, row.unit)
                } else {
                    format!("{} ({})", format_value(*v, row.unit), ratios.join(", "))
                };
                out.push_str(&format!(" {cell} |"));
            }
            out.push('\n');
        }
        out.push_str(&format!(
            "\n{} round(s), medians; scale {}.",
            self.rounds, self.scale
        ));
        if !references.is_empty() {
            out.push_str(
                " In brackets: the share of the null baseline (null) and of the disk floor (disk) where more is better, the multiple of theirs where less is.",
            );
        }
        out.push('\n');
        for note in &self.notes {
            out.push_str(&format!("- {note}\n"));
        }
        out
    }
}

/// The label of the disk floor's column.
pub const FLOOR: &str = "disk floor";

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            targets: vec!["hoard".into(), "baseline".into()],
            rounds: 3,
            scale: 1.0,
            rows: vec![
                Row {
                    metric: "Upload",
                    unit: "MiB/s",
                    better: Better::Higher,
                    values: vec![Some(2500.0), Some(2793.0)],
                },
                Row {
                    metric: "Lookup p99",
                    unit: "ms",
                    better: Better::Lower,
                    values: vec![Some(1.234), Some(4.2)],
                },
                Row {
                    metric: "Idle memory",
                    unit: "MiB",
                    better: Better::Lower,
                    values: vec![Some(4.5), None],
                },
            ],
            notes: vec!["all downloads verified".into()],
        }
    }

    #[test]
    fn one_row_per_metric_and_one_column_per_target() {
        let md = report().to_markdown();
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines[0], "| metric | hoard | baseline |");
        assert_eq!(lines[1], "|---|---:|---:|");
        assert_eq!(lines[2], "| Upload (MiB/s) | 2,500 (90% null) | 2,793 |");
        assert_eq!(lines[3], "| Lookup p99 (ms) | 1.23 (0.3× null) | 4.20 |");
        assert_eq!(lines[4], "| Idle memory (MiB) | 4.50 | – |");
        assert!(md.contains("3 round(s), medians"));
        assert!(md.contains("- all downloads verified"));
    }

    #[test]
    fn cells_show_their_ratio_to_both_references() {
        let mut r = report();
        r.targets.push(FLOOR.into());
        r.rows[0].values.push(Some(2000.0));
        r.rows[1].values.push(Some(2.0));
        r.rows[2].values.push(Some(3.0));
        let md = r.to_markdown();
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(
            lines[2],
            "| Upload (MiB/s) | 2,500 (90% null, 125% disk) | 2,793 (140% disk) | 2,000 (72% null) |"
        );
        assert_eq!(
            lines[3],
            "| Lookup p99 (ms) | 1.23 (0.3× null, 0.6× disk) | 4.20 (2.1× disk) | 2.00 (0.5× null) |"
        );
        assert_eq!(
            lines[4],
            "| Idle memory (MiB) | 4.50 (1.5× disk) | – | 3.00 |"
        );
    }

    #[test]
    fn counts_and_shares_show_no_ratio() {
        let mut r = report();
        r.rows.push(Row {
            metric: "Fleet: misses seen",
            unit: "%",
            better: Better::Neither,
            values: vec![Some(18.75), Some(18.75)],
        });
        let md = r.to_markdown();
        assert!(
            md.contains("| Fleet: misses seen (%) | 18.8 | 18.8 |"),
            "{md}"
        );
    }

    #[test]
    fn json_keeps_every_value() {
        let json = serde_json::to_value(report()).unwrap();
        assert_eq!(json["targets"][1], "baseline");
        assert_eq!(json["rows"][0]["values"][0], 2500.0);
        assert!(json["rows"][2]["values"][1].is_null());
        assert_eq!(json["rows"][1]["better"], "lower");
    }

    #[test]
    fn large_numbers_are_grouped() {
        assert_eq!(format_value(52599.4, "/s"), "52,599");
        assert_eq!(format_value(999.0, "/s"), "999");
        assert_eq!(format_value(1234567.0, "MiB/s"), "1,234,567");
        assert_eq!(format_value(0.5, "s/GiB"), "0.50");
    }
}

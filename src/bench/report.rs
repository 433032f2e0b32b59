//! The benchmark report: one row per metric, one column per target, as the published table.

use serde::Serialize;

/// How a metric's values read and compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Higher,
    Lower,
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

fn format_value(v: f64, unit: &str) -> String {
    // Rates read as whole numbers; times and sizes keep two or three significant digits.
    let digits = match unit {
        "ms" | "s" | "MiB" | "s/GiB" if v < 10.0 => 2,
        "ms" | "s" | "MiB" | "s/GiB" if v < 100.0 => 1,
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
    /// The Markdown table, with ratios to the first target named `baseline` when there is one.
    pub fn to_markdown(&self) -> String {
        let baseline = self.targets.iter().position(|t| t == "baseline");
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
                let cell = match (v, baseline.and_then(|b| row.values[b])) {
                    (None, _) => "–".to_owned(),
                    (Some(v), Some(base))
                        if Some(i) != baseline && base > 0.0 && row.better == Better::Higher =>
                    {
                        format!("{} ({:.0}%)", format_value(*v, row.unit), 100.0 * v / base)
                    }
                    (Some(v), _) => format_value(*v, row.unit),
                };
                out.push_str(&format!(" {cell} |"));
            }
            out.push('\n');
        }
        out.push_str(&format!(
            "\n{} round(s), medians; scale {}. Percentages are of the baseline column.\n",
            self.rounds, self.scale
        ));
        for note in &self.notes {
            out.push_str(&format!("- {note}\n"));
        }
        out
    }
}

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
        assert_eq!(lines[2], "| Upload (MiB/s) | 2,500 (90%) | 2,793 |");
        assert_eq!(lines[3], "| Lookup p99 (ms) | 1.23 | 4.20 |");
        assert_eq!(lines[4], "| Idle memory (MiB) | 4.50 | – |");
        assert!(md.contains("3 round(s), medians"));
        assert!(md.contains("- all downloads verified"));
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

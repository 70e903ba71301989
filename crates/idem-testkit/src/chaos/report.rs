//! What a run did and what its checker found, in one shape for every
//! target, and the Markdown tables the long runs record.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use super::fault::Fault;

/// Something that must never happen, and the key it happened to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The key, when the violation is about one.
    pub key: Option<String>,
    /// What was seen.
    pub what: String,
}

impl Violation {
    /// A violation about no key in particular.
    pub fn run(what: impl Into<String>) -> Self {
        Self {
            key: None,
            what: what.into(),
        }
    }

    /// A violation about `key`.
    pub fn key(key: impl Into<String>, what: impl Into<String>) -> Self {
        Self {
            key: Some(key.into()),
            what: what.into(),
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.key {
            Some(key) => write!(f, "{key}: {}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

/// What a target's checker found, before the engine adds what it knows
/// (the faults, the time taken).
#[derive(Debug, Clone, Default)]
pub struct Findings {
    /// Distinct keys.
    pub keys: usize,
    /// The target's own counts, in the order of its table's columns
    /// (`("exec", 312)`).
    pub counts: Vec<(&'static str, u64)>,
    /// What must never happen, and did.
    pub violations: Vec<Violation>,
    /// What else a reader of the violations should see (why workers
    /// asked for redeliveries, say).
    pub notes: Vec<String>,
    /// Where the run's ledgers and logs were kept for a look, when it
    /// found violations (otherwise they are removed).
    pub kept: Option<PathBuf>,
}

/// What a run did and what the checker found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The target's name (`pg-lease`, `http-redis`, `jetstream`).
    pub target: String,
    /// The seed.
    pub seed: u64,
    /// Faults injected, by kind (every kind the run could inject, so a
    /// kind never injected shows as 0).
    pub faults: BTreeMap<Fault, u64>,
    /// From the first delivery to the judgement.
    pub elapsed: Duration,
    /// What the target's checker found.
    pub findings: Findings,
}

impl Report {
    /// Distinct keys.
    pub fn keys(&self) -> usize {
        self.findings.keys
    }

    /// The target's count called `name` (0 if it has none).
    pub fn count(&self, name: &str) -> u64 {
        self.findings
            .counts
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    }

    /// Faults of `kind` injected.
    pub fn faults_of(&self, kind: Fault) -> u64 {
        self.faults.get(&kind).copied().unwrap_or(0)
    }

    /// What must never happen, and did.
    pub fn violations(&self) -> &[Violation] {
        &self.findings.violations
    }

    /// Where the run's ledgers and logs were kept, if it found violations.
    pub fn kept(&self) -> Option<&std::path::Path> {
        self.findings.kept.as_deref()
    }

    /// Panics with the violations if there are any.
    pub fn assert_clean(&self) {
        assert!(
            self.violations().is_empty(),
            "{} violations in the {} chaos run (seed {}):\n{}",
            self.violations().len(),
            self.target,
            self.seed,
            self.violation_lines(50)
        );
    }

    /// The violations, one per line (at most `limit`, then a count), and
    /// the target's notes after them.
    pub fn violation_lines(&self, limit: usize) -> String {
        let mut out = String::new();
        let violations = self.violations();
        for v in violations.iter().take(limit) {
            let _ = writeln!(out, "  {}: {v}", self.target);
        }
        if violations.len() > limit {
            let _ = writeln!(out, "  … and {} more", violations.len() - limit);
        }
        if !violations.is_empty() {
            for note in &self.findings.notes {
                let _ = writeln!(out, "  {note}");
            }
        }
        out
    }

    /// The faults as one cell: `kill=5 stop=4 restart=3`.
    pub fn faults_cell(&self) -> String {
        let cells: Vec<String> = self
            .faults
            .iter()
            .map(|(kind, n)| format!("{}={n}", kind.name()))
            .collect();
        cells.join(" ")
    }

    /// Markdown tables of `reports`, one row per run and one table per
    /// shape of counts: target, seed, keys, the target's counts, faults,
    /// seconds, violations.
    pub fn tables(reports: &[Report]) -> String {
        let mut shapes: Vec<Vec<&'static str>> = Vec::new();
        for report in reports {
            let shape: Vec<_> = report.findings.counts.iter().map(|(n, _)| *n).collect();
            if !shapes.contains(&shape) {
                shapes.push(shape);
            }
        }
        let mut out = String::new();
        for shape in shapes {
            let mut header = vec!["target", "seed", "keys"];
            header.extend(&shape);
            header.extend(["faults", "secs", "violations"]);
            let rows: Vec<Vec<String>> = reports
                .iter()
                .filter(|r| {
                    r.findings
                        .counts
                        .iter()
                        .map(|(n, _)| *n)
                        .eq(shape.iter().copied())
                })
                .map(|r| {
                    let mut row = vec![r.target.clone(), r.seed.to_string(), r.keys().to_string()];
                    row.extend(r.findings.counts.iter().map(|(_, v)| v.to_string()));
                    row.push(r.faults_cell());
                    row.push(format!("{:.0}", r.elapsed.as_secs_f64()));
                    row.push(r.violations().len().to_string());
                    row
                })
                .collect();
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&markdown_table(&header, &rows));
        }
        out
    }
}

/// A Markdown table with padded columns.
fn markdown_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = header
        .iter()
        .enumerate()
        .map(|(i, h)| rows.iter().map(|r| r[i].len()).fold(h.len(), usize::max))
        .collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect();
        format!("| {} |\n", padded.join(" | "))
    };
    let mut out = line(header.to_vec());
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&line(rule.iter().map(String::as_str).collect()));
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(target: &str, counts: Vec<(&'static str, u64)>) -> Report {
        Report {
            target: target.into(),
            seed: 1,
            faults: BTreeMap::from([(Fault::Kill, 3), (Fault::StoreRestart, 0)]),
            elapsed: Duration::from_secs(9),
            findings: Findings {
                keys: 10,
                counts,
                ..Findings::default()
            },
        }
    }

    #[test]
    fn runs_of_one_shape_share_a_table_and_others_get_their_own() {
        let tables = Report::tables(&[
            report("pg-lease", vec![("exec", 12)]),
            report("http-sqlite", vec![("2xx", 7)]),
            report("redis-lease", vec![("exec", 11)]),
        ]);
        let lines: Vec<&str> = tables.lines().collect();
        assert_eq!(lines.len(), 4 + 1 + 3, "{tables}");
        assert!(
            lines[0].contains("exec") && lines[3].contains("redis-lease"),
            "{tables}"
        );
        assert!(lines[2].contains("kill=3 restart=0"), "{tables}");
        assert!(lines[5].contains("2xx"), "{tables}");
    }
}

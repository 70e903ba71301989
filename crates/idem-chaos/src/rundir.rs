//! A run's directory of ledgers and logs: made at its start, removed at
//! its end unless the run found violations.

use std::path::PathBuf;

use idem_testkit::chaos::Report;

use crate::check::Violation;
use crate::error::{harness, ChaosError};

/// A new directory for a run's ledgers and logs, named after `what`.
pub(crate) fn run_dir(what: &str) -> Result<PathBuf, ChaosError> {
    let dir = std::env::temp_dir().join(format!(
        "{what}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| harness(format!("{}: {e}", dir.display())))?;
    Ok(dir)
}

/// Removes the run's directory of ledgers and logs, or keeps it (and
/// says where) when the run found violations.
pub(crate) fn keep_if_violated(mut report: Report, dir: PathBuf) -> Report {
    if report.violations().is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        report.findings.violations.push(Violation::run(format!(
            "ledgers and logs kept in {}",
            dir.display()
        )));
        report.findings.kept = Some(dir);
    }
    report
}

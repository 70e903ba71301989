//! The checker of an HTTP run: what the upstream's ledger, the clients'
//! answers and the gateway's store must agree on, and the report.

use std::collections::BTreeMap;
use std::time::Duration;

use idem::{FailureClass, Record, State};

use crate::check::{markdown_table, violation_lines, Violation};
use crate::{FaultKind, Target};

/// The faults an HTTP run injects (workload faults are always on).
pub const FAULTS: [FaultKind; 5] = [
    FaultKind::Kill,
    FaultKind::Latency,
    FaultKind::Blackhole,
    FaultKind::Reset,
    FaultKind::Cut,
];

/// The final answer a client got for one request (after its retries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) key: String,
    /// 0 when the client gave up.
    pub(crate) status: u16,
    /// The execution number in a 2xx body.
    pub(crate) exec: Option<u64>,
    /// The last segment of a problem's type.
    pub(crate) problem: Option<String>,
}

/// What an HTTP run did and what the checker found.
#[derive(Debug, Clone)]
pub struct HttpReport {
    /// The gateway's store.
    pub target: Target,
    /// The seed.
    pub seed: u64,
    /// Distinct keys.
    pub keys: usize,
    /// Requests the clients were given (keys plus duplicates, then one
    /// settling request per key).
    pub requests: usize,
    /// Of which duplicates of another during the fault phase.
    pub duplicates: usize,
    /// HTTP attempts in all (first tries and retries).
    pub attempts: u64,
    /// Attempts the client's own timeout cut off.
    pub timeouts: u64,
    /// Executions by the upstream.
    pub executions: u64,
    /// Requests answered 2xx.
    pub answered_ok: u64,
    /// Requests answered outcome-unknown (502 or 422).
    pub answered_unknown: u64,
    /// Requests whose client gave up.
    pub gave_up: u64,
    /// Keys that ended failed with an unknown outcome.
    pub unknown_keys: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<FaultKind, u64>,
    /// The whole run.
    pub elapsed: Duration,
    /// What must never happen, and did.
    pub violations: Vec<Violation>,
    /// Where the run's ledgers and logs were kept for a look, when it
    /// found violations (otherwise they are removed).
    pub kept: Option<std::path::PathBuf>,
}

impl HttpReport {
    /// Faults of `kind` injected.
    pub fn faults_of(&self, kind: FaultKind) -> u64 {
        self.faults.get(&kind).copied().unwrap_or(0)
    }

    /// The summary table of `reports`, one row per run.
    pub fn table(reports: &[HttpReport]) -> String {
        let mut header = vec![
            "target", "seed", "keys", "requests", "dups", "attempts", "timeouts", "exec", "2xx",
            "unknown", "gave up",
        ];
        header.extend(FAULTS.iter().map(|k| k.name()));
        header.extend(["secs", "violations"]);
        let rows: Vec<Vec<String>> = reports
            .iter()
            .map(|r| {
                let mut row = vec![
                    r.target.name().to_owned(),
                    r.seed.to_string(),
                    r.keys.to_string(),
                    r.requests.to_string(),
                    r.duplicates.to_string(),
                    r.attempts.to_string(),
                    r.timeouts.to_string(),
                    r.executions.to_string(),
                    r.answered_ok.to_string(),
                    r.unknown_keys.to_string(),
                    r.gave_up.to_string(),
                ];
                row.extend(FAULTS.iter().map(|k| r.faults_of(*k).to_string()));
                row.push(format!("{:.1}", r.elapsed.as_secs_f64()));
                row.push(r.violations.len().to_string());
                row
            })
            .collect();
        markdown_table(&header, &rows)
    }

    /// The violations, one per line (at most `limit`, then a count).
    pub fn violation_lines(&self, limit: usize) -> String {
        violation_lines(self.target, &self.violations, limit)
    }
}

/// Checks one key. `executions` are the upstream's execution numbers for
/// it; `answers` every final answer a client got for it; `record` the
/// store's record after the run; `in_doubt` whether an unknown outcome is
/// explained (the gateway died while the key was in progress, or the
/// upstream broke its answer off or answered too late on purpose).
pub(crate) fn check_key(
    key: &str,
    executions: &[u64],
    answers: &[&Answer],
    record: Option<&Record>,
    in_doubt: bool,
    violations: &mut Vec<Violation>,
) {
    let mut violate = |what: String| {
        violations.push(Violation {
            key: Some(key.to_owned()),
            what,
        });
    };
    if executions.len() > 1 {
        violate(format!(
            "the upstream executed it {} times (executions {executions:?})",
            executions.len()
        ));
    }
    for answer in answers {
        if (200..300).contains(&answer.status) && answer.exec != executions.first().copied() {
            violate(format!(
                "a client got {} with execution {:?}, but the upstream's executions are \
                 {executions:?}",
                answer.status, answer.exec
            ));
        }
    }
    match record.map(|r| &r.state) {
        Some(State::Completed { .. }) if executions.len() == 1 => {}
        Some(State::Completed { .. }) => violate(format!(
            "completed, but the upstream's executions are {executions:?}"
        )),
        Some(State::Failed { failure }) if failure.class == FailureClass::Unknown => {
            if !in_doubt {
                violate(format!(
                    "ended with an unknown outcome ({}), but neither did the gateway die while \
                     it was in progress nor did the upstream break its answer",
                    failure.message
                ));
            }
        }
        Some(state) => violate(format!("ended {}", state_name(state))),
        None => violate("no record after the run".to_owned()),
    }
}

fn state_name(state: &State) -> String {
    match state {
        State::InProgress { .. } => "in progress".to_owned(),
        State::Completed { .. } => "completed".to_owned(),
        State::Failed { failure } => format!("failed ({}: {})", failure.class, failure.message),
        State::Released { .. } => "released".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem::{Failure, Timestamp};

    fn record(state: State) -> Record {
        Record {
            state,
            fingerprint: None,
            attempt: 1,
            fence: 1,
            created_at: Timestamp::ZERO,
            updated_at: Timestamp::ZERO,
            expires_at: Timestamp::from_millis(60_000),
        }
    }

    fn ok(exec: u64) -> Answer {
        Answer {
            key: "k".into(),
            status: 201,
            exec: Some(exec),
            problem: None,
        }
    }

    #[test]
    fn each_broken_promise_is_reported() {
        let completed = record(State::Completed {
            response: bytes::Bytes::new(),
        });
        let unknown = record(State::Failed {
            failure: Failure::new(FailureClass::Unknown, "lost"),
        });
        // Executions, answers, the record, whether in doubt, the violation.
        type Case<'a> = (&'a [u64], Vec<Answer>, &'a Record, bool, &'a str);
        let cases: Vec<Case<'_>> = vec![
            (&[1], vec![ok(1), ok(1)], &completed, false, ""),
            (
                &[1, 2],
                vec![ok(1)],
                &completed,
                false,
                "executed it 2 times",
            ),
            (
                &[1],
                vec![ok(2)],
                &completed,
                false,
                "with execution Some(2)",
            ),
            (&[], vec![], &completed, false, "completed, but"),
            (&[1], vec![], &unknown, true, ""),
            (&[1], vec![], &unknown, false, "neither did the gateway die"),
        ];
        for (executions, answers, record, in_doubt, expected) in cases {
            let mut violations = Vec::new();
            let answers: Vec<&Answer> = answers.iter().collect();
            check_key(
                "k",
                executions,
                &answers,
                Some(record),
                in_doubt,
                &mut violations,
            );
            if expected.is_empty() {
                assert!(violations.is_empty(), "{violations:?}");
            } else {
                assert!(
                    violations.iter().any(|v| v.what.contains(expected)),
                    "{expected}: {violations:?}"
                );
            }
        }
    }
}

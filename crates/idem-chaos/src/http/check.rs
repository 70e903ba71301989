//! The checker of an HTTP run: what the upstream's ledger, the clients'
//! answers and the gateway's store must agree on, and the report.

use idem::{FailureClass, Record, State};
use idem_testkit::chaos::Findings;

use crate::check::Violation;

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

/// What an HTTP run counted.
#[derive(Debug, Clone, Default)]
pub(crate) struct HttpTally {
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
    /// What must never happen, and did.
    pub violations: Vec<Violation>,
}

impl HttpTally {
    /// The report's findings for a run of `keys` keys: its columns are
    /// `requests`, `dups`, `attempts`, `timeouts` (attempts the client's
    /// own timeout cut off), `exec` (upstream executions), `2xx`,
    /// `unknown` (keys that ended with an unknown outcome) and `gave-up`
    /// (requests whose client gave up).
    pub(crate) fn into_findings(self, keys: usize) -> Findings {
        Findings {
            keys,
            counts: vec![
                ("requests", self.requests as u64),
                ("dups", self.duplicates as u64),
                ("attempts", self.attempts),
                ("timeouts", self.timeouts),
                ("exec", self.executions),
                ("2xx", self.answered_ok),
                ("unknown", self.unknown_keys as u64),
                ("gave-up", self.gave_up),
            ],
            violations: self.violations,
            notes: vec![format!(
                "{} answers said outcome unknown",
                self.answered_unknown
            )],
            kept: None,
        }
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

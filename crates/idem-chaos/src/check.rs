//! The checker: what the ledger, the downstream table and the store must
//! agree on after a worker run, and what the run counted.

use std::collections::{BTreeMap, HashMap};

use idem::{Record, State};
use idem_testkit::chaos::Findings;
pub(crate) use idem_testkit::chaos::Violation;

/// What a worker run counted, and the violations found so far.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    /// Deliveries published (keys plus duplicates).
    pub deliveries: usize,
    /// Deliveries that were duplicates of another.
    pub duplicates: usize,
    /// Deliveries handed out again: after a retry request, a killed
    /// worker, or a visibility timeout.
    pub redeliveries: u64,
    /// Acknowledgements saying the handler ran.
    pub acked_executed: u64,
    /// Acknowledgements saying a stored result was replayed.
    pub acked_replayed: u64,
    /// Handler starts (lease modes) or committed effects (inbox mode).
    pub executions: u64,
    /// Fenced downstream writes refused as stale (lease modes).
    pub stale_writes: u64,
    /// Completions refused because the lease was taken over (lease modes).
    pub lease_lost: u64,
    /// Why workers asked for deliveries to be redelivered, with counts.
    pub retry_reasons: BTreeMap<String, u64>,
    /// What must never happen, and did.
    pub violations: Vec<Violation>,
}

impl Tally {
    /// The report's findings for a run of `keys` keys: its columns are
    /// `deliv` (keys plus duplicates), `dups`, `redeliv`, `acked` (each
    /// delivery once in a clean run), `exec` (handler starts; inbox:
    /// committed effects), `stale` (fenced writes refused) and `lost`
    /// (completions refused after a takeover).
    pub(crate) fn into_findings(self, keys: usize) -> Findings {
        let mut reasons: Vec<_> = self.retry_reasons.into_iter().collect();
        reasons.sort_by_key(|r| std::cmp::Reverse(r.1));
        Findings {
            keys,
            counts: vec![
                ("deliv", self.deliveries as u64),
                ("dups", self.duplicates as u64),
                ("redeliv", self.redeliveries),
                ("acked", self.acked_executed + self.acked_replayed),
                ("exec", self.executions),
                ("stale", self.stale_writes),
                ("lost", self.lease_lost),
            ],
            violations: self.violations,
            notes: reasons
                .into_iter()
                .take(10)
                .map(|(reason, n)| format!("retried {n}×: {reason}"))
                .collect(),
            kept: None,
        }
    }
}

/// What one key's lease-mode ledger says.
#[derive(Debug, Default)]
pub(crate) struct KeyLedger {
    /// Fences of the handler starts.
    pub starts: Vec<u64>,
    /// Fences of the acknowledged (stored) completions.
    pub done: Vec<u64>,
}

/// Parses the workers' ledger lines into per-key entries and counts of
/// stale writes and lost leases.
pub(crate) fn parse_ledger(text: &str) -> (HashMap<String, KeyLedger>, u64, u64) {
    let mut keys: HashMap<String, KeyLedger> = HashMap::new();
    let (mut stale, mut lost) = (0, 0);
    for line in text.lines() {
        let mut parts = line.split(' ');
        let (Some(kind), Some(key), Some(Ok(fence))) = (
            parts.next(),
            parts.next(),
            parts.next().map(str::parse::<u64>),
        ) else {
            // A worker killed mid-write can leave a torn last line.
            continue;
        };
        let entry = keys.entry(key.to_owned()).or_default();
        match (kind, parts.next()) {
            ("start", _) => entry.starts.push(fence),
            ("done", _) => entry.done.push(fence),
            ("effect", Some("stale")) => stale += 1,
            ("lost", _) => lost += 1,
            _ => {}
        }
    }
    (keys, stale, lost)
}

/// A downstream row: the fence of the write it holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Downstream {
    pub fence: u64,
}

/// Checks one key of a lease-mode run.
pub(crate) fn check_lease_key(
    key: &str,
    record: Option<&Record>,
    ledger: Option<&KeyLedger>,
    downstream: Option<Downstream>,
    out: &mut Vec<Violation>,
) {
    let mut flag = |what: String| {
        out.push(Violation {
            key: Some(key.to_owned()),
            what,
        })
    };
    let Some(record) = record else {
        flag("no record in the store: the key was lost".into());
        return;
    };
    if !matches!(record.state, State::Completed { .. }) {
        flag(format!(
            "record is {:?}, not completed",
            record.state.kind()
        ));
        return;
    }
    let stored = record.fence;
    let empty = KeyLedger::default();
    let ledger = ledger.unwrap_or(&empty);
    if !ledger.starts.contains(&stored) {
        flag(format!(
            "completed with fence {stored}, but no handler started with that fence"
        ));
    }
    if let Some(newest) = ledger.starts.iter().max().filter(|f| **f > stored) {
        flag(format!(
            "completed with fence {stored}, but a holder with fence {newest} started: \
             a stale completion was accepted or a completed key was claimed again"
        ));
    }
    if ledger.done.len() > 1 {
        flag(format!(
            "{} completions were acknowledged (fences {:?})",
            ledger.done.len(),
            ledger.done
        ));
    }
    if let Some(done) = ledger.done.iter().find(|f| **f != stored) {
        flag(format!(
            "the completion acknowledged with fence {done} is not the stored one \
             (fence {stored}): an acknowledged completion was lost or overwritten"
        ));
    }
    match downstream {
        None => flag("completed, but no downstream write was applied".into()),
        Some(d) if d.fence != stored => flag(format!(
            "downstream holds the write of fence {}, the store the completion of fence \
             {stored}",
            d.fence
        )),
        Some(_) => {}
    }
}

/// Checks one key of an inbox-mode run: exactly one committed effect, and
/// an inbox row with a response.
pub(crate) fn check_inbox_key(
    key: &str,
    effects: usize,
    inbox_responded: bool,
    out: &mut Vec<Violation>,
) {
    let mut flag = |what: String| {
        out.push(Violation {
            key: Some(key.to_owned()),
            what,
        })
    };
    match effects {
        1 => {}
        0 => flag("no effect committed: the key was lost".into()),
        n => flag(format!("{n} effects committed")),
    }
    if !inbox_responded {
        flag("no inbox record with a response".into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use idem::Timestamp;

    fn completed(fence: u64) -> Record {
        Record {
            state: State::Completed {
                response: Bytes::from_static(b"{}"),
            },
            fingerprint: None,
            attempt: 1,
            fence,
            created_at: Timestamp::from_millis(0),
            updated_at: Timestamp::from_millis(0),
            expires_at: Timestamp::from_millis(1),
        }
    }

    fn check(record: Option<&Record>, ledger: &str, downstream: Option<u64>) -> Vec<String> {
        let (keys, _, _) = parse_ledger(ledger);
        let mut out = Vec::new();
        check_lease_key(
            "k",
            record,
            keys.get("k"),
            downstream.map(|fence| Downstream { fence }),
            &mut out,
        );
        out.into_iter().map(|v| v.what).collect()
    }

    #[test]
    fn a_clean_takeover_passes() {
        let ledger = "start k 1\neffect k 1 applied\nstart k 2\neffect k 2 applied\ndone k 2\n\
                      lost k 1\neffect k 1 stale\n";
        assert!(check(Some(&completed(2)), ledger, Some(2)).is_empty());
    }

    #[test]
    fn each_broken_promise_is_caught() {
        // A stale holder's completion stands although a newer one started.
        let v = check(
            Some(&completed(1)),
            "start k 1\nstart k 2\ndone k 1\n",
            Some(1),
        );
        assert!(v.iter().any(|w| w.contains("stale completion")), "{v:?}");
        // Two acknowledged completions.
        let v = check(
            Some(&completed(2)),
            "start k 1\nstart k 2\ndone k 1\ndone k 2\n",
            Some(2),
        );
        assert!(v.iter().any(|w| w.contains("2 completions")), "{v:?}");
        assert!(v.iter().any(|w| w.contains("lost or overwritten")), "{v:?}");
        // The downstream holds another holder's write.
        let v = check(Some(&completed(2)), "start k 1\nstart k 2\n", Some(1));
        assert!(v.iter().any(|w| w.contains("downstream holds")), "{v:?}");
        // Lost, and not completed.
        assert!(check(None, "", None)[0].contains("lost"));
        let mut open = completed(1);
        open.state = State::Released { last_failure: None };
        assert!(check(Some(&open), "start k 1\n", Some(1))[0].contains("not completed"));
        // A torn last line is skipped, not misread.
        let (keys, _, _) = parse_ledger("start k 1\nsta");
        assert_eq!(keys["k"].starts, vec![1]);
    }

    #[test]
    fn inbox_keys_need_exactly_one_effect() {
        let mut out = Vec::new();
        check_inbox_key("a", 1, true, &mut out);
        assert!(out.is_empty());
        check_inbox_key("b", 2, true, &mut out);
        check_inbox_key("c", 0, false, &mut out);
        assert_eq!(out.len(), 3, "{out:?}");
    }
}

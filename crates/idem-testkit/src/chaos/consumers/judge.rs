//! The judgement of a consumer chaos run: what the ledger, the fenced
//! downstream, the store's records and the dead-letters must agree on.

use std::collections::BTreeMap;

use idem::codec::AtRest;
use idem::{GetRecord, Key, Record, RecordId, Scope, State};

use crate::consumers::ledger::Ledger;
use crate::consumers::under_test::DeadLetterSeen;

/// What a run left behind.
#[derive(Debug, Default)]
pub struct Evidence {
    /// Handler starts per key, with their fences.
    pub starts: BTreeMap<String, Vec<u64>>,
    /// The fence of the write the downstream holds, per key.
    pub downstream: BTreeMap<String, u64>,
    /// The store's record per key (good and poison ones).
    pub records: BTreeMap<String, Record>,
    /// The good keys.
    pub good: Vec<String>,
}

impl Evidence {
    /// Reads the ledger and the records of `good` and `poison` keys (scope
    /// `orders`) from `store`.
    pub async fn gather<S: GetRecord>(
        ledger: &Ledger,
        store: &S,
        good: &[String],
        poison: &[String],
    ) -> Self {
        let mut records = BTreeMap::new();
        for key in good.iter().chain(poison) {
            if let Some(record) = store.get(&record_id(key)).await.expect("read a record") {
                records.insert(key.clone(), record);
            }
        }
        Self {
            starts: ledger.fenced_starts(),
            downstream: good
                .iter()
                .chain(poison)
                .filter_map(|k| Some((k.clone(), ledger.downstream(k)?)))
                .collect(),
            records,
            good: good.to_vec(),
        }
    }
}

/// The record of `key` in the consumers' scope, `orders`.
fn record_id(key: &str) -> RecordId {
    RecordId::new(
        Scope::new("orders").expect("a valid scope"),
        Key::new(key).expect("a valid key"),
    )
}

/// The ids of the messages each completed record of `keys` holds for
/// the pipeline's next hop (a record not completed holds none).
pub(super) async fn emitted<S: GetRecord>(
    store: &S,
    keys: &[String],
) -> BTreeMap<String, Vec<String>> {
    let at_rest = AtRest::reader(None);
    let mut out = BTreeMap::new();
    for key in keys {
        let id = record_id(key);
        let ids = match store.get(&id).await {
            Ok(Some(Record {
                state: State::Completed { response },
                ..
            })) => idem::outbox::stored_messages(&at_rest, &id, &response)
                .map(|messages| messages.iter().map(|m| m.id().to_owned()).collect())
                .unwrap_or_else(|why| vec![format!("unreadable: {why}")]),
            _ => Vec::new(),
        };
        out.insert(key.clone(), ids);
    }
    out
}

/// What the pipeline's next hop must agree on beyond its own
/// [`judge`]: each good key's completed run emitted exactly one message,
/// and the next hop started nothing but those (a message of a run that
/// was not the one stored, sent anyway, would show there).
pub(super) fn judge_hop(
    emitted: &BTreeMap<String, Vec<String>>,
    started: &[String],
) -> Vec<String> {
    let mut out = Vec::new();
    for (key, ids) in emitted {
        if ids.len() != 1 {
            out.push(format!(
                "{key}: the completed run holds {} messages for the next hop, not one: {ids:?}",
                ids.len()
            ));
        }
    }
    for id in started {
        if !emitted.values().any(|ids| ids.contains(id)) {
            out.push(format!(
                "next hop: {id} was delivered, but no stored run emitted it"
            ));
        }
    }
    out
}

/// Whether every good key's record is completed and every poison key's
/// failed: nothing left in progress for a redelivery to finish.
pub(crate) async fn records_final<S: GetRecord>(
    store: &S,
    good: &[String],
    poison: &[String],
) -> bool {
    for (keys, done) in [(good, true), (poison, false)] {
        for key in keys {
            let state = match store.get(&record_id(key)).await {
                Ok(Some(record)) => record.state,
                _ => return false,
            };
            let is_final = match state {
                State::Completed { .. } => done,
                State::Failed { .. } => !done,
                _ => false,
            };
            if !is_final {
                return false;
            }
        }
    }
    true
}

/// Every broken promise in `evidence`, one line each:
///
/// - each good key is completed, with the fence of a holder that
///   started it, and no holder with a newer fence started it (a completed
///   key claimed again, or a stale completion accepted);
/// - no fence was handed out twice, and no key started more often than
///   its record was acquired (a record lost and its key run again);
/// - the downstream holds the completing holder's write;
/// - each poison key failed terminally, wrote nothing, and was
///   dead-lettered; nothing else was.
pub fn judge(evidence: &Evidence, dead: &[DeadLetterSeen], poison: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let none = Vec::new();
    for key in &evidence.good {
        let starts = evidence.starts.get(key).unwrap_or(&none);
        let mut fences = starts.clone();
        fences.sort_unstable();
        if fences.windows(2).any(|w| w[0] == w[1]) {
            out.push(format!("{key}: a fence was handed out twice: {starts:?}"));
        }
        let Some(record) = evidence.records.get(key) else {
            out.push(format!(
                "{key}: no record in the store: the message was lost"
            ));
            continue;
        };
        if !matches!(record.state, State::Completed { .. }) {
            out.push(format!(
                "{key}: the record is {:?}, not completed",
                record.state.kind()
            ));
            continue;
        }
        let stored = record.fence;
        if (record.attempt as usize) < starts.len() {
            out.push(format!(
                "{key}: {} handler starts, but the record was acquired {} times: it was \
                 lost and its key run again",
                starts.len(),
                record.attempt
            ));
        }
        if !starts.contains(&stored) {
            out.push(format!(
                "{key}: completed with fence {stored}, but no handler started with it ({starts:?})"
            ));
        }
        if let Some(newer) = starts.iter().find(|f| **f > stored) {
            out.push(format!(
                "{key}: completed with fence {stored}, but a holder with fence {newer} started \
                 it: a completed key was claimed again or a stale completion was accepted"
            ));
        }
        match evidence.downstream.get(key) {
            None => out.push(format!("{key}: completed, but no write reached downstream")),
            Some(held) if *held != stored => out.push(format!(
                "{key}: downstream holds the write of fence {held}, the store the completion \
                 of fence {stored}"
            )),
            Some(_) => {}
        }
    }
    for key in poison {
        match evidence.records.get(key).map(|r| &r.state) {
            Some(State::Failed { .. }) => {}
            other => out.push(format!(
                "{key}: a poison message's record is {:?}, not failed",
                other.map(State::kind)
            )),
        }
        if evidence.downstream.contains_key(key) {
            out.push(format!("{key}: a poison message wrote downstream"));
        }
        if !dead.iter().any(|d| d.key.as_deref() == Some(key)) {
            out.push(format!("{key}: a poison message was not dead-lettered"));
        }
    }
    for letter in dead {
        if !letter.key.as_ref().is_some_and(|k| poison.contains(k)) {
            out.push(format!(
                "{:?}: dead-lettered, but not poison ({})",
                letter.key, letter.reason
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use idem::{Failure, FailureClass, Timestamp};

    use super::*;

    fn record(state: State, fence: u64) -> Record {
        Record {
            state,
            fingerprint: None,
            attempt: u32::try_from(fence).unwrap_or(u32::MAX),
            fence,
            created_at: Timestamp::now(),
            updated_at: Timestamp::now(),
            expires_at: Timestamp::now(),
        }
    }

    fn completed(fence: u64) -> Record {
        record(
            State::Completed {
                response: bytes::Bytes::new(),
            },
            fence,
        )
    }

    /// One good key `a` with `starts`, its record completed with `stored`
    /// and the downstream holding `held`; one poison key `p`, failed and
    /// dead-lettered.
    fn evidence(starts: &[u64], stored: Option<u64>, held: Option<u64>) -> Evidence {
        let mut e = Evidence {
            good: vec!["a".into()],
            ..Evidence::default()
        };
        e.starts.insert("a".into(), starts.to_vec());
        if let Some(f) = stored {
            e.records.insert("a".into(), completed(f));
        }
        if let Some(f) = held {
            e.downstream.insert("a".into(), f);
        }
        e.records.insert(
            "p".into(),
            record(
                State::Failed {
                    failure: Failure::new(FailureClass::Terminal, "poison"),
                },
                1,
            ),
        );
        e
    }

    fn dead(keys: &[&str]) -> Vec<DeadLetterSeen> {
        keys.iter()
            .map(|k| DeadLetterSeen {
                key: Some((*k).to_owned()),
                reason: "poison".into(),
                consumer: None,
            })
            .collect()
    }

    fn verdict(e: &Evidence, dead_keys: &[&str]) -> Vec<String> {
        judge(e, &dead(dead_keys), &["p".to_owned()])
    }

    #[test]
    fn a_takeover_whose_new_holder_completes_passes() {
        assert_eq!(
            verdict(&evidence(&[1, 2], Some(2), Some(2)), &["p", "p"]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn each_broken_promise_is_caught() {
        let mut poison_wrote = evidence(&[1], Some(1), Some(1));
        poison_wrote.downstream.insert("p".into(), 1);
        let mut rerun = evidence(&[1, 2], Some(2), Some(2));
        rerun.records.insert("a".into(), completed(2));
        if let Some(r) = rerun.records.get_mut("a") {
            r.attempt = 1;
        }
        let cases: [(Evidence, &[&str], &str); 9] = [
            (evidence(&[1], None, Some(1)), &["p"], "lost"),
            (evidence(&[1, 2], Some(1), Some(2)), &["p"], "claimed again"),
            (evidence(&[1], Some(1), Some(0)), &["p"], "downstream holds"),
            (evidence(&[1], Some(1), None), &["p"], "no write reached"),
            (evidence(&[1, 1], Some(1), Some(1)), &["p"], "twice"),
            (evidence(&[1], Some(1), Some(1)), &[], "not dead-lettered"),
            (evidence(&[1], Some(1), Some(1)), &["p", "a"], "not poison"),
            (poison_wrote, &["p"], "wrote downstream"),
            (rerun, &["p"], "run again"),
        ];
        for (e, dead_keys, expected) in cases {
            let found = verdict(&e, dead_keys);
            assert!(
                found.iter().any(|v| v.contains(expected)),
                "{expected:?} not in {found:?}"
            );
        }
    }

    #[test]
    fn the_next_hop_is_caught_running_a_message_no_stored_run_emitted() {
        let one = |ids: &[&str]| -> BTreeMap<String, Vec<String>> {
            [(
                "a".to_owned(),
                ids.iter().map(|i| (*i).to_owned()).collect(),
            )]
            .into()
        };
        let started = |ids: &[&str]| ids.iter().map(|i| (*i).to_owned()).collect::<Vec<_>>();
        assert!(judge_hop(&one(&["m1"]), &started(&["m1"])).is_empty());
        let stale = judge_hop(&one(&["m1"]), &started(&["m1", "m0"]));
        assert!(
            stale.iter().any(|v| v.contains("no stored run emitted it")),
            "{stale:?}"
        );
        let none = judge_hop(&one(&[]), &started(&[]));
        assert!(
            none.iter().any(|v| v.contains("holds 0 messages")),
            "{none:?}"
        );
        let two = judge_hop(&one(&["m1", "m2"]), &started(&["m1"]));
        assert!(
            two.iter().any(|v| v.contains("holds 2 messages")),
            "{two:?}"
        );
    }
}

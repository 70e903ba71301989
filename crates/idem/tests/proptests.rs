//! Property tests of the pure state machine: random sequences of claims,
//! writes by current and stale holders, deletes and clock moves, checked
//! against the invariants of the store contract (`idem::contract`) after
//! every step.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use idem::machine::{decide_claim, decide_write, ClaimDecision, Fresh, Write};
use idem::store::{ClaimOutcome, ClaimParams, Lease, LeaseToken};
use idem::{Failure, FailureClass, Fingerprint, Record, RecordId, State, Timestamp};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

const KEYS: usize = 2;
const LEASE_S: u64 = 10;
const RETAIN_S: u64 = 60;

#[derive(Debug, Clone)]
enum Event {
    Claim { key: usize, fp: Option<u8> },
    Complete { lease: usize, body: u8, keep_s: u64 },
    Fail { lease: usize, class: u8 },
    Extend { lease: usize, secs: u64 },
    Release { lease: usize },
    Delete { key: usize },
    Advance { secs: u64 },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0..KEYS, prop::option::of(0u8..2)).prop_map(|(key, fp)| Event::Claim { key, fp }),
        2 => (any::<usize>(), any::<u8>(), 1u64..90).prop_map(|(lease, body, keep_s)| Event::Complete { lease, body, keep_s }),
        1 => (any::<usize>(), 0u8..3).prop_map(|(lease, class)| Event::Fail { lease, class }),
        1 => (any::<usize>(), 1u64..30).prop_map(|(lease, secs)| Event::Extend { lease, secs }),
        1 => any::<usize>().prop_map(|lease| Event::Release { lease }),
        1 => (0..KEYS).prop_map(|key| Event::Delete { key }),
        2 => (0u64..40).prop_map(|secs| Event::Advance { secs }),
    ]
}

/// A minimal store around the pure functions: what the memory store does,
/// without the concurrency.
struct World {
    now: Timestamp,
    records: HashMap<usize, Record>,
    seq: u64,
    leases: Vec<(usize, Lease)>,
    tokens: HashSet<LeaseToken>,
    last_fence: HashMap<usize, u64>,
}

fn rid(key: usize) -> RecordId {
    RecordId::parse("prop", &format!("k{key}")).expect("valid")
}

fn fingerprint(fp: Option<u8>) -> Option<Fingerprint> {
    fp.map(|b| Fingerprint::of_bytes(&[b]))
}

impl World {
    fn new() -> Self {
        Self {
            now: Timestamp::from_millis(1_000_000),
            records: HashMap::new(),
            seq: 0,
            leases: Vec::new(),
            tokens: HashSet::new(),
            last_fence: HashMap::new(),
        }
    }

    fn pick(&self, index: usize) -> Option<(usize, Lease)> {
        (!self.leases.is_empty()).then(|| self.leases[index % self.leases.len()].clone())
    }

    /// Whether `token` could write to `key` now.
    fn holds(&self, key: usize, token: LeaseToken) -> bool {
        decide_write(self.records.get(&key), token, Write::Release, self.now).is_ok()
    }

    fn write(&mut self, index: usize, write: Write) -> Result<(), TestCaseError> {
        let Some((key, lease)) = self.pick(index) else {
            return Ok(());
        };
        let latest = self
            .leases
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, l)| l.token);
        let before = self.records.get(&key).cloned();
        match decide_write(before.as_ref(), lease.token, write, self.now) {
            Ok(next) => {
                prop_assert_eq!(
                    Some(lease.token),
                    latest,
                    "only the latest holder may write"
                );
                prop_assert!(
                    matches!(
                        before,
                        Some(Record {
                            state: State::InProgress { .. },
                            ..
                        })
                    ),
                    "writes only change in-progress records"
                );
                self.records.insert(key, next);
            }
            Err(_) => prop_assert_eq!(self.records.get(&key), before.as_ref()),
        }
        Ok(())
    }

    fn apply(&mut self, event: &Event) -> Result<(), TestCaseError> {
        match *event {
            Event::Claim { key, fp } => {
                self.seq += 1;
                let fresh = Fresh {
                    token: LeaseToken::from_parts(1, self.seq),
                    fence_floor: self.seq,
                };
                let params = ClaimParams {
                    fingerprint: fingerprint(fp),
                    lease: Duration::from_secs(LEASE_S),
                    retention: Duration::from_secs(RETAIN_S),
                };
                let before = self.records.get(&key).cloned();
                let live = before.clone().filter(|r| !r.is_expired(self.now));
                match decide_claim(before.as_ref(), &params, self.now, fresh) {
                    ClaimDecision::Acquire { record, takeover } => {
                        let (write, outcome) =
                            ClaimDecision::Acquire { record, takeover }.into_parts(&rid(key));
                        let ClaimOutcome::Acquired(lease) = outcome else {
                            unreachable!()
                        };
                        prop_assert!(self.tokens.insert(lease.token), "token reused");
                        let last = self.last_fence.insert(key, lease.fence).unwrap_or(0);
                        prop_assert!(
                            lease.fence > last,
                            "fence must rise: {} then {}",
                            last,
                            lease.fence
                        );
                        prop_assert!(lease.lease_until > self.now);
                        match &live {
                            None => prop_assert_eq!((lease.attempt, lease.takeover), (1, false)),
                            Some(r) => {
                                prop_assert_eq!(r.fingerprint, params.fingerprint);
                                prop_assert_eq!(lease.attempt, r.attempt + 1);
                                match r.state {
                                    State::InProgress { lease_until, .. } => {
                                        prop_assert!(lease_until <= self.now, "took a live lease");
                                        prop_assert!(lease.takeover);
                                    }
                                    State::Released { .. } => prop_assert!(!lease.takeover),
                                    _ => prop_assert!(
                                        false,
                                        "acquired a finished record: {:?}",
                                        r.state
                                    ),
                                }
                            }
                        }
                        self.records.insert(key, write.expect("acquire writes"));
                        self.leases.push((key, lease));
                    }
                    ClaimDecision::Answer(answer) => {
                        let r = live.expect("only a live record answers");
                        match (&answer, &r.state) {
                            (ClaimOutcome::Mismatch, _) => {
                                prop_assert_ne!(r.fingerprint, params.fingerprint)
                            }
                            (ClaimOutcome::Completed(b), State::Completed { response }) => {
                                prop_assert_eq!(b, response)
                            }
                            (ClaimOutcome::Failed(f), State::Failed { failure }) => {
                                prop_assert_eq!(f, failure)
                            }
                            (
                                ClaimOutcome::InProgress { retry_after },
                                State::InProgress { lease_until, .. },
                            ) => {
                                prop_assert!(!retry_after.is_zero());
                                prop_assert_eq!(
                                    self.now.saturating_add(*retry_after),
                                    *lease_until
                                );
                            }
                            other => {
                                prop_assert!(false, "answer does not match the record: {:?}", other)
                            }
                        }
                    }
                }
            }
            Event::Complete {
                lease,
                body,
                keep_s,
            } => self.write(
                lease,
                Write::Complete {
                    response: Bytes::from(vec![body]),
                    retention: Duration::from_secs(keep_s),
                },
            )?,
            Event::Fail { lease, class } => {
                let class = [
                    FailureClass::Retryable,
                    FailureClass::Terminal,
                    FailureClass::Unknown,
                ][class as usize];
                self.write(
                    lease,
                    Write::Fail {
                        failure: Failure::new(class, "boom"),
                        retention: Duration::from_secs(RETAIN_S),
                    },
                )?
            }
            Event::Extend { lease, secs } => self.write(
                lease,
                Write::Extend {
                    lease: Duration::from_secs(secs),
                },
            )?,
            Event::Release { lease } => self.write(lease, Write::Release)?,
            Event::Delete { key } => {
                self.records.remove(&key);
            }
            Event::Advance { secs } => {
                self.now = self.now.saturating_add(Duration::from_secs(secs))
            }
        }
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        for key in 0..KEYS {
            let holders = self
                .leases
                .iter()
                .filter(|(k, l)| *k == key && self.holds(key, l.token))
                .count();
            prop_assert!(holders <= 1, "key {} has {} live owners", key, holders);
            if let Some(r) = self.records.get(&key) {
                prop_assert!(r.expires_at > r.created_at || r.is_expired(self.now));
                if let State::InProgress { lease_until, .. } = r.state {
                    prop_assert!(
                        r.expires_at >= lease_until,
                        "retention must cover the lease"
                    );
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn state_machine_keeps_its_invariants(events in prop::collection::vec(event(), 1..80)) {
        let mut world = World::new();
        for event in &events {
            let finished: HashMap<usize, Record> = world
                .records
                .iter()
                .filter(|(_, r)| matches!(r.state, State::Completed { .. } | State::Failed { .. }))
                .map(|(k, r)| (*k, r.clone()))
                .collect();
            world.apply(event)?;
            world.check()?;
            for (key, before) in finished {
                if matches!(event, Event::Delete { key: k } if *k == key) || before.is_expired(world.now) {
                    continue;
                }
                prop_assert_eq!(
                    world.records.get(&key), Some(&before),
                    "a finished record changed before expiry after {:?}", event
                );
            }
        }
    }
}

//! A batch's shared arguments. The lease, retention, grace and memory of
//! a batch's claims and completions are nearly always the same, so they
//! go once at the head of the batch script's arguments (`lua/batch.lua`),
//! and a claim or completion with exactly those values goes in a short
//! form without them: seven arguments fewer a claim+complete pair for
//! Redis to parse and for Lua to make into strings. A call whose values
//! differ goes whole, as before.

use crate::call::{Call, Op};

/// Where a claim's lease, retention, grace and memory are among its
/// arguments (token, fingerprint, lease, retention, scope, key, grace,
/// memory).
const CLAIM: [usize; 4] = [2, 3, 6, 7];
/// Where a claim's own arguments are (token, fingerprint, scope, key).
const CLAIM_OWN: [usize; 4] = [0, 1, 4, 5];
/// Where a completion's retention, grace and memory are among its
/// arguments (token, response, retention, grace, memory).
const COMPLETE: [usize; 3] = [2, 3, 4];
/// Where a completion's own arguments are (token, response).
const COMPLETE_OWN: [usize; 2] = [0, 1];

/// The values a batch's short claims and completions take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shared<'a> {
    lease: &'a [u8],
    retention: &'a [u8],
    grace: &'a [u8],
    memory: &'a [u8],
}

impl<'a> Shared<'a> {
    /// The values of the batch's first claim, or of its first completion
    /// (with no lease) when it has no claim.
    pub(crate) fn of(calls: &[&'a Call]) -> Self {
        let arg = |call: &'a Call, at: usize| call.args.get(at).map_or(&b"0"[..], |b| b.as_ref());
        if let Some(claim) = calls.iter().find(|c| c.op == Op::Claim) {
            let [lease, retention, grace, memory] = CLAIM.map(|at| arg(claim, at));
            return Self {
                lease,
                retention,
                grace,
                memory,
            };
        }
        let [retention, grace, memory] = calls
            .iter()
            .find(|c| c.op == Op::Complete)
            .map_or([&b"0"[..]; 3], |complete| {
                COMPLETE.map(|at| arg(complete, at))
            });
        Self {
            lease: b"0",
            retention,
            grace,
            memory,
        }
    }

    /// The head of the batch script's arguments.
    pub(crate) fn head(&self) -> [&'a [u8]; 4] {
        [self.lease, self.retention, self.grace, self.memory]
    }

    /// Appends `call` to the batch script's arguments: its code and its
    /// arguments, in the short form when its values are these.
    pub(crate) fn push(&self, call: &'a Call, args: &mut Vec<&'a [u8]>) {
        let same = |at: &[usize], values: &[&[u8]]| {
            at.iter()
                .zip(values)
                .all(|(at, value)| call.args.get(*at).is_some_and(|b| b.as_ref() == *value))
        };
        let own = |at: &[usize], args: &mut Vec<&'a [u8]>| {
            args.extend(
                at.iter()
                    .filter_map(|at| call.args.get(*at))
                    .map(|b| b.as_ref()),
            );
        };
        match call.op {
            Op::Claim if same(&CLAIM, &self.head()) => {
                args.push(b"C");
                own(&CLAIM_OWN, args);
            }
            Op::Complete if same(&COMPLETE, &self.head()[1..]) => {
                args.push(b"D");
                own(&COMPLETE_OWN, args);
            }
            _ => {
                args.push(call.op.code());
                args.extend(call.args.iter().map(|b| b.as_ref()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::Shared;
    use crate::call::{Call, Op};

    fn call(op: Op, args: &[&str]) -> Call {
        Call {
            op,
            key: "k".to_owned(),
            args: args
                .iter()
                .map(|a| Bytes::copy_from_slice(a.as_bytes()))
                .collect(),
        }
    }

    fn claim(token: &str, lease: &str) -> Call {
        call(
            Op::Claim,
            &[token, "fp", lease, "9000", "s", "key", "100", "0"],
        )
    }

    fn sent(calls: &[Call]) -> Vec<String> {
        let refs: Vec<&Call> = calls.iter().collect();
        let shared = Shared::of(&refs);
        let mut args: Vec<&[u8]> = shared.head().to_vec();
        for call in &refs {
            shared.push(call, &mut args);
        }
        args.iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    }

    #[test]
    fn calls_with_the_shared_values_go_short_and_others_whole() {
        let calls = [
            claim("t1", "5000"),
            claim("t2", "7000"),
            call(Op::Complete, &["t3", "resp", "9000", "100", "0"]),
            call(Op::Complete, &["t4", "resp", "9000", "100", "30"]),
            call(Op::Release, &["t5"]),
        ];
        assert_eq!(
            sent(&calls),
            [
                "5000", "9000", "100", "0", // the head
                "C", "t1", "fp", "s", "key", // the first claim, short
                "c", "t2", "fp", "7000", "9000", "s", "key", "100", "0", // another lease
                "D", "t3", "resp", // a completion with the shared values
                "d", "t4", "resp", "9000", "100", "30", // another memory
                "r", "t5",
            ]
        );
    }

    #[test]
    fn a_batch_without_claims_shares_its_first_completions_values() {
        let calls = [
            call(Op::Complete, &["t1", "a", "60000", "100", "0"]),
            call(Op::Complete, &["t2", "b", "60000", "100", "0"]),
        ];
        assert_eq!(
            sent(&calls),
            ["0", "60000", "100", "0", "D", "t1", "a", "D", "t2", "b"]
        );
        assert_eq!(
            sent(&[call(Op::Release, &["t"])]),
            ["0", "0", "0", "0", "r", "t"]
        );
    }
}

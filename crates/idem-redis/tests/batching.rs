//! Calls made at the same time go to a single server together (one script
//! call for many), each still atomic and answered on its own. Every test
//! starts its own redis-server so that its script calls can be counted.

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use futures_util::FutureExt;
use idem::store::{ClaimOutcome, ClaimParams, Completion, Lease};
use idem::{ClaimMany, CompleteMany, RecordId, Store, StoreError};
use idem_redis::RedisStore;
use idem_testkit::servers::redis::RedisServer;

fn params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600))
}

fn id(key: &str) -> RecordId {
    RecordId::parse("batching", key).expect("valid id")
}

async fn store(server: &RedisServer, batching: bool) -> RedisStore {
    RedisStore::builder(&server.url())
        .expect("valid URL")
        .batching(batching)
        .connect()
        .await
        .expect("connect")
}

/// Script calls the server ran (`EVALSHA` and `EVAL`), from
/// `INFO commandstats`.
fn script_calls(server: &RedisServer) -> u64 {
    ["evalsha", "eval"]
        .iter()
        .map(|c| server.command_stats(c).expect("info").calls)
        .sum()
}

/// The leases of claims that must all have been acquired.
fn held(claims: Vec<Result<ClaimOutcome, StoreError>>) -> Vec<Lease> {
    claims
        .into_iter()
        .map(|c| match c {
            Ok(ClaimOutcome::Acquired(lease)) => lease,
            other => panic!("{other:?}"),
        })
        .collect()
}

fn acquired(outcome: &Result<ClaimOutcome, StoreError>) -> bool {
    matches!(outcome, Ok(ClaimOutcome::Acquired(_)))
}

/// 200 claims made at once (on one thread, so all but the first two, which
/// run on their own, are queued before any is sent) take a handful of
/// script calls with batching and 200 without, and the completes that
/// follow do the same. Each claim is answered on its own either way.
#[tokio::test(flavor = "current_thread")]
async fn calls_made_together_share_script_calls() {
    for (batching, most) in [(true, 4), (false, 200)] {
        let server = RedisServer::start().expect("redis-server");
        let store = store(&server, batching).await;
        store.load_scripts().await.expect("load");
        let before = script_calls(&server);
        let ids: Vec<RecordId> = (0..200).map(|i| id(&format!("k{i}"))).collect();
        let params = params();
        let claims = join_all(ids.iter().map(|id| store.claim(id, &params))).await;
        let claimed = script_calls(&server) - before;
        assert!(
            claims.iter().all(acquired),
            "batching {batching}: {claims:?}"
        );
        assert!(
            claimed <= most && (batching || claimed == 200),
            "batching {batching}: 200 claims took {claimed} script calls"
        );
        let leases = held(claims);
        let before = script_calls(&server);
        let done = join_all(
            leases
                .iter()
                .map(|l| store.complete(l, "ok".into(), Duration::from_secs(3600))),
        )
        .await;
        assert!(done.iter().all(Result::is_ok), "{done:?}");
        let completed = script_calls(&server) - before;
        assert!(
            completed <= most,
            "batching {batching}: 200 completes took {completed} script calls"
        );
        let replays = join_all(ids.iter().map(|id| store.claim(id, &params))).await;
        assert!(
            replays
                .iter()
                .all(|r| matches!(r, Ok(ClaimOutcome::Completed(b)) if b == "ok")),
            "{replays:?}"
        );
    }
}

/// A record the script cannot read (a key of another type) fails its own
/// call; the calls batched with it are answered as if it were not there,
/// and the odd key is left as it was.
#[tokio::test(flavor = "current_thread")]
async fn an_error_in_one_call_fails_that_call_alone() {
    let server = RedisServer::start().expect("redis-server");
    let store = store(&server, true).await;
    store.load_scripts().await.expect("load");
    let bad = id("not-a-record");
    let key = store.record_key(&bad);
    server.cli(&format!("RPUSH {key} a-list")).expect("rpush");
    let mut ids: Vec<RecordId> = (0..30).map(|i| id(&format!("k{i}"))).collect();
    ids.insert(15, bad);
    let before = script_calls(&server);
    let params = params();
    let claims = join_all(ids.iter().map(|id| store.claim(id, &params))).await;
    assert!(
        script_calls(&server) - before <= 4,
        "the claims were not batched"
    );
    for (i, claim) in claims.iter().enumerate() {
        if i == 15 {
            assert!(matches!(claim, Err(StoreError::Backend(_))), "{claim:?}");
        } else {
            assert!(acquired(claim), "claim {i}: {claim:?}");
        }
    }
    assert_eq!(
        server
            .cli(&format!("LRANGE {key} 0 -1"))
            .expect("lrange")
            .trim(),
        "a-list"
    );
}

/// A batch of claims longer than one script call's share goes in several,
/// one after another, so a key that occurs twice is still claimed in the
/// order given: first acquired, then in progress.
#[tokio::test(flavor = "current_thread")]
async fn a_long_batch_keeps_its_order() {
    let server = RedisServer::start().expect("redis-server");
    let store = store(&server, true).await;
    let mut claims: Vec<(RecordId, ClaimParams)> =
        (0..300).map(|i| (id(&format!("k{i}")), params())).collect();
    claims[250] = (id("k10"), params());
    let outcomes = store.claim_many(&claims).await.expect("batch");
    assert_eq!(outcomes.len(), 300);
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == 250 {
            assert!(
                matches!(outcome, Ok(ClaimOutcome::InProgress { .. })),
                "{outcome:?}"
            );
        } else {
            assert!(acquired(outcome), "claim {i}: {outcome:?}");
        }
    }
}

/// Callers that give up on their call (their futures dropped once queued)
/// take nothing with them: the calls batched with theirs are answered,
/// and the store goes on working. A dropped claim that was already queued
/// still runs, as one whose answer a crash lost would: its lease simply
/// runs out.
#[tokio::test(flavor = "current_thread")]
async fn callers_that_give_up_leave_the_batch_whole() {
    let server = RedisServer::start().expect("redis-server");
    let store = store(&server, true).await;
    let ids: Vec<RecordId> = (0..40).map(|i| id(&format!("k{i}"))).collect();
    let params = params();
    // Every claim is polled once, so all are on their way (the first two
    // on their own, the rest queued), then the callers of the even ones
    // give up.
    let mut claims: Vec<_> = ids
        .iter()
        .map(|id| Box::pin(store.claim(id, &params)))
        .collect();
    for claim in &mut claims {
        assert!(claim.as_mut().now_or_never().is_none());
    }
    let kept: Vec<_> = claims
        .into_iter()
        .enumerate()
        .filter_map(|(i, claim)| (i % 2 == 1).then_some(claim))
        .collect();
    let answered = join_all(kept).await;
    assert!(answered.iter().all(acquired), "{answered:?}");
    let later = store.claim(&id("after"), &params).await;
    assert!(acquired(&later), "{later:?}");
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        let again = store.claim(id, &params).await;
        // The first call found nothing going on and ran on its own from
        // its caller, who gave up on it; it may or may not have reached
        // the server. The others were queued, so their batch ran them.
        let ran = matches!(again, Ok(ClaimOutcome::InProgress { .. }));
        assert!(ran || (i == 0 && acquired(&again)), "claim {i}: {again:?}");
    }
}

/// Claims and completions go short when they have the batch's lease,
/// retention, grace and memory and whole when they do not: in one batch
/// with two of each, every record still gets its own lease and kept time.
#[tokio::test(flavor = "current_thread")]
async fn calls_of_one_batch_keep_their_own_lease_and_retention() {
    let server = RedisServer::start().expect("redis-server");
    let store = store(&server, true).await;
    store.load_scripts().await.expect("load");
    let hour = Duration::from_secs(3600);
    let own = |i: usize| {
        if i.is_multiple_of(2) {
            (Duration::from_secs(30), hour)
        } else {
            (Duration::from_secs(5), 2 * hour)
        }
    };
    let claims: Vec<(RecordId, ClaimParams)> = (0..10)
        .map(|i| {
            let (lease, retention) = own(i);
            (id(&format!("mixed{i}")), ClaimParams::new(lease, retention))
        })
        .collect();
    let before = script_calls(&server);
    let outcomes = store.claim_many(&claims).await.expect("claims");
    let leases = held(outcomes);
    let now = idem::Timestamp::now();
    let ttl = |id: &RecordId| -> u64 {
        let key = store.record_key(id);
        let ms = server.cli(&format!("PTTL {key}")).expect("pttl");
        ms.trim().parse().expect("a number of ms")
    };
    for (i, lease) in leases.iter().enumerate() {
        let (held, retention) = own(i);
        let left = lease.lease_until.since(now);
        assert!(
            left <= held && left + Duration::from_secs(2) >= held,
            "claim {i}: its lease runs {left:?}, not {held:?}"
        );
        let kept = Duration::from_millis(ttl(&lease.id));
        assert!(
            kept >= retention && kept <= retention + Duration::from_secs(600),
            "claim {i}: kept {kept:?} for a retention of {retention:?}"
        );
    }
    // Completions keeping the outcome for three hours and for one.
    let completions: Vec<Completion> = leases
        .iter()
        .enumerate()
        .map(|(i, lease)| {
            let retention = if i.is_multiple_of(2) { 3 * hour } else { hour };
            Completion::new(lease.clone(), Bytes::from(format!("done {i}")), retention)
        })
        .collect();
    for written in store.complete_many(&completions).await.expect("completes") {
        written.expect("completed");
    }
    assert_eq!(script_calls(&server) - before, 2, "one batch each");
    for (i, lease) in leases.iter().enumerate() {
        let at_least = completions[i].retention;
        let kept = Duration::from_millis(ttl(&lease.id));
        assert!(
            kept >= at_least - Duration::from_secs(2)
                && kept <= at_least + Duration::from_secs(600),
            "record {i}: kept {kept:?}, not about {at_least:?}"
        );
        let found = store.claim(&lease.id, &params()).await.expect("replay");
        assert_eq!(
            found,
            ClaimOutcome::Completed(Bytes::from(format!("done {i}"))),
            "record {i}"
        );
    }
}

//! Claims and completions made at the same time go to PostgreSQL together
//! (group commit: one `claim_many` or `complete_many` statement for many
//! calls), each still atomic and answered on its own. The statements are
//! counted as the write transactions the server started (transaction ids),
//! on the file's own server, so its tests take turns.

mod common;

use std::time::Duration;

use futures_util::future::join_all;
use idem::store::{ClaimOutcome, ClaimParams, Lease};
use idem::{RecordId, Store};
use idem_postgres::PgStore;
use tokio::sync::Mutex;

/// Held by each test: a test's transactions would count in another's.
static TURN: Mutex<()> = Mutex::const_new(());

/// Write transactions the server has started: the next transaction id.
/// (Reading it takes one.)
fn xids() -> u64 {
    let (server, db) = common::server();
    server
        .psql(db, "SELECT txid_current()")
        .expect("psql")
        .trim()
        .parse()
        .expect("a number")
}

async fn store(batching: bool) -> PgStore {
    PgStore::builder(&common::url())
        .expect("valid URL")
        .schema(format!("batching_{batching}_{:08x}", rand::random::<u32>()))
        .pool_size(4)
        .batching(batching)
        .connect()
        .await
        .expect("connect")
}

fn params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600))
}

/// 200 claims made at once (on one thread, so all but the first two,
/// which run on their own, are queued before any is sent) take a handful of write
/// transactions with batching and 200 without; the completes that follow
/// do the same, and every record then replays its own response.
#[tokio::test(flavor = "current_thread")]
async fn calls_made_together_share_statements() {
    let _turn = TURN.lock().await;
    // Slack for what the server writes by itself meanwhile (auto-analyze
    // of the table the test fills).
    for (batching, most) in [(true, 12), (false, 215)] {
        let store = store(batching).await;
        let ids: Vec<RecordId> = (0..200)
            .map(|i| RecordId::parse("batching", &format!("k{i}")).expect("valid id"))
            .collect();
        let params = params();
        let before = xids();
        let claims = join_all(ids.iter().map(|id| store.claim(id, &params))).await;
        let claimed = xids() - before - 1;
        let leases: Vec<Lease> = claims
            .into_iter()
            .map(|c| match c {
                Ok(ClaimOutcome::Acquired(lease)) => lease,
                other => panic!("batching {batching}: {other:?}"),
            })
            .collect();
        assert!(
            claimed <= most && (batching || claimed >= 200),
            "batching {batching}: 200 claims took {claimed} write transactions"
        );
        let before = xids();
        let done = join_all(leases.iter().map(|l| {
            let response = format!("ok {}", l.id.key());
            store.complete(l, response.into(), Duration::from_secs(3600))
        }))
        .await;
        let completed = xids() - before - 1;
        assert!(done.iter().all(Result::is_ok), "{done:?}");
        assert!(
            completed <= most && (batching || completed >= 200),
            "batching {batching}: 200 completes took {completed} write transactions"
        );
        let replays = join_all(ids.iter().map(|id| store.claim(id, &params))).await;
        for (id, replay) in ids.iter().zip(replays) {
            match replay {
                Ok(ClaimOutcome::Completed(b)) if b == format!("ok {}", id.key()) => {}
                other => panic!("{id}: {other:?}"),
            }
        }
    }
}

/// A completion whose lease was lost, batched with live ones, is refused
/// alone: nothing of it is written and the others are stored.
#[tokio::test(flavor = "current_thread")]
async fn a_lost_lease_in_a_batch_fails_that_completion_alone() {
    let _turn = TURN.lock().await;
    let store = store(true).await;
    let params = params();
    let ids: Vec<RecordId> = (0..20)
        .map(|i| RecordId::parse("lost", &format!("k{i}")).expect("valid id"))
        .collect();
    let mut leases: Vec<Lease> = Vec::new();
    for id in &ids {
        match store.claim(id, &params).await {
            Ok(ClaimOutcome::Acquired(lease)) => leases.push(lease),
            other => panic!("{other:?}"),
        }
    }
    // The tenth holder loses its record to a release and a new claim.
    store.release(&leases[10]).await.expect("release");
    let new_holder = match store.claim(&ids[10], &params).await {
        Ok(ClaimOutcome::Acquired(lease)) => lease,
        other => panic!("{other:?}"),
    };
    let done = join_all(
        leases
            .iter()
            .map(|l| store.complete(l, "ok".into(), Duration::from_secs(3600))),
    )
    .await;
    for (i, result) in done.iter().enumerate() {
        if i == 10 {
            assert!(
                matches!(result, Err(idem::StoreError::LeaseLost)),
                "{result:?}"
            );
        } else {
            assert!(result.is_ok(), "completion {i}: {result:?}");
        }
    }
    assert!(
        matches!(
            store.claim(&ids[10], &params).await,
            Ok(ClaimOutcome::InProgress { .. })
        ),
        "the new holder's claim is untouched"
    );
    store
        .complete(&new_holder, "mine".into(), Duration::from_secs(3600))
        .await
        .expect("the new holder completes");
}

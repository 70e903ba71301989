//! `idem failures` and `idem redrive` against a real store file: failed
//! and parked records grouped by how they failed, and groups released or
//! resolved in bulk, after which the executor runs what is left and
//! nothing a journal holds.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem::step::{Park, Retry};
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{
    Failure, FailureClass, GetRecord, HandlerError, Idempotency, RecordId, Resolution, StepJournal,
    Store,
};
use idem_cli::failures::{failures, redrive, Redrive};
use idem_cli::store::{AnyStore, StoreUrl};
use serde_json::Value;

fn no_secrets() -> idem_cli::admin::Secrets {
    idem_cli::admin::Secrets::read(None, None).expect("no files to read")
}

fn id(key: &str) -> RecordId {
    RecordId::parse("orders", key).expect("valid")
}

const HOUR: Duration = Duration::from_secs(3600);

/// Claims `key` and fails it with `class` and `message`, after journaling
/// `finished` steps and starting `in_doubt` ones.
async fn failed(
    store: &AnyStore,
    key: &str,
    class: FailureClass,
    message: &str,
    finished: &[&str],
    in_doubt: &[&str],
) {
    let params = ClaimParams::new(Duration::from_secs(60), HOUR);
    let ClaimOutcome::Acquired(lease) = store.claim(&id(key), &params).await.expect("claim") else {
        panic!("fresh key {key}");
    };
    for step in finished {
        store.begin_step(&lease, step).await.expect("begin");
        store
            .finish_step(&lease, step, Bytes::from(format!("\"{step} of {key}\"")))
            .await
            .expect("finish");
    }
    for step in in_doubt {
        store.begin_step(&lease, step).await.expect("begin");
    }
    store
        .fail(&lease, Failure::new(class, message), HOUR)
        .await
        .expect("fail");
}

/// The group whose pattern is `pattern`.
fn group<'a>(groups: &'a [Value], pattern: &str) -> &'a Value {
    groups
        .iter()
        .find(|g| g["pattern"] == pattern)
        .unwrap_or_else(|| panic!("no group {pattern:?} in {groups:?}"))
}

/// `idem redrive` of a whole group, in any scope, without key secrets.
async fn redrive_group(
    store: &AnyStore,
    group: &str,
    action: &Redrive,
    dry_run: bool,
) -> anyhow::Result<Vec<Value>> {
    redrive(store, group, action, None, 1_000, dry_run, &no_secrets()).await
}

async fn open(dir: &tempfile::TempDir) -> (AnyStore, String) {
    let url = format!("sqlite:{}", dir.path().join("idem.db").display());
    let store = url
        .parse::<StoreUrl>()
        .expect("url")
        .open()
        .await
        .expect("open");
    (store, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_grouped_by_cause_and_redriven_in_bulk() {
    let dir = tempfile::tempdir().expect("dir");
    let (store, _) = open(&dir).await;
    let terminal = FailureClass::Terminal;
    let unknown = FailureClass::Unknown;
    for (key, card) in [("o-1", 4242), ("o-2", 1881), ("o-3", 4000)] {
        let message = format!("card {card} declined for order 0b9f7c2e-1d2a-4c5e-9f00-{card:012}");
        failed(&store, key, terminal, &message, &[], &[]).await;
    }
    failed(
        &store,
        "o-4",
        terminal,
        "address 12 Main St not found",
        &[],
        &[],
    )
    .await;
    for key in ["p-1", "p-2"] {
        failed(
            &store,
            key,
            unknown,
            "step \"ship\" is in doubt",
            &["charge"],
            &["ship"],
        )
        .await;
    }
    let charge = "step \"charge\" is in doubt";
    failed(&store, "p-3", unknown, charge, &[], &["charge"]).await;
    let broke = "the upstream broke off after 3 s";
    failed(&store, "g-1", unknown, broke, &[], &[]).await;

    let groups = failures(&store, None, 1_000).await.expect("failures");
    assert_eq!(groups.len(), 5, "{groups:#?}");
    assert!(groups.iter().all(|g| g["truncated"] == false));
    assert_eq!(groups[0]["count"], 3, "largest first: {groups:#?}");
    let declined = group(&groups, "card # declined for order <id>");
    assert_eq!(
        (&declined["state"], &declined["class"], &declined["scopes"]),
        (
            &Value::from("failed"),
            &Value::from("terminal"),
            &serde_json::json!(["orders"])
        )
    );
    assert_eq!(declined["keys"], serde_json::json!(["o-1", "o-2", "o-3"]));
    assert!(declined["first_seen_ms"].as_u64() <= declined["last_seen_ms"].as_u64());
    let parked = group(&groups, "step \"ship\" is in doubt");
    assert_eq!(
        (&parked["state"], &parked["count"]),
        (&Value::from("parked"), &Value::from(2))
    );
    let broke_off = group(&groups, broke);
    let charge_in_doubt = group(&groups, charge);
    let cut = failures(&store, None, 2).await.expect("failures");
    assert!(cut.iter().all(|g| g["truncated"] == true), "{cut:?}");
    let in_scope = failures(
        &store,
        Some(idem::Scope::new("other").expect("scope")),
        1_000,
    )
    .await
    .expect("failures");
    assert!(in_scope.is_empty(), "{in_scope:?}");

    let declined_id = declined["group"].as_str().expect("id").to_owned();
    let dry = redrive_group(&store, &declined_id, &Redrive::Release, true)
        .await
        .expect("dry run");
    assert_eq!(dry.last().expect("summary")["would_redrive"], 3);
    assert_eq!(
        failures(&store, None, 1_000).await.expect("failures").len(),
        5,
        "unchanged"
    );
    let not_parked = redrive_group(
        &store,
        &declined_id,
        &Redrive::Resolve(Resolution::NotApplied),
        true,
    )
    .await
    .expect_err("a terminal failure has no step in doubt");
    assert!(not_parked.to_string().contains("--release"), "{not_parked}");
    let done = redrive_group(&store, &declined_id, &Redrive::Release, false)
        .await
        .expect("redrive");
    assert_eq!(done[0]["action"], "released");
    assert_eq!(done.last().expect("summary")["redriven"], 3);

    // The released orders run again; the one declined for another cause
    // still replays its failure.
    let idem = Idempotency::builder(store.clone())
        .build()
        .expect("executor");
    let runs = AtomicU32::new(0);
    for key in ["o-1", "o-2", "o-3", "o-4"] {
        let _ = idem
            .run(&id(key), None, |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, HandlerError>(())
            })
            .await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    // Parked runs with a finished step are not released (a fresh run would
    // charge again); their step in doubt is resolved, and the next run
    // resumes after the charge.
    let parked_id = parked["group"].as_str().expect("id").to_owned();
    let refused = redrive_group(&store, &parked_id, &Redrive::Release, false)
        .await
        .expect("redrive");
    assert_eq!(refused[0]["action"], "skipped");
    assert!(
        refused[0]["why"].as_str().expect("why").contains("repeat"),
        "{refused:?}"
    );
    let resolved = redrive_group(
        &store,
        &parked_id,
        &Redrive::Resolve(Resolution::NotApplied),
        false,
    )
    .await
    .expect("redrive");
    assert_eq!(
        (&resolved[0]["action"], &resolved[0]["step"]),
        (&Value::from("resolved"), &Value::from("ship"))
    );
    let (charges, shipments) = (AtomicU32::new(0), AtomicU32::new(0));
    let (charged, shipped) = (&charges, &shipments);
    for key in ["p-1", "p-2"] {
        idem.run(&id(key), None, |ctx| async move {
            let charge: String = ctx
                .step("charge", Retry, |_| async {
                    charged.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, HandlerError>("charged again".to_owned())
                })
                .await?;
            let parcel: String = ctx
                .step("ship", Park, |_| async {
                    shipped.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, HandlerError>("shipped".to_owned())
                })
                .await?;
            Ok::<_, HandlerError>(format!("{charge}, {parcel}"))
        })
        .await
        .expect("resumed");
    }
    assert_eq!(
        charges.load(Ordering::SeqCst),
        0,
        "the journal's charges stand"
    );
    assert_eq!(shipments.load(Ordering::SeqCst), 2);

    // A run parked on its first step is not released either: the step may
    // have charged.
    let first_step = charge_in_doubt["group"].as_str().expect("id");
    let refused = redrive_group(&store, first_step, &Redrive::Release, false)
        .await
        .expect("redrive");
    assert_eq!(refused[0]["action"], "skipped");
    assert!(
        refused[0]["why"]
            .as_str()
            .expect("why")
            .contains("in doubt"),
        "{refused:?}"
    );

    // An unknown outcome without a journal (the gateway's) has no step to
    // resolve: release it.
    let broke_off_id = broke_off["group"].as_str().expect("id");
    let no_step = redrive_group(
        &store,
        broke_off_id,
        &Redrive::Resolve(Resolution::NotApplied),
        false,
    )
    .await
    .expect("redrive");
    assert!(
        no_step[0]["why"].as_str().expect("why").contains("release"),
        "{no_step:?}"
    );
    let unknown_group = redrive_group(&store, "000000000000", &Redrive::Release, false)
        .await
        .expect_err("no such group");
    assert!(
        unknown_group.to_string().contains("idem failures"),
        "{unknown_group}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_lists_groups_and_redrives_one() {
    let dir = tempfile::tempdir().expect("dir");
    let (store, url) = open(&dir).await;
    failed(
        &store,
        "o-1",
        FailureClass::Terminal,
        "declined by issuer 5001",
        &[],
        &[],
    )
    .await;
    failed(
        &store,
        "o-2",
        FailureClass::Terminal,
        "declined by issuer 5002",
        &[],
        &[],
    )
    .await;
    drop(store);
    let idem = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(args)
            .args(["--store", &url])
            .output()
            .expect("run idem");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.success(), text, stderr)
    };
    let (ok, listed, stderr) = idem(&["failures"]);
    assert!(ok, "{stderr}");
    let group: Value = serde_json::from_str(listed.lines().next().expect("a group")).expect("JSON");
    assert_eq!(
        (&group["pattern"], &group["count"]),
        (&Value::from("declined by issuer #"), &Value::from(2))
    );
    let id = group["group"].as_str().expect("id");

    let (ok, _, stderr) = idem(&["redrive", id]);
    assert!(!ok, "an action is required");
    assert!(stderr.contains("--release"), "{stderr}");
    let (ok, out, stderr) = idem(&["redrive", id, "--release", "--dry-run"]);
    assert!(ok, "{stderr}");
    assert!(out.contains("would release"), "{out}");
    let (ok, out, stderr) = idem(&["redrive", id, "--release"]);
    assert!(ok, "{stderr}");
    assert!(out.contains("\"redriven\":2"), "{out}");
    let (ok, listed, stderr) = idem(&["failures"]);
    assert!(ok, "{stderr}");
    assert_eq!(listed.trim(), "", "nothing failed is left");
}

/// Gateway keys whose answer was lost carry their attempt's effect mark:
/// releasing them is not held back by it, resolving one "not applied"
/// settles the mark, and "applied" with a step's JSON is refused (it is
/// not a stored response).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_keys_in_doubt_are_released_or_settled_not_applied() {
    let dir = tempfile::tempdir().expect("dir");
    let (store, _) = open(&dir).await;
    let lost = "the request may have reached the upstream, but its response was lost";
    let died = "attempt 2 found the key's earlier attempt stopped without an outcome";
    for key in ["lost-1", "lost-2"] {
        failed(
            &store,
            key,
            FailureClass::Unknown,
            lost,
            &[],
            &["$effect.1"],
        )
        .await;
    }
    failed(
        &store,
        "died-1",
        FailureClass::Unknown,
        died,
        &[],
        &["$effect.1"],
    )
    .await;
    // Settled applied once (a later attempt died storing it): its release
    // would send the request again.
    failed(
        &store,
        "died-2",
        FailureClass::Unknown,
        died,
        &["$effect.5"],
        &["$effect.6"],
    )
    .await;
    let groups = failures(&store, None, 1_000).await.expect("failures");
    let lost_group = group(&groups, lost)["group"]
        .as_str()
        .expect("id")
        .to_owned();
    let died_group = group(&groups, died)["group"]
        .as_str()
        .expect("id")
        .to_owned();

    let applied = Redrive::Resolve(Resolution::Applied(Bytes::from_static(b"{}")));
    let refused = redrive_group(&store, &lost_group, &applied, false)
        .await
        .expect("redrive");
    assert_eq!(refused.last().expect("summary")["skipped"], 2);
    assert!(refused[0]["why"]
        .as_str()
        .expect("why")
        .contains("--applied takes a step's JSON"));

    let settled = redrive_group(
        &store,
        &lost_group,
        &Redrive::Resolve(Resolution::NotApplied),
        false,
    )
    .await
    .expect("redrive");
    assert_eq!(settled[0]["action"], "resolved", "{settled:?}");
    assert_eq!(settled[0]["step"], "$effect.1");
    assert_eq!(settled.last().expect("summary")["redriven"], 2);
    for key in ["lost-1", "lost-2"] {
        let record = store.get(&id(key)).await.expect("get").expect("kept");
        assert_eq!(record.state.kind(), idem::StateKind::Released);
        assert!(store.steps(&id(key)).await.expect("steps").is_empty());
    }

    let released = redrive_group(&store, &died_group, &Redrive::Release, false)
        .await
        .expect("redrive");
    let action = |key: &str| {
        released
            .iter()
            .find(|l| l["key"] == key)
            .unwrap_or_else(|| panic!("{key} in {released:?}"))
    };
    assert_eq!(action("died-1")["action"], "released", "{released:?}");
    assert!(store.get(&id("died-1")).await.expect("get").is_none());
    assert_eq!(action("died-2")["action"], "skipped");
    assert!(action("died-2")["why"]
        .as_str()
        .expect("why")
        .contains("settled applied"));
    assert!(store.get(&id("died-2")).await.expect("get").is_some());
}

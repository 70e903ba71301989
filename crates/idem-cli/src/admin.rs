//! Admin commands against any store: inspect, list, release, purge, stats.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use idem::durable::INPUT_STEP;
use idem::step::check_step_name;
use idem::{
    DeleteRecord, GetRecord, ListQuery, ListRecords, PurgeExpired, Record, RecordId, Resolution,
    Resolved, State, StateKind, StepEntry, StepJournal, StepState,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

pub use crate::payload::Secrets;
use crate::store::AnyStore;

/// A record as the admin commands print it.
pub fn describe(id: &RecordId, record: &Record) -> Value {
    let mut out = json!({
        "scope": id.scope().as_str(),
        "key": id.key().as_str(),
        "state": record.state.kind().as_str(),
        "attempt": record.attempt,
        "fence": record.fence,
        "created_at_ms": record.created_at.as_millis(),
        "updated_at_ms": record.updated_at.as_millis(),
        "expires_at_ms": record.expires_at.as_millis(),
        "fingerprint": record.fingerprint.as_ref().map(|f| f.to_hex()),
    });
    match &record.state {
        State::InProgress { lease_until, .. } => {
            out["lease_until_ms"] = json!(lease_until.as_millis());
        }
        State::Completed { response } => out["response_bytes"] = json!(response.len()),
        State::Failed { failure } => {
            out["failure"] = json!({"class": failure.class.as_str(), "message": failure.message});
        }
        State::Released { last_failure } => {
            if let Some(f) = last_failure {
                out["last_failure"] = json!({"class": f.class.as_str(), "message": f.message});
            }
        }
    }
    out
}

/// A journaled step as the admin commands print it: its state, the
/// attempt that started it, and its result (as JSON when it is JSON, a
/// sealed one opened with `--keyring`).
pub fn describe_step(id: &RecordId, step: &StepEntry, secrets: &Secrets) -> Value {
    match &step.state {
        StepState::Started { attempt } => {
            json!({"name": step.name, "state": "started", "attempt": attempt})
        }
        StepState::Done { result } if result.is_empty() => {
            json!({"name": step.name, "state": "skipped"})
        }
        StepState::Done { result } => match secrets.step_result(id, &step.name, result) {
            Ok(value) => json!({"name": step.name, "state": "done", "result": value}),
            Err(unopened) => json!({
                "name": step.name,
                "state": "done",
                "result_bytes": result.len(),
                "unopened": unopened,
            }),
        },
    }
}

/// Adds a record's journal to its description: a durable run's input
/// (the reserved [`INPUT_STEP`] entry) as `input`, the steps as `steps`.
fn add_journal(out: &mut Value, id: &RecordId, journal: &[StepEntry], secrets: &Secrets) {
    let (input, steps): (Vec<&StepEntry>, Vec<&StepEntry>) =
        journal.iter().partition(|s| s.name == INPUT_STEP);
    if let Some(input) = input.first() {
        let described = describe_step(id, input, secrets);
        out["input"] = described
            .get("result")
            .cloned()
            .unwrap_or_else(|| json!({"state": described["state"]}));
    }
    if !steps.is_empty() {
        out["steps"] = steps
            .into_iter()
            .map(|step| describe_step(id, step, secrets))
            .collect();
    }
}

/// `idem inspect SCOPE KEY`: the record with its stored response
/// described (see [`Secrets::describe_response`]) and its step journal,
/// or `None` if absent or expired. A step still `started` on a record
/// that is not in progress is in doubt.
pub async fn inspect(
    store: &AnyStore,
    id: &RecordId,
    secrets: &Secrets,
) -> anyhow::Result<Option<Value>> {
    let Some(record) = store.get(id).await? else {
        return Ok(None);
    };
    let mut out = describe(id, &record);
    if let State::Completed { response } = &record.state {
        out["response"] = secrets.describe_response(id, response);
    }
    add_journal(&mut out, id, &store.steps(id).await?, secrets);
    Ok(Some(out))
}

/// `idem inspect --body`: writes the body of `id`'s stored response to
/// `out` — kept in the record, or streamed from its blob and checked
/// against its digest (`blobs` is opened only then). `Ok(false)` when
/// there is no completed record.
pub async fn write_body(
    store: &AnyStore,
    id: &RecordId,
    secrets: &Secrets,
    blobs: impl std::future::Future<Output = anyhow::Result<Option<idem::blob::Blobs>>>,
    out: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<bool> {
    let Some(record) = store.get(id).await? else {
        return Ok(false);
    };
    let State::Completed { response } = &record.state else {
        return Ok(false);
    };
    let http = secrets
        .http_response(id, response)
        .map_err(|e| anyhow::anyhow!("the stored response: {e}"))?;
    let idem_http::Kept::Reference(blob) = &http.kept else {
        out.write_all(&http.body)?;
        return Ok(true);
    };
    let blobs = blobs.await?.ok_or_else(|| {
        anyhow::anyhow!(
            "the body is kept in blob {}: name its blob store with --blobs",
            blob.locator
        )
    })?;
    let mut chunks = blobs.open(blob).await?;
    while let Some(chunk) = chunks.next().await? {
        out.write_all(&chunk)?;
    }
    Ok(true)
}

/// `idem list --state parked`: failed records whose outcome is unknown,
/// each with its step journal (so the step in doubt is visible). Lists
/// failed records and keeps the parked ones, so it reads every failed
/// record of the scope.
pub async fn list_parked(
    store: &AnyStore,
    scope: Option<idem::Scope>,
    limit: usize,
    secrets: &Secrets,
) -> anyhow::Result<Vec<Value>> {
    let parked = |r: &Record| matches!(&r.state, State::Failed { failure } if failure.is_parked());
    let records = collect(store, Some(StateKind::Failed), scope, limit, parked).await?;
    let mut out = Vec::with_capacity(records.len());
    for (id, record) in &records {
        let mut described = describe(id, record);
        described["steps"] = json!([]);
        add_journal(&mut described, id, &store.steps(id).await?, secrets);
        out.push(described);
    }
    Ok(out)
}

/// The resolution `idem resolve` was given: `--applied JSON` or
/// `--not-applied`. The JSON must parse, since the handler decodes it as
/// the step's result.
pub fn resolution(applied: Option<&str>) -> anyhow::Result<Resolution> {
    match applied {
        None => Ok(Resolution::NotApplied),
        Some(json) => {
            let value: Value = serde_json::from_str(json)
                .map_err(|e| anyhow::anyhow!("--applied must be the step's result as JSON: {e}"))?;
            Ok(Resolution::Applied(Bytes::from(serde_json::to_vec(
                &value,
            )?)))
        }
    }
}

/// `idem resolve SCOPE KEY STEP`: journals the operator's finding for a
/// parked record's step in doubt and releases the record. An error says
/// why nothing changed.
/// An applied result is sealed under `--keyring`, as the executor seals
/// the step results it journals.
pub async fn resolve(
    store: &AnyStore,
    id: &RecordId,
    step: &str,
    resolution: Resolution,
    secrets: &Secrets,
) -> anyhow::Result<()> {
    if let Err(problem) = check_step_name(step) {
        anyhow::bail!(
            "step name {step:?} {problem}; nothing changed. `idem inspect` lists the steps"
        );
    }
    let resolution = match resolution {
        Resolution::Applied(json) => {
            Resolution::Applied(secrets.at_rest().seal_step(id, step, json))
        }
        other => other,
    };
    match store.resolve_step(id, step, resolution).await? {
        Resolved::Released => Ok(()),
        Resolved::NotParked => anyhow::bail!(
            "{id} is not parked (absent, expired, or not failed with an unknown outcome); nothing changed"
        ),
        Resolved::StepNotInDoubt => anyhow::bail!(
            "step {step:?} of {id} is not in doubt (never started, or already finished); nothing changed. `idem inspect` lists its steps"
        ),
    }
}

/// Up to `limit` live records of `state` and `scope` that `keep` accepts,
/// read a page at a time.
pub(crate) async fn collect(
    store: &AnyStore,
    state: Option<StateKind>,
    scope: Option<idem::Scope>,
    limit: usize,
    keep: impl Fn(&Record) -> bool,
) -> anyhow::Result<Vec<(RecordId, Record)>> {
    let mut out = Vec::new();
    let mut after = None;
    while out.len() < limit {
        let mut query = ListQuery::new((limit - out.len()).min(1_000));
        query.state = state;
        query.scope = scope.clone();
        query.after = after.take();
        let page = store.list(&query).await?;
        out.extend(page.records.into_iter().filter(|(_, r)| keep(r)));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    out.truncate(limit);
    Ok(out)
}

/// `idem list`: up to `limit` records, optionally of one state and scope.
pub async fn list(
    store: &AnyStore,
    state: Option<StateKind>,
    scope: Option<idem::Scope>,
    limit: usize,
) -> anyhow::Result<Vec<Value>> {
    let records = collect(store, state, scope, limit, |_| true).await?;
    Ok(records.iter().map(|(id, r)| describe(id, r)).collect())
}

/// `idem release SCOPE KEY`: force-releases a stuck key by deleting its
/// record. Whether a live record was there.
pub async fn release(store: &AnyStore, id: &RecordId) -> anyhow::Result<bool> {
    Ok(store.delete(id).await?)
}

fn spinner(show: bool, message: &'static str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner().with_message(message);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}: {pos} ({per_sec}, {elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// `idem purge`: deletes expired records `batch` at a time until none are
/// left, with a progress line. How many were deleted.
pub async fn purge(store: &AnyStore, batch: usize, progress: bool) -> anyhow::Result<u64> {
    let bar = spinner(progress, "purging expired records");
    let mut total = 0u64;
    loop {
        let n = store.purge_expired(batch.max(1)).await?;
        total += n as u64;
        bar.inc(n as u64);
        if n == 0 {
            break;
        }
    }
    bar.finish_and_clear();
    Ok(total)
}

/// `idem stats`: live records by state, and how many scopes hold them.
pub async fn stats(store: &AnyStore, progress: bool) -> anyhow::Result<Value> {
    let bar = spinner(progress, "counting records");
    let mut by_state: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut scopes: BTreeMap<String, u64> = BTreeMap::new();
    let mut after = None;
    loop {
        let mut query = ListQuery::new(1_000);
        query.after = after.take();
        let page = store.list(&query).await?;
        for (id, record) in &page.records {
            *by_state.entry(record.state.kind().as_str()).or_default() += 1;
            *scopes.entry(id.scope().as_str().to_owned()).or_default() += 1;
        }
        bar.inc(page.records.len() as u64);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    bar.finish_and_clear();
    let total: u64 = by_state.values().sum();
    Ok(json!({ "records": total, "by_state": by_state, "scopes": scopes.len() }))
}

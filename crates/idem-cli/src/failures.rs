//! `idem failures` and `idem redrive`: failed and parked records grouped
//! by how they failed, and a group handled in bulk with the commands an
//! operator would run one key at a time.

use std::collections::BTreeMap;

use idem::durable::INPUT_STEP;
use idem::{
    DeleteRecord, FailureClass, GetRecord, Record, RecordId, Resolution, Resolved, Scope, State,
    StateKind, StepJournal, StepState,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::admin::{collect, Secrets};
use crate::store::AnyStore;

/// How many keys a group shows.
const SAMPLES: usize = 5;

/// A failure message with what varies between records of one cause taken
/// out: a word (letters, digits, `-`, `_`) of eight characters or more
/// with a digit in it is an id and becomes `<id>` (UUIDs, hex digests,
/// ULIDs, `pi_3Mtw…`), a run of four digits or more elsewhere becomes `#`;
/// shorter numbers stay (status codes, step names such as `ship-2`), so
/// that causes they tell apart stay apart.
///
/// ```
/// use idem_cli::failures::pattern;
///
/// assert_eq!(
///     pattern("card 4242 declined for order 0b9f7c2e-1d2a-4c5e-9f00-2a9d1c3e4f5a"),
///     "card # declined for order <id>"
/// );
/// assert_eq!(pattern("upstream returned 502"), "upstream returned 502");
/// assert_eq!(pattern("step \"ship-2\" is in doubt"), "step \"ship-2\" is in doubt");
/// assert_eq!(pattern("intent pi_3MtwBwLkdIwHu7ix28a3tqPa failed"), "intent <id> failed");
/// ```
pub fn pattern(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    let in_word = |c: char| c.is_alphanumeric() || c == '-' || c == '_';
    while let Some(start) = rest.find(in_word) {
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let end = rest.find(|c: char| !in_word(c)).unwrap_or(rest.len());
        let word = &rest[..end];
        if word.chars().count() >= 8 && word.chars().any(|c| c.is_numeric()) {
            out.push_str("<id>");
        } else {
            let mut digits = String::new();
            for c in word.chars() {
                if c.is_numeric() {
                    digits.push(c);
                    continue;
                }
                flush_digits(&mut out, &mut digits);
                out.push(c);
            }
            flush_digits(&mut out, &mut digits);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// A run of digits as [`pattern`] writes it: four or more as `#`.
fn flush_digits(out: &mut String, digits: &mut String) {
    if digits.chars().count() >= 4 {
        out.push('#');
    } else {
        out.push_str(digits);
    }
    digits.clear();
}

/// The group a failure belongs to: 12 hex digits of the SHA-256 of its
/// class and pattern, stable across runs and machines.
fn group_id(class: FailureClass, pattern: &str) -> String {
    let digest = Sha256::digest(format!("{}\n{pattern}", class.as_str()));
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// One group as it is being counted.
struct Group {
    class: FailureClass,
    pattern: String,
    records: Vec<(RecordId, Record)>,
}

/// Failed records (up to `limit`, of `scope` if given) by group id, and
/// whether the limit cut the reading short.
async fn groups(
    store: &AnyStore,
    scope: Option<Scope>,
    limit: usize,
) -> anyhow::Result<(BTreeMap<String, Group>, bool)> {
    let failed = collect(store, Some(StateKind::Failed), scope, limit, |_| true).await?;
    let truncated = failed.len() >= limit;
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    for (id, record) in failed {
        let State::Failed { failure } = &record.state else {
            continue;
        };
        let pattern = pattern(&failure.message);
        let class = failure.class;
        groups
            .entry(group_id(class, &pattern))
            .or_insert_with(|| Group {
                class,
                pattern,
                records: Vec::new(),
            })
            .records
            .push((id, record));
    }
    Ok((groups, truncated))
}

/// `idem failures`: failed and parked records grouped by class and
/// pattern, largest group first, each with its count, when it was first
/// and last seen (the records' last updates), its scopes and a few keys
/// (as stored: hashed under `--key-secret`). When `limit` records were
/// read before the end, every group says `"truncated": true` and its count
/// is a lower bound.
pub async fn failures(
    store: &AnyStore,
    scope: Option<Scope>,
    limit: usize,
) -> anyhow::Result<Vec<Value>> {
    let (groups, truncated) = groups(store, scope, limit).await?;
    let mut out: Vec<Value> = groups
        .into_iter()
        .map(|(id, group)| {
            let seen = group.records.iter().map(|(_, r)| r.updated_at.as_millis());
            let mut scopes: Vec<&str> = group
                .records
                .iter()
                .map(|(id, _)| id.scope().as_str())
                .collect();
            scopes.sort_unstable();
            scopes.dedup();
            json!({
                "group": id,
                "state": if group.class == FailureClass::Unknown { "parked" } else { "failed" },
                "class": group.class.as_str(),
                "pattern": group.pattern,
                "count": group.records.len(),
                "first_seen_ms": seen.clone().min(),
                "last_seen_ms": seen.max(),
                "scopes": scopes,
                "keys": group.records.iter().take(SAMPLES).map(|(id, _)| id.key().as_str()).collect::<Vec<_>>(),
                "truncated": truncated,
            })
        })
        .collect();
    out.sort_by(|a, b| b["count"].as_u64().cmp(&a["count"].as_u64()));
    Ok(out)
}

/// `idem redrive`'s arguments: the group, and exactly one action.
#[derive(Debug, clap::Args)]
pub struct RedriveArgs {
    /// The group's id.
    pub group: String,
    /// Delete each record so its next delivery runs afresh (skipped for
    /// records with a step in doubt, a finished step or a durable input).
    #[arg(long, required_unless_present_any = ["applied", "not_applied"], conflicts_with_all = ["applied", "not_applied"])]
    pub release: bool,
    /// Each record's step in doubt took effect: journal this JSON as its
    /// result; the next delivery resumes after it.
    #[arg(long, value_name = "JSON", conflicts_with = "not_applied")]
    pub applied: Option<String>,
    /// Each record's step in doubt did not take effect: the next delivery
    /// runs it.
    #[arg(long)]
    pub not_applied: bool,
    /// Say what would be done, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Only records in this scope.
    #[arg(long)]
    pub scope: Option<String>,
    /// Read at most this many failed records.
    #[arg(long, default_value_t = 100_000)]
    pub limit: usize,
}

impl RedriveArgs {
    /// The action the flags name (`--applied` must be JSON).
    pub fn action(&self) -> anyhow::Result<Redrive> {
        if self.release {
            Ok(Redrive::Release)
        } else {
            Ok(Redrive::Resolve(crate::admin::resolution(
                self.applied.as_deref(),
            )?))
        }
    }
}

/// What `idem redrive` does to each record of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redrive {
    /// Delete the record, so the next delivery of its key runs afresh:
    /// refused for a record with finished journaled steps, which a fresh
    /// run would repeat.
    Release,
    /// Resolve the step in doubt of a parked record (see `idem resolve`),
    /// so the next delivery resumes after its finished steps.
    Resolve(Resolution),
}

/// `idem redrive GROUP`: carries out `action` on every record of the
/// group (up to `limit` failed records read), or with `dry_run` says what
/// it would do. One JSON object per record (`scope`, `key`, `action`, and
/// `why` when skipped), then a summary.
pub async fn redrive(
    store: &AnyStore,
    group: &str,
    action: &Redrive,
    scope: Option<Scope>,
    limit: usize,
    dry_run: bool,
    secrets: &Secrets,
) -> anyhow::Result<Vec<Value>> {
    let (mut groups, truncated) = groups(store, scope, limit).await?;
    let Some(found) = groups.remove(group) else {
        let read = if truncated {
            format!(" among the first {limit} failed records (raise --limit)")
        } else {
            String::new()
        };
        anyhow::bail!("no failure group {group:?}{read}; `idem failures` lists them");
    };
    if matches!(action, Redrive::Resolve(_)) && found.class != FailureClass::Unknown {
        anyhow::bail!(
            "group {group:?} failed {}, not parked: it has no step in doubt to resolve; \
             release it with --release",
            found.class.as_str()
        );
    }
    let mut out = Vec::with_capacity(found.records.len() + 1);
    let (mut done, mut skipped) = (0u64, 0u64);
    for (id, listed) in &found.records {
        let line = redrive_record(store, (id, listed), action, dry_run, secrets).await?;
        if line["action"] == "skipped" {
            skipped += 1;
        } else {
            done += 1;
        }
        out.push(line);
    }
    let mut summary = json!({
        "group": group,
        "pattern": found.pattern,
        "records": found.records.len(),
        "skipped": skipped,
        "dry_run": dry_run,
    });
    summary[if dry_run { "would_redrive" } else { "redriven" }] = json!(done);
    out.push(summary);
    Ok(out)
}

/// `idem redrive`'s rules for one failed record `listed` as `id`: which
/// step `action` settles, or why the record is skipped (a durable run, a
/// step a fresh run would repeat, several steps in doubt…), carried out
/// unless `dry_run`. The line `idem redrive` prints for it (`scope`,
/// `key`, `action`, `step`, `why`).
pub async fn redrive_record(
    store: &AnyStore,
    (id, listed): (&RecordId, &Record),
    action: &Redrive,
    dry_run: bool,
    secrets: &Secrets,
) -> anyhow::Result<Value> {
    let journal = store.steps(id).await?;
    let durable = journal.iter().any(|s| s.name == INPUT_STEP);
    let steps = journal.iter().filter(|s| s.name != INPUT_STEP);
    let finished = steps
        .clone()
        .filter(|s| matches!(s.state, StepState::Done { .. }))
        .count();
    // A run's effect in doubt as a whole (a gateway key whose answer
    // was lost) is what releasing or resolving it decides, not a step
    // a fresh run would repeat; its latest attempt's mark is the one.
    let effect = idem::effect_in_doubt_of(&journal);
    let settled = journal.iter().any(|s| {
        idem::effect_mark_fence(&s.name).is_some() && matches!(s.state, StepState::Done { .. })
    });
    let in_doubt: Vec<&str> = steps
        .filter(|s| matches!(s.state, StepState::Started { .. }))
        .filter(|s| idem::effect_mark_fence(&s.name).is_none())
        .map(|s| s.name.as_str())
        .collect();
    let step = match (action, in_doubt.as_slice()) {
        (Redrive::Release, _) if durable => Err(
            "a durable run: deleting it would drop its journaled input, and nothing would \
             run it again; resolve its step in doubt, or `idem release` it knowingly"
                .to_owned(),
        ),
        (Redrive::Release, [step, ..]) => Err(format!(
            "step {step:?} is in doubt, and a fresh run would repeat it: resolve it instead"
        )),
        (Redrive::Release, []) if settled => Err(
            "the request's outcome was settled applied: its next request stores and replays \
             it, and a fresh run would send the request again"
                .to_owned(),
        ),
        (Redrive::Release, []) if finished > 0 => Err(format!(
            "{finished} journaled step(s) finished, which a fresh run would repeat"
        )),
        (Redrive::Release, []) => Ok(None),
        (Redrive::Resolve(Resolution::Applied(_)), []) if effect.is_some() => Err(
            "the outcome of a gateway request is in doubt: --applied takes a step's JSON, \
             not the request's response; settle it with the gateway's --reconcile, or \
             --not-applied (the next request runs)"
                .to_owned(),
        ),
        (Redrive::Resolve(_), []) if effect.is_some() => Ok(effect),
        (Redrive::Resolve(_), [step]) => Ok(Some(*step)),
        (Redrive::Resolve(_), []) => {
            Err("no step in doubt to resolve: release the key instead".to_owned())
        }
        (Redrive::Resolve(_), many) => Err(format!(
            "several steps in doubt ({}): resolve them one at a time with `idem resolve`",
            many.join(", ")
        )),
    };
    let mut line = json!({"scope": id.scope().as_str(), "key": id.key().as_str()});
    match step {
        Err(why) => {
            line["action"] = json!("skipped");
            line["why"] = json!(why);
        }
        Ok(step) => {
            line["action"] = json!(match (action, dry_run) {
                (Redrive::Release, false) => "released",
                (Redrive::Release, true) => "would release",
                (Redrive::Resolve(_), false) => "resolved",
                (Redrive::Resolve(_), true) => "would resolve",
            });
            if let Some(step) = step {
                line["step"] = json!(step);
            }
            if !dry_run {
                apply(store, (id, listed), action, step, secrets, &mut line).await?;
            }
        }
    }
    Ok(line)
}

/// Carries out `action` on one record; a record that changed since it was
/// `listed` (resolved, released or run meanwhile) is marked skipped. A
/// release reads the record again just before deleting it, since the
/// delete itself is unconditional: a record resolved and claimed again
/// meanwhile, deleted with its journal, would run its finished steps
/// again. (The window left is that one round trip.)
async fn apply(
    store: &AnyStore,
    (id, listed): (&RecordId, &Record),
    action: &Redrive,
    step: Option<&str>,
    secrets: &Secrets,
    line: &mut Value,
) -> anyhow::Result<()> {
    let changed = match (action, step) {
        (Redrive::Release, _) => {
            let now = store.get(id).await?;
            let same = now.as_ref().is_some_and(|r| {
                r.state.kind() == StateKind::Failed
                    && r.fence == listed.fence
                    && r.updated_at == listed.updated_at
            });
            !same || !store.delete(id).await?
        }
        (Redrive::Resolve(resolution), Some(step)) => {
            let resolution = match resolution {
                Resolution::Applied(json) => {
                    Resolution::Applied(secrets.at_rest().seal_step(id, step, json.clone()))
                }
                other => other.clone(),
            };
            store.resolve_step(id, step, resolution).await? != Resolved::Released
        }
        (Redrive::Resolve(_), None) => true,
    };
    if changed {
        line["action"] = json!("skipped");
        line["why"] = json!("the record changed since it was read");
    }
    Ok(())
}

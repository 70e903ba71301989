//! Outcomes resolved by asking the service. A key whose outcome is
//! unknown (the response was lost after the request went out, or the
//! process serving it died mid-request) is kept failed and answered 422
//! `outcome-unknown`, never run a second time. With a [`Reconciler`], a
//! retry of such a key first asks the service whether the request took
//! effect, and settles the key on what it hears:
//!
//! - [`Finding::Applied`] with the response it would have answered: that
//!   response is stored as the key's and the retry gets it (marked
//!   replayed), nothing forwarded;
//! - [`Finding::NotApplied`]: the key is released and the retry runs;
//! - [`Finding::Unknown`] (or no answer within the timeout): the key stays
//!   as it was, for a person (`idem release`), and the retry gets 422.
//!
//! Settling goes through the step journal (the attempt's effect mark,
//! [`idem::effect_mark`], written when the outcome became unknown),
//! atomically with the record's release, so two retries reconciling at
//! once settle the key once, and a late finding about an earlier attempt
//! settles nothing. Every finding is logged and counted
//! ([`RECONCILIATIONS`]).
//!
//! Answer [`Finding::NotApplied`] only when the request can no longer take
//! effect: it never arrived, or a late copy of it would be refused (the
//! service deduplicates on the key). A request still being worked on is
//! [`Finding::Unknown`]; the next retry asks again.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Response, Uri};
use idem::store::DynStepJournal;
use idem::{Codec, Record, RecordId, Resolution, Resolved, State, Store};
use tokio::sync::Semaphore;

use crate::layer::IdempotencyLayerBuilder;
use crate::request::Settings;
use crate::stored::{Responses, StoredResponse};

/// Reconciliations, by `finding` (`applied`, `not_applied`, `unknown`,
/// `none`) and `why`: `answered` (settled), `raced` (settled meanwhile by
/// another retry; `none` when it was before asking), and for unknown ones
/// `said`, `timeout`, `busy`, `unmarked`, `unstorable`, `store`.
pub const RECONCILIATIONS: &str = "idem_reconciliations_total";

/// How long a reconciler may take before its finding counts as unknown
/// (and, as long again, how long a retry waits for its turn to ask).
pub const DEFAULT_RECONCILE_TIMEOUT: Duration = Duration::from_secs(5);

/// How many reconciliations may run at once; a retry that finds them all
/// busy waits its turn for up to the reconcile timeout, then is answered
/// as before (422), without asking.
pub const DEFAULT_MAX_RECONCILING: usize = 16;

/// The request a reconciler is asked about: the retry of a key whose
/// outcome is unknown (the same key and, by the fingerprint check, the
/// same request).
#[derive(Debug, Clone)]
pub struct Question {
    /// The key's record id (its scope — tenant and route — and key).
    pub id: RecordId,
    /// The retry's method.
    pub method: Method,
    /// The retry's URI.
    pub uri: Uri,
    /// The retry's headers.
    pub headers: HeaderMap,
}

/// What a reconciler found out.
#[derive(Debug)]
pub enum Finding {
    /// The request took effect, and this is the response it answers (or
    /// would have answered): stored as the key's outcome and replayed.
    Applied(Response<Bytes>),
    /// The request did not take effect: the key is released and runs again.
    NotApplied,
    /// It cannot tell; why, for the log. The key stays for a person.
    Unknown(String),
}

/// A boxed finding, for [`Reconciler`].
pub type BoxFinding = Pin<Box<dyn Future<Output = Finding> + Send>>;

/// Asks the service whether a request whose outcome is unknown took
/// effect. Any `Fn(Question) -> impl Future<Output = Finding>` is one;
/// the `idem` gateway's `--reconcile URL` asks an endpoint of the upstream.
pub trait Reconciler: Send + Sync + 'static {
    /// Finds out about `question`'s request.
    fn reconcile(&self, question: Question) -> BoxFinding;
}

impl<F, Fut> Reconciler for F
where
    F: Fn(Question) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Finding> + Send + 'static,
{
    fn reconcile(&self, question: Question) -> BoxFinding {
        Box::pin(self(question))
    }
}

/// A layer's reconciler and its bounds.
#[derive(Clone)]
pub(crate) struct Reconciling {
    reconciler: Arc<dyn Reconciler>,
    timeout: Duration,
    slots: Arc<Semaphore>,
}

impl Reconciling {
    fn new(reconciler: Arc<dyn Reconciler>) -> Self {
        Self {
            reconciler,
            timeout: DEFAULT_RECONCILE_TIMEOUT,
            slots: Arc::new(Semaphore::new(DEFAULT_MAX_RECONCILING)),
        }
    }
}

impl<S> IdempotencyLayerBuilder<S> {
    /// Asks `reconciler` about a key whose outcome is unknown when a retry
    /// of it arrives, instead of answering 422 until a person releases it
    /// (see [the module](crate::reconcile)). Off by default; the store
    /// must keep a step journal (every store idem ships does).
    pub fn reconciler(mut self, reconciler: impl Reconciler) -> Self {
        self.reconciling = Some(Reconciling::new(Arc::new(reconciler)));
        self
    }

    /// How long the reconciler may take (default
    /// [`DEFAULT_RECONCILE_TIMEOUT`]) and how many reconciliations may run
    /// at once (default [`DEFAULT_MAX_RECONCILING`]). No effect without a
    /// [`reconciler`](Self::reconciler).
    pub fn reconcile_limits(mut self, timeout: Duration, at_once: usize) -> Self {
        if let Some(reconciling) = &mut self.reconciling {
            reconciling.timeout = timeout;
            reconciling.slots = Arc::new(Semaphore::new(at_once.max(1)));
        }
        self
    }
}

/// What a sweep made of one parked key (see
/// [`IdempotencyLayer::reconcile_parked`](crate::IdempotencyLayer::reconcile_parked)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swept {
    /// Asked, and settled (or settled meanwhile by a retry): the key's
    /// next request replays the response found, or runs.
    Settled,
    /// Asked, and left for a person (or for the next sweep).
    Unsettled,
    /// Not asked: the layer has no reconciler, hashes its keys (the
    /// service would be asked about the hash), or the key's scope is not
    /// one of this layer's routes.
    NotAsked,
}

impl<S: Store> crate::IdempotencyLayer<S> {
    /// Asks the reconciler about a key found parked by a sweep over the
    /// store, with no retry in hand: the question carries the method and
    /// route its scope names (`http POST /charges`; no query string) and no
    /// headers, so a service that needs the caller's credentials or tenant
    /// to answer says unknown, and the key waits for its retry as before.
    /// Settles the key on the finding exactly as a retry's reconciliation
    /// does.
    pub async fn reconcile_parked(&self, stored: &RecordId) -> Swept {
        let settings = &self.settings;
        if settings.reconciling.is_none() || settings.idem.key_hasher().is_some() {
            return Swept::NotAsked;
        }
        let Some(question) = swept_question(stored) else {
            return Swept::NotAsked;
        };
        if settings.reconcile(question).await {
            Swept::Settled
        } else {
            Swept::Unsettled
        }
    }
}

/// The question a sweep asks about `id`: the method and route of its
/// scope (`http METHOD ROUTE[ tenant:HASH]`).
fn swept_question(id: &RecordId) -> Option<Question> {
    let rest = id.scope().as_str().strip_prefix("http ")?;
    let (method, route) = rest.split_once(' ')?;
    let route = route.split(" tenant:").next()?;
    Some(Question {
        id: id.clone(),
        method: Method::from_bytes(method.as_bytes()).ok()?,
        uri: route.parse().ok()?,
        headers: HeaderMap::new(),
    })
}

impl<S: Store> Settings<S> {
    /// Asks the reconciler about `question`'s key (found parked) and
    /// settles it on the finding. Whether the key may have changed, so the
    /// request should be run again: settled here or by someone else.
    pub(crate) async fn reconcile(&self, question: Question) -> bool {
        let Some(reconciling) = &self.reconciling else {
            return false;
        };
        let Some(journal) = self.idem.store().step_journal() else {
            return false;
        };
        let id = self.idem.stored_id(&question.id).into_owned();
        // The attempt whose effect is in doubt: the finding settles that
        // one only.
        let mark = match journal.steps(&id).await {
            Ok(steps) => match idem::effect_in_doubt_of(&steps) {
                Some(mark) => mark.to_owned(),
                None => return self.unmarked(&id).await,
            },
            Err(error) => return unknown(&id, "store", &idem::error_chain(&error)),
        };
        // Waits its turn for as long as one reconciliation may take.
        let Ok(Ok(_slot)) =
            tokio::time::timeout(reconciling.timeout, reconciling.slots.acquire()).await
        else {
            return unknown(&id, "busy", "no turn to reconcile within the timeout");
        };
        let path = question.uri.path().to_owned();
        let finding = tokio::time::timeout(
            reconciling.timeout,
            reconciling.reconciler.reconcile(question),
        )
        .await
        .unwrap_or_else(|_| Finding::Unknown(TIMED_OUT.into()));
        let (label, resolution) = match finding {
            Finding::Applied(response) => match self.journaled(&id, &mark, &path, response) {
                Ok(sealed) => ("applied", Resolution::Applied(sealed)),
                Err(why) => return unknown(&id, "unstorable", &why),
            },
            Finding::NotApplied => ("not_applied", Resolution::NotApplied),
            Finding::Unknown(why) => {
                let said = if why == TIMED_OUT { "timeout" } else { "said" };
                return unknown(&id, said, &why);
            }
        };
        settle(&*journal, &id, &mark, label, resolution).await
    }

    /// A key found parked with no effect mark in doubt: settled by another
    /// retry since (run again to find out how), or parked without a mark
    /// (by an older version, or the mark could not be written).
    async fn unmarked(&self, id: &RecordId) -> bool {
        let parked = matches!(
            self.idem.store().peek(id).await,
            Ok(Some(Record { state: State::Failed { ref failure }, .. })) if failure.is_parked()
        );
        if !parked {
            metrics::counter!(RECONCILIATIONS, "finding" => "none", "why" => "raced").increment(1);
            return true;
        }
        unknown(
            id,
            "unmarked",
            "the key was parked without its effect marked in doubt (by an older version, or the \
             mark could not be written)",
        )
    }

    /// An applied finding's response as the effect's journaled result:
    /// what the route keeps of it, as stored-response bytes, sealed as the
    /// executor seals step results. Refused when the layer would not store
    /// it (its status, its size).
    fn journaled(
        &self,
        id: &RecordId,
        mark: &str,
        path: &str,
        response: Response<Bytes>,
    ) -> Result<Bytes, String> {
        let (head, body) = response.into_parts();
        if !(self.stored)(head.status) {
            return Err(format!(
                "the response found has status {}, which is not stored",
                head.status
            ));
        }
        let stored = StoredResponse::new(head.status, head.headers, body);
        let policy = self.keep.for_path(path);
        let stored = policy.reduce(&stored).unwrap_or(stored);
        let bytes = Responses
            .encode(&stored)
            .map_err(|e| format!("encoding the response found: {e}"))?;
        if bytes.len() > self.max_stored_bytes {
            return Err(format!(
                "the response found is over the {}-byte limit for stored responses",
                self.max_stored_bytes
            ));
        }
        Ok(self.idem.at_rest().seal_step(id, mark, Bytes::from(bytes)))
    }
}

/// What a reconciler that did not answer in time is taken to have said.
const TIMED_OUT: &str = "no finding within the timeout";

/// Journals `resolution` for `id`'s effect `mark` and releases the record.
async fn settle(
    journal: &dyn DynStepJournal,
    id: &RecordId,
    mark: &str,
    label: &'static str,
    resolution: Resolution,
) -> bool {
    match journal.resolve_step(id, mark, resolution).await {
        Ok(Resolved::Released) => {
            metrics::counter!(RECONCILIATIONS, "finding" => label, "why" => "answered")
                .increment(1);
            tracing::info!(%id, finding = label, "outcome unknown: reconciled and released");
            true
        }
        // Settled by another retry (or released by a person) meanwhile:
        // the run again finds the key as it is now.
        Ok(Resolved::NotParked | Resolved::StepNotInDoubt) => {
            metrics::counter!(RECONCILIATIONS, "finding" => label, "why" => "raced").increment(1);
            tracing::info!(%id, finding = label, "outcome unknown: settled meanwhile by another");
            true
        }
        Err(error) => unknown(id, "store", &idem::error_chain(&error)),
    }
}
/// Counts and logs a reconciliation that settled nothing.
fn unknown(id: &RecordId, why: &'static str, detail: &str) -> bool {
    metrics::counter!(RECONCILIATIONS, "finding" => "unknown", "why" => why).increment(1);
    tracing::warn!(%id, why, detail, "outcome unknown: the reconciler did not settle it");
    false
}

/// A stored response read back from the effect's journaled result.
pub(crate) fn settled_response(bytes: &[u8]) -> Result<StoredResponse, String> {
    Responses
        .decode::<StoredResponse>(bytes)
        .map_err(|e| format!("the settled response does not decode: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_asks_about_the_method_and_route_of_the_scope() {
        let id = RecordId::parse("http POST /charges/42 tenant:0a1b", "k-1").expect("id");
        let question = swept_question(&id).expect("a question");
        assert_eq!(question.method, Method::POST);
        assert_eq!(question.uri.path(), "/charges/42");
        assert!(question.headers.is_empty());
        for scope in [
            "orders",
            "http POST",
            "http P(ST /x",
            "http POST not-a-path^",
        ] {
            let id = RecordId::parse(scope, "k-1").expect("id");
            assert!(swept_question(&id).is_none(), "{scope}");
        }
    }
}

//! `Engine`: an executor over one store, opened from its URL.

use std::sync::Arc;
use std::time::Duration;

use idem_engine::input::{self, Unit};
use idem_engine::{Begin, EngineError, EngineOptions};
use napi::bindgen_prelude::{Either, PromiseRaw};
use napi::Env;
use napi_derive::napi;

use crate::errors::to_js;
use crate::promise::{promise, text};
use crate::run::Run;

/// How the engine runs its keys (milliseconds); unset: idem's defaults.
#[napi(object)]
pub struct Options {
    /// How long a claim is held without a heartbeat.
    pub lease_ms: Option<f64>,
    /// How long results are kept and replayed.
    pub retention_ms: Option<f64>,
    /// How long terminal failures are kept and replayed.
    pub failure_retention_ms: Option<f64>,
    /// How long a claim waits for a duplicate in flight, by default.
    pub wait_ms: Option<f64>,
    /// Attempts after which a retryable failure is terminal.
    pub max_attempts: Option<u32>,
    /// The largest result stored, in bytes.
    pub max_result_bytes: Option<u32>,
    /// The token for a remote `idem serve`.
    pub token: Option<String>,
    /// A keyring file sealing stored results at rest.
    pub keyring: Option<String>,
    /// A file holding the secret keys are hashed with at rest.
    pub key_secret: Option<String>,
    /// The broker what runs send goes to, by URL.
    pub outbox: Option<String>,
}

/// Milliseconds from JavaScript as a duration.
fn millis(name: &str, ms: Option<f64>) -> Result<Option<Duration>, EngineError> {
    input::duration(name, ms, Unit::Millis)
}

fn options(given: Option<Options>) -> Result<EngineOptions, EngineError> {
    let Some(given) = given else {
        return Ok(EngineOptions::default());
    };
    Ok(EngineOptions {
        lease: millis("leaseMs", given.lease_ms)?,
        retention: millis("retentionMs", given.retention_ms)?,
        failure_retention: millis("failureRetentionMs", given.failure_retention_ms)?,
        wait: millis("waitMs", given.wait_ms)?,
        max_attempts: input::attempts("maxAttempts", given.max_attempts)?,
        max_result_bytes: given.max_result_bytes.map(|n| n as usize),
        token: given.token,
        keyring: given.keyring.map(Into::into),
        key_secret: given.key_secret.map(Into::into),
        outbox: given.outbox,
    })
}

/// idem's executor over the store at a URL; see the package's `Idem`.
#[napi]
pub struct Engine {
    engine: Arc<idem_engine::Engine>,
}

impl Engine {
    /// The engine, for the middleware built over it.
    pub(crate) fn shared(&self) -> Arc<idem_engine::Engine> {
        Arc::clone(&self.engine)
    }
}

#[napi]
impl Engine {
    /// Opens the store at `url` (connecting to it, for a networked one).
    #[napi(constructor)]
    pub fn new(url: String, options: Option<Options>) -> napi::Result<Self> {
        let options = self::options(options).map_err(to_js)?;
        let engine = idem_engine::Engine::open(&url, options).map_err(to_js)?;
        Ok(Self {
            engine: Arc::new(engine),
        })
    }

    /// The store's URL, its password hidden.
    #[napi(getter)]
    pub fn url(&self) -> String {
        self.engine.url()
    }

    /// Claims `scope`/`key`: a `Run` to do, or the stored result (JSON).
    #[napi]
    pub fn begin<'env>(
        &self,
        env: &'env Env,
        scope: String,
        key: String,
        fingerprint: Option<String>,
        wait_ms: Option<f64>,
    ) -> napi::Result<PromiseRaw<'env, Either<Run, String>>> {
        let local = self.engine.here().map_err(to_js)?;
        let wait = millis("waitMs", wait_ms).map_err(to_js)?;
        let work = Arc::clone(&local);
        let begin = async move {
            work.begin(
                &scope,
                &key,
                fingerprint.as_deref().map(str::as_bytes),
                wait,
            )
            .await
        };
        promise(env, &local, begin, |begun| {
            Ok(match begun {
                Begin::Run(run) => Either::A(Run::new(run)),
                Begin::Replayed(json) => Either::B(text(json)),
            })
        })
    }

    /// The record of `scope`/`key` as JSON (as `idem serve`'s
    /// `GET /v1/record` answers), or `null`.
    #[napi]
    pub fn record<'env>(
        &self,
        env: &'env Env,
        scope: String,
        key: String,
    ) -> napi::Result<PromiseRaw<'env, Option<String>>> {
        let local = self.engine.here().map_err(to_js)?;
        let work = Arc::clone(&local);
        let record = async move { work.record(&scope, &key).await };
        promise(env, &local, record, |record| Ok(record.map(text)))
    }
}

/// The fingerprint (hex SHA-256 of the canonical JSON) of `json`, as the
/// engine computes it for a claim.
#[napi]
pub fn fingerprint(json: String) -> napi::Result<String> {
    idem::Fingerprint::of_json(json.as_bytes())
        .map(|f| f.to_hex())
        .map_err(|e| {
            to_js(EngineError::Json {
                what: "the fingerprint",
                reason: e.to_string(),
            })
        })
}

//! [`ConsumeOptions`]: which scope a consumer runs its deliveries in,
//! where their keys come from, and its retry bounds.

use std::time::Duration;

use idem::derive::json::JsonKey;
use idem::Scope;
use idem_consumer::{Consumer, KeyExtractor, KeySource};

use crate::error::EngineError;
use crate::local::Local;
use crate::store::AnyStore;

/// How a consumer runs its deliveries; unset: the consumer layer's
/// defaults (keys from the `Idempotency-Key` header, then the broker's
/// message id; payloads fingerprinted; retries 100 ms to 5 minutes apart).
#[derive(Debug, Clone, Default)]
pub struct ConsumeOptions {
    /// The scope of the keys (usually the queue's purpose: `orders`).
    pub scope: String,
    /// Where keys come from, tried in order: `header:NAME`, `message_id`,
    /// a JSON pointer into the payload (`/order_id`), `fields:/a,/b` (a
    /// hash of those fields), `composite:/a,/b` (their values joined), or
    /// `content_hash`.
    pub keys: Option<Vec<String>>,
    /// Whether a key reused with another payload is dead-lettered.
    pub fingerprint: Option<bool>,
    /// The consumer's name in dead-letter headers and logs (default: the
    /// scope).
    pub name: Option<String>,
    /// The shortest delay before a retried delivery.
    pub min_retry_delay: Option<Duration>,
    /// The longest delay before a retried delivery.
    pub max_retry_delay: Option<Duration>,
}

fn source(spec: &str) -> Result<KeySource, EngineError> {
    Ok(match spec {
        "message_id" => KeySource::MessageId,
        "content_hash" => KeySource::ContentHash,
        json if json.starts_with('/')
            || json.starts_with("fields:")
            || json.starts_with("composite:") =>
        {
            KeySource::from(
                json.parse::<JsonKey>()
                    .map_err(|e| EngineError::Config(format!("key source {json:?}: {e}")))?,
            )
        }
        other => match other.strip_prefix("header:") {
            Some(name) if !name.is_empty() => KeySource::Header(name.to_owned()),
            _ => {
                return Err(EngineError::Config(format!(
                    "key source {other:?}: use \"header:NAME\", \"message_id\", a JSON pointer \
                     (\"/order_id\") or \"content_hash\""
                )))
            }
        },
    })
}

impl ConsumeOptions {
    /// The consumer layer over `local`'s executor.
    pub(crate) fn consumer(&self, local: &Local) -> Result<Consumer<AnyStore>, EngineError> {
        let scope = Scope::new(&self.scope)?;
        let mut builder = Consumer::builder(local.idem().clone(), scope);
        if let Some(specs) = &self.keys {
            let mut sources = specs.iter().map(|s| source(s));
            let first = sources.next().ok_or_else(|| {
                EngineError::Config("keys: name at least one key source".to_owned())
            })??;
            let mut keys = KeyExtractor::new(first);
            for next in sources {
                keys = keys.or(next?);
            }
            builder = builder.keys(keys);
        }
        if let Some(on) = self.fingerprint {
            builder = builder.fingerprint(on);
        }
        if let Some(name) = &self.name {
            builder = builder.name(name.clone());
        }
        if self.min_retry_delay.is_some() || self.max_retry_delay.is_some() {
            let min = self.min_retry_delay.unwrap_or(Duration::from_millis(100));
            let max = self.max_retry_delay.unwrap_or(Duration::from_secs(300));
            if min > max {
                return Err(EngineError::Config(format!(
                    "the shortest retry delay ({min:?}) is longer than the longest ({max:?})"
                )));
            }
            builder = builder.retry_delay(min, max);
        }
        Ok(builder.build())
    }
}

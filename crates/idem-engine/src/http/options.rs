//! [`HttpOptions`]: what an adapter's middleware covers and how, and the
//! tower layer built from them over an engine's store.

use std::time::Duration;

use http::{HeaderName, Method};
use idem::blob::Blobs;
use idem::derive::json::JsonKey;
use idem_http::{FingerprintRule, IdempotencyLayer, IdempotencyLayerBuilder, Webhook, WebhookKind};

use super::message::{Route, Tenant};
use crate::error::EngineError;
use crate::local::Local;
use crate::store::{AnyStore, BlobUrl};

/// What a request's fingerprint covers; a key reused with another
/// fingerprint is answered 422.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HttpFingerprint {
    /// Method, path, query and body, a JSON body canonicalised first
    /// (`request`, the default).
    #[default]
    Request,
    /// Method and path, plus only these JSON-pointer fields of the body
    /// (`/amount`).
    JsonFields(Vec<String>),
    /// None: any request under a used key gets the stored answer (`off`).
    Off,
}

impl std::str::FromStr for HttpFingerprint {
    type Err = EngineError;

    fn from_str(name: &str) -> Result<Self, EngineError> {
        match name {
            "request" => Ok(Self::Request),
            "off" => Ok(Self::Off),
            other => Err(EngineError::Config(format!(
                "fingerprint {other:?}: use \"request\", \"off\" or a list of JSON pointers \
                 (\"/amount\")"
            ))),
        }
    }
}

/// How the middleware treats requests; `Default` is the tower layer's
/// defaults (POST and PATCH covered, keys optional, the whole request
/// fingerprinted, 1 MiB bodies, 409 at once for a duplicate in flight
/// unless it sends `Prefer: wait=N`, up to 10 s). The lease and the
/// retention are the engine's.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// The methods covered (default POST and PATCH).
    pub methods: Option<Vec<String>>,
    /// The key header (default `Idempotency-Key`).
    pub header: Option<String>,
    /// Whether a covered request without a key is refused with 400
    /// (default: passed through unguarded).
    pub required: bool,
    /// What the fingerprint covers.
    pub fingerprint: HttpFingerprint,
    /// Whether keys are scoped per tenant: each request then carries its
    /// verified caller in [`HttpRequest::tenant`](super::HttpRequest::tenant)
    /// (hashed before it is stored; a request without one is `anonymous`),
    /// so no caller can replay another's response.
    pub tenant: bool,
    /// The largest request body read, in bytes (413 beyond).
    pub max_request_bytes: Option<usize>,
    /// The largest response stored, in bytes (larger ones are answered
    /// once and the key closed).
    pub max_response_bytes: Option<usize>,
    /// The longest a duplicate in flight is held for with `Prefer: wait`.
    pub max_wait: Option<Duration>,
    /// How long a duplicate in flight waits without `Prefer: wait`.
    pub default_wait: Option<Duration>,
    /// Whether a key whose earlier attempt died mid-request runs again
    /// (default: answered 422 `outcome-unknown` until released).
    pub forward_takeovers: bool,
    /// Whether UUIDv7 keys older than the retention are refused (422).
    pub reject_old_uuid_v7: bool,
    /// What is stored of responses for replays, per path prefix, in the
    /// gateway's `--keep` form (`status-only;/v1/users=redacted:/ssn`);
    /// default: everything.
    pub keep: Option<String>,
    /// Where a request without the key header has its key in its JSON
    /// body, as the gateway's `--key-in-body`: a JSON pointer (`/id`),
    /// `composite:/a,/b` or `fields:/a,/b` (a hash of those fields).
    pub key_in_body: Option<String>,
    /// A webhook sender whose signatures are checked before a key is
    /// claimed, as the gateway's `--webhook` (see [`webhook`]).
    pub webhook: Option<Webhook>,
    /// Serve MCP tool calls keyed by this tool argument, as the
    /// gateway's `--mcp` (`idempotency_key`).
    pub mcp: Option<String>,
    /// Where bodies kept by `reference` go, as the gateway's `--blobs`
    /// (`dir:PATH`, `postgres://…`, `s3://…`); default: a directory beside
    /// the embedded store's file, or the PostgreSQL store's database.
    pub blobs: Option<String>,
}

/// The webhook sender named `kind` (`standard`, `stripe`, `github`)
/// signing with `secret`, for [`HttpOptions::webhook`]; both are needed
/// or neither.
pub fn webhook(kind: Option<&str>, secret: Option<&str>) -> Result<Option<Webhook>, EngineError> {
    let (kind, secret) = match (kind, secret) {
        (None, None) => return Ok(None),
        (Some(kind), Some(secret)) => (kind, secret),
        (Some(_), None) => return Err(invalid("webhook", "give its signing secret as well")),
        (None, Some(_)) => return Err(invalid("webhook secret", "name the sender as well")),
    };
    let kind: WebhookKind = kind.parse().map_err(|e| invalid("webhook", e))?;
    Webhook::new(kind, secret)
        .map(Some)
        .map_err(|e| invalid("webhook", e))
}

fn invalid(what: &str, reason: impl std::fmt::Display) -> EngineError {
    EngineError::Config(format!("{what}: {reason}"))
}

impl HttpOptions {
    /// The blob store named by `blobs`, else the one beside the store
    /// ([`AnyStore::blobs_beside`]); a layer that keeps bodies by reference
    /// without one is refused when it is built.
    fn open_blobs(&self, local: &Local, reference: bool) -> Result<Option<Blobs>, EngineError> {
        let Some(url) = &self.blobs else {
            return local
                .idem()
                .store()
                .blobs_beside(reference)
                .map_err(|e| invalid("blobs", idem::error_chain(&e)));
        };
        let url: BlobUrl = url.parse().map_err(|e| invalid("blobs", e))?;
        let opened = match url.open_local() {
            Some(opened) => opened,
            None if tokio::runtime::Handle::try_current().is_ok() => {
                return Err(invalid(
                    "blobs",
                    "a networked blob store is opened when the middleware is made, not from \
                     async code",
                ))
            }
            None => local.block_on(url.open()),
        };
        opened
            .map(Some)
            .map_err(|e| invalid("blobs", idem::error_chain(&e)))
    }

    /// Where keys are read from besides the header: a JSON body source, a
    /// webhook sender or MCP tool calls, at most one of them (each decides
    /// where keys are).
    fn key_placement(
        &self,
        builder: IdempotencyLayerBuilder<AnyStore>,
    ) -> Result<IdempotencyLayerBuilder<AnyStore>, EngineError> {
        let given = [
            ("key_in_body", self.key_in_body.is_some()),
            ("webhook", self.webhook.is_some()),
            ("mcp", self.mcp.is_some()),
        ];
        if given.iter().filter(|(_, set)| *set).count() > 1 {
            return Err(EngineError::Config(
                "key_in_body, webhook and mcp each decide where keys are: give one of them"
                    .to_owned(),
            ));
        }
        if let Some(spec) = &self.key_in_body {
            let source: JsonKey = spec.parse().map_err(|e| invalid("key_in_body", e))?;
            return Ok(builder.key_in_body(source));
        }
        if let Some(webhook) = &self.webhook {
            return Ok(builder.webhook(webhook.clone()));
        }
        match &self.mcp {
            Some(_) if self.fingerprint != HttpFingerprint::default() => Err(invalid(
                "mcp",
                "MCP tool calls are fingerprinted by their tool and arguments; leave fingerprint \
                 unset",
            )),
            Some(argument) => Ok(builder.mcp(argument)),
            None => Ok(builder),
        }
    }

    /// The tower layer over `local`'s store, lease and retention; refused
    /// over a remote `idem serve`.
    pub(crate) fn layer(&self, local: &Local) -> Result<IdempotencyLayer<AnyStore>, EngineError> {
        let idem = local.idem();
        if matches!(idem.store(), AnyStore::Remote(_)) {
            // Its claim API stores JSON results; the layer stores
            // responses as bytes, and would find out only after the
            // handler ran.
            return Err(EngineError::Config(
                "the HTTP middleware cannot store responses through a remote idem serve (it \
                 keeps JSON results only): open the store itself (sqlite:, redis://, \
                 postgres://), or put the idem gateway in front of the service"
                    .to_owned(),
            ));
        }
        let mut builder = IdempotencyLayer::builder(idem.store().clone())
            .lease(idem.lease())
            .retention(idem.retention())
            .required(self.required)
            .forward_takeovers(self.forward_takeovers)
            .reject_old_uuid_v7(self.reject_old_uuid_v7)
            .fingerprint(match &self.fingerprint {
                HttpFingerprint::Request => FingerprintRule::Request,
                HttpFingerprint::JsonFields(fields) => FingerprintRule::JsonFields(fields.clone()),
                HttpFingerprint::Off => FingerprintRule::Off,
            })
            .route(|parts| {
                parts
                    .extensions
                    .get::<Route>()
                    .map_or_else(|| parts.uri.path().to_owned(), |route| route.0.clone())
            });
        if let Some(keep) = &self.keep {
            let rules = idem_http::KeepRules::parse(keep).map_err(|e| invalid("keep", e))?;
            if let Some(blobs) = self.open_blobs(local, rules.any_reference())? {
                builder = builder.blobs(blobs);
            }
            builder = builder.keep_rules(rules);
        } else if let Some(blobs) = self.open_blobs(local, false)? {
            builder = builder.blobs(blobs);
        }
        if let Some(keyring) = idem.at_rest().keyring() {
            builder = builder.keyring(keyring.clone());
        }
        if let Some(hasher) = idem.key_hasher() {
            builder = builder.hash_keys(hasher.clone());
        }
        if self.tenant {
            builder = builder.tenant(|parts| {
                parts
                    .extensions
                    .get::<Tenant>()
                    .map(|tenant| tenant.0.clone())
            });
        }
        if let Some(methods) = &self.methods {
            let methods = methods
                .iter()
                .map(|m| {
                    Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                        .map_err(|e| invalid(&format!("the method {m:?}"), e))
                })
                .collect::<Result<Vec<_>, _>>()?;
            builder = builder.methods(methods);
        }
        if let Some(header) = &self.header {
            let name = HeaderName::from_bytes(header.as_bytes())
                .map_err(|e| invalid(&format!("the header name {header:?}"), e))?;
            builder = builder.header(name);
        }
        if let Some(bytes) = self.max_request_bytes {
            builder = builder.max_request_bytes(bytes);
        }
        if let Some(bytes) = self.max_response_bytes {
            builder = builder.max_response_bytes(bytes);
        }
        if let Some(wait) = self.max_wait {
            builder = builder.max_wait(wait);
        }
        builder = self.key_placement(builder)?;
        if let Some(wait) = self.default_wait {
            builder = builder.default_wait(wait);
        }
        builder
            .build()
            .map_err(|e| EngineError::Config(e.to_string()))
    }
}

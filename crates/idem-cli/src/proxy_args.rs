//! `idem proxy`'s settings: flags, `IDEM_*` variables and the `--config`
//! file, checked into a [`ProxyConfig`](crate::proxy::ProxyConfig).

use std::path::PathBuf;

use http::{HeaderName, Method, Uri};
use serde::Deserialize;

use crate::{duration, forwarded, proxy, tls, wait};

/// `idem proxy` settings. Each comes from its flag, else its `IDEM_*`
/// environment variable, else the `--config` TOML file (same names, with
/// underscores: `upstream = "http://127.0.0.1:3000"`), else the default.
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyArgs {
    /// A TOML file with any of these settings.
    #[arg(long, env = "IDEM_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Where the gateway listens [default: 127.0.0.1:8080].
    #[arg(long, env = "IDEM_LISTEN")]
    pub listen: Option<String>,
    /// Serve HTTPS with this certificate chain (PEM, leaf first), read
    /// again on SIGHUP; needs --tls-key. HTTP/2 and HTTP/1.1 are offered.
    #[arg(long, env = "IDEM_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert, read again on SIGHUP.
    #[arg(long, env = "IDEM_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The service behind the gateway, e.g. `http://127.0.0.1:3000` or
    /// `https://orders.internal`.
    #[arg(long, env = "IDEM_UPSTREAM")]
    pub upstream: Option<String>,
    /// PEM certificates of a private CA to trust for an https://
    /// upstream, besides the platform's roots.
    #[arg(long, env = "IDEM_UPSTREAM_CA")]
    pub upstream_ca: Option<PathBuf>,
    /// Speak HTTP/2 only to the upstream: h2c (prior knowledge) to an
    /// http:// one, as gRPC servers expect. https:// upstreams get HTTP/2
    /// whenever they offer it, without this [default: false].
    #[arg(long, env = "IDEM_UPSTREAM_HTTP2", num_args = 0..=1, default_missing_value = "true")]
    pub upstream_http2: Option<bool>,
    /// Where /metrics and /healthz are served [default: 127.0.0.1:9090;
    /// "off" for none].
    #[arg(long, env = "IDEM_ADMIN_LISTEN")]
    pub admin_listen: Option<String>,
    /// Serve the operator console on the admin listener, at `/console`,
    /// to whoever signs in with this token (16 characters or more;
    /// `openssl rand -hex 16` makes one). Prefer the variable or the
    /// config file to the flag, which other users can read in `ps`
    /// [default: no console].
    #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// How often the console's charts sample the gateway's metrics
    /// [default: 10s].
    #[arg(long, env = "IDEM_CONSOLE_EVERY")]
    pub console_every: Option<String>,
    /// The store (as the global --store; this one also reads the file).
    #[arg(skip)]
    pub store: Option<String>,
    /// Covered methods, comma-separated [default: POST,PATCH].
    #[arg(long, env = "IDEM_METHODS")]
    pub methods: Option<String>,
    /// The key header [default: Idempotency-Key].
    #[arg(long, env = "IDEM_HEADER")]
    pub header: Option<String>,
    /// Refuse covered requests without a key (400).
    #[arg(long, env = "IDEM_REQUIRE_KEY", num_args = 0..=1, default_missing_value = "true")]
    pub require_key: Option<bool>,
    /// For requests without the key header, where their JSON body holds
    /// the key: a JSON pointer (`/id`, Stripe's event id),
    /// `composite:/order,/step` (the fields' values joined with `:`), or
    /// `fields:/account,/amount` (a hash of those fields, for senders
    /// that send no id). The body is read before the key is known; a body
    /// without it is a request without a key [default: none].
    #[arg(long, env = "IDEM_KEY_IN_BODY")]
    pub key_in_body: Option<String>,
    /// Verify a webhook sender's signatures before a key is claimed, and
    /// read keys only from what it signed: `standard` (Standard Webhooks:
    /// `webhook-id`), `stripe` (the event's `id` in the body) or `github`
    /// (the SHA-256 of the body: GitHub does not sign its delivery id).
    /// Every covered request must be signed; one whose signature does not
    /// check out gets 400 `bad-signature` and uses no key. Needs
    /// --webhook-secret-file [default: none].
    #[arg(long, env = "IDEM_WEBHOOK", requires = "webhook_secret_file")]
    pub webhook: Option<String>,
    /// The file holding the webhook signing secret (`whsec_…`; a trailing
    /// newline is ignored).
    #[arg(long, env = "IDEM_WEBHOOK_SECRET_FILE", requires = "webhook")]
    pub webhook_secret_file: Option<PathBuf>,
    /// Serve MCP tool calls (JSON-RPC over streamable HTTP): a
    /// `tools/call` whose arguments carry the key in this argument
    /// (`--mcp` alone: `idempotency_key`) runs once per key, and its
    /// replay answers the retry's JSON-RPC id with
    /// `"_meta": {"io.idem/replayed": true}` in the result; other messages
    /// pass through, and a duplicate of a running call waits for its
    /// result (up to --max-wait) [default: off].
    #[arg(long, env = "IDEM_MCP", num_args = 0..=1, default_missing_value = idem_http::MCP_KEY_ARGUMENT)]
    pub mcp: Option<String>,
    /// Fingerprint only these JSON pointers of a covered request's body,
    /// comma-separated (with its method and path), instead of the whole
    /// request: a retry whose other fields differ (a timestamp) is then a
    /// replay, not 422 [default: the method, path, query and whole body].
    #[arg(long, env = "IDEM_FINGERPRINT_FIELDS")]
    pub fingerprint_fields: Option<String>,
    /// Separate keys per value of this header, so no client can replay
    /// another's response. Use one that stays the same between a request
    /// and its retries, set by your authentication proxy (e.g.
    /// x-account-id), not a bearer token that is refreshed.
    #[arg(long, env = "IDEM_TENANT_HEADER")]
    pub tenant_header: Option<String>,
    /// How long completed keys are remembered [default: 24h].
    #[arg(long, env = "IDEM_RETENTION")]
    pub retention: Option<String>,
    /// How long a claim lasts without a heartbeat [default: 30s].
    #[arg(long, env = "IDEM_LEASE")]
    pub lease: Option<String>,
    /// The largest request body on covered methods, bytes [default: 1048576].
    #[arg(long, env = "IDEM_MAX_REQUEST_BYTES")]
    pub max_request_bytes: Option<usize>,
    /// The largest response body stored, bytes [default: 1048576].
    #[arg(long, env = "IDEM_MAX_RESPONSE_BYTES")]
    pub max_response_bytes: Option<usize>,
    /// Pass requests through unguarded when the store is unreachable.
    #[arg(long, env = "IDEM_FAIL_OPEN", num_args = 0..=1, default_missing_value = "true")]
    pub fail_open: Option<bool>,
    /// How long the upstream may take to answer a covered request, head
    /// and body, before 502 [default: 60s]. The request was sent, so its
    /// key is kept with an unknown outcome (never sent twice); `idem
    /// release` it after checking the upstream. This, not a gRPC client's
    /// deadline, bounds a covered call; requests passed through are not
    /// bounded (downloads, streams).
    #[arg(long, env = "IDEM_UPSTREAM_TIMEOUT")]
    pub upstream_timeout: Option<String>,
    /// When a key's earlier request stopped without an outcome (a gateway
    /// died mid-request), forward it again instead of answering 422
    /// outcome-unknown [default: false]. Only for upstreams that
    /// deduplicate on the forwarded Idempotency-Key themselves.
    #[arg(long, env = "IDEM_FORWARD_TAKEOVERS", num_args = 0..=1, default_missing_value = "true")]
    pub forward_takeovers: Option<bool>,
    /// Ask this URL of the upstream whether a request whose outcome is
    /// unknown took effect, when a retry of its key arrives, instead of
    /// answering 422 outcome-unknown until someone runs `idem release`:
    /// `GET URL` with the key, `Idem-Method` and `Idem-Path`; the answer's
    /// `Idempotency-Outcome: applied` (the answer is the response to
    /// replay) or `not-applied` (the retry runs) settles the key.
    #[arg(long, env = "IDEM_RECONCILE")]
    pub reconcile: Option<String>,
    /// With --reconcile, also sweep the store this often for keys whose
    /// outcome is unknown and ask about them before any retry comes (up to
    /// 100 keys a sweep, taking turns); 0 only asks when a retry arrives.
    /// Not with --key-secret: the upstream would be asked about the hash
    /// [default: 60s].
    #[arg(long, env = "IDEM_RECONCILE_EVERY")]
    pub reconcile_every: Option<String>,
    /// How long keys whose records expired are remembered, so a retry that
    /// comes after the retention is answered 410 key-expired instead of
    /// run again (the same key with another request still runs); 0 turns
    /// it off. The store URL's own `remember=` wins; the setting is kept in
    /// the store, so this overrides what another process set. SQLite,
    /// memory, PostgreSQL and MySQL remember unless told; Redis, which
    /// keeps the memory in RAM, when this flag (or its URL) says so; on
    /// others this gateway warns that late retries run again [default:
    /// 30d].
    #[arg(long, env = "IDEM_REMEMBER_EXPIRED")]
    pub remember_expired: Option<String>,
    /// Refuse keys that are UUIDv7s older than the retention with 410
    /// key-too-old: a retry that late may belong to a request whose record
    /// has expired [default: false].
    #[arg(long, env = "IDEM_REJECT_OLD_UUID_V7", num_args = 0..=1, default_missing_value = "true")]
    pub reject_old_uuid_v7: Option<bool>,
    /// The longest a duplicate of a running request that asks
    /// `Prefer: wait=N` is held for its outcome; 0 ignores the preference
    /// [default: 10s].
    #[arg(long, env = "IDEM_MAX_WAIT")]
    pub max_wait: Option<String>,
    /// How long a duplicate of a running request is held for its outcome
    /// when it does not ask [default: 0, answer 409 at once].
    #[arg(long, env = "IDEM_DEFAULT_WAIT")]
    pub default_wait: Option<String>,
    /// Memory for replaying responses this gateway stored without asking
    /// the store, bytes; 0 turns it off [default: 67108864].
    #[arg(long, env = "IDEM_REPLAY_CACHE_BYTES")]
    pub replay_cache_bytes: Option<usize>,
    /// The longest a response is replayed from memory (never past the
    /// retention): a record deleted by `idem release` elsewhere may be
    /// replayed here this long; 0 turns it off [default: 60s].
    #[arg(long, env = "IDEM_REPLAY_CACHE_TTL")]
    pub replay_cache_ttl: Option<String>,
    /// Keep the client's Forwarded and X-Forwarded-* headers and add this
    /// hop to them, for a gateway behind a proxy that sets them; otherwise
    /// they are replaced by what this gateway saw [default: false].
    #[arg(long, env = "IDEM_TRUST_FORWARDED", num_args = 0..=1, default_missing_value = "true")]
    pub trust_forwarded: Option<bool>,
    /// Send the client's Host header to the upstream; false sends the
    /// upstream's own host:port [default: true for an http:// upstream
    /// spoken to in HTTP/1.1, false for https:// and --upstream-http2,
    /// whose TLS name and :authority a client's Host would contradict].
    #[arg(long, env = "IDEM_PRESERVE_HOST", num_args = 0..=1, default_missing_value = "true")]
    pub preserve_host: Option<bool>,
    /// Stored response headers left out of replays, comma-separated
    /// (e.g. x-request-id); replays always carry a Date of their own, and
    /// leave out Set-Cookie unless --replay-set-cookie [default: none].
    #[arg(long, env = "IDEM_REPLAY_DROP_HEADERS")]
    pub replay_drop_headers: Option<String>,
    /// Replay the stored Set-Cookie headers: a session cookie given to
    /// the first answer is then handed to anyone who sends the same key
    /// and body again [default: false].
    #[arg(long, env = "IDEM_REPLAY_SET_COOKIE", num_args = 0..=1, default_missing_value = "true")]
    pub replay_set_cookie: Option<bool>,
    /// For gRPC calls without an idempotency-key metadata entry, the
    /// number of the request message's top-level string field that holds
    /// the key (AIP-155's `request_id`, e.g. `string request_id = 3;`),
    /// per method (`/shop.Orders/Create=3`, comma-separated) or, as a
    /// bare number, for every method (only for services whose methods are
    /// all unary: such a call's request stream is read to its end before
    /// it is passed on) [default: none].
    #[arg(long, env = "IDEM_GRPC_REQUEST_ID_FIELD")]
    pub grpc_request_id_field: Option<String>,
    /// What is stored of a response for its replays: `full`;
    /// `status-only` (no body; `status-only:location,etag` keeps those
    /// headers); `redacted:` and JSON pointers and header names whose
    /// values are replaced (`redacted:/card/number,x-api-key`);
    /// `reference` (bodies over 64 KiB, or `reference:1MiB`, kept in the
    /// blob store, see --blobs, and streamed on replay). Per path
    /// prefix as `PREFIX=POLICY`, entries separated by `;`
    /// (`/v1/tokens=status-only;/v1/users=redacted:/ssn`). The client
    /// whose request ran always gets the whole response [default: full].
    #[arg(long, env = "IDEM_KEEP")]
    pub keep: Option<String>,
    /// Where bodies kept by `reference` go: `dir:PATH`, `postgres://…`
    /// (tables of their own), or `s3://BUCKET/PREFIX[?endpoint=URL]`
    /// (the `s3` feature). Also needed to replay records
    /// kept by reference before a policy changed [default: a directory
    /// beside the embedded store's file (`idem.db.blobs`), or the
    /// PostgreSQL store's database].
    #[arg(long, env = "IDEM_BLOBS")]
    pub blobs: Option<String>,
    /// The keyring (as the global --keyring; this one also reads the
    /// file).
    #[arg(skip)]
    pub keyring: Option<PathBuf>,
    /// The key-hashing secret (as the global --key-secret; this one also
    /// reads the file).
    #[arg(skip)]
    pub key_secret: Option<PathBuf>,
}

macro_rules! fill {
    ($into:ident, $from:ident; $($field:ident),*) => {
        $( if $into.$field.is_none() { $into.$field = $from.$field; } )*
    };
}

impl ProxyArgs {
    /// Fills unset settings from the `--config` file, if any.
    pub fn with_file(mut self) -> anyhow::Result<Self> {
        let Some(path) = self.config.clone() else {
            return Ok(self);
        };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("cannot read the config file {}: {e}", path.display()))?;
        let file: ProxyArgs = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
        fill!(self, file; listen, tls_cert, tls_key, upstream, upstream_ca, upstream_http2, admin_listen, admin_token, console_every, store, methods, header, require_key,
              key_in_body, fingerprint_fields, webhook, webhook_secret_file, mcp,
              tenant_header, retention, lease, max_request_bytes, max_response_bytes, fail_open,
              upstream_timeout, forward_takeovers, reconcile, reconcile_every, remember_expired, reject_old_uuid_v7,
              max_wait, default_wait,
              replay_cache_bytes, replay_cache_ttl, trust_forwarded, preserve_host,
              replay_drop_headers, replay_set_cookie, grpc_request_id_field, keep, blobs, keyring,
              key_secret);
        Ok(self)
    }

    /// The console `--admin-token` asks for, with charts of `metrics`
    /// (sampled every `--console-every`); `None` without a token.
    pub fn console(
        &self,
        metrics: Option<&metrics_exporter_prometheus::PrometheusHandle>,
    ) -> anyhow::Result<Option<crate::console::Console>> {
        let secrets =
            crate::admin::Secrets::read(self.keyring.as_deref(), self.key_secret.as_deref())?;
        crate::console::Console::from_settings(
            self.admin_token.as_deref(),
            self.console_every.as_deref(),
            secrets,
            metrics,
        )
    }

    /// The blob store, opened: the one `--blobs` names, else the one
    /// beside `store` ([`AnyStore::blobs_beside`](idem_engine::store::AnyStore::blobs_beside));
    /// `None` when there is none and no route needs one.
    pub async fn open_blobs(
        &self,
        store: &idem_engine::store::AnyStore,
        keep: &idem_http::KeepRules,
    ) -> anyhow::Result<Option<idem::blob::Blobs>> {
        let blobs = match self.blobs.as_deref() {
            Some(url) => {
                let url: idem_engine::store::BlobUrl = url.parse()?;
                tracing::info!(blobs = %url, "blob store");
                Some(url.open().await?)
            }
            None => store.blobs_beside(keep.any_reference())?,
        };
        if blobs.is_none() && keep.any_reference() {
            anyhow::bail!(
                "--keep keeps bodies by reference: name a blob store with --blobs \
                 (dir:PATH, postgres://… or s3://BUCKET/PREFIX)"
            );
        }
        Ok(blobs)
    }

    /// The gateway's settings, checked.
    pub fn proxy_config(&self) -> anyhow::Result<proxy::ProxyConfig> {
        let upstream: Uri = self
            .upstream
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("--upstream is required (e.g. http://127.0.0.1:3000)"))?
            .parse()
            .map_err(|e| anyhow::anyhow!("--upstream: {e}"))?;
        anyhow::ensure!(
            matches!(upstream.scheme_str(), Some("http" | "https"))
                && upstream.authority().is_some(),
            "--upstream must be an http:// or https:// URL with a host, got {upstream}"
        );
        let methods = self
            .methods
            .as_deref()
            .unwrap_or("POST,PATCH")
            .split(',')
            .map(|m| {
                Method::from_bytes(m.trim().to_ascii_uppercase().as_bytes())
                    .map_err(|_| anyhow::anyhow!("--methods: {m:?} is not an HTTP method"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let header_name = |flag: &str, v: &str| {
            HeaderName::from_bytes(v.trim().as_bytes())
                .map_err(|_| anyhow::anyhow!("{flag}: {v:?} is not a header name"))
        };
        // An https:// or HTTP/2 upstream routes by the name it was
        // reached by (SNI, :authority), which a client's Host would
        // contradict; the client's still reaches it in X-Forwarded-Host.
        let plain_http1 =
            upstream.scheme_str() == Some("http") && !self.upstream_http2.unwrap_or(false);
        Ok(proxy::ProxyConfig {
            upstream,
            upstream_protocol: crate::upstream::UpstreamProtocol {
                ca_file: self.upstream_ca.clone(),
                http2_only: self.upstream_http2.unwrap_or(false),
            },
            methods,
            header: header_name(
                "--header",
                self.header.as_deref().unwrap_or("idempotency-key"),
            )?,
            require_key: self.require_key.unwrap_or(false),
            key_in_body: self
                .key_in_body
                .as_deref()
                .map(|spec| {
                    spec.parse::<idem::derive::json::JsonKey>()
                        .map_err(|e| anyhow::anyhow!("--key-in-body: {e}"))
                })
                .transpose()?,
            webhook: self.webhook()?,
            mcp: self.mcp_argument()?,
            fingerprint_fields: self
                .fingerprint_fields
                .as_deref()
                .map(fingerprint_fields)
                .transpose()?,
            tenant_header: self
                .tenant_header
                .as_deref()
                .map(|h| header_name("--tenant-header", h))
                .transpose()?,
            // The layer's defaults, so the gateway and the layer agree.
            retention: match self.retention.as_deref() {
                Some(text) => duration("--retention", text)?,
                None => idem::DEFAULT_RETENTION,
            },
            lease: match self.lease.as_deref() {
                Some(text) => duration("--lease", text)?,
                None => idem::DEFAULT_LEASE,
            },
            max_request_bytes: self
                .max_request_bytes
                .unwrap_or(idem_http::DEFAULT_MAX_REQUEST_BYTES),
            max_response_bytes: self
                .max_response_bytes
                .unwrap_or(idem::DEFAULT_MAX_RESPONSE_BYTES),
            fail_open: self.fail_open.unwrap_or(false),
            upstream_timeout: duration(
                "--upstream-timeout",
                self.upstream_timeout.as_deref().unwrap_or("60s"),
            )?,
            forward_takeovers: self.forward_takeovers.unwrap_or(false),
            reconcile: self
                .reconcile
                .as_deref()
                .map(|url| url.parse().map_err(|e| anyhow::anyhow!("--reconcile: {e}")))
                .transpose()?,
            reconcile_every: match self.reconcile_every.as_deref().unwrap_or("60s") {
                "0" => None,
                every => Some(duration("--reconcile-every", every)?),
            },
            reject_old_uuid_v7: self.reject_old_uuid_v7.unwrap_or(false),
            max_wait: match self.max_wait.as_deref() {
                Some(text) => wait("--max-wait", text)?,
                None => idem_http::DEFAULT_MAX_WAIT,
            },
            default_wait: wait(
                "--default-wait",
                self.default_wait.as_deref().unwrap_or("0"),
            )?,
            replay_cache_bytes: self
                .replay_cache_bytes
                .unwrap_or(idem::DEFAULT_REPLAY_CACHE_BYTES),
            replay_cache_ttl: match self.replay_cache_ttl.as_deref() {
                Some(text) => wait("--replay-cache-ttl", text)?,
                None => idem::DEFAULT_REPLAY_CACHE_TTL,
            },
            replay_drop_headers: self
                .replay_drop_headers
                .as_deref()
                .unwrap_or("")
                .split(',')
                .filter(|h| !h.trim().is_empty())
                .map(|h| header_name("--replay-drop-headers", h))
                .collect::<anyhow::Result<_>>()?,
            replay_set_cookie: self.replay_set_cookie.unwrap_or(false),
            grpc_request_id_fields: self
                .grpc_request_id_field
                .as_deref()
                .unwrap_or("")
                .split(',')
                .filter(|f| !f.trim().is_empty())
                .map(request_id_field)
                .collect::<anyhow::Result<_>>()?,
            keep: idem_http::KeepRules::parse(self.keep.as_deref().unwrap_or(""))
                .map_err(|e| anyhow::anyhow!("--keep: {e}"))?,
            blobs: None,
            keyring: self
                .keyring
                .as_deref()
                .map(idem::codec::Keyring::from_file)
                .transpose()
                .map_err(|e| anyhow::anyhow!("--keyring: {e}"))?,
            key_hasher: self
                .key_secret
                .as_deref()
                .map(idem::key_hash::KeyHasher::from_file)
                .transpose()
                .map_err(|e| anyhow::anyhow!("--key-secret: {e}"))?,
            forwarded: forwarded::ForwardedPolicy {
                trust_incoming: self.trust_forwarded.unwrap_or(false),
                preserve_host: self.preserve_host.unwrap_or(plain_http1),
            },
            tls: match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => Some(tls::TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                }),
                (None, None) => None,
                _ => anyhow::bail!("--tls-cert and --tls-key go together: give both or neither"),
            },
        })
    }
}

/// One `--grpc-request-id-field` entry: `N` (every method) or
/// `/package.Service/Method=N`.
fn request_id_field(entry: &str) -> anyhow::Result<(Option<String>, u32)> {
    let entry = entry.trim();
    let (method, number) = match entry.rsplit_once('=') {
        Some((method, number)) => (Some(method.trim()), number.trim()),
        None => (None, entry),
    };
    let field = number
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=536_870_911).contains(n))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--grpc-request-id-field {entry:?}: {number:?} is not a protobuf field number \
                 (1 to 536870911)"
            )
        })?;
    match method {
        Some(path) if !path.starts_with('/') || path[1..].split('/').count() != 2 => {
            anyhow::bail!(
                "--grpc-request-id-field {entry:?}: {path:?} is not a gRPC method path \
                 (/package.Service/Method)"
            )
        }
        method => Ok((method.map(str::to_owned), field)),
    }
}

impl ProxyArgs {
    /// The webhook sender of `--webhook`, with the secret read from
    /// `--webhook-secret-file`.
    fn webhook(&self) -> anyhow::Result<Option<idem_http::Webhook>> {
        let (Some(kind), Some(file)) = (&self.webhook, &self.webhook_secret_file) else {
            if self.webhook.is_some() || self.webhook_secret_file.is_some() {
                anyhow::bail!("--webhook and --webhook-secret-file go together");
            }
            return Ok(None);
        };
        if self.key_in_body.is_some() {
            anyhow::bail!(
                "--key-in-body and --webhook: the webhook sender decides where its key is; \
                 give one of them"
            );
        }
        let kind: idem_http::WebhookKind = kind
            .parse()
            .map_err(|e| anyhow::anyhow!("--webhook: {e}"))?;
        let secret = std::fs::read_to_string(file).map_err(|e| {
            anyhow::anyhow!("--webhook-secret-file: cannot read {}: {e}", file.display())
        })?;
        let webhook = idem_http::Webhook::new(kind, &secret)
            .map_err(|e| anyhow::anyhow!("--webhook-secret-file {}: {e}", file.display()))?;
        Ok(Some(webhook))
    }
}

impl ProxyArgs {
    /// The tool argument of `--mcp`, which decides where keys are and
    /// what fingerprints cover, so it goes with no other such setting.
    fn mcp_argument(&self) -> anyhow::Result<Option<String>> {
        let Some(argument) = &self.mcp else {
            return Ok(None);
        };
        let clashes = [
            ("--key-in-body", self.key_in_body.is_some()),
            ("--fingerprint-fields", self.fingerprint_fields.is_some()),
            ("--webhook", self.webhook.is_some()),
        ];
        if let Some((flag, _)) = clashes.iter().find(|(_, set)| *set) {
            anyhow::bail!("--mcp decides where keys are and what fingerprints cover: drop {flag}");
        }
        if argument.trim().is_empty() {
            anyhow::bail!("--mcp: name the tool argument holding the key (e.g. idempotency_key)");
        }
        Ok(Some(argument.trim().to_owned()))
    }
}

/// The JSON pointers of `--fingerprint-fields`.
fn fingerprint_fields(list: &str) -> anyhow::Result<Vec<String>> {
    let fields: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    if fields.is_empty() {
        anyhow::bail!("--fingerprint-fields: name at least one JSON pointer (e.g. /amount)");
    }
    if let Some(bad) = fields.iter().find(|f| !f.starts_with('/')) {
        anyhow::bail!(
            "--fingerprint-fields: {bad:?} is not a JSON pointer (rule: starts with '/')"
        );
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::{fingerprint_fields, request_id_field};

    #[test]
    fn request_id_fields_are_numbers_for_every_method_or_per_method_path() {
        assert_eq!(request_id_field("3").expect("every method"), (None, 3));
        assert_eq!(
            request_id_field(" /shop.Orders/Create = 7 ").expect("one method"),
            (Some("/shop.Orders/Create".to_owned()), 7)
        );
        for bad in [
            "0",
            "x",
            "536870912",
            "Create=3",
            "/shop.Orders=3",
            "/a/b/c=3",
        ] {
            let error = request_id_field(bad).expect_err(bad).to_string();
            assert!(error.contains("--grpc-request-id-field"), "{bad}: {error}");
        }
    }

    #[test]
    fn fingerprint_fields_are_json_pointers() {
        assert_eq!(
            fingerprint_fields("/amount, /to").expect("two"),
            ["/amount", "/to"]
        );
        for bad in ["", " , ", "amount"] {
            let error = fingerprint_fields(bad).expect_err(bad).to_string();
            assert!(error.contains("--fingerprint-fields"), "{bad}: {error}");
        }
    }
}

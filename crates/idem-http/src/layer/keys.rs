//! The builder's settings of where a key is read besides the key header:
//! a gRPC message's `request_id`, a JSON body, a webhook sender, MCP tool
//! calls.

use http::HeaderName;
use idem::derive::json::JsonKey;
use idem::Store;

use super::IdempotencyLayerBuilder;
use crate::webhook::Webhook;

impl<S: Store> IdempotencyLayerBuilder<S> {
    /// Takes the key of a gRPC call that has no key header from field
    /// `field` of its request message, as AIP-155 designs `request_id`
    /// (`string request_id = N;` at the top level of the message, a UUID
    /// the client keeps across its retries), for every method not given
    /// a field of its own by [`grpc_request_id_field_of`]. The header
    /// still wins when both are sent; a call whose message cannot be read
    /// (compressed, not protobuf, more than one message) is refused as a
    /// malformed key.
    ///
    /// Such a call's whole request stream is read before it is passed
    /// on, so use this only when every method of the service is unary
    /// (or server-streaming); name the methods with
    /// [`grpc_request_id_field_of`] otherwise.
    ///
    /// [`grpc_request_id_field_of`]: Self::grpc_request_id_field_of
    pub fn grpc_request_id_field(mut self, field: u32) -> Self {
        self.grpc_request_id.every = Some(field);
        self
    }

    /// Takes the key of calls to the method at `path`
    /// (`/package.Service/Method`) that have no key header from field
    /// `field` of their request message, as
    /// [`grpc_request_id_field`](Self::grpc_request_id_field) does for
    /// every method. Calls to other methods are untouched.
    pub fn grpc_request_id_field_of(mut self, path: impl Into<String>, field: u32) -> Self {
        self.grpc_request_id.methods.insert(path.into(), field);
        self
    }

    /// Takes the key of a request that has no key header from its JSON
    /// body: a field ([`JsonKey::Pointer`], e.g. Stripe's event `/id`),
    /// several fields joined ([`JsonKey::Composite`]), or a hash of chosen
    /// fields ([`JsonKey::Fields`], for requests that carry no id but
    /// whose fields identify them). The header still wins when both are
    /// sent.
    ///
    /// The body is read, within
    /// [`max_request_bytes`](Self::max_request_bytes), before the key is
    /// known. A body without the key is treated as a request without the
    /// header: refused with 400 when keys are
    /// [`required`](Self::required), passed through otherwise; so is a
    /// body that is not JSON (refused naming the parser's complaint). A
    /// value that is there but is not a valid key (an object, a fraction,
    /// a key breaking the key rules) is refused with 400. gRPC calls take their
    /// key from [`grpc_request_id_field`](Self::grpc_request_id_field)
    /// instead.
    ///
    /// With a key from a hash of fields, fingerprint the same fields
    /// ([`FingerprintRule::JsonFields`](crate::FingerprintRule::JsonFields))
    /// when the rest of the body may differ between a request and its
    /// retries (a timestamp, say): otherwise such a retry is refused with
    /// 422 as a reused key.
    pub fn key_in_body(mut self, source: JsonKey) -> Self {
        self.body_key = Some(source);
        self
    }

    /// Serves a webhook sender: every covered request's signature is
    /// checked before a key is claimed, and the key is read only from what
    /// the sender signed (see [`Webhook::key`]), whatever the key header,
    /// [`required`](Self::required) and [`key_in_body`](Self::key_in_body)
    /// say. A request whose signature does not check out is refused with
    /// 400 `bad-signature` and uses no key, so a copy nobody signed can
    /// neither run nor use the key of the event it copies; a captured
    /// delivery sent again is answered from the store.
    ///
    /// ```
    /// use idem_http::{IdempotencyLayer, Webhook, WebhookKind};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    /// let layer = IdempotencyLayer::builder(idem::MemoryStore::new())
    ///     .webhook(Webhook::new(WebhookKind::Standard, secret)?)
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    pub fn webhook(mut self, webhook: Webhook) -> Self {
        self.webhook = Some(webhook);
        self
    }

    /// Serves MCP tool calls (JSON-RPC over MCP's streamable HTTP
    /// transport): a `tools/call` whose arguments carry the key in
    /// `argument` (e.g. [`MCP_KEY_ARGUMENT`](crate::MCP_KEY_ARGUMENT),
    /// `idempotency_key`) runs once per key; any other message
    /// (`initialize`, `tools/list`, a call without the argument) passes
    /// through. The fingerprint covers the method, the tool and its
    /// arguments, not the JSON-RPC id, which differs between a call and
    /// its retry, nor the params' `_meta` (a progress token). These
    /// replace [`key_in_body`](Self::key_in_body) and
    /// [`fingerprint`](Self::fingerprint), in whatever order they are
    /// called.
    ///
    /// A replay answers the retry's own id, and its result carries
    /// `"_meta": {"io.idem/replayed": true}`
    /// ([`MCP_REPLAYED_META`](crate::MCP_REPLAYED_META)), since an agent
    /// sees no headers. Answers in JSON and in an event stream are both
    /// rewritten: tool calls are passed on without `Accept-Encoding`, and
    /// a [`keep`](Self::keep) policy keeping bodies by reference is
    /// refused when the layer is built. The stored `Mcp-Session-Id` is
    /// left out of replays, which may reach another session.
    ///
    /// A duplicate of a call still running waits for its result, up to
    /// [`max_wait`](Self::max_wait), instead of getting a 409 an agent
    /// cannot act on; set [`default_wait`](Self::default_wait) after this
    /// to change that.
    pub fn mcp(mut self, argument: &str) -> Self {
        self.replay_drop
            .push(HeaderName::from_static("mcp-session-id"));
        self.default_wait = self.max_wait;
        self.mcp = Some(argument.to_owned());
        self
    }
}

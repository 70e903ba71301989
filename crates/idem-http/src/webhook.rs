//! Webhooks: where each sender puts its event id, and how its signature
//! is checked before the key is claimed, so a replay nobody signed cannot
//! burn the key of the event it copies.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use http::HeaderMap;
use idem::derive::json::{self, JsonDoc};
use idem::{derive, Key, KeyRules, Timestamp};
use sha2::Sha256;

/// How far a signed timestamp may be from this machine's clock, either
/// way, as Stripe's and Standard Webhooks' libraries default to.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// A webhook sender's conventions: what it signs, and so where its
/// event's key is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WebhookKind {
    /// [Standard Webhooks](https://www.standardwebhooks.com/) (Svix,
    /// OpenAI, Resend, …): the id in `webhook-id`, signed with the secret
    /// `whsec_<base64>` over `id.timestamp.body` in `webhook-signature`.
    Standard,
    /// Stripe: the event's `id` in the JSON body, signed with the
    /// endpoint secret over `timestamp.body` in `Stripe-Signature`.
    Stripe,
    /// GitHub: signed with the secret over the body in
    /// `X-Hub-Signature-256`. GitHub signs neither a timestamp nor its
    /// `X-GitHub-Delivery` id, so deliveries are keyed by the SHA-256 of
    /// the body: a redelivery, or a captured body sent again, is the same
    /// key.
    GitHub,
}

impl std::str::FromStr for WebhookKind {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "standard" => Ok(Self::Standard),
            "stripe" => Ok(Self::Stripe),
            "github" => Ok(Self::GitHub),
            other => Err(format!(
                "webhook sender {other:?}: use \"standard\" (Standard Webhooks), \"stripe\" or \
                 \"github\""
            )),
        }
    }
}

/// Why a webhook secret cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("webhook secret: {0}")]
pub struct WebhookSecretError(String);

/// A webhook sender and its signing secret: given to
/// [`IdempotencyLayerBuilder::webhook`](crate::IdempotencyLayerBuilder::webhook),
/// it decides where the key is read from and refuses, before anything is
/// claimed, a request whose signature does not check out.
///
/// ```
/// use idem_http::{Webhook, WebhookKind};
///
/// let stripe = Webhook::new(WebhookKind::Stripe, "whsec_test_secret").unwrap();
/// # let _ = stripe;
/// ```
#[derive(Clone)]
pub struct Webhook {
    kind: WebhookKind,
    key: Vec<u8>,
    tolerance: Duration,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("kind", &self.kind)
            .field("tolerance", &self.tolerance)
            .finish_non_exhaustive()
    }
}

impl Webhook {
    /// A sender of `kind` signing with `secret` (surrounding whitespace,
    /// such as a secret file's newline, is ignored). A Standard Webhooks
    /// secret is `whsec_` and the base64 of the key; Stripe's and
    /// GitHub's are used as they are.
    pub fn new(kind: WebhookKind, secret: &str) -> Result<Self, WebhookSecretError> {
        let secret = secret.trim();
        if secret.is_empty() {
            return Err(WebhookSecretError("it is empty".into()));
        }
        let key = match kind {
            WebhookKind::Standard => BASE64
                .decode(secret.strip_prefix("whsec_").unwrap_or(secret))
                .map_err(|e| {
                    WebhookSecretError(format!(
                        "a Standard Webhooks secret is whsec_ and base64, but this one is not \
                         base64: {e}"
                    ))
                })?,
            WebhookKind::Stripe | WebhookKind::GitHub => secret.as_bytes().to_vec(),
        };
        Ok(Self {
            kind,
            key,
            tolerance: DEFAULT_TOLERANCE,
        })
    }

    /// How far a signed timestamp may be from this machine's clock
    /// (default [`DEFAULT_TOLERANCE`]); older or newer deliveries are
    /// refused, as a replay of a captured request would be.
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The sender.
    pub fn kind(&self) -> WebhookKind {
        self.kind
    }

    /// The key of a delivery whose signature checked out, read only from
    /// what the sender signed: Standard Webhooks' `webhook-id` (part of
    /// the signed content), Stripe's event `id` in the body, and for
    /// GitHub, whose `X-GitHub-Delivery` is not signed, the SHA-256 of the
    /// body (a redelivery carries the same body). A header a client adds,
    /// such as `Idempotency-Key`, is never used: it could give a captured
    /// delivery a new key.
    pub fn key(&self, headers: &HeaderMap, body: &[u8], rules: &KeyRules) -> Result<Key, String> {
        match self.kind {
            WebhookKind::Standard => {
                let id = header(headers, "webhook-id")?;
                rules
                    .parse(id)
                    .map_err(|e| format!("the webhook-id header: {e}"))
            }
            WebhookKind::Stripe => match json::pointer_key(&mut JsonDoc::new(body), "/id", rules) {
                Ok(Some(key)) => Ok(key),
                Ok(None) => Err("the Stripe event has no id".to_owned()),
                Err(error) => Err(format!("the Stripe event's id: {error}")),
            },
            WebhookKind::GitHub => Ok(derive::bytes_key(body)),
        }
    }

    /// Checks the request's signature at `now`: `Err` says what is wrong,
    /// without revealing what was expected.
    pub fn verify(&self, headers: &HeaderMap, body: &[u8], now: Timestamp) -> Result<(), String> {
        match self.kind {
            WebhookKind::Standard => self.verify_standard(headers, body, now),
            WebhookKind::Stripe => self.verify_stripe(headers, body, now),
            WebhookKind::GitHub => self.verify_github(headers, body),
        }
    }

    fn verify_standard(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: Timestamp,
    ) -> Result<(), String> {
        let id = header(headers, "webhook-id")?;
        let timestamp = header(headers, "webhook-timestamp")?;
        self.check_time(timestamp, now)?;
        let signatures = header(headers, "webhook-signature")?;
        let mac = self.mac(&[id.as_bytes(), b".", timestamp.as_bytes(), b".", body]);
        let matches = signatures
            .split(' ')
            .filter_map(|entry| entry.strip_prefix("v1,"))
            .filter_map(|sig| BASE64.decode(sig).ok())
            .any(|sig| mac.clone().verify_slice(&sig).is_ok());
        if matches {
            Ok(())
        } else {
            Err("no v1 signature in webhook-signature matches the body".into())
        }
    }

    fn verify_stripe(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: Timestamp,
    ) -> Result<(), String> {
        let value = header(headers, "stripe-signature")?;
        let field = |name: &'static str| {
            value
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .filter(move |(k, _)| k.trim() == name)
                .map(|(_, v)| v.trim())
        };
        let timestamp = field("t")
            .next()
            .ok_or("the Stripe-Signature header has no t= timestamp")?;
        self.check_time(timestamp, now)?;
        let mac = self.mac(&[timestamp.as_bytes(), b".", body]);
        let matches = field("v1")
            .filter_map(|sig| hex::decode(sig).ok())
            .any(|sig| mac.clone().verify_slice(&sig).is_ok());
        if matches {
            Ok(())
        } else {
            Err("no v1 signature in Stripe-Signature matches the body".into())
        }
    }

    fn verify_github(&self, headers: &HeaderMap, body: &[u8]) -> Result<(), String> {
        let value = header(headers, "x-hub-signature-256")?;
        let sig = value
            .strip_prefix("sha256=")
            .and_then(|sig| hex::decode(sig).ok())
            .ok_or("X-Hub-Signature-256 is not sha256= and hex digits")?;
        self.mac(&[body])
            .verify_slice(&sig)
            .map_err(|_| "X-Hub-Signature-256 does not match the body".to_owned())
    }

    fn mac(&self, parts: &[&[u8]]) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes a key of any length");
        for part in parts {
            mac.update(part);
        }
        mac
    }

    /// The signed timestamp (seconds since the epoch) is within the
    /// tolerance of `now`.
    fn check_time(&self, timestamp: &str, now: Timestamp) -> Result<(), String> {
        let seconds: u64 = timestamp
            .parse()
            .map_err(|_| format!("the signed timestamp {timestamp:?} is not whole seconds"))?;
        let signed = Timestamp::from_millis(seconds.saturating_mul(1000));
        let apart = if signed > now {
            signed.since(now)
        } else {
            now.since(signed)
        };
        if apart > self.tolerance {
            return Err(format!(
                "the signature's timestamp is {}s from this server's clock, more than the {}s \
                 allowed: a delivery this old is refused as a replay",
                apart.as_secs(),
                self.tolerance.as_secs()
            ));
        }
        Ok(())
    }
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Result<&'h str, String> {
    headers
        .get(name)
        .ok_or_else(|| format!("the {name} header is missing"))?
        .to_str()
        .map_err(|_| format!("the {name} header is not visible ASCII"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (http::HeaderName::from_static(k), v.parse().expect("value")))
            .collect()
    }

    #[test]
    fn github_signs_the_body_as_its_docs_show() {
        // GitHub's documented example ("Validating webhook deliveries").
        let hook = Webhook::new(WebhookKind::GitHub, "It's a Secret to Everybody").expect("ok");
        let signed = headers(&[(
            "x-hub-signature-256",
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        )]);
        let now = Timestamp::now();
        assert_eq!(hook.verify(&signed, b"Hello, World!", now), Ok(()));
        assert!(hook.verify(&signed, b"Hello, World?", now).is_err());
        assert!(hook
            .verify(&HeaderMap::new(), b"Hello, World!", now)
            .is_err());
    }

    #[test]
    fn standard_webhooks_sign_id_timestamp_and_body() {
        // The Standard Webhooks reference libraries' test vector.
        let hook = Webhook::new(
            WebhookKind::Standard,
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )
        .expect("ok");
        let body = br#"{"test": 2432232314}"#;
        let signed = headers(&[
            ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            ("webhook-timestamp", "1614265330"),
            (
                "webhook-signature",
                "v1,bad v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            ),
        ]);
        let then = Timestamp::from_millis(1_614_265_330_000 + 10_000);
        assert_eq!(hook.verify(&signed, body, then), Ok(()));
        assert!(hook.verify(&signed, br#"{"test": 1}"#, then).is_err());
        let late = Timestamp::from_millis(1_614_265_330_000 + 301_000);
        let refused = hook.verify(&signed, body, late).expect_err("too old");
        assert!(
            refused.contains("301s from this server's clock"),
            "{refused}"
        );
    }

    #[test]
    fn stripe_signs_the_timestamp_and_body_and_may_send_several_signatures() {
        let hook = Webhook::new(WebhookKind::Stripe, "whsec_test").expect("ok");
        let body = br#"{"id":"evt_1"}"#;
        let sig = hex::encode(
            hook.mac(&[b"1700000000", b".", body])
                .finalize()
                .into_bytes(),
        );
        let value = format!("t=1700000000,v1=00,v1={sig},v0=ignored");
        let signed = headers(&[("stripe-signature", &value)]);
        let now = Timestamp::from_millis(1_700_000_000_000);
        assert_eq!(hook.verify(&signed, body, now), Ok(()));
        assert!(hook.verify(&signed, br#"{"id":"evt_2"}"#, now).is_err());
    }

    #[test]
    fn keys_come_only_from_what_the_sender_signed() {
        let rules = KeyRules::default();
        let added = headers(&[("idempotency-key", "chosen-by-a-client")]);
        let stripe = Webhook::new(WebhookKind::Stripe, "whsec_test").expect("ok");
        let key = stripe.key(&added, br#"{"id":"evt_9"}"#, &rules);
        assert_eq!(key.expect("an id").as_str(), "evt_9");
        assert!(stripe.key(&added, br#"{"type":"x"}"#, &rules).is_err());
        let github = Webhook::new(WebhookKind::GitHub, "s").expect("ok");
        let delivered = headers(&[("x-github-delivery", "d-1")]);
        let redelivered = headers(&[("x-github-delivery", "d-2")]);
        assert_eq!(
            github.key(&delivered, b"{}", &rules),
            github.key(&redelivered, b"{}", &rules),
            "the unsigned delivery id does not make a new key"
        );
        let standard = Webhook::new(WebhookKind::Standard, "whsec_dGVzdA==").expect("ok");
        let id = headers(&[("webhook-id", "msg_1"), ("idempotency-key", "other")]);
        assert_eq!(
            standard.key(&id, b"{}", &rules).expect("id").as_str(),
            "msg_1"
        );
    }

    #[test]
    fn a_secret_that_cannot_be_used_is_refused() {
        assert!(Webhook::new(WebhookKind::Standard, "whsec_not base64!").is_err());
        assert!(Webhook::new(WebhookKind::Stripe, "  \n").is_err());
        assert!("svix".parse::<WebhookKind>().is_err());
    }
}

//! Bearer tokens and the tenants they stand for: every record a token's
//! caller names is kept under its tenant, so no other token can see or
//! touch it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The shortest token accepted: anything shorter can be guessed.
pub const MIN_TOKEN_LEN: usize = 16;

/// The longest tenant name, in bytes.
pub const MAX_TENANT_LEN: usize = 64;

/// The tenant of a server started without tokens (on loopback only).
pub const OPEN_TENANT: &str = "default";

/// Who may call the API, and as which tenant.
#[derive(Debug, Clone)]
pub struct Tenants {
    /// SHA-256 of each token, to its tenant. Looking up a digest rather
    /// than the token keeps the token's bytes out of any timing.
    by_digest: HashMap<[u8; 32], Arc<str>>,
    /// Without tokens, every caller is this tenant.
    open: Option<Arc<str>>,
}

/// The `--tokens` file: each tenant with the tokens that act for it (more
/// than one while a token is rotated).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    tenants: HashMap<String, Vec<String>>,
}

impl Tenants {
    /// No tokens: every caller is [`OPEN_TENANT`].
    pub fn open() -> Self {
        Self {
            by_digest: HashMap::new(),
            open: Some(OPEN_TENANT.into()),
        }
    }

    /// Tenants and their tokens, checked: tenant names are 1 to 64 bytes
    /// of `A-Z a-z 0-9 _ . -`, tokens at least [`MIN_TOKEN_LEN`] bytes of
    /// visible ASCII, and no token acts for two tenants.
    pub fn new<'a>(
        tenants: impl IntoIterator<Item = (&'a str, &'a [String])>,
    ) -> anyhow::Result<Self> {
        let mut by_digest = HashMap::new();
        for (tenant, tokens) in tenants {
            check_tenant(tenant)?;
            anyhow::ensure!(!tokens.is_empty(), "tenant {tenant:?} has no token");
            let tenant: Arc<str> = tenant.into();
            for token in tokens {
                anyhow::ensure!(
                    token.len() >= MIN_TOKEN_LEN,
                    "a token of tenant {tenant:?} is shorter than {MIN_TOKEN_LEN} characters: \
                     it could be guessed (openssl rand -hex 32 makes a good one)"
                );
                anyhow::ensure!(
                    token.bytes().all(|b| (0x21..=0x7E).contains(&b)),
                    "a token of tenant {tenant:?} has a character outside visible ASCII"
                );
                match by_digest.insert(digest(token), tenant.clone()) {
                    Some(other) if other != tenant => anyhow::bail!(
                        "the same token is given to tenants {other:?} and {tenant:?}: \
                         a token must act for one tenant"
                    ),
                    Some(_) => anyhow::bail!("a token of tenant {tenant:?} is listed twice"),
                    None => {}
                }
            }
        }
        anyhow::ensure!(!by_digest.is_empty(), "no tenant has a token");
        Ok(Self {
            by_digest,
            open: None,
        })
    }

    /// Reads a `--tokens` file:
    ///
    /// ```toml
    /// [tenants]
    /// shop = ["a-long-random-token"]
    /// billing = ["another-token", "its-replacement-while-rotating"]
    /// ```
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read the tokens file {}: {e}", path.display()))?;
        let file: TokensFile = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("tokens file {}: {e}", path.display()))?;
        Self::new(
            file.tenants
                .iter()
                .map(|(tenant, tokens)| (tenant.as_str(), tokens.as_slice())),
        )
        .map_err(|e| anyhow::anyhow!("tokens file {}: {e}", path.display()))
    }

    /// Whether callers need a token.
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// How many tenants there are (one when open).
    pub fn count(&self) -> usize {
        if self.open.is_some() {
            return 1;
        }
        let mut names: Vec<&str> = self.by_digest.values().map(|t| &**t).collect();
        names.sort_unstable();
        names.dedup();
        names.len()
    }

    /// The tenant an `Authorization` header's value acts for, if any.
    pub fn tenant(&self, authorization: Option<&[u8]>) -> Option<Arc<str>> {
        if let Some(open) = &self.open {
            return Some(open.clone());
        }
        let value = std::str::from_utf8(authorization?).ok()?;
        let (scheme, token) = value.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.by_digest.get(&digest(token.trim())).cloned()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn check_tenant(tenant: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !tenant.is_empty()
            && tenant.len() <= MAX_TENANT_LEN
            && tenant
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)),
        "tenant name {tenant:?} must be 1 to {MAX_TENANT_LEN} characters of A-Z a-z 0-9 _ . -"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn each_token_acts_for_its_own_tenant_only() {
        let shop = tokens(&["shop-token-0123456789"]);
        let billing = tokens(&["billing-token-0123456789", "billing-rotated-0123456"]);
        let tenants = Tenants::new([("shop", shop.as_slice()), ("billing", billing.as_slice())])
            .expect("tenants");
        let of = |h: &str| tenants.tenant(Some(h.as_bytes())).map(|t| t.to_string());
        assert_eq!(of("Bearer shop-token-0123456789").as_deref(), Some("shop"));
        assert_eq!(
            of("bearer billing-rotated-0123456").as_deref(),
            Some("billing")
        );
        assert_eq!(of("Bearer shop-token-012345678"), None);
        assert_eq!(of("Basic shop-token-0123456789"), None);
        assert_eq!(of("shop-token-0123456789"), None);
        assert_eq!(tenants.tenant(None), None);
        assert_eq!(tenants.count(), 2);
    }

    #[test]
    fn bad_tokens_files_are_refused_with_the_reason() {
        let short = tokens(&["short"]);
        let shared = tokens(&["shared-token-0123456789"]);
        for (tenants, needle) in [
            (vec![("shop", short.as_slice())], "shorter than 16"),
            (vec![("sh op", shared.as_slice())], "must be 1 to 64"),
            (vec![("", shared.as_slice())], "must be 1 to 64"),
            (
                vec![("a", shared.as_slice()), ("b", shared.as_slice())],
                "same token",
            ),
            (vec![("a", &[][..])], "has no token"),
            (
                vec![("a", &[shared[0].clone(), shared[0].clone()][..])],
                "listed twice",
            ),
            (vec![], "no tenant"),
        ] {
            let error = Tenants::new(tenants).expect_err(needle).to_string();
            assert!(error.contains(needle), "{error}");
        }
    }

    #[test]
    fn an_open_server_has_one_tenant() {
        let open = Tenants::open();
        assert!(open.is_open());
        assert_eq!(open.tenant(None).as_deref(), Some(OPEN_TENANT));
    }
}

//! The gateway's store URL with its memory of expired keys
//! (`--remember-expired`, [`idem::horizon`]).

use idem_engine::store::{StoreUrl, DEFAULT_STORE};

use crate::duration;
use crate::proxy_args::ProxyArgs;

/// How long the gateway remembers keys whose records expired, unless told
/// (`--remember-expired`): a month, thirty times the default retention,
/// at about 40 bytes a key (see the guide's "Keys after the retention").
pub(crate) const DEFAULT_REMEMBER_EXPIRED: std::time::Duration =
    std::time::Duration::from_secs(30 * 86_400);

impl ProxyArgs {
    /// The store URL with the gateway's memory of expired keys: the URL's
    /// own `?remember=`, else `--remember-expired` (30 days by default, on
    /// the stores that keep the memory on disk; Redis only when the flag
    /// is given). A store that cannot remember is refused if the flag was
    /// given, and warned about if not.
    pub fn store_url(&self) -> anyhow::Result<StoreUrl> {
        let url: StoreUrl = self.store.as_deref().unwrap_or(DEFAULT_STORE).parse()?;
        let told = self.remember_expired.as_deref().map(str::trim);
        let memory = match told {
            Some("0") => std::time::Duration::ZERO,
            Some(text) => duration("--remember-expired", text)?,
            None => DEFAULT_REMEMBER_EXPIRED,
        };
        if memory.is_zero() || url.remembers_unless_told() || (told.is_some() && url.can_remember())
        {
            return Ok(url.remembering_by_default(memory));
        }
        if told.is_some() {
            anyhow::bail!(
                "--remember-expired: the store {url} cannot remember expired keys yet (SQLite, \
                 memory, PostgreSQL, MySQL, DynamoDB and Redis can); give --remember-expired 0 to run without"
            );
        }
        if url.can_remember() {
            tracing::warn!(
                store = %url,
                "Redis remembers expired keys only when asked, since it keeps them in memory \
                 (about 200 bytes a key for as long as it remembers): a retry that comes after the \
                 retention runs again unless the namespace remembers; give --remember-expired 7d \
                 (or remember= in the URL) to turn it on, or --remember-expired 0 to silence this"
            );
            return Ok(url);
        }
        tracing::warn!(
            store = %url,
            "this store cannot remember expired keys: a retry that comes after the retention \
             runs again (SQLite, memory, PostgreSQL, MySQL, DynamoDB and Redis remember; \
             --remember-expired 0 silences this)"
        );
        Ok(url)
    }
}

//! Connections: the pool (healing itself after a restart or a failover),
//! the URL, and TLS.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use ssl_mode::{Tls, TlsMode};

pub(crate) mod ssl_mode;
#[cfg(feature = "tls")]
pub(crate) mod tls;
pub(crate) mod url;

/// When a connection of the pool last found its server was no longer the
/// primary (SQLSTATE 25006 `read_only_sql_transaction`: a failover
/// demoted it while the connection stayed up). Every connection made
/// before then is dropped when next taken from the pool, so the new ones
/// follow the address to the new primary instead of retrying a standby
/// for the whole lease.
///
/// Read on every checkout, so kept without a lock: nanoseconds since
/// `since`, plus one (0: never seen).
#[derive(Debug)]
pub(crate) struct Demotion {
    since: Instant,
    at: AtomicU64,
}

impl Default for Demotion {
    fn default() -> Self {
        Self {
            since: Instant::now(),
            at: AtomicU64::new(0),
        }
    }
}

impl Demotion {
    /// Notes that a connection just met a demoted server.
    pub(crate) fn seen(&self) {
        let nanos = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        self.at.fetch_max(nanos + 1, Ordering::Relaxed);
    }

    /// Whether a connection made at `created` may be to the demoted
    /// server.
    fn outdates(&self, created: Instant) -> bool {
        match self.at.load(Ordering::Relaxed) {
            0 => false,
            at => created <= self.since + Duration::from_nanos(at - 1),
        }
    }
}

/// A pool of connections made from `config`. Connections that the server
/// closed (a restart, an idle timeout) are dropped when handed back, and
/// connections older than a demotion seen on any of them when next taken,
/// so the pool heals itself once the server (or the new primary) is back.
pub(crate) fn pool(
    mut config: tokio_postgres::Config,
    tls: &Tls,
    size: usize,
    connect: Duration,
    response: Duration,
    demotion: Arc<Demotion>,
) -> Result<Pool, String> {
    config.connect_timeout(connect);
    let manager_config = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match tls.mode {
        TlsMode::Disable => Manager::from_config(config, NoTls, manager_config),
        #[cfg(feature = "tls")]
        _ => Manager::from_config(config, tls::connector(tls)?, manager_config),
        // Without the feature only `prefer` gets here (parse_url refuses
        // the rest), and with no TLS to offer it is a plain connection.
        #[cfg(not(feature = "tls"))]
        _ => Manager::from_config(config, NoTls, manager_config),
    };
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .create_timeout(Some(connect))
        .wait_timeout(Some(response))
        .recycle_timeout(Some(response))
        .pre_recycle(Hook::sync_fn(move |_, metrics| {
            if demotion.outdates(metrics.created) {
                Err(HookError::message("made before its server was demoted"))
            } else {
                Ok(())
            }
        }))
        .build()
        .map_err(|e| e.to_string())
}

//! Waiting for a record to change, woken by PostgreSQL's LISTEN/NOTIFY.
//!
//! The first wait of a store opens one connection of its own and `LISTEN`s
//! on [`CHANNEL`]. Each wait then marks its record `waited`
//! (`sql/wait.sql`, which hands back the record's payload on the channel),
//! and the write that ends a waited record announces it from a trigger
//! (`migrations/0006_waiters.sql`); the task reading the connection wakes
//! the waits on that payload ([`idem::wake`]). When the connection ends,
//! every wait is woken, and the next one connects anew; a wait that cannot
//! listen polls ([`idem::store::poll_while`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::wake::Waiters;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::{AsyncMessage, Client, Connection};

use crate::conn::ssl_mode::{Tls, TlsMode};

/// The channel the trigger announces ended records on.
pub(crate) const CHANNEL: &str = "idem_done";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// After a failed attempt to listen, how long waits poll instead of trying
/// again (a server out of connections is not asked once per wait).
const RETRY_LISTENING_AFTER: Duration = Duration::from_secs(5);

/// The listening connection of one store, and its waits.
pub(crate) struct Listener {
    config: tokio_postgres::Config,
    tls: Tls,
    /// `false` when the URL says `listen=false`: every wait polls.
    enabled: bool,
    /// For connecting and for the `LISTEN`.
    timeout: Duration,
    waiters: Arc<Waiters>,
    connection: parking_lot::Mutex<Connected>,
    /// Held while one wait connects; the others wait for it.
    connecting: tokio::sync::Mutex<()>,
}

/// What the last attempt to listen left.
#[derive(Default)]
enum Connected {
    #[default]
    Never,
    Open(Listening),
    FailedAt(Instant),
}

/// An open listening connection: dropping the client closes it.
struct Listening {
    client: Client,
    open: Arc<AtomicBool>,
}

impl Listening {
    fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire) && !self.client.is_closed()
    }
}

// By hand: the configuration holds the password.
impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("enabled", &self.enabled)
            .field("waiters", &self.waiters)
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// A listener that connects with `config` and `tls` when first asked
    /// (never, unless `enabled`). Its connection sends TCP keepalives, so
    /// one that died without a word (a failover, a dropped NAT entry) is
    /// noticed within about a minute rather than hours.
    pub(crate) fn new(
        mut config: tokio_postgres::Config,
        tls: Tls,
        enabled: bool,
        connect: Duration,
        response: Duration,
    ) -> Self {
        config
            .connect_timeout(connect)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3);
        Self {
            config,
            tls,
            enabled,
            timeout: connect + response,
            waiters: Arc::default(),
            connection: parking_lot::Mutex::default(),
            connecting: tokio::sync::Mutex::default(),
        }
    }

    /// The waits, by payload.
    pub(crate) fn waiters(&self) -> &Arc<Waiters> {
        &self.waiters
    }

    /// Whether announcements reach this store: connects and listens first
    /// if no connection is open, within `budget` (a wait that finds
    /// another connecting waits for that one). `false` (the wait polls) if
    /// listening is turned off, failed less than [`RETRY_LISTENING_AFTER`]
    /// ago, or fails now.
    pub(crate) async fn listening(&self, budget: Duration) -> bool {
        if !self.enabled {
            return false;
        }
        if let Some(known) = self.known() {
            return known;
        }
        let budget = self.timeout.min(budget);
        let Ok(_connecting) = tokio::time::timeout(budget, self.connecting.lock()).await else {
            return false;
        };
        // Another wait may have connected, or failed, meanwhile.
        if let Some(known) = self.known() {
            return known;
        }
        let connected = match tokio::time::timeout(budget, self.connect()).await {
            Ok(Ok(listening)) => Connected::Open(listening),
            Ok(Err(error)) => {
                tracing::debug!(%error, "no listening connection; waiting by polling");
                Connected::FailedAt(Instant::now())
            }
            // Cut short by this wait's own budget: the next wait tries again.
            Err(_) if budget < self.timeout => Connected::Never,
            Err(_) => {
                tracing::debug!("listening connection timed out; waiting by polling");
                Connected::FailedAt(Instant::now())
            }
        };
        let open = matches!(connected, Connected::Open(_));
        *self.connection.lock() = connected;
        open
    }

    /// Whether announcements reach this store, if that is known without
    /// connecting: an open connection, or a recent failure.
    fn known(&self) -> Option<bool> {
        match &*self.connection.lock() {
            Connected::Open(listening) if listening.is_open() => Some(true),
            Connected::FailedAt(at) if at.elapsed() < RETRY_LISTENING_AFTER => Some(false),
            _ => None,
        }
    }

    async fn connect(&self) -> Result<Listening, BoxError> {
        match self.tls.mode {
            TlsMode::Disable => {
                let (client, connection) = self.config.connect(tokio_postgres::NoTls).await?;
                self.listen(client, connection).await
            }
            #[cfg(feature = "tls")]
            _ => {
                let tls = crate::conn::tls::connector(&self.tls)?;
                let (client, connection) = self.config.connect(tls).await?;
                self.listen(client, connection).await
            }
            // Without the feature only `prefer` gets here, plain (as the pool).
            #[cfg(not(feature = "tls"))]
            _ => {
                let (client, connection) = self.config.connect(tokio_postgres::NoTls).await?;
                self.listen(client, connection).await
            }
        }
    }

    /// Drives `connection` in a task of its own that wakes the waits on
    /// each announcement, then listens.
    async fn listen<S, T>(
        &self,
        client: Client,
        mut connection: Connection<S, T>,
    ) -> Result<Listening, BoxError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let open = Arc::new(AtomicBool::new(true));
        let (waiters, still_open) = (Arc::clone(&self.waiters), Arc::clone(&open));
        tokio::spawn(async move {
            while let Some(Ok(message)) =
                std::future::poll_fn(|cx| connection.poll_message(cx)).await
            {
                if let AsyncMessage::Notification(n) = message {
                    if n.channel() == CHANNEL {
                        waiters.wake(n.payload());
                    }
                }
            }
            still_open.store(false, Ordering::Release);
            waiters.wake_all();
        });
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        Ok(Listening { client, open })
    }
}

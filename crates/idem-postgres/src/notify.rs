//! Waiting for a record to change, woken by PostgreSQL's LISTEN/NOTIFY.
//!
//! The first wait of a store opens one connection of its own and `LISTEN`s
//! on [`CHANNEL`]. Each wait then marks its record `waited`
//! (`sql/wait.sql`, which hands back the record's payload on the channel),
//! and the write that ends a waited record announces it from a trigger
//! (`migrations/0006_waiters.sql`); the task reading the connection wakes
//! the waits on that payload ([`idem::wake`]). When the connection ends,
//! every wait is woken, and the next one connects anew; a wait that cannot
//! listen polls ([`idem::poll_while`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::wake::Waiters;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::{AsyncMessage, Client, Connection};

use crate::conn::{Tls, TlsMode};

/// The channel the trigger announces ended records on.
pub(crate) const CHANNEL: &str = "idem_done";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The listening connection of one store, and its waits.
#[derive(Debug)]
pub(crate) struct Listener {
    config: tokio_postgres::Config,
    tls: Tls,
    /// For connecting and for the `LISTEN`.
    timeout: Duration,
    waiters: Arc<Waiters>,
    connection: tokio::sync::Mutex<Option<Listening>>,
}

/// An open listening connection: dropping the client closes it.
#[derive(Debug)]
struct Listening {
    _client: Client,
    open: Arc<AtomicBool>,
}

impl Listener {
    /// A listener that connects with `config` and `tls` when first asked.
    pub(crate) fn new(
        mut config: tokio_postgres::Config,
        tls: Tls,
        connect: Duration,
        response: Duration,
    ) -> Self {
        config.connect_timeout(connect);
        Self {
            config,
            tls,
            timeout: connect + response,
            waiters: Arc::default(),
            connection: tokio::sync::Mutex::new(None),
        }
    }

    /// The waits, by payload.
    pub(crate) fn waiters(&self) -> &Arc<Waiters> {
        &self.waiters
    }

    /// Whether announcements reach this store: connects and listens first
    /// if no connection is open. `false` if that failed.
    pub(crate) async fn listening(&self) -> bool {
        let mut connection = self.connection.lock().await;
        if connection
            .as_ref()
            .is_some_and(|c| c.open.load(Ordering::Acquire))
        {
            return true;
        }
        *connection = None;
        match tokio::time::timeout(self.timeout, self.connect()).await {
            Ok(Ok(listening)) => {
                *connection = Some(listening);
                true
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, "no listening connection; waiting by polling");
                false
            }
            Err(_) => {
                tracing::debug!("listening connection timed out; waiting by polling");
                false
            }
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
                let tls = crate::tls::connector(&self.tls)?;
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
        Ok(Listening {
            _client: client,
            open,
        })
    }
}

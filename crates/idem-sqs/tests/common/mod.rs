//! What the SQS tests share: queues and a store table on moto, an effects
//! ledger on disk, and worker processes to kill.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use aws_sdk_sqs::Client;
use idem::outbox::Sender;
use idem::{Idempotency, Scope};
use idem_consumer::{Consumer, KeyExtractor};
use idem_dynamodb::DynamoStore;
use idem_sqs::{SqsConsumer, SqsSender, CONSUMER_HEADER, KEY_HEADER, REASON_HEADER};
use idem_testkit::consumers::ledger::{Ledger, Work};
use idem_testkit::consumers::under_test::{BrokerUnderTest, ChaosBroker, DeadLetterSeen};
use idem_testkit::servers::moto::{MotoServer, ACCESS_KEY, REGION, SECRET_KEY};
use idem_testkit::ServerError;

/// The settings a test and its workers share.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    pub(crate) endpoint: String,
    pub(crate) store_endpoint: String,
    pub(crate) queue_url: String,
    pub(crate) table: String,
    pub(crate) ledger: Ledger,
}

pub(crate) fn sqs_client(endpoint: &str) -> Client {
    idem_sqs::client_for(Some(endpoint), REGION, ACCESS_KEY, SECRET_KEY, None).expect("client")
}

impl Setup {
    /// A queue (FIFO if `fifo`) with a one-hour retention and a two-second
    /// visibility timeout, and a table for the store, on the shared moto.
    pub(crate) async fn new(name: &str, fifo: bool) -> Self {
        let endpoint = MotoServer::shared()
            .expect("moto_server must be installed (scripts/test installs it)")
            .url();
        Self::on(endpoint, name, fifo, 2).await
    }

    /// The same on the moto at `endpoint`, with a visibility timeout of
    /// `visibility` seconds.
    pub(crate) async fn on(endpoint: String, name: &str, fifo: bool, visibility: u32) -> Self {
        Self::on_each(endpoint.clone(), endpoint, name, fifo, visibility).await
    }

    /// A standard queue (visibility two seconds) on the moto at
    /// `endpoint`, its store's table on the one at `store_endpoint`.
    async fn on_both(endpoint: String, store_endpoint: String, name: &str) -> Self {
        Self::on_each(endpoint, store_endpoint, name, false, 2).await
    }

    async fn on_each(
        endpoint: String,
        store_endpoint: String,
        name: &str,
        fifo: bool,
        visibility: u32,
    ) -> Self {
        let id = format!("{name}-{:08x}", rand::random::<u32>());
        let queue = if fifo {
            format!("{id}.fifo")
        } else {
            id.clone()
        };
        let table = format!("idem-sqs-{id}");
        let queue_url =
            create_queue_and_table(&endpoint, &store_endpoint, &queue, &table, visibility).await;
        Self {
            ledger: Ledger::create(&id),
            store_endpoint,
            endpoint,
            queue_url,
            table,
        }
    }

    /// The queue's name, the end of its URL.
    fn queue_name(&self) -> &str {
        self.queue_url.rsplit('/').next().unwrap_or_default()
    }

    pub(crate) fn client(&self) -> Client {
        sqs_client(&self.endpoint)
    }

    pub(crate) fn store(&self) -> DynamoStore {
        let client = idem_dynamodb::client_for(
            Some(&self.store_endpoint),
            REGION,
            ACCESS_KEY,
            SECRET_KEY,
            None,
        )
        .expect("client");
        DynamoStore::new(client, self.table.clone())
    }

    /// The consumer tests and workers run: short leases, so a killed
    /// worker's claims are taken over within seconds, and a heartbeat well
    /// inside the queue's two-second visibility timeout.
    #[allow(dead_code)] // the chaos run builds its own
    pub(crate) fn idem(&self) -> Idempotency<DynamoStore> {
        idem_testkit::consumers::scenario::executor(self.store())
    }

    #[allow(dead_code)] // the chaos run builds its own
    pub(crate) async fn sqs(&self) -> SqsConsumer<DynamoStore, idem::Json> {
        self.sqs_at(&self.endpoint).await
    }

    /// [`sqs`](Self::sqs), reaching SQS at `endpoint` (a fault proxy in
    /// front of moto); the store still goes to moto directly.
    #[allow(dead_code)] // the chaos run builds its own
    pub(crate) async fn sqs_at(&self, endpoint: &str) -> SqsConsumer<DynamoStore, idem::Json> {
        self.sqs_with(endpoint, self.idem()).await
    }

    /// [`sqs_at`](Self::sqs_at) with the executor `idem`.
    pub(crate) async fn sqs_with(
        &self,
        endpoint: &str,
        idem: Idempotency<DynamoStore>,
    ) -> SqsConsumer<DynamoStore, idem::Json> {
        // Keyed only by the attribute: a message without one is
        // dead-lettered (the default would fall back to SQS's message id).
        let consumer = Consumer::builder(idem, Scope::new("orders").expect("scope"))
            .keys(KeyExtractor::header("Idempotency-Key"))
            .build();
        SqsConsumer::builder(sqs_client(endpoint), &self.queue_url, consumer)
            .concurrency(8)
            .wait_time(Duration::from_secs(1))
            .connect()
            .await
            .expect("connect to SQS")
    }

    /// Sends `body`, keyed by the `Idempotency-Key` attribute when given.
    pub(crate) async fn send(&self, key: Option<&str>, body: &str, fifo_dedup: Option<&str>) {
        let mut send = self
            .client()
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body);
        if let Some(key) = key {
            send = send.message_attributes(
                "Idempotency-Key",
                MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(key)
                    .build()
                    .expect("attribute"),
            );
        }
        if let Some(dedup) = fifo_dedup {
            send = send
                .message_group_id("orders")
                .message_deduplication_id(dedup);
        }
        send.send().await.expect("send");
    }

    /// How many messages the queue still holds, visible or not.
    pub(crate) async fn remaining(&self) -> u64 {
        let attributes = self
            .client()
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .expect("attributes")
            .attributes
            .unwrap_or_default();
        [
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            QueueAttributeName::ApproximateNumberOfMessagesDelayed,
        ]
        .iter()
        .map(|a| {
            attributes
                .get(a)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
    }
}

/// Every message of the dead-letter queue.
pub(crate) async fn dead_letters(client: &Client, url: &str) -> Vec<DeadLetterSeen> {
    let mut out = Vec::new();
    loop {
        let received = client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .visibility_timeout(600)
            .send()
            .await
            .expect("receive")
            .messages
            .unwrap_or_default();
        if received.is_empty() {
            break;
        }
        for m in received {
            let attrs: HashMap<String, String> = m
                .message_attributes
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(k, v)| v.string_value.map(|s| (k, s)))
                .collect();
            out.push(DeadLetterSeen {
                key: attrs.get(KEY_HEADER).cloned(),
                reason: attrs.get(REASON_HEADER).cloned().expect("reason"),
                consumer: attrs.get(CONSUMER_HEADER).cloned(),
            });
        }
    }
    out.sort();
    out
}

impl BrokerUnderTest for Setup {
    async fn create(name: &str) -> Self {
        Self::new(name, false).await
    }

    fn from_env() -> Option<Self> {
        let var = |name| std::env::var(name).ok();
        Some(Self {
            endpoint: var("IDEM_SQS_ENDPOINT")?,
            store_endpoint: var("IDEM_SQS_STORE")?,
            queue_url: var("IDEM_SQS_QUEUE")?,
            table: var("IDEM_SQS_TABLE")?,
            ledger: Ledger::at(PathBuf::from(var("IDEM_SQS_DIR")?)),
        })
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("IDEM_SQS_ENDPOINT", self.endpoint.clone()),
            ("IDEM_SQS_STORE", self.store_endpoint.clone()),
            ("IDEM_SQS_QUEUE", self.queue_url.clone()),
            ("IDEM_SQS_TABLE", self.table.clone()),
            (
                "IDEM_SQS_DIR",
                self.ledger.dir().to_string_lossy().into_owned(),
            ),
        ]
    }

    fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    async fn publish(&self, key: Option<&str>, payload: &str) {
        self.send(key, payload, None).await;
    }

    async fn consume(&self, work: Work, shutdown: impl Future<Output = ()> + Send + 'static) {
        let (idem, _dispatcher) =
            idem_testkit::consumers::scenario::executor_for(&work, self.store(), &self.ledger);
        self.sqs_with(&self.endpoint, idem)
            .await
            .run(work.handler(self.ledger.clone()), shutdown)
            .await
            .expect("consume");
    }

    /// Nothing left in the queue, visible or not (a dead-letter copy is
    /// accepted before its original is deleted).
    async fn settled(&self, _dead_letters: usize) -> bool {
        for _ in 0..100 {
            if self.remaining().await == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    async fn dead_letters(&self) -> Vec<DeadLetterSeen> {
        dead_letters(&self.client(), &format!("{}-dead", self.queue_url)).await
    }
}

impl ChaosBroker for Setup {
    /// Two motos: SQS on one (long polls hold a request open), the
    /// store's DynamoDB on another that takes one request at a time, as
    /// DynamoDB's conditional writes need.
    type Server = (MotoServer, MotoServer);
    type Store = DynamoStore;

    /// moto keeps queues and tables in memory only.
    const RESTARTS: bool = false;

    fn start_server() -> Result<Self::Server, ServerError> {
        Ok((MotoServer::start()?, MotoServer::start_serial()?))
    }

    fn port(server: &Self::Server) -> u16 {
        server.0.port()
    }

    fn restart(_server: &mut Self::Server) -> Result<(), ServerError> {
        Err(ServerError::Failed {
            what: "moto keeps nothing across a restart".into(),
        })
    }

    fn store_port(server: &Self::Server) -> Option<u16> {
        Some(server.1.port())
    }

    fn store_url(port: u16) -> String {
        format!("http://127.0.0.1:{port}")
    }

    async fn create_at(name: &str, broker_port: u16, store_url: &str) -> Self {
        Self::on_both(
            format!("http://127.0.0.1:{broker_port}"),
            store_url.to_owned(),
            name,
        )
        .await
    }

    fn through(&self, broker_port: u16, store_url: &str) -> Self {
        Self {
            endpoint: format!("http://127.0.0.1:{broker_port}"),
            store_endpoint: store_url.to_owned(),
            ..self.clone()
        }
    }

    async fn store(&self) -> DynamoStore {
        Setup::store(self)
    }

    fn output(&self) -> Self {
        Self {
            queue_url: format!("{}-out", self.queue_url),
            table: format!("{}-out", self.table),
            ledger: self.ledger.output(),
            ..self.clone()
        }
    }

    async fn declare(&self) {
        create_queue_and_table(
            &self.endpoint,
            &self.store_endpoint,
            self.queue_name(),
            &self.table,
            2,
        )
        .await;
    }

    fn address(&self) -> String {
        self.queue_url.clone()
    }

    async fn sender(&self) -> Arc<dyn Sender> {
        Arc::new(SqsSender::new(self.client()))
    }
}

/// Creates queue `queue` (FIFO if its name ends `.fifo`) with a one-hour
/// retention and a visibility timeout of `visibility` seconds on the moto
/// at `endpoint`, and the store's table `table` on the one at
/// `store_endpoint`; the queue's URL.
async fn create_queue_and_table(
    endpoint: &str,
    store_endpoint: &str,
    queue: &str,
    table: &str,
    visibility: u32,
) -> String {
    let mut create = sqs_client(endpoint)
        .create_queue()
        .queue_name(queue)
        .attributes(QueueAttributeName::MessageRetentionPeriod, "3600")
        .attributes(
            QueueAttributeName::VisibilityTimeout,
            visibility.to_string(),
        );
    if queue.ends_with(".fifo") {
        create = create.attributes(QueueAttributeName::FifoQueue, "true");
    }
    let queue_url = create
        .send()
        .await
        .expect("create queue")
        .queue_url
        .expect("queue url");
    let dynamo =
        idem_dynamodb::client_for(Some(store_endpoint), REGION, ACCESS_KEY, SECRET_KEY, None)
            .expect("client");
    idem_dynamodb::create_table(&dynamo, table)
        .await
        .expect("create table");
    queue_url
}

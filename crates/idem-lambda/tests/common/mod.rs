//! What the Lambda tests share: the function (this test binary run again
//! as a child of the local Lambda runtime), DynamoDB on moto as its store,
//! its effects ledger, and the events Lambda sends.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use idem::{Idempotency, Scope, Terminal};
use idem_consumer::{Consumer, Job, KeyExtractor};
use idem_lambda::{
    store_from_env, BatchHandler, DynamoDbEvent, KinesisEvent, Record, SqsEvent, STORE_ENV,
};
use idem_testkit::servers::lambda::LambdaRuntime;
use idem_testkit::servers::moto::{MotoServer, ACCESS_KEY, REGION, SECRET_KEY};
use serde_json::{json, Value};
use tower::Layer as _;

/// The function's timeout in the tests.
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// Set in the child: which event source the function handles.
const SOURCE_ENV: &str = "IDEM_TEST_LAMBDA_SOURCE";
/// Set in the child: the effects ledger.
const EFFECTS_ENV: &str = "IDEM_TEST_LAMBDA_EFFECTS";
/// Set in the child: the executor's lease, in milliseconds.
const LEASE_ENV: &str = "IDEM_TEST_LAMBDA_LEASE_MS";

/// The shared moto server (serial, so conditional writes are atomic).
pub fn moto() -> &'static MotoServer {
    MotoServer::shared_serial().expect(
        "moto_server must be installed (scripts/test installs it into ~/.cache/idem/tools/moto)",
    )
}

/// A function under the local Lambda runtime, with a table and a ledger
/// of its own.
pub struct Function {
    pub lambda: LambdaRuntime,
    effects: PathBuf,
    _dir: tempfile::TempDir,
}

impl Function {
    /// Starts the function for `source` (`sqs`, `kinesis`, `dynamodb`,
    /// `http`), with the executor's default lease.
    pub async fn start(source: &str) -> Self {
        Self::with_lease(source, idem::DEFAULT_LEASE).await
    }

    /// [`start`](Self::start) with the executor's `lease`.
    pub async fn with_lease(source: &str, lease: Duration) -> Self {
        let server = moto();
        let client =
            idem_dynamodb::client_for(Some(&server.url()), REGION, ACCESS_KEY, SECRET_KEY, None)
                .expect("client");
        let table = format!("idem-lambda-{source}-{:08x}", rand::random::<u32>());
        idem_dynamodb::create_table(&client, &table)
            .await
            .expect("create table");
        let store = format!(
            "dynamodb://{table}?endpoint={}&region={REGION}",
            server.url()
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let effects = dir.path().join("effects");
        std::fs::write(&effects, "").expect("ledger");
        let lambda = LambdaRuntime::start().await.expect("Lambda Runtime API");
        let (source, ledger) = (source.to_owned(), effects.clone());
        lambda.run_function(move || {
            let mut command = Command::new(std::env::current_exe().expect("test binary"));
            command
                .args(idem_testkit::rerun::only_ignored("function"))
                .env(SOURCE_ENV, &source)
                .env(EFFECTS_ENV, &ledger)
                .env(LEASE_ENV, lease.as_millis().to_string())
                .env(STORE_ENV, &store)
                .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
                .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
                .env("AWS_REGION", REGION)
                .stdout(Stdio::null());
            command
        });
        Self {
            lambda,
            effects,
            _dir: dir,
        }
    }

    /// How many times the handler started for each key.
    pub fn starts(&self) -> BTreeMap<String, u32> {
        self.count("start")
    }

    /// How many effects each key had.
    pub fn effects(&self) -> BTreeMap<String, u32> {
        self.count("effect")
    }

    fn count(&self, what: &str) -> BTreeMap<String, u32> {
        let text = std::fs::read_to_string(&self.effects).expect("ledger");
        let mut counts = BTreeMap::new();
        for line in text.lines() {
            if let Some(key) = line.strip_prefix(what).and_then(|l| l.strip_prefix(' ')) {
                *counts.entry(key.to_owned()).or_default() += 1;
            }
        }
        counts
    }
}

/// `(key, count)` pairs as a map, for comparing with the ledger.
pub fn counts<const N: usize>(pairs: [(&str, u32); N]) -> BTreeMap<String, u32> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// The ids a batch response names.
pub fn failures(response: &Value) -> Vec<String> {
    response["batchItemFailures"]
        .as_array()
        .unwrap_or_else(|| panic!("not a batch response: {response}"))
        .iter()
        .map(|f| f["itemIdentifier"].as_str().expect("id").to_owned())
        .collect()
}

/// An SQS event of `(messageId, body)` records from `queue`.
pub fn sqs_event(queue: &str, records: &[(&str, Value)]) -> Value {
    let records: Vec<Value> = records
        .iter()
        .map(|(id, body)| {
            json!({
                "messageId": id,
                "receiptHandle": format!("handle-{id}"),
                "body": body.to_string(),
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": "1700000000000",
                    "SenderId": "AIDAEXAMPLE",
                    "ApproximateFirstReceiveTimestamp": "1700000000001"
                },
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": format!("arn:aws:sqs:{REGION}:000000000000:{queue}"),
                "awsRegion": REGION
            })
        })
        .collect();
    json!({ "Records": records })
}

/// A Kinesis event of `(sequence number, data)` records.
pub fn kinesis_event(records: &[(&str, Value)]) -> Value {
    let records: Vec<Value> = records
        .iter()
        .map(|(sequence, data)| {
            json!({
                "kinesis": {
                    "kinesisSchemaVersion": "1.0",
                    "partitionKey": "orders",
                    "sequenceNumber": sequence,
                    "data": base64::engine::general_purpose::STANDARD.encode(data.to_string()),
                    "approximateArrivalTimestamp": 1_700_000_000.5
                },
                "eventSource": "aws:kinesis",
                "eventVersion": "1.0",
                "eventID": format!("shardId-000000000000:{sequence}"),
                "eventName": "aws:kinesis:record",
                "invokeIdentityArn": "arn:aws:iam::000000000000:role/idem-test",
                "awsRegion": REGION,
                "eventSourceARN": format!("arn:aws:kinesis:{REGION}:000000000000:stream/orders")
            })
        })
        .collect();
    json!({ "Records": records })
}

/// A DynamoDB Streams event of `(eventID, sequence number, item id)`
/// INSERT records.
pub fn dynamodb_event(records: &[(&str, &str, &str)]) -> Value {
    let records: Vec<Value> = records
        .iter()
        .map(|(event_id, sequence, id)| {
            json!({
                "eventID": event_id,
                "eventName": "INSERT",
                "eventVersion": "1.1",
                "eventSource": "aws:dynamodb",
                "awsRegion": REGION,
                "dynamodb": {
                    "ApproximateCreationDateTime": 1_700_000_000,
                    "Keys": { "id": { "S": id } },
                    "NewImage": { "id": { "S": id }, "amount": { "N": "5" } },
                    "SequenceNumber": sequence,
                    "SizeBytes": 26,
                    "StreamViewType": "NEW_AND_OLD_IMAGES"
                },
                "eventSourceARN": format!(
                    "arn:aws:dynamodb:{REGION}:000000000000:table/orders/stream/2026-01-01T00:00:00.000"
                )
            })
        })
        .collect();
    json!({ "Records": records })
}

/// A function URL event (API Gateway's HTTP API payload 2.0): a POST of
/// `body` to `/charges` with `key` as its `Idempotency-Key`.
pub fn url_event(key: &str, body: &Value) -> Value {
    json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": "/charges",
        "rawQueryString": "",
        "headers": {
            "content-type": "application/json",
            "idempotency-key": key,
            "host": "idem-test.lambda-url.us-east-1.on.aws"
        },
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "idem-test",
            "domainName": "idem-test.lambda-url.us-east-1.on.aws",
            "domainPrefix": "idem-test",
            "http": {
                "method": "POST",
                "path": "/charges",
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": "idem-test"
            },
            "requestId": format!("{:016x}", rand::random::<u64>()),
            "routeKey": "$default",
            "stage": "$default",
            "time": "01/Dec/2026:00:00:00 +0000",
            "timeEpoch": 1_796_000_000_000_u64
        },
        "body": body.to_string(),
        "isBase64Encoded": false
    })
}

/// The function itself, in the child the runtime started: a no-op in a
/// normal test run.
pub fn function_main() {
    let Ok(source) = std::env::var(SOURCE_ENV) else {
        return;
    };
    let ledger = PathBuf::from(std::env::var(EFFECTS_ENV).expect("ledger"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime
        .block_on(serve(&source, &ledger))
        .expect("the function stopped");
}

async fn serve(source: &str, ledger: &Path) -> Result<(), lambda_runtime::Error> {
    let store = store_from_env().await?;
    if source == "http" {
        let layer = idem_http::IdempotencyLayer::builder(store).build()?;
        let ledger = ledger.to_owned();
        let charges = tower::service_fn(move |request: Request<Full<Bytes>>| {
            let ledger = ledger.clone();
            async move {
                let key = request.headers()["idempotency-key"]
                    .to_str()
                    .unwrap_or_default()
                    .to_owned();
                let body = request.into_body().collect().await?.to_bytes();
                record(&ledger, &format!("effect {key}"));
                Ok::<_, std::convert::Infallible>(
                    Response::builder()
                        .status(StatusCode::CREATED)
                        .header("content-type", "application/json")
                        .body(Full::new(body))
                        .expect("response"),
                )
            }
        });
        return idem_lambda::run_http(layer.layer(charges)).await;
    }
    let lease: u64 = std::env::var(LEASE_ENV)?.parse()?;
    let idem = Idempotency::builder(store)
        .lease(Duration::from_millis(lease))
        .build()?;
    let consumer = Consumer::builder(idem, Scope::new("orders")?);
    // A DynamoDB stream record is keyed by its eventID (the default): one
    // change; the others by the order id in the payload.
    let consumer = if source == "dynamodb" {
        consumer.build()
    } else {
        consumer.keys(KeyExtractor::json_pointer("/id")).build()
    };
    let handler = BatchHandler::new(consumer, |job| work(job, ledger));
    match source {
        "sqs" => handler.run::<SqsEvent>().await,
        "kinesis" => handler.run::<KinesisEvent>().await,
        "dynamodb" => handler.run::<DynamoDbEvent>().await,
        other => panic!("unknown source {other}"),
    }
}

/// The handler: logs its start, fails terminally on `"poison": true`,
/// sleeps `sleep_ms` on a first attempt (or blocks its thread for
/// `block_ms`, deaf to the deadline), then logs its effect.
async fn work(job: Job<Record>, ledger: &Path) -> Result<Value, Terminal> {
    let key = job.key().as_str().to_owned();
    record(ledger, &format!("start {key}"));
    let payload: Value = job.json().unwrap_or(Value::Null);
    if payload["poison"] == true {
        return Err(Terminal::new(format!("{key} is poison")));
    }
    if job.ctx().attempt() == 1 {
        if let Some(ms) = payload["sleep_ms"].as_u64() {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if let Some(ms) = payload["block_ms"].as_u64() {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }
    record(ledger, &format!("effect {key}"));
    Ok(json!({ "charged": key }))
}

/// Appends one line to the ledger (one `write`, so lines never mix).
fn record(ledger: &Path, line: &str) {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(ledger)
        .expect("ledger");
    file.write_all(format!("{line}\n").as_bytes())
        .expect("ledger write");
}

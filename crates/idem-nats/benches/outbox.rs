//! What the outbox costs a consumer that emits one message per input:
//! messages per second through `NatsConsumer` whose handler publishes one
//! message to JetStream directly (awaiting its ack: the anchor), against
//! the same consumer sending it through the outbox (stored with the
//! outcome, then published by `JetStreamSender`), on Redis and on
//! PostgreSQL, in the same run, the phases' order alternating by round.
//! A phase ends when its output stream holds a message for every input.
//!
//! Run: `cargo bench -p idem-nats --bench outbox [-- --messages N --rounds R --concurrency C --store redis|postgres]`
//!
//! Starts its own nats-server (JetStream, file store), redis-server and
//! PostgreSQL.

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream, Context};
use async_nats::HeaderMap;
use idem::outbox::Message;
use idem::{HandlerError, Idempotency, Scope, Store};
use idem_consumer::Consumer;
use idem_nats::{JetStreamSender, NatsConsumer};
use idem_testkit::servers::nats::NatsServer;
use idem_testkit::servers::postgres::PgServer;
use idem_testkit::servers::redis::RedisServer;

struct Args {
    messages: usize,
    rounds: usize,
    concurrency: usize,
    /// One store's phases alone (`redis` or `postgres`), to profile it.
    store: Option<String>,
}

fn args() -> Args {
    let mut out = Args {
        messages: 5000,
        rounds: 3,
        concurrency: 64,
        store: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--store" {
            out.store = it.next();
            continue;
        }
        let mut value = || it.next().and_then(|v| v.parse().ok()).expect("a number");
        match flag.as_str() {
            "--messages" => out.messages = value(),
            "--rounds" => out.rounds = value(),
            "--concurrency" => out.concurrency = value(),
            _ => {} // cargo bench's own flags
        }
    }
    out
}

async fn fill(js: &Context, subject: &str, messages: usize) {
    let mut pending = Vec::with_capacity(1000);
    for i in 0..messages {
        if pending.len() == 1000 {
            for ack in pending.drain(..) {
                let ack: jetstream::context::PublishAckFuture = ack;
                ack.await.expect("stored");
            }
        }
        let mut headers = HeaderMap::new();
        headers.insert("Idempotency-Key", format!("{subject}-{i}").as_str());
        pending.push(
            js.publish_with_headers(
                subject.to_owned(),
                headers,
                br#"{"order":1}"#.as_slice().into(),
            )
            .await
            .expect("publish"),
        );
    }
    for ack in pending {
        ack.await.expect("stored");
    }
}

async fn stream(js: &Context, name: &str) {
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{name}.*")],
        max_age: Duration::from_secs(3600),
        ..Default::default()
    })
    .await
    .expect("stream");
}

/// Until the stream `out` holds `messages` messages.
async fn filled(js: Context, out: String, messages: usize) {
    loop {
        let info = js
            .get_stream(&out)
            .await
            .expect("stream")
            .info()
            .await
            .map(|i| i.state.messages);
        if info.is_ok_and(|n| n >= messages as u64) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One phase: `messages` inputs through a consumer over `store`, each
/// emitting one message, directly or through the outbox. Messages per
/// second.
async fn phase<S: Store + Clone>(
    nats_url: &str,
    js: &Context,
    store: S,
    outbox: bool,
    a: &Args,
) -> f64 {
    let name = format!("OUTBOX_{:08x}", rand::random::<u32>());
    let out = format!("{name}_OUT");
    stream(js, &name).await;
    stream(js, &out).await;
    fill(js, &format!("{name}.in"), a.messages).await;
    let mut idem = Idempotency::builder(store);
    if outbox {
        idem = idem.outbox(JetStreamSender::new(js.clone()));
    }
    let consumer = Consumer::builder(
        idem.build().expect("config"),
        Scope::new("bench").expect("scope"),
    )
    .build();
    let nats = NatsConsumer::builder(nats_url, &name, "bench", consumer)
        .concurrency(a.concurrency)
        .connect()
        .await
        .expect("connect");
    let subject = format!("{out}.events");
    let direct = js.clone();
    let handler = move |job: idem_consumer::Job<idem_nats::NatsMessage>| {
        let (subject, direct) = (subject.clone(), direct.clone());
        async move {
            let payload = job.key().as_str().to_owned();
            if outbox {
                job.ctx().send(Message::new(subject, payload))?;
            } else {
                direct
                    .publish(subject, payload.into())
                    .await
                    .map_err(|e| HandlerError::new(e.to_string()))?
                    .await
                    .map_err(|e| HandlerError::new(e.to_string()))?;
            }
            Ok::<_, HandlerError>(())
        }
    };
    let start = Instant::now();
    nats.run(handler, filled(js.clone(), out.clone(), a.messages))
        .await
        .expect("run");
    let rate = a.messages as f64 / start.elapsed().as_secs_f64();
    let _ = js.delete_stream(&name).await;
    let _ = js.delete_stream(&out).await;
    rate
}

fn range(rates: &[f64]) -> String {
    let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = rates.iter().copied().fold(0.0, f64::max);
    format!("{lo:.0}–{hi:.0}")
}

#[tokio::main]
async fn main() {
    let a = args();
    let nats = NatsServer::start().expect("nats-server");
    let redis = RedisServer::start().expect("redis-server");
    let pg = PgServer::start().expect("postgres");
    let js = jetstream::new(
        async_nats::connect(nats.url().as_str())
            .await
            .expect("connect"),
    );
    let redis_store = |n: usize| {
        idem_redis::RedisStore::builder(&redis.url())
            .expect("url")
            .namespace(format!("bench{n}"))
    };
    let pg_url = pg.url("postgres");
    // rates[store][direct, outbox]
    let mut rates = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    let mut n = 0;
    for round in 0..a.rounds {
        for step in 0..4 {
            // Alternate which of each pair runs first.
            let (which, outbox) = (step / 2, (step % 2 == 1) ^ (round % 2 == 1));
            let named = ["redis", "postgres"][which];
            if a.store.as_deref().is_some_and(|only| only != named) {
                continue;
            }
            n += 1;
            let rate = if which == 0 {
                let store = redis_store(n).connect().await.expect("redis");
                phase(&nats.url(), &js, store, outbox, &a).await
            } else {
                let store = idem_postgres::PgStore::builder(&pg_url)
                    .expect("url")
                    .schema(format!("bench{n}"))
                    .connect()
                    .await
                    .expect("postgres");
                phase(&nats.url(), &js, store, outbox, &a).await
            };
            rates[which][usize::from(outbox)].push(rate);
        }
    }
    println!(
        "\n{} inputs per phase, {} rounds, concurrency {}: messages per second (range over rounds)\n",
        a.messages, a.rounds, a.concurrency
    );
    println!("| store | publishing directly | through the outbox | outbox / direct |");
    println!("|---|---|---|---|");
    for (which, name) in [(0, "Redis"), (1, "PostgreSQL")] {
        let [direct, outbox] = &rates[which];
        if direct.is_empty() {
            continue;
        }
        let ratios: Vec<f64> = direct.iter().zip(outbox).map(|(d, o)| o / d).collect();
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(0.0, f64::max);
        println!(
            "| {name} | {} | {} | {lo:.2}–{hi:.2} |",
            range(direct),
            range(outbox)
        );
    }
}

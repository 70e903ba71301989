//! One client process of an HTTP run: it sends each job's POST through the
//! fault proxy to the gateway and retries with the same key as API SDKs
//! do (timeouts, connection errors, 409 honouring `Retry-After`, and 5xx,
//! with exponential backoff and jitter), until it gets another answer or
//! gives up.
//!
//! The protocol is one line per message:
//!
//! - in: `J <job> <key> <timeout_ms> <delay_ms> <none|reset> <wait_s>`:
//!   the request's own timeout (each attempt), what the upstream is asked
//!   to do (take `delay_ms`, then answer or break its answer off), and
//!   the `Prefer: wait=` to send (none when 0);
//! - out: `R <job> <attempts> <timeouts> <status> <exec|-> <problem|->`:
//!   the final answer (status 0 when the client gave up), the execution
//!   number in a 2xx body, the problem type's last segment otherwise.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::Rng;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// The environment variable naming the gateway's base URL.
pub(crate) const GATEWAY_ENV: &str = "IDEM_CHAOS_GATEWAY";

/// Attempts before a client gives up on a job.
const MAX_ATTEMPTS: u32 = 40;
/// How long a client keeps retrying one job.
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

struct Job {
    id: u64,
    key: String,
    timeout: Duration,
    delay_ms: u64,
    fault: String,
    wait_s: u64,
}

fn parse(line: &str) -> Option<Job> {
    let mut parts = line.split(' ');
    if parts.next()? != "J" {
        return None;
    }
    Some(Job {
        id: parts.next()?.parse().ok()?,
        key: parts.next()?.to_owned(),
        timeout: Duration::from_millis(parts.next()?.parse().ok()?),
        delay_ms: parts.next()?.parse().ok()?,
        fault: parts.next()?.to_owned(),
        wait_s: parts.next()?.parse().ok()?,
    })
}

/// The final answer to a job.
struct Answer {
    attempts: u32,
    timeouts: u32,
    status: u16,
    exec: Option<u64>,
    problem: Option<String>,
}

/// Runs the client: jobs from stdin, answers on stdout, each job in a task
/// of its own.
pub async fn main() -> anyhow::Result<()> {
    let base = std::env::var(GATEWAY_ENV).with_context(|| format!("{GATEWAY_ENV} is not set"))?;
    let url: Arc<str> = format!("{base}/charges").into();
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .context("HTTP client")?;
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = rx.recv().await {
            if stdout.write_all(line.as_bytes()).await.is_err() {
                return;
            }
            let _ = stdout.flush().await;
        }
    });
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await.context("reading jobs")? {
        let Some(job) = parse(&line) else { continue };
        let (client, url, tx) = (client.clone(), Arc::clone(&url), tx.clone());
        tokio::spawn(async move {
            let a = send(&client, &url, &job).await;
            let _ = tx.send(format!(
                "R {} {} {} {} {} {}\n",
                job.id,
                a.attempts,
                a.timeouts,
                a.status,
                a.exec.map_or("-".to_owned(), |n| n.to_string()),
                a.problem.as_deref().unwrap_or("-")
            ));
        });
    }
    drop(tx);
    let _ = writer.await;
    Ok(())
}

async fn send(client: &reqwest::Client, url: &str, job: &Job) -> Answer {
    let started = Instant::now();
    let body = format!(r#"{{"key":"{}","amount":1250}}"#, job.key);
    let mut answer = Answer {
        attempts: 0,
        timeouts: 0,
        status: 0,
        exec: None,
        problem: None,
    };
    loop {
        answer.attempts += 1;
        let mut request = client.post(url);
        if job.wait_s > 0 {
            request = request.header("prefer", format!("wait={}", job.wait_s));
        }
        let sent = request
            .timeout(job.timeout)
            .header("idempotency-key", &job.key)
            .header("content-type", "application/json")
            .header("x-delay-ms", job.delay_ms.to_string())
            .header("x-fault", &job.fault)
            .body(body.clone())
            .send()
            .await;
        let wait = match sent {
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                    .map(Duration::from_secs);
                let text = match tokio::time::timeout(job.timeout, response.text()).await {
                    Ok(Ok(text)) => Some(text),
                    Ok(Err(_)) => None,
                    Err(_) => {
                        answer.timeouts += 1;
                        None
                    }
                };
                match (status, text) {
                    (409, _) => Some(retry_after.unwrap_or(Duration::from_millis(200))),
                    (500..=599, _) | (_, None) => None,
                    (status, Some(text)) => {
                        answer.status = status;
                        let json: serde_json::Value =
                            serde_json::from_str(&text).unwrap_or_default();
                        answer.exec = json["exec"].as_u64();
                        answer.problem = json["type"]
                            .as_str()
                            .and_then(|t| t.rsplit('/').next())
                            .map(str::to_owned);
                        return answer;
                    }
                }
            }
            Err(error) => {
                if error.is_timeout() {
                    answer.timeouts += 1;
                }
                None
            }
        };
        if answer.attempts >= MAX_ATTEMPTS || started.elapsed() > GIVE_UP_AFTER {
            return answer;
        }
        let backoff = wait.unwrap_or_else(|| {
            let base = Duration::from_millis(50).saturating_mul(1 << answer.attempts.min(5));
            base.min(Duration::from_secs(1))
        });
        let jitter = rand::rng().random_range(0.5..1.0);
        tokio::time::sleep(backoff.min(Duration::from_secs(2)).mul_f64(jitter)).await;
    }
}

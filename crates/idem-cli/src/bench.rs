//! `idem bench`: drives claim → complete through the executor and checks
//! that every unique key ran exactly once.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::{Idempotency, RecordId, Scope};
use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rand::Rng;
use serde::Serialize;

use crate::store::AnyStore;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Unique keys.
    pub keys: u64,
    /// The fraction of operations that repeat an earlier key, in `[0, 1)`.
    pub duplicates: f64,
    /// Concurrent callers.
    pub concurrency: usize,
    /// Show a progress bar.
    pub progress: bool,
}

/// What happened.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Operations run (unique keys plus duplicates).
    pub operations: u64,
    /// Unique keys.
    pub unique_keys: u64,
    /// Handler executions; equal to `unique_keys` when all is well.
    pub executions: u64,
    /// Operations answered by a replay.
    pub replays: u64,
    /// Operations that failed (each is printed once as a sample).
    pub errors: u64,
    /// Operations per second.
    pub ops_per_sec: f64,
    /// Median latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile latency, microseconds.
    pub p99_us: u64,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// Runs the benchmark. Keys are unique to this run, so it can be pointed
/// at a store in use.
pub async fn run(store: AnyStore, config: &BenchConfig) -> anyhow::Result<BenchReport> {
    anyhow::ensure!(config.keys > 0, "--keys must be at least 1");
    anyhow::ensure!(
        (0.0..1.0).contains(&config.duplicates),
        "--duplicates must be in [0, 1), got {}",
        config.duplicates
    );
    let operations = ((config.keys as f64) / (1.0 - config.duplicates)).round() as u64;
    let plan = Arc::new(plan(config.keys, operations));
    let scope = Scope::new(&format!("idem-bench/{:016x}", rand::random::<u64>()))?;
    let idem = Arc::new(
        Idempotency::builder(store)
            .wait_for_in_flight(Duration::from_secs(10))
            .build()?,
    );
    let bar = if config.progress {
        let bar = ProgressBar::new(operations);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} ops ({per_sec}, eta {eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let next = Arc::new(AtomicUsize::new(0));
    let executions = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..config.concurrency.max(1))
        .map(|_| {
            let (plan, idem, next, executions, scope, bar) = (
                Arc::clone(&plan),
                Arc::clone(&idem),
                Arc::clone(&next),
                Arc::clone(&executions),
                scope.clone(),
                bar.clone(),
            );
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let (mut replays, mut errors) = (0u64, 0u64);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&key) = plan.get(i) else { break };
                    let id = RecordId::new(scope.clone(), idem::Key::new(&format!("k{key}"))?);
                    let t = Instant::now();
                    let result = idem
                        .run(&id, None, |_ctx| async {
                            executions.fetch_add(1, Ordering::Relaxed);
                            Ok::<_, std::io::Error>(key)
                        })
                        .await;
                    latencies.push(t.elapsed().as_micros() as u64);
                    match result {
                        Ok(outcome) if outcome.is_replayed() => replays += 1,
                        Ok(_) => {}
                        Err(e) => {
                            if errors == 0 {
                                tracing::warn!(error = %e, "bench operation failed");
                            }
                            errors += 1;
                        }
                    }
                    bar.inc(1);
                }
                anyhow::Ok((latencies, replays, errors))
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(operations as usize);
    let (mut replays, mut errors) = (0, 0);
    for worker in workers {
        let (l, r, e) = worker.await??;
        latencies.extend(l);
        replays += r;
        errors += e;
    }
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    Ok(BenchReport {
        operations,
        unique_keys: config.keys,
        executions: executions.load(Ordering::Relaxed),
        replays,
        errors,
        ops_per_sec: operations as f64 / seconds,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        seconds,
    })
}

/// Every key once, then duplicates of earlier keys, shuffled so that
/// duplicates arrive both during and after their original.
fn plan(keys: u64, operations: u64) -> Vec<u64> {
    let mut rng = rand::rng();
    let mut plan: Vec<u64> = (0..keys).collect();
    plan.extend((keys..operations).map(|_| rng.random_range(0..keys)));
    plan.shuffle(&mut rng);
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_holds_every_key_and_the_duplicates() {
        let plan = plan(100, 150);
        assert_eq!(plan.len(), 150);
        let mut seen: Vec<u64> = plan.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
    }
}

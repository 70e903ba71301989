//! What the store benchmarks share: a closed-loop rate measurement and
//! the `--secs N` argument.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `callers` tasks for `secs`, each looping over `work(caller, i)`
/// which returns how many units it did; returns units per second.
///
/// # Panics
///
/// If a task panics (a benchmark's work asserts what it gets back).
pub async fn rate<F, Fut>(callers: usize, secs: f64, work: F) -> f64
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = u64> + Send,
{
    let work = Arc::new(work);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let (work, stop, done) = (Arc::clone(&work), Arc::clone(&stop), Arc::clone(&done));
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    done.fetch_add(work(c, i).await, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("bench task");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// The seconds per point a benchmark was given as `--secs N` on its
/// command line, or `default`.
pub fn secs_arg(default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--secs")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The number a benchmark was given as `NAME N` on its command line, or
/// `default`.
pub fn count_arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(default)
}

/// The median of the rounds' results (the upper one of an even count).
pub fn median(mut results: Vec<f64>) -> f64 {
    results.sort_by(f64::total_cmp);
    results[results.len() / 2]
}

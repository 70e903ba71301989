//! What the console's charts show: the process's own metrics, read every
//! few seconds from its Prometheus recorder and kept as a short history
//! of per-interval figures (the last hour at the default interval).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;

/// How often the history is sampled by default.
pub const EVERY: Duration = Duration::from_secs(10);

/// How many samples are kept.
const KEPT: usize = 360;

/// One interval's figures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    /// When the interval ended, in milliseconds since the epoch.
    pub at_ms: u64,
    /// Handler runs in the interval.
    pub executions: f64,
    /// Duplicates answered with a stored outcome.
    pub replays: f64,
    /// Replays as a share of runs that finished (0 to 1; 0 with none).
    pub duplicate_rate: f64,
    /// Claims that found their key in progress (duplicates that waited
    /// for, or were told of, a run still going).
    pub waits: f64,
    /// The store's mean operation time, in milliseconds (0 with none).
    pub store_ms: f64,
}

/// The sums a sample is made of, as the recorder rendered them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Totals {
    executions: f64,
    replays: f64,
    waits: f64,
    store_seconds: f64,
    store_ops: f64,
}

impl Totals {
    /// The totals in Prometheus' text format: each series of a name summed
    /// over its labels.
    fn read(text: &str) -> Self {
        let mut totals = Self::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            match name {
                idem::metrics::EXECUTIONS => totals.executions += value,
                idem::metrics::REPLAYS => totals.replays += value,
                idem::metrics::CLAIMS if labels.contains("outcome=\"in_progress\"") => {
                    totals.waits += value;
                }
                "idem_store_seconds_sum" => totals.store_seconds += value,
                "idem_store_seconds_count" => totals.store_ops += value,
                _ => {}
            }
        }
        totals
    }

    /// The interval from `before` to `self`, ending at `at_ms`.
    fn since(&self, before: &Self, at_ms: u64) -> Point {
        let executions = (self.executions - before.executions).max(0.0);
        let replays = (self.replays - before.replays).max(0.0);
        let ops = (self.store_ops - before.store_ops).max(0.0);
        let finished = executions + replays;
        Point {
            at_ms,
            executions,
            replays,
            duplicate_rate: if finished > 0.0 {
                replays / finished
            } else {
                0.0
            },
            waits: (self.waits - before.waits).max(0.0),
            store_ms: if ops > 0.0 {
                (self.store_seconds - before.store_seconds).max(0.0) / ops * 1e3
            } else {
                0.0
            },
        }
    }
}

/// The sampled history of one process's metrics.
#[derive(Debug)]
pub struct History {
    every: Duration,
    points: Mutex<VecDeque<Point>>,
}

impl History {
    /// Samples `metrics` every `every` from now on, for as long as the
    /// returned history is held.
    pub fn spawn(metrics: PrometheusHandle, every: Duration) -> Arc<Self> {
        let history = Arc::new(Self {
            every,
            points: Mutex::new(VecDeque::with_capacity(KEPT)),
        });
        let weak: Weak<Self> = Arc::downgrade(&history);
        tokio::spawn(async move {
            let mut before = Totals::read(&metrics.render());
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(history) = weak.upgrade() else {
                    return;
                };
                let now = Totals::read(&metrics.render());
                history.push(now.since(&before, now_ms()));
                before = now;
            }
        });
        history
    }

    fn push(&self, point: Point) {
        let mut points = self.points.lock().unwrap_or_else(PoisonError::into_inner);
        if points.len() == KEPT {
            points.pop_front();
        }
        points.push_back(point);
    }

    /// The samples, oldest first.
    pub fn points(&self) -> Vec<Point> {
        self.points
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .copied()
            .collect()
    }

    /// How long each sample's interval is.
    pub fn every(&self) -> Duration {
        self.every
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RENDERED: &str = "\
# TYPE idem_executions_total counter
idem_executions_total{result=\"ok\"} 7
idem_executions_total{result=\"terminal\"} 1
idem_replays_total 4
idem_claims_total{outcome=\"acquired\"} 8
idem_claims_total{outcome=\"in_progress\"} 2
# TYPE idem_store_seconds summary
idem_store_seconds{op=\"claim\",quantile=\"0.5\"} 0.001
idem_store_seconds_sum{op=\"claim\"} 0.02
idem_store_seconds_count{op=\"claim\"} 10
idem_store_seconds_sum{op=\"complete\"} 0.01
idem_store_seconds_count{op=\"complete\"} 10
";

    #[test]
    fn a_sample_is_what_changed_summed_over_labels() {
        let now = Totals::read(RENDERED);
        assert_eq!(now.executions, 8.0);
        assert_eq!(now.waits, 2.0);
        let point = now.since(&Totals::default(), 5);
        assert_eq!(point.replays, 4.0);
        assert!((point.duplicate_rate - 4.0 / 12.0).abs() < 1e-9);
        assert!((point.store_ms - 1.5).abs() < 1e-9, "{}", point.store_ms);
        let same = now.since(&now, 6);
        assert_eq!(
            (same.executions, same.duplicate_rate, same.store_ms),
            (0.0, 0.0, 0.0)
        );
    }
}

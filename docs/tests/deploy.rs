//! The Prometheus rules and the Grafana dashboard in `deploy/` name only
//! metrics idem exports and its docs list (the rules' behaviour is tested
//! by `promtool test rules`, from `scripts/test`).

use std::collections::BTreeSet;
use std::path::Path;

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every `idem_…` metric name in `text`: recording rules (`idem:…`,
/// `idem_consumer:…`) are not metrics, and a histogram's series are named
/// by its own name.
fn metric_names(text: &str) -> BTreeSet<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    text.split(|c: char| !is_name(c))
        .filter(|word| word.starts_with("idem_") && !word.contains(':'))
        .map(|word| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| word.strip_suffix(suffix))
                .unwrap_or(word)
                .to_owned()
        })
        .collect()
}

/// The metric names the code exports.
fn exported() -> BTreeSet<String> {
    use idem::metrics as core;
    use idem_consumer::metrics as consumer;
    [
        core::CLAIMS,
        core::REPLAYS,
        core::TAKEOVERS,
        core::LEASE_LOST,
        core::MISMATCHES,
        core::EXECUTIONS,
        core::FAIL_OPEN,
        core::STORE_ERRORS,
        core::STORE_SECONDS,
        core::STEPS,
        core::STEPS_IN_DOUBT,
        core::PARKED,
        core::REDRIVEN,
        core::BLOBS_SWEPT,
        core::BLOBS_UNREADABLE,
        core::OUTBOX_SENT,
        core::OUTBOX_FAILED,
        core::OUTBOX_DISPATCHES,
        core::OUTBOX_PENDING,
        core::OUTBOX_LAG,
        idem::cache::CACHE_HITS,
        idem::cache::CACHE_MISSES,
        idem::cache::CACHE_ERRORS,
        consumer::DELIVERIES,
        consumer::HANDLER_SECONDS,
        consumer::DUPLICATE_RATIO,
        consumer::KEYED_BY_SEND_ID,
    ]
    .into_iter()
    .map(str::to_owned)
    .collect()
}

/// The metric names the docs list: the core table and the consumers'.
fn documented() -> BTreeSet<String> {
    let docs = read("crates/idem/docs/metrics.md") + &read("docs/guide/src/operating.md");
    docs.split('`')
        .skip(1)
        .step_by(2)
        .filter(|code| {
            code.starts_with("idem_") && code.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_rules_and_the_dashboard_name_only_exported_and_documented_metrics() {
    let documented: BTreeSet<String> = documented().intersection(&exported()).cloned().collect();
    assert!(documented.contains("idem_claims_total"), "{documented:?}");
    assert!(documented.contains("idem_consumer_deliveries_total"));
    for path in [
        "deploy/prometheus/idem.rules.yml",
        "deploy/prometheus/idem.rules.test.yml",
        "deploy/grafana/idem.json",
    ] {
        let used = metric_names(&read(path));
        assert!(!used.is_empty(), "{path} names no metric");
        let unknown: Vec<_> = used.difference(&documented).collect();
        assert!(
            unknown.is_empty(),
            "{path} names metrics not both exported and documented: {unknown:?}"
        );
    }
}

#[test]
fn the_dashboard_queries_the_chosen_prometheus_in_every_panel() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/idem.json")).expect("dashboard JSON");
    let variable = &dashboard["templating"]["list"][0];
    assert_eq!(
        (variable["name"].as_str(), variable["type"].as_str()),
        (Some("datasource"), Some("datasource"))
    );
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut queries = 0;
    for panel in panels {
        assert!(
            ids.insert(panel["id"].as_u64().expect("id")),
            "duplicate id in {panel}"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "{}",
            panel["title"]
        );
        for target in panel["targets"].as_array().expect("targets") {
            assert_eq!(target["datasource"]["uid"], "${datasource}");
            assert!(target["expr"].as_str().is_some_and(|e| e.contains("idem_")));
            queries += 1;
        }
    }
    assert!(queries >= 15, "{queries} queries");
}

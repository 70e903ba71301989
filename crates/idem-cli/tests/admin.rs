//! The admin commands and the bench against a real store file, and the
//! proxy's settings from a TOML file.

use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{RecordId, Store};
use idem_cli::store::{AnyStore, StoreUrl};
use idem_cli::{admin, bench, ProxyArgs};

fn no_secrets() -> admin::Secrets {
    admin::Secrets::read(None, None).expect("no files to read")
}

fn id(key: &str) -> RecordId {
    RecordId::parse("http POST /charges", key).expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_list_release_stats_and_purge() {
    let dir = tempfile::tempdir().expect("dir");
    let url: StoreUrl = format!("sqlite:{}", dir.path().join("idem.db").display())
        .parse()
        .expect("url");
    let store = url.open().await.expect("open");
    let long = ClaimParams::new(Duration::from_secs(60), Duration::from_secs(3600));
    let short = ClaimParams::new(Duration::from_millis(300), Duration::from_millis(300));
    for key in ["done-1", "done-2"] {
        let ClaimOutcome::Acquired(lease) = store.claim(&id(key), &long).await.expect("claim")
        else {
            panic!("fresh key");
        };
        store
            .complete(&lease, Bytes::from_static(b"ok"), Duration::from_secs(3600))
            .await
            .expect("complete");
    }
    assert!(matches!(
        store.claim(&id("stuck"), &long).await.expect("claim"),
        ClaimOutcome::Acquired(_)
    ));
    for i in 0..25 {
        store
            .claim(
                &RecordId::parse("expiring", &format!("k{i}")).expect("valid"),
                &short,
            )
            .await
            .expect("claim");
    }

    let record = admin::inspect(&store, &id("done-1"), &no_secrets())
        .await
        .expect("inspect")
        .expect("present");
    assert_eq!(record["state"], "completed");
    assert_eq!(record["response_bytes"], 2);
    assert_eq!(record["key"], "done-1");

    let scope = idem::Scope::new("http POST /charges").expect("scope");
    let stuck = admin::list(&store, Some(idem::StateKind::InProgress), Some(scope), 100)
        .await
        .expect("list");
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0]["key"], "stuck");
    let completed = admin::list(&store, Some(idem::StateKind::Completed), None, 1)
        .await
        .expect("list");
    assert_eq!(completed.len(), 1, "the limit is honoured");

    assert!(admin::release(&store, &id("stuck")).await.expect("release"));
    assert!(
        matches!(
            store.claim(&id("stuck"), &long).await.expect("claim"),
            ClaimOutcome::Acquired(_)
        ),
        "a released key runs again"
    );

    // Every "expiring" record was claimed at least this long ago.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let stats = admin::stats(&store, false).await.expect("stats");
    assert_eq!(
        stats["records"], 3,
        "expired records are not counted: {stats}"
    );
    assert_eq!(stats["by_state"]["completed"], 2);
    assert_eq!(
        admin::purge(&store, 10, false).await.expect("purge"),
        25,
        "every expired record, in batches of 10"
    );
    assert_eq!(admin::purge(&store, 10, false).await.expect("purge"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_every_unique_key_once() {
    let dir = tempfile::tempdir().expect("dir");
    let store =
        AnyStore::Sqlite(idem_sqlite::SqliteStore::open(dir.path().join("idem.db")).expect("open"));
    let report = bench::run(
        store,
        &bench::BenchConfig {
            keys: 500,
            duplicates: 0.5,
            concurrency: 16,
            progress: false,
        },
    )
    .await
    .expect("bench");
    assert_eq!(report.operations, 1_000);
    assert_eq!(report.executions, 500);
    assert_eq!(report.replays, 500);
    assert_eq!(report.errors, 0);
}

#[test]
fn keys_in_the_body_webhooks_and_mcp_come_from_the_config_file_and_clash_when_mixed() {
    let dir = tempfile::tempdir().expect("dir");
    let secret = dir.path().join("stripe-secret");
    std::fs::write(&secret, "whsec_test\n").expect("write");
    let path = dir.path().join("idem.toml");
    let from = |toml: String| {
        std::fs::write(&path, toml).expect("write");
        ProxyArgs {
            config: Some(path.clone()),
            ..ProxyArgs::default()
        }
        .with_file()
        .expect("file read")
        .proxy_config()
    };
    let upstream = "upstream = \"http://127.0.0.1:3000\"\n";
    let config = from(format!(
        "{upstream}key_in_body = \"fields:/account, /amount\"\n\
         fingerprint_fields = \"/account,/amount\"\n"
    ))
    .expect("valid");
    assert_eq!(
        config.key_in_body,
        Some(idem::derive::json::JsonKey::Fields(vec![
            "/account".into(),
            "/amount".into()
        ]))
    );
    assert_eq!(
        config.fingerprint_fields.as_deref(),
        Some(&["/account".to_owned(), "/amount".to_owned()][..])
    );
    let config = from(format!(
        "{upstream}webhook = \"stripe\"\nwebhook_secret_file = {:?}\n",
        secret.display().to_string()
    ))
    .expect("valid");
    assert_eq!(
        config.webhook.map(|w| w.kind()),
        Some(idem_http::WebhookKind::Stripe)
    );
    let config = from(format!("{upstream}mcp = \"request_id\"\n")).expect("valid");
    assert_eq!(config.mcp.as_deref(), Some("request_id"));
    let secret_file = format!("webhook_secret_file = {:?}\n", secret.display().to_string());
    for (clash, complaint) in [
        (
            "mcp = \"k\"\nkey_in_body = \"/id\"\n".to_owned(),
            "drop --key-in-body",
        ),
        (format!("webhook = \"svix\"\n{secret_file}"), "--webhook"),
        (secret_file.clone(), "go together"),
        ("key_in_body = \"id\"\n".to_owned(), "--key-in-body"),
    ] {
        let error = from(format!("{upstream}{clash}"))
            .expect_err(&clash)
            .to_string();
        assert!(error.contains(complaint), "{clash}: {error}");
    }
}

#[test]
fn proxy_settings_come_from_flags_then_file_then_defaults() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("idem.toml");
    std::fs::write(
        &path,
        "upstream = \"http://127.0.0.1:3000\"\nretention = \"2h\"\nrequire_key = true\n\
         methods = \"post, put\"\nlisten = \"127.0.0.1:9999\"\n",
    )
    .expect("write");
    let args = ProxyArgs {
        config: Some(path.clone()),
        listen: Some("127.0.0.1:8081".to_owned()),
        ..ProxyArgs::default()
    }
    .with_file()
    .expect("file read");
    assert_eq!(
        args.listen.as_deref(),
        Some("127.0.0.1:8081"),
        "the flag wins"
    );
    let config = args.proxy_config().expect("valid");
    assert_eq!(config.retention, Duration::from_secs(7200));
    assert!(config.require_key);
    assert_eq!(config.methods, [http::Method::POST, http::Method::PUT]);
    assert_eq!(config.lease, Duration::from_secs(30), "the default");

    std::fs::write(&path, "upstream = \"http://x\"\nretension = \"2h\"\n").expect("write");
    let err = ProxyArgs {
        config: Some(path),
        ..ProxyArgs::default()
    }
    .with_file()
    .expect_err("a misspelt setting is refused");
    assert!(err.to_string().contains("retension"), "{err}");

    let bad = ProxyArgs {
        upstream: Some("ftp://x".to_owned()),
        ..ProxyArgs::default()
    };
    let err = bad.proxy_config().expect_err("not http");
    assert!(err.to_string().contains("http:// or https:// URL"), "{err}");
    for (upstream, http2, preserved) in [
        ("http://x", None, true),
        ("https://x", None, false),
        ("http://x", Some(true), false),
    ] {
        let config = ProxyArgs {
            upstream: Some(upstream.to_owned()),
            upstream_http2: http2,
            ..ProxyArgs::default()
        }
        .proxy_config()
        .expect("valid");
        assert_eq!(
            config.forwarded.preserve_host, preserved,
            "Host by default for {upstream} (http2 {http2:?})"
        );
    }
    let half = ProxyArgs {
        upstream: Some("https://x".to_owned()),
        tls_cert: Some("cert.pem".into()),
        ..ProxyArgs::default()
    };
    let err = half
        .proxy_config()
        .expect_err("a certificate without its key");
    assert!(err.to_string().contains("give both or neither"), "{err}");
    let bad = ProxyArgs {
        upstream: Some("http://x".to_owned()),
        retention: Some("5 parsecs".to_owned()),
        ..ProxyArgs::default()
    };
    let err = bad.proxy_config().expect_err("bad duration");
    assert!(err.to_string().contains("--retention"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_records_are_listed_inspected_and_resolved() {
    use idem::{Failure, FailureClass, StepJournal};

    let dir = tempfile::tempdir().expect("dir");
    let url: StoreUrl = format!("sqlite:{}", dir.path().join("idem.db").display())
        .parse()
        .expect("url");
    let store = url.open().await.expect("open");
    let long = ClaimParams::new(Duration::from_secs(60), Duration::from_secs(3600));
    let parked = id("order-9");
    let ClaimOutcome::Acquired(lease) = store.claim(&parked, &long).await.expect("claim") else {
        panic!("fresh key");
    };
    store
        .begin_step(&lease, idem::durable::INPUT_STEP)
        .await
        .expect("begin");
    store
        .finish_step(
            &lease,
            idem::durable::INPUT_STEP,
            Bytes::from_static(b"{\"order\":9}"),
        )
        .await
        .expect("journal the input");
    store.begin_step(&lease, "charge").await.expect("begin");
    store
        .finish_step(&lease, "charge", Bytes::from_static(b"{\"id\":\"ch_1\"}"))
        .await
        .expect("finish");
    store.begin_step(&lease, "ship").await.expect("begin");
    store
        .fail(
            &lease,
            Failure::new(FailureClass::Unknown, "step \"ship\" is in doubt"),
            Duration::from_secs(3600),
        )
        .await
        .expect("park");
    let ClaimOutcome::Acquired(other) = store.claim(&id("declined"), &long).await.expect("claim")
    else {
        panic!("fresh key");
    };
    store
        .fail(
            &other,
            Failure::new(FailureClass::Terminal, "declined"),
            Duration::from_secs(3600),
        )
        .await
        .expect("fail");

    let listed = admin::list_parked(&store, None, 10, &no_secrets())
        .await
        .expect("list");
    assert_eq!(
        listed.len(),
        1,
        "only the unknown outcome is parked: {listed:?}"
    );
    assert_eq!(listed[0]["key"], "order-9");
    assert_eq!(listed[0]["steps"][0]["result"]["id"], "ch_1");
    assert_eq!(listed[0]["steps"][1]["state"], "started");
    assert_eq!(
        listed[0]["input"]["order"], 9,
        "a durable run's input is shown apart"
    );
    assert_eq!(listed[0]["steps"].as_array().map(Vec::len), Some(2));
    let shown = admin::inspect(&store, &parked, &no_secrets())
        .await
        .expect("inspect")
        .expect("present");
    assert_eq!(shown["failure"]["class"], "unknown");
    assert_eq!(shown["steps"][1]["name"], "ship");

    let bad_json = admin::resolution(Some("{not json")).expect_err("broken JSON");
    assert!(bad_json.to_string().contains("as JSON"), "{bad_json}");
    let finished = admin::resolve(
        &store,
        &parked,
        "charge",
        admin::resolution(None).expect("not applied"),
        &no_secrets(),
    )
    .await
    .expect_err("charge is not in doubt");
    assert!(finished.to_string().contains("not in doubt"), "{finished}");
    let reserved = admin::resolve(
        &store,
        &parked,
        idem::durable::INPUT_STEP,
        admin::resolution(Some("{}")).expect("applied"),
        &no_secrets(),
    )
    .await
    .expect_err("the input is not a step");
    assert!(reserved.to_string().contains("reserved"), "{reserved}");
    let not_parked = admin::resolve(
        &store,
        &id("declined"),
        "x",
        admin::resolution(None).expect("not applied"),
        &no_secrets(),
    )
    .await
    .expect_err("a terminal failure is not parked");
    assert!(
        not_parked.to_string().contains("not parked"),
        "{not_parked}"
    );

    admin::resolve(
        &store,
        &parked,
        "ship",
        admin::resolution(Some(r#"{"shipment": "shp_1"}"#)).expect("json"),
        &no_secrets(),
    )
    .await
    .expect("resolve");
    let shown = admin::inspect(&store, &parked, &no_secrets())
        .await
        .expect("inspect")
        .expect("present");
    assert_eq!(shown["state"], "released");
    assert_eq!(shown["steps"][1]["result"]["shipment"], "shp_1");
    assert!(admin::list_parked(&store, None, 10, &no_secrets())
        .await
        .expect("list")
        .is_empty());
}

/// The gateway's yes/no settings are switches, as clap and every other
/// CLI teach: the flag alone turns one on, `=false` off, and the old
/// `--flag true` form still reads.
#[test]
fn yes_no_settings_are_switches() {
    use clap::Parser;
    let parse = |extra: &[&str]| {
        let mut argv = vec!["idem", "proxy", "--upstream", "http://127.0.0.1:3000"];
        argv.extend_from_slice(extra);
        let cli = idem_cli::Cli::try_parse_from(argv).expect("parsed");
        let idem_cli::Command::Proxy(args) = cli.command else {
            panic!("proxy")
        };
        args.proxy_config().expect("valid")
    };
    let on = parse(&[
        "--upstream-http2",
        "--require-key",
        "--fail-open",
        "--forward-takeovers",
        "--reject-old-uuid-v7",
        "--trust-forwarded",
        "--preserve-host",
        "--replay-set-cookie",
    ]);
    assert!(on.upstream_protocol.http2_only && on.require_key && on.fail_open);
    assert!(on.forward_takeovers && on.reject_old_uuid_v7 && on.replay_set_cookie);
    assert!(on.forwarded.trust_incoming && on.forwarded.preserve_host);
    let off = parse(&["--require-key=false", "--preserve-host=false"]);
    assert!(!off.require_key && !off.forwarded.preserve_host);
    let old_form = parse(&["--require-key", "true", "--fail-open", "false"]);
    assert!(old_form.require_key && !old_form.fail_open);
    let defaults = parse(&[]);
    assert!(!defaults.require_key && !defaults.replay_set_cookie);
}

/// A gateway others can reach with no tenant source is warned about at
/// start: every client would share one key space.
#[test]
fn a_shared_key_space_on_a_reachable_address_is_warned_about() {
    let mut config = ProxyArgs {
        upstream: Some("http://127.0.0.1:3000".to_owned()),
        ..ProxyArgs::default()
    }
    .proxy_config()
    .expect("valid");
    let public: std::net::SocketAddr = "0.0.0.0:8080".parse().expect("addr");
    let loopback: std::net::SocketAddr = "127.0.0.1:8080".parse().expect("addr");
    let warning = idem_cli::proxy::tenant_warning(&config, public).expect("warned");
    assert!(warning.contains("--tenant-header"), "{warning}");
    assert!(idem_cli::proxy::tenant_warning(&config, loopback).is_none());
    config.tenant_header = Some(http::HeaderName::from_static("x-account-id"));
    assert!(idem_cli::proxy::tenant_warning(&config, public).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_messages_a_run_sent() {
    use idem::outbox::{MemorySender, Message};

    let dir = tempfile::tempdir().expect("dir");
    let url: StoreUrl = format!("sqlite:{}", dir.path().join("idem.db").display())
        .parse()
        .expect("url");
    let store = url.open().await.expect("open");
    let sender = MemorySender::new();
    sender.fail(true);
    let idem = idem::Idempotency::builder(store.clone())
        .outbox(sender)
        .build()
        .expect("executor");
    let run = RecordId::parse("orders", "order-9").expect("valid");
    idem.run(&run, None, |ctx| async move {
        ctx.send(Message::new("shipping", "order-9").header("tenant", "a"))?;
        Ok::<_, idem::HandlerError>(9u32)
    })
    .await
    .expect("completes");

    let record = admin::inspect(&store, &run, &no_secrets())
        .await
        .expect("inspect")
        .expect("present");
    assert_eq!(record["response"]["envelope"], "with-messages");
    assert_eq!(record["response"]["value"], 9);
    let messages = &record["response"]["messages"];
    assert_eq!(messages[0]["destination"], "shipping");
    assert_eq!(messages[0]["bytes"], 7);
    assert_eq!(messages[0]["headers"], 1);
    assert_eq!(messages[0]["id"].as_str().map(str::len), Some(36));
}

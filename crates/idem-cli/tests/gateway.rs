//! The gateway end to end: a real upstream HTTP server that counts its
//! executions, the `idem proxy` router on a real listener over the embedded
//! store, and a real HTTP client, all on loopback.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_duplicates_run_once_and_replay_byte_for_byte() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let gw = Gateway::start(sqlite(&dir), config(addr)).await;
    let url = format!("{}/charge", gw.url);

    let first = post(&url, Some("order-1")).await;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert_eq!(first.headers()["idempotency-key-lifetime"], "3600");
    let first_body = first.bytes().await.expect("body");
    for _ in 0..3 {
        let again = post(&url, Some("order-1")).await;
        assert_eq!(again.status(), 201);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        let links: Vec<_> = again.headers().get_all("link").iter().collect();
        assert_eq!(
            links,
            ["</a>; rel=a", "</b>; rel=b"],
            "repeated headers kept, in order"
        );
        assert!(
            again.headers().get("set-cookie").is_none(),
            "cookies are not handed out again by default"
        );
        assert_eq!(again.headers()["x-charge"], "1");
        assert_eq!(again.headers()["content-type"], "application/json");
        assert_eq!(again.bytes().await.expect("body"), first_body);
    }
    assert_eq!(up.runs("/charge"), 1, "one execution for four requests");

    // Without a key (not required by default) every request runs.
    post(&url, None).await;
    post(&url, None).await;
    assert_eq!(up.runs("/charge"), 3);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_duplicates_execute_once() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let gw = Gateway::start(sqlite(&dir), config(addr)).await;
    let url = format!("{}/charge", gw.url);
    let requests: Vec<_> = (0..50)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let response = client()
                    .post(&url)
                    .header("idempotency-key", "\"race-1\"")
                    .header("x-delay-ms", "300")
                    .body("{}")
                    .send()
                    .await
                    .expect("sent");
                let status = response.status().as_u16();
                let retry_after = response.headers().get("retry-after").cloned();
                (status, retry_after, response.bytes().await.expect("body"))
            })
        })
        .collect();
    let mut created = Vec::new();
    let mut conflicts = 0;
    for request in requests {
        let (status, retry_after, body) = request.await.expect("task");
        match status {
            201 => created.push(body),
            409 => {
                conflicts += 1;
                assert!(retry_after.is_some(), "409 carries Retry-After");
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(
        up.runs("/charge"),
        1,
        "exactly one execution among 50 duplicates"
    );
    assert!(!created.is_empty());
    assert!(
        created.windows(2).all(|w| w[0] == w[1]),
        "every 201 is the same response"
    );
    assert_eq!(created.len() + conflicts, 50);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn problems_and_uncovered_methods_come_through_the_proxy() {
    // Each row of the status table is tested beside the service
    // (crates/idem-http/tests/status.rs); here, that the gateway forwards
    // what is not covered and answers what is, through a real client.
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let mut cfg = config(addr);
    cfg.require_key = true;
    cfg.max_request_bytes = 1024;
    let gw = Gateway::start(sqlite(&dir), cfg).await;
    let url = format!("{}/charge", gw.url);

    for _ in 0..2 {
        let r = client()
            .get(format!("{}/read", gw.url))
            .header("idempotency-key", "k")
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("idempotent-replayed").is_none());
    }
    assert_eq!(up.runs("/read"), 2);

    let detail = problem(post(&url, None).await, 400, "key-missing").await;
    assert!(
        detail.contains("requires an idempotency-key header"),
        "{detail}"
    );
    let huge = client()
        .post(&url)
        .header("idempotency-key", "big-body")
        .body(vec![b'x'; 4096])
        .send()
        .await
        .expect("sent");
    let detail = problem(huge, 413, "body-too-large").await;
    assert!(detail.contains("limit is 1024"), "{detail}");
    assert_eq!(post(&url, Some("big-body")).await.status(), 201);
    assert_eq!(up.runs("/charge"), 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_fidelity_for_binary_bodies_and_statuses() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let gw = Gateway::start(sqlite(&dir), config(addr)).await;
    let url = format!("{}/binary", gw.url);
    let first = post(&url, Some("bin")).await;
    assert_eq!(first.status(), 202);
    let first_body = first.bytes().await.expect("body");
    assert_eq!(first_body.len(), 512);
    let again = post(&url, Some("bin")).await;
    assert_eq!(again.status(), 202);
    assert_eq!(again.headers()["content-type"], "application/octet-stream");
    assert!(again.headers().get("transfer-encoding").is_none());
    assert_eq!(again.bytes().await.expect("body"), first_body);
    assert_eq!(up.runs("/binary"), 1);

    // 4xx outcomes are stored (a 404 replays) ...
    for code in [404u16, 422] {
        let url = format!("{}/status/{code}", gw.url);
        let a = post(&url, Some("s")).await;
        assert_eq!(a.status().as_u16(), code);
        let b = post(&url, Some("s")).await;
        assert_eq!(b.status().as_u16(), code);
        assert_eq!(b.headers()["idempotent-replayed"], "true");
        assert_eq!(up.runs(&format!("/status/{code}")), 1);
    }
    // ... except those a client may retry, and 5xx, which release the key.
    for code in [409u16, 429, 500, 503] {
        let url = format!("{}/status/{code}", gw.url);
        for run in 1..=2 {
            let r = post(&url, Some("s")).await;
            assert_eq!(r.status().as_u16(), code);
            assert!(r.headers().get("idempotent-replayed").is_none());
            assert_eq!(
                r.text().await.expect("body"),
                format!("status {code}, run {run}")
            );
        }
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_releases_the_key_and_the_retry_runs() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let gw = Gateway::start(sqlite(&dir), config(addr)).await;
    let url = format!("{}/flaky", gw.url);
    let first = post(&url, Some("f")).await;
    assert_eq!(first.status(), 503);
    assert_eq!(first.text().await.expect("body"), "upstream busy");
    let second = post(&url, Some("f")).await;
    assert_eq!(second.status(), 201);
    assert_eq!(second.text().await.expect("body"), "done on run 2");
    let third = post(&url, Some("f")).await;
    assert_eq!(third.headers()["idempotent-replayed"], "true");
    assert_eq!(third.text().await.expect("body"), "done on run 2");
    assert_eq!(up.runs("/flaky"), 2);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_is_502_and_the_key_stays_usable() {
    let dir = tempfile::tempdir().expect("dir");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let gw = Gateway::start(sqlite(&dir), config(addr)).await;
    let url = format!("{}/charge", gw.url);
    let detail = problem(post(&url, Some("down")).await, 502, "upstream-unavailable").await;
    assert!(detail.contains("could not be reached"), "{detail}");
    let up = start_upstream_on(TcpListener::bind(addr).await.expect("rebind")).await;
    let ok = post(&url, Some("down")).await;
    assert_eq!(ok.status(), 201);
    assert!(ok.headers().get("idempotent-replayed").is_none());
    assert_eq!(up.runs("/charge"), 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_may_have_reached_the_upstream_is_never_sent_twice() {
    let cases: [(&str, &'static [u8], u16, &str); 3] = [
        ("no answer in time", b"", 502, "did not answer"),
        (
            "closed before answering",
            b"\r",
            502,
            "failed after the request was sent",
        ),
        (
            "body broke off",
            b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial",
            502,
            "broke off",
        ),
    ];
    for (case, answer, status, says) in cases {
        let dir = tempfile::tempdir().expect("dir");
        let (seen, addr) = broken_upstream(answer).await;
        let mut config = config(addr);
        config.upstream_timeout = Duration::from_millis(800);
        let gw = Gateway::start(sqlite(&dir), config).await;
        let url = format!("{}/charge", gw.url);
        let detail = problem(post(&url, Some("k")).await, status, "outcome-unknown").await;
        assert!(detail.contains(says), "{case}: {detail}");
        assert!(detail.contains("will not run it again"), "{case}: {detail}");
        for _ in 0..2 {
            let detail = problem(post(&url, Some("k")).await, 422, "outcome-unknown").await;
            assert!(
                detail.contains("may have been processed"),
                "{case}: {detail}"
            );
        }
        assert_eq!(
            seen.load(Ordering::SeqCst),
            1,
            "{case}: the upstream saw the request once; retries were not forwarded"
        );
        let other = problem(post(&url, Some("other")).await, status, "outcome-unknown").await;
        assert!(other.contains(says), "{case}: {other}");
        assert_eq!(
            seen.load(Ordering::SeqCst),
            2,
            "{case}: another key is forwarded"
        );
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_kept_alive_and_replaced_once_the_upstream_closes_them() {
    let dir = tempfile::tempdir().expect("dir");
    let (seen, addr) = keep_alive_upstream(None).await;
    let gw = Gateway::start(sqlite(&dir), config(addr)).await;
    let url = format!("{}/charge", gw.url);
    for i in 0..10 {
        let response = post(&url, Some(&format!("kept-{i}"))).await;
        assert_eq!(response.status(), 201);
        assert_eq!(response.text().await.expect("body"), "ok");
        // Bodiless answers give their connection back too.
        let head = client().head(&url).send().await.expect("HEAD");
        assert_eq!(head.status(), 201);
    }
    assert_eq!(seen.requests.load(Ordering::SeqCst), 20);
    assert_eq!(
        seen.opened.load(Ordering::SeqCst),
        1,
        "one connection carried every request, one after another"
    );
    gw.shutdown().await;

    // An upstream that closes a connection 50 ms after its answer: each
    // request after a pause finds its connection closed and goes out on a
    // new one, once, instead of failing as sent and lost.
    let (seen, addr) = keep_alive_upstream(Some(Duration::from_millis(50))).await;
    let gw = Gateway::start(sqlite(&dir), config(addr)).await;
    let url = format!("{}/charge", gw.url);
    for i in 0..5 {
        let response = post(&url, Some(&format!("idle-{i}"))).await;
        assert_eq!(response.status(), 201, "request {i}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(seen.requests.load(Ordering::SeqCst), 5);
    assert_eq!(seen.opened.load(Ordering::SeqCst), 5);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_never_see_each_others_responses() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let mut cfg = config(addr);
    cfg.tenant_header = Some(http::header::AUTHORIZATION);
    let gw = Gateway::start(sqlite(&dir), cfg).await;
    let url = format!("{}/charge", gw.url);
    let send = |who: &'static str| {
        client()
            .post(&url)
            .header("idempotency-key", "shared-key")
            .header("authorization", who)
            .body("{}")
            .send()
    };
    for round in 0..2 {
        for who in ["Bearer alice", "Bearer bob"] {
            let r = send(who).await.expect("sent");
            assert_eq!(r.status(), 201);
            assert_eq!(r.headers().get("idempotent-replayed").is_some(), round == 1);
            let body: serde_json::Value = r.json().await.expect("json");
            assert_eq!(body["for"], who, "each tenant gets its own response");
        }
    }
    assert_eq!(up.runs("/charge"), 2, "one execution per tenant");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_too_large_to_store_is_delivered_once_then_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let mut cfg = config(addr);
    cfg.max_response_bytes = 1024;
    let gw = Gateway::start(sqlite(&dir), cfg).await;
    let url = format!("{}/big", gw.url);
    let first = post(&url, Some("big")).await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.bytes().await.expect("body").len(), 4096, "sent whole");
    let detail = problem(post(&url, Some("big")).await, 422, "response-not-stored").await;
    assert!(detail.contains("1024-byte limit"), "{detail}");
    assert_eq!(up.runs("/big"), 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_is_503_fail_closed() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let store = sqlite(&dir);
    let gw = Gateway::start(store, config(addr)).await;
    // Another connection holds the write lock past the store's busy timeout.
    let locker = rusqlite::Connection::open(dir.path().join("idem.db")).expect("open");
    locker.execute_batch("BEGIN IMMEDIATE").expect("lock");
    let r = post(&format!("{}/charge", gw.url), Some("locked")).await;
    let retry_after = r.headers().get("retry-after").cloned();
    problem(r, 503, "store-unavailable").await;
    assert!(retry_after.is_some());
    assert_eq!(up.runs("/charge"), 0, "nothing ran without a claim");
    locker.execute_batch("ROLLBACK").expect("unlock");
    assert_eq!(
        post(&format!("{}/charge", gw.url), Some("locked"))
            .await
            .status(),
        201
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_completed_records_and_shutdown_finishes_in_flight() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let gw = Gateway::start(sqlite(&dir), config(addr)).await;
    let url = format!("{}/charge", gw.url);
    assert_eq!(post(&url, Some("kept")).await.status(), 201);
    // A slow request is in flight when shutdown starts: it finishes, and
    // its key is completed, not left claimed.
    let slow = {
        let url = url.clone();
        tokio::spawn(async move {
            client()
                .post(&url)
                .header("idempotency-key", "in-flight")
                .header("content-type", "application/json")
                .header("x-delay-ms", "400")
                .body(r#"{"amount":100}"#)
                .send()
                .await
                .expect("sent")
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    gw.shutdown().await;
    assert_eq!(slow.await.expect("task"), 201);

    let gw = Gateway::start(sqlite(&dir), config(addr)).await;
    let url = format!("{}/charge", gw.url);
    for key in ["kept", "in-flight"] {
        let r = post(&url, Some(key)).await;
        assert_eq!(r.status(), 201);
        assert_eq!(
            r.headers()["idempotent-replayed"],
            "true",
            "{key} survived the restart"
        );
    }
    assert_eq!(up.runs("/charge"), 2);
    gw.shutdown().await;
}

/// Two gateways (two replicas behind a load balancer) sharing one Redis
/// Cluster: 50 concurrent duplicates spread over both run the upstream once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_a_redis_cluster_execute_once() {
    let cluster =
        idem_testkit::servers::redis::RedisCluster::start().expect("start a Redis Cluster");
    two_gateways_execute_once(&cluster.url()).await;
}

/// The same with PostgreSQL as the shared store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_postgres_execute_once() {
    let server = idem_testkit::servers::postgres::PgServer::start().expect("start postgres");
    two_gateways_execute_once(&format!("{}?schema=gateway", server.url("postgres"))).await;
}

/// The same with MariaDB as the shared store, named by a `mysql://` URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_mysql_execute_once() {
    let server = idem_testkit::servers::mysql::MySqlServer::start().expect("start mariadb");
    let db = server.create_database("gateway").expect("database");
    two_gateways_execute_once(&server.url(&db)).await;
}

async fn two_gateways_execute_once(url: &str) {
    let store_url: idem_cli::store::StoreUrl = url.parse().expect("store URL");
    let (up, addr) = start_upstream().await;
    let a = Gateway::start(store_url.open().await.expect("connect"), config(addr)).await;
    let b = Gateway::start(store_url.open().await.expect("connect"), config(addr)).await;
    let requests: Vec<_> = (0..50)
        .map(|i| {
            let url = format!("{}/charge", if i % 2 == 0 { &a.url } else { &b.url });
            tokio::spawn(async move {
                let response = client()
                    .post(&url)
                    .header("idempotency-key", "shared-1")
                    .header("x-delay-ms", "200")
                    .body("{}")
                    .send()
                    .await
                    .expect("sent");
                (
                    response.status().as_u16(),
                    response.bytes().await.expect("body"),
                )
            })
        })
        .collect();
    let mut created = Vec::new();
    for request in requests {
        match request.await.expect("task") {
            (201, body) => created.push(body),
            (409, _) => {}
            (other, body) => panic!("unexpected status {other}: {body:?}"),
        }
    }
    assert_eq!(up.runs("/charge"), 1, "one execution across both gateways");
    // Once it is done, both gateways replay the same bytes.
    for gw in [&a, &b] {
        let replay = client()
            .post(format!("{}/charge", gw.url))
            .header("idempotency-key", "shared-1")
            .body("{}")
            .send()
            .await
            .expect("sent");
        assert_eq!(replay.status(), 201);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        let body = replay.bytes().await.expect("body");
        assert!(
            created.iter().all(|c| *c == body),
            "replays match the first response"
        );
    }
    assert_eq!(up.runs("/charge"), 1);
    a.shutdown().await;
    b.shutdown().await;
}

/// A duplicate asking `Prefer: wait=N` is held until the first request's
/// response is stored, then gets it; without the preference, 409 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_that_prefers_to_wait_gets_the_stored_response() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let gw = Gateway::start(sqlite(&dir), config(addr)).await;
    let url = format!("{}/charge", gw.url);
    let send = |prefer: Option<&'static str>, delay: &'static str| {
        let mut request = client()
            .post(&url)
            .header("idempotency-key", "waited")
            .header("content-type", "application/json")
            .header("x-delay-ms", delay)
            .body(r#"{"amount":100}"#);
        if let Some(prefer) = prefer {
            request = request.header("prefer", prefer);
        }
        request.send()
    };
    let first = tokio::spawn(send(None, "700"));
    while up.runs("/charge") == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(send(None, "0").await.expect("sent").status(), 409);
    let waited = send(Some("wait=5"), "0").await.expect("sent");
    assert_eq!(waited.status(), 201);
    assert_eq!(waited.headers()["idempotent-replayed"], "true");
    assert_eq!(waited.headers()["preference-applied"], "wait=5");
    let first = first.await.expect("task").expect("sent");
    assert_eq!(
        waited.text().await.expect("body"),
        first.text().await.expect("body")
    );
    assert_eq!(up.runs("/charge"), 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn replays_leave_out_the_headers_the_gateway_is_told_to() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (up, upstream) = start_upstream().await;
    let mut config = config(upstream);
    config.replay_drop_headers = vec![http::header::LINK];
    let gateway = Gateway::start(sqlite(&dir), config).await;
    let url = format!("{}/charge", gateway.url);
    let first = post(&url, Some("cookie-1")).await;
    assert_eq!(first.headers().get_all("set-cookie").iter().count(), 2);
    assert_eq!(first.headers().get_all("link").iter().count(), 2);
    let again = post(&url, Some("cookie-1")).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers().get_all("link").iter().count(), 0);
    assert_eq!(
        again.headers().get_all("set-cookie").iter().count(),
        0,
        "nor cookies, by default"
    );
    assert!(again.headers().contains_key("date"));
    assert_eq!(up.runs("/charge"), 1);
    gateway.shutdown().await;

    // --replay-set-cookie brings them back.
    let (up, upstream) = start_upstream().await;
    let mut config = common::config(upstream);
    config.replay_set_cookie = true;
    let gateway = Gateway::start(sqlite(&dir), config).await;
    let url = format!("{}/charge", gateway.url);
    post(&url, Some("cookie-2")).await;
    let again = post(&url, Some("cookie-2")).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let cookies: Vec<_> = again.headers().get_all("set-cookie").iter().collect();
    assert_eq!(cookies, ["a=1", "b=2"]);
    assert_eq!(up.runs("/charge"), 1);
    gateway.shutdown().await;
}

//! The operator console, in a real browser (Debian's Chromium, headless,
//! through ChromeDriver): an operator signs in on the gateway's admin
//! listener, finds the runs whose outcome the gateway could not know,
//! resolves one from its page and a failure group in bulk, and reads the
//! charts' figures; the retries then run. Without the browser: what the
//! console refuses (no token, another site's form, a stale form token).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use common::browser::Browser;
use common::client;
use common::process::GatewayProcess;
use serde_json::Value;

const TOKEN: &str = "console-test-token-0123456789";

/// Runs of each key. A key starting `hang-` hangs on its first run (the
/// gateway gives up: outcome unknown); every other run answers at once.
#[derive(Clone, Default)]
struct Upstream {
    runs: Arc<Mutex<HashMap<String, u32>>>,
}

impl Upstream {
    fn runs(&self, key: &str) -> u32 {
        self.runs
            .lock()
            .expect("lock")
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

async fn charge(
    State(up): State<Upstream>,
    headers: HeaderMap,
) -> (axum::http::StatusCode, String) {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let run = {
        let mut runs = up.runs.lock().expect("lock");
        let run = runs.entry(key.clone()).or_default();
        *run += 1;
        *run
    };
    if run == 1 && key.starts_with("hang-") {
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    (
        axum::http::StatusCode::CREATED,
        format!("charged {key} (run {run})"),
    )
}

async fn start(args: &[&str]) -> (Upstream, GatewayProcess, tempfile::TempDir) {
    let upstream = Upstream::default();
    let app = Router::new()
        .route("/charges", post(charge))
        .with_state(upstream.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let at = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().expect("dir");
    let store = format!("sqlite:{}", dir.path().join("idem.db").display());
    let mut all = vec!["--upstream", &at, "--upstream-timeout", "500ms"];
    all.extend_from_slice(args);
    let gateway = GatewayProcess::start_with_admin(&store, &all).await;
    (upstream, gateway, dir)
}

async fn charge_once(gateway: &GatewayProcess, key: &str) -> reqwest::Response {
    client()
        .post(format!("{}/charges", gateway.url))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"amount":100}"#)
        .send()
        .await
        .expect("answered")
}

/// The sum of a chart's figures, read from the page.
async fn chart_sum(browser: &Browser, chart: &str) -> f64 {
    let data = browser
        .find(&format!("#chart-{chart}"))
        .await
        .attr("data-points")
        .await
        .expect("attr")
        .expect("data-points");
    let points: Vec<(u64, f64)> = serde_json::from_str(&data).expect("figures");
    points.iter().map(|(_, v)| v).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resolves_parked_runs_in_the_browser_and_the_retries_run() {
    let (upstream, gateway, _dir) =
        start(&["--admin-token", TOKEN, "--console-every", "200ms"]).await;
    let admin = gateway.admin_url.clone().expect("admin listener");

    // Five charges, each retried once (replayed), and three whose
    // upstream never answered in time: their outcome is unknown.
    for i in 0..5 {
        let key = format!("ok-{i}");
        assert_eq!(charge_once(&gateway, &key).await.status(), 201);
        let retry = charge_once(&gateway, &key).await;
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
    }
    for key in ["hang-1", "hang-2", "hang-3"] {
        assert_eq!(charge_once(&gateway, key).await.status(), 502, "{key}");
        assert_eq!(
            charge_once(&gateway, key).await.status(),
            422,
            "{key} waits for a person"
        );
    }
    // Two samples of the metrics after the last request.
    tokio::time::sleep(Duration::from_millis(700)).await;

    let browser = Browser::start().await;
    browser
        .client
        .goto(&format!("{admin}/console"))
        .await
        .expect("goto");
    browser
        .find("#token")
        .await
        .send_keys("not-the-admin-token")
        .await
        .expect("type");
    browser.click("#sign-in", "#problem").await;
    assert!(browser
        .text("#problem")
        .await
        .contains("not the admin token"));
    browser
        .find("#token")
        .await
        .send_keys(TOKEN)
        .await
        .expect("type");
    browser.click("#sign-in", "#by-state").await;
    assert_eq!(browser.text("td.count[data-state=parked]").await, "3");
    assert_eq!(browser.text("td.count[data-state=completed]").await, "5");
    // The replays: the five retries, and the three answered 422 from
    // their kept records.
    assert_eq!(
        chart_sum(&browser, "replays").await,
        8.0,
        "the replays chart"
    );
    assert!(
        chart_sum(&browser, "executions").await >= 5.0,
        "the executions chart"
    );
    assert!(
        chart_sum(&browser, "store_ms").await > 0.0,
        "the store latency chart"
    );
    browser.screenshot("console-overview").await;

    // One parked run, from its page: its step in doubt did not take
    // effect (the upstream never answered), so the retry runs.
    browser
        .click("a[href='/console/records?state=parked']", "#records")
        .await;
    let rows = browser
        .client
        .find_all(fantoccini::Locator::Css("tr.record"))
        .await
        .expect("rows");
    assert_eq!(rows.len(), 3);
    assert!(browser
        .find("tr.record[data-key='hang-1'] a")
        .await
        .attr("href")
        .await
        .expect("attr")
        .is_some());
    // Found by its key as the client sent it.
    browser
        .find("input[name=scope]")
        .await
        .send_keys("http POST /charges")
        .await
        .expect("type");
    browser
        .find("#search-key")
        .await
        .send_keys("hang-1")
        .await
        .expect("type");
    browser.click("#search", "#fields").await;
    assert_eq!(browser.text("#field-key").await, "hang-1");
    assert_eq!(browser.text("#field-state").await, "failed");
    // The gateway's one step: the forward, named for the attempt's fence.
    let step = "tr.step";
    let name = browser
        .find(step)
        .await
        .attr("data-step")
        .await
        .expect("attr");
    assert!(name.is_some_and(|n| n.starts_with("$effect.")));
    assert_eq!(browser.text("tr.step .step-state").await, "started");
    browser.screenshot("console-record").await;
    browser.click("#resolve form button", "#confirm-what").await;
    assert!(browser
        .text("#confirm-what")
        .await
        .contains("did not take effect"));
    assert_eq!(
        upstream.runs("hang-1"),
        1,
        "nothing changed before the confirmation"
    );
    browser.click("#confirm form button", "#done").await;
    let retry = charge_once(&gateway, "hang-1").await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.text().await.expect("body"), "charged hang-1 (run 2)");

    // The other two as a failure group, in bulk: a dry run first.
    browser
        .client
        .goto(&format!("{admin}/console/failures"))
        .await
        .expect("goto");
    let group = browser.find("tr.group[data-count='2']").await;
    assert!(group.text().await.expect("text").contains("parked"));
    browser.screenshot("console-failures").await;
    browser
        .click("tr.group[data-count='2'] button.redrive", "#redrive")
        .await;
    let planned = browser
        .client
        .find_all(fantoccini::Locator::Css("td.redrive-action"))
        .await
        .expect("rows");
    assert_eq!(planned.len(), 2);
    for cell in planned {
        assert_eq!(cell.text().await.expect("text"), "would resolve");
    }
    assert_eq!(
        charge_once(&gateway, "hang-2").await.status(),
        422,
        "a dry run changes nothing"
    );
    browser
        .click("#confirm form button", "#redrive-summary")
        .await;
    let summary: Value =
        serde_json::from_str(&browser.text("#redrive-summary").await).expect("json");
    assert_eq!(summary["redriven"], 2, "{summary}");
    for key in ["hang-2", "hang-3"] {
        let retry = charge_once(&gateway, key).await;
        assert_eq!(retry.status(), 201, "{key}");
        assert_eq!(upstream.runs(key), 2, "{key}: the hung run and the retry");
    }
    for i in 0..5 {
        assert_eq!(upstream.runs(&format!("ok-{i}")), 1);
    }

    browser
        .client
        .goto(&format!("{admin}/console"))
        .await
        .expect("goto");
    assert_eq!(browser.text("td.count[data-state=parked]").await, "0");
    browser.click("header form button", "#token").await;
    browser
        .client
        .goto(&format!("{admin}/console"))
        .await
        .expect("goto");
    browser.find("#token").await;
    browser.close().await;
}

/// A confirmed release of `kept-1`, signed in with the bearer token,
/// carrying `form_token`, from a page of `origin`.
async fn release(
    http: &reqwest::Client,
    admin: &str,
    form_token: &str,
    origin: Option<&str>,
) -> reqwest::Response {
    let mut request = http
        .post(format!("{admin}/console/release"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .form(&[
            ("scope", "http POST /charges"),
            ("key", "kept-1"),
            ("form_token", form_token),
            ("confirm", "yes"),
        ]);
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    request.send().await.expect("post")
}

/// The form token in a console page.
fn form_token(html: &str) -> String {
    let at =
        html.find("name=form_token value='").expect("a form") + "name=form_token value='".len();
    html[at..at + 64].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_refuses_strangers_other_sites_and_stale_forms() {
    let (_upstream, gateway, _dir) = start(&["--admin-token", TOKEN]).await;
    let admin = gateway.admin_url.clone().expect("admin listener");
    assert_eq!(charge_once(&gateway, "kept-1").await.status(), 201);
    let http = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let bearer = format!("Bearer {TOKEN}");

    let page = http
        .get(format!("{admin}/console"))
        .send()
        .await
        .expect("get");
    assert_eq!(page.status(), 303);
    assert_eq!(page.headers()["location"], "/console/login");
    let json = http
        .get(format!("{admin}/console/history.json"))
        .send()
        .await
        .expect("get");
    assert_eq!(json.status(), 401);
    let wrong = http
        .post(format!("{admin}/console/login"))
        .form(&[("token", "console-test-token-9876543210")])
        .send()
        .await
        .expect("post");
    assert_eq!(wrong.status(), 401);
    let signed = http
        .post(format!("{admin}/console/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .expect("post");
    assert_eq!(signed.status(), 303);
    let cookie = signed.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );

    let history: Value = http
        .get(format!("{admin}/console/history.json"))
        .header("authorization", &bearer)
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(history["every_ms"], 10_000);

    let record = format!("{admin}/console/record?scope=http+POST+%2Fcharges&key=kept-1");
    let page = http
        .get(&record)
        .header("authorization", &bearer)
        .send()
        .await
        .expect("get");
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    assert!(page.headers()["content-security-policy"]
        .to_str()
        .expect("csp")
        .contains("default-src 'none'"));
    let token = form_token(&page.text().await.expect("html"));
    let stale = release(&http, &admin, &"0".repeat(64), None).await;
    assert_eq!(stale.status(), 403);
    let foreign = release(&http, &admin, &token, Some("http://evil.example")).await;
    assert_eq!(foreign.status(), 403);
    assert!(foreign.text().await.expect("body").contains("another site"));
    let replayed = charge_once(&gateway, "kept-1").await;
    assert_eq!(
        replayed.headers()["idempotent-replayed"],
        "true",
        "still kept"
    );

    let released = release(&http, &admin, &token, Some(&admin)).await;
    assert_eq!(released.status(), 200);
    assert!(released.text().await.expect("body").contains("Released"));
    let gone = http
        .get(&record)
        .header("authorization", &bearer)
        .send()
        .await
        .expect("get");
    assert_eq!(gone.status(), 404);
    let again = charge_once(&gateway, "kept-1").await;
    assert_eq!(again.status(), 201);
    assert!(
        again.headers().get("idempotent-replayed").is_none(),
        "released: it ran again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_there_is_no_console_and_a_short_token_is_refused() {
    let (_upstream, gateway, _dir) = start(&[]).await;
    let admin = gateway.admin_url.clone().expect("admin listener");
    let page = client()
        .get(format!("{admin}/console"))
        .send()
        .await
        .expect("get");
    assert_eq!(page.status(), 404);
    assert!(page.text().await.expect("body").contains("--admin-token"));
    let metrics = client()
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .expect("get");
    assert_eq!(metrics.status(), 200, "the metrics stay open");

    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "--store",
            "memory:",
            "proxy",
            "--upstream",
            "http://127.0.0.1:9",
        ])
        .args(["--admin-listen", "127.0.0.1:0", "--admin-token", "short"])
        .output()
        .expect("run");
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("--admin-token") && said.contains("at least 16"),
        "{said}"
    );
}

/// A parked record in the SQLite file at `db`, as a consumer's run leaves
/// one whose step `charge` was started and never finished.
async fn parked_record(db: &std::path::Path, key: &str) {
    use idem::store::{ClaimOutcome, ClaimParams};
    use idem::{Failure, FailureClass, StepJournal, Store};
    let store = format!("sqlite:{}", db.display())
        .parse::<idem_cli::store::StoreUrl>()
        .expect("url")
        .open()
        .await
        .expect("open");
    let id = idem::RecordId::parse("orders", key).expect("id");
    let params = ClaimParams::new(Duration::from_secs(60), Duration::from_secs(3600));
    let ClaimOutcome::Acquired(lease) = store.claim(&id, &params).await.expect("claim") else {
        panic!("a fresh key");
    };
    store.begin_step(&lease, "charge").await.expect("begin");
    store
        .fail(
            &lease,
            Failure::new(FailureClass::Unknown, "step \"charge\" is in doubt"),
            Duration::from_secs(3600),
        )
        .await
        .expect("fail");
}

/// Waits until something listens on `at`.
async fn listening(at: &str, child: &mut std::process::Child) {
    let start = std::time::Instant::now();
    while tokio::net::TcpStream::connect(at).await.is_err() {
        assert!(child.try_wait().expect("wait").is_none(), "exited at start");
        assert!(start.elapsed() < Duration::from_secs(10), "{at} not up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A process, killed and reaped when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_serve_and_idem_console_on_its_own_serve_the_console_too() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("idem.db");
    parked_record(&db, "order-7").await;
    let store = format!("sqlite:{}", db.display());
    let free = || format!("127.0.0.1:{}", idem_testkit::free_port().expect("port"));
    let records = |admin: &str| format!("http://{admin}/console/records?state=parked");

    // idem serve, with an admin listener and a token.
    let (listen, admin) = (free(), free());
    let mut serve = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["--store", &store, "serve", "--listen", &listen])
            .args(["--admin-listen", &admin, "--admin-token", TOKEN])
            .env("IDEM_LOG", "warn")
            .spawn()
            .expect("idem serve"),
    );
    listening(&admin, &mut serve.0).await;
    let page = client()
        .get(records(&admin))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .expect("get");
    assert_eq!(page.status(), 200);
    assert!(page
        .text()
        .await
        .expect("html")
        .contains("data-key='order-7'"));
    let metrics = client()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .expect("get");
    assert_eq!(metrics.status(), 200);
    drop(serve);

    // idem console on its own: it makes a token and says it once.
    let listen = free();
    let mut console = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["--store", &store, "console", "--listen", &listen])
            .env("IDEM_LOG", "warn")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("idem console"),
    );
    let stderr = console.0.stderr.take().expect("stderr");
    let said = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stderr), &mut line).expect("read");
        line
    })
    .await
    .expect("line");
    let token = said.trim().rsplit(' ').next().expect("token").to_owned();
    assert_eq!(token.len(), 32, "{said}");
    listening(&listen, &mut console.0).await;
    let refused = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
        .get(records(&listen))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .expect("get");
    assert_eq!(refused.status(), 401, "another token");
    let page = client()
        .get(records(&listen))
        .header("authorization", format!("Bearer {token}"))
        .send()
        .await
        .expect("get");
    assert_eq!(page.status(), 200);
    let html = page.text().await.expect("html");
    assert!(html.contains("data-key='order-7'"), "{html}");
}

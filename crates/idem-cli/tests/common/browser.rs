//! Debian's Chromium, headless, driven through its ChromeDriver with
//! fantoccini (a WebDriver client): one browser per test, its driver
//! killed and reaped when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::net::TcpStream;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

pub struct Browser {
    driver: Child,
    pub client: Client,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// A headless Chromium with a fresh profile, 1280×900.
    pub async fn start() -> Self {
        for program in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(program).is_file(),
                "{program} is not installed: run scripts/test, which installs Debian's chromium \
                 and chromium-driver (ensure_chromium in scripts/lib.sh)"
            );
        }
        let port = idem_testkit::free_port().expect("port");
        let mut driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            if let Ok(Some(exit)) = driver.try_wait() {
                panic!("chromedriver exited at start: {exit}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "chromedriver not up"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().expect("profile");
        let options = serde_json::json!({
            "binary": CHROMIUM,
            "args": [
                "--headless=new",
                "--no-sandbox",
                "--disable-dev-shm-usage",
                "--disable-gpu",
                "--window-size=1280,900",
                format!("--user-data-dir={}", profile.path().display()),
            ],
        });
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("goog:chromeOptions".into(), options);
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a WebDriver session in chromium");
        Self {
            driver,
            client,
            _profile: profile,
        }
    }

    /// The element `css` selects on the current page (waited for up to
    /// 10 s).
    pub async fn find(&self, css: &str) -> fantoccini::elements::Element {
        match self
            .client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(css))
            .await
        {
            Ok(element) => element,
            Err(e) => {
                let at = self.client.current_url().await;
                let page = self.client.source().await.unwrap_or_default();
                panic!("no {css} on {at:?}: {e}\n{page}")
            }
        }
    }

    /// The visible text of `css`.
    pub async fn text(&self, css: &str) -> String {
        self.find(css).await.text().await.expect("text")
    }

    /// Clicks `css`, then waits for the page it leads to to show `then`.
    /// The page the click leaves is first seen gone (its element stale),
    /// so `then` is never found on it: a confirmation page may show the
    /// same element as the page it leads to.
    pub async fn click(&self, css: &str, then: &str) {
        let clicked = self.find(css).await;
        clicked.clone().click().await.expect("click");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match clicked.is_displayed().await {
                Err(fantoccini::error::CmdError::Standard(e))
                    if e.error == fantoccini::error::ErrorStatus::StaleElementReference =>
                {
                    break
                }
                _ if std::time::Instant::now() > deadline => {
                    panic!("clicking {css} did not leave its page")
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        self.find(then).await;
    }

    /// A screenshot of the page, to `$IDEM_CONSOLE_SCREENSHOTS/NAME.png`
    /// when that is set (the guide's pictures are taken this way).
    pub async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("screenshot");
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        if let Some(dir) = std::env::var_os("IDEM_CONSOLE_SCREENSHOTS") {
            std::fs::write(Path::new(&dir).join(format!("{name}.png")), png).expect("write");
        }
    }

    /// Ends the session (the browser exits), then the driver.
    pub async fn close(self) {
        self.client
            .clone()
            .close()
            .await
            .expect("close the session");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

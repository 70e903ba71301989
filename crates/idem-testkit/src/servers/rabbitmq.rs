//! A RabbitMQ broker for tests, shared by every test of a binary.
//!
//! [`RabbitServer::shared`] reuses a broker already listening on
//! `127.0.0.1:5672` (the machine's own service), or the one named by
//! `IDEM_TEST_AMQP_URL`; otherwise it starts its own as a child process
//! on free loopback ports. Tests isolate themselves by unique queue names.
//!
//! An own broker runs under an `sh` watchdog holding a pipe from the test
//! process: when the test process exits, the watchdog stops the broker
//! by PID (SIGTERM, which the start script turns into a clean stop), then
//! asks `epmd` to exit, which it refuses while any other node uses it, and
//! removes the broker's directory. [`RabbitServer::restart`] writes `keep`
//! down the pipe instead: the watchdog stops the broker and leaves its
//! directory, and a new watchdog starts it again on the same data.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::servers::{failed, listening, wait_listening};
pub use crate::servers::{free_port, ServerError};

const PROGRAM: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";

const WATCHDOG: &str = r#""$0" & pid=$!; read -r keep; case "$pid" in ''|0|*[!0-9]*) exit 1 ;; esac; kill -s TERM -- "$pid"; wait "$pid"; [ "$keep" = keep ] && exit 0; epmd -kill >/dev/null 2>&1; case "$1" in /tmp/idem-rabbitmq-*) rm -rf -- "$1" ;; esac; exit 0"#;

/// Settings of a broker a test starts for itself.
#[derive(Debug, Clone, Default)]
pub struct RabbitOptions {
    /// The broker's `consumer_timeout`: a delivery unacknowledged for
    /// longer makes the broker close the channel (and requeue what it
    /// held). The broker checks it on every channel tick, set here to
    /// 500 ms (RabbitMQ's default tick is a minute).
    pub consumer_timeout: Option<Duration>,
}

impl RabbitOptions {
    fn advanced_config(&self) -> String {
        match self.consumer_timeout {
            Some(timeout) => format!(
                "[{{rabbit, [{{consumer_timeout, {}}}, {{channel_tick_interval, 500}}]}}].\n",
                timeout.as_millis()
            ),
            None => "[].\n".to_owned(),
        }
    }
}

/// A RabbitMQ broker: the machine's, or one this process started.
#[derive(Debug)]
pub struct RabbitServer {
    url: String,
    port: u16,
    own: Option<OwnBroker>,
}

#[derive(Debug)]
struct OwnBroker {
    process: (Child, ChildStdin),
    node: NodeSetup,
}

/// What it takes to start an own broker's node, again on restart.
#[derive(Debug)]
struct NodeSetup {
    port: u16,
    dist_port: u16,
    dir: std::path::PathBuf,
    advanced: String,
}

impl NodeSetup {
    /// Starts the node under its watchdog and waits until it listens.
    fn spawn(&self) -> Result<(Child, ChildStdin), ServerError> {
        let (port, dir) = (self.port, &self.dir);
        // Files of its own, so the machine's /etc/rabbitmq (which may pin
        // the listener to 5672) is not read.
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text)
                .map_err(|e| failed(format!("writing {}: {e}", path.display())))
                .map(|()| path)
        };
        let plugins = write("enabled_plugins", "[].\n".to_owned())?;
        let config = write(
            "rabbitmq.conf",
            format!("listeners.tcp.default = 127.0.0.1:{port}\n"),
        )?;
        let env_file = write("rabbitmq-env.conf", String::new())?;
        let advanced = write("advanced.config", self.advanced.clone())?;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg(PROGRAM)
            .arg(dir)
            .env("RABBITMQ_NODENAME", format!("idem-{port}@localhost"))
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", &plugins)
            .env("RABBITMQ_CONFIG_FILE", &config)
            .env("RABBITMQ_CONF_ENV_FILE", &env_file)
            .env("RABBITMQ_ADVANCED_CONFIG_FILE", &advanced)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| failed(format!("spawning sh: {e}")))?;
        let stdin = child.stdin.take().ok_or_else(|| failed("no stdin pipe"))?;
        wait_listening(&mut child, "rabbitmq-server", port, Duration::from_secs(90))
            .and_then(|()| wait_greeting(port, Duration::from_secs(30)))
            .map_err(|why| failed(format!("{why}; logs in {}", dir.join("log").display())))?;
        Ok((child, stdin))
    }
}

/// Waits until the broker on `port` answers an AMQP protocol header with
/// its greeting (a `Connection.Start` frame): it listens a little before
/// it has booted, and a client connecting then has its connection
/// aborted.
fn wait_greeting(port: u16, limit: Duration) -> Result<(), String> {
    /// AMQP 0-9-1's protocol header.
    const HEADER: &[u8] = b"AMQP\x00\x00\x09\x01";
    /// The frame type of a method frame, which the greeting is.
    const METHOD_FRAME: u8 = 1;
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let greeted = || -> std::io::Result<bool> {
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(HEADER)?;
        let mut frame_type = [0u8; 1];
        stream.read_exact(&mut frame_type)?;
        Ok(frame_type[0] == METHOD_FRAME)
    };
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if matches!(greeted(), Ok(true)) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "rabbitmq-server listened on port {port} but did not greet an AMQP client in {} s",
        limit.as_secs()
    ))
}

impl RabbitServer {
    /// The broker every test of this binary uses; started on first use.
    pub fn shared() -> Result<&'static RabbitServer, ServerError> {
        static SHARED: OnceLock<Result<RabbitServer, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| Self::find_or_start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| failed(e.clone()))
    }

    fn find_or_start() -> Result<Self, ServerError> {
        if let Ok(url) = std::env::var("IDEM_TEST_AMQP_URL") {
            let port = url
                .rsplit_once(':')
                .and_then(|(_, rest)| rest.split('/').next()?.parse().ok())
                .unwrap_or(5672);
            return Ok(Self {
                url,
                port,
                own: None,
            });
        }
        if std::env::var_os("IDEM_TEST_OWN_RABBITMQ").is_none() && listening(5672) {
            return Ok(Self {
                url: "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned(),
                port: 5672,
                own: None,
            });
        }
        Self::start()
    }

    /// Starts a broker of its own on free loopback ports (about 10 s).
    pub fn start() -> Result<Self, ServerError> {
        Self::start_with(&RabbitOptions::default())
    }

    /// [`start`](Self::start) with settings a test needs of the broker.
    pub fn start_with(options: &RabbitOptions) -> Result<Self, ServerError> {
        if !std::path::Path::new(PROGRAM).is_file() {
            return Err(ServerError::NotInstalled("rabbitmq-server"));
        }
        let port = free_port()?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("idem-rabbitmq-{port}-"))
            .tempdir()
            .map_err(|e| failed(format!("temporary directory: {e}")))?
            .keep();
        let node = NodeSetup {
            port,
            dist_port: free_port()?,
            dir,
            advanced: options.advanced_config(),
        };
        let process = node.spawn()?;
        Ok(Self {
            url: format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
            port,
            own: Some(OwnBroker { process, node }),
        })
    }

    /// Stops a broker this process started, cleanly (its durable queues
    /// and persistent messages kept on disk), and starts it again on the
    /// same port with the same data; unacknowledged deliveries are back in
    /// their queues. Returns once it accepts connections again.
    pub fn restart(&mut self) -> Result<(), ServerError> {
        let own = self
            .own
            .as_mut()
            .ok_or_else(|| failed("only a broker this process started can be restarted"))?;
        let (child, stdin) = &mut own.process;
        writeln!(stdin, "keep").map_err(|e| failed(format!("asking the watchdog to stop: {e}")))?;
        child
            .wait()
            .map_err(|e| failed(format!("waiting for the broker to stop: {e}")))?;
        own.process = own.node.spawn()?;
        Ok(())
    }

    /// The AMQP URL, with guest credentials.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The AMQP port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

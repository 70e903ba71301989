//! A local AWS Lambda: the Runtime API a function's runtime polls
//! (`GET …/invocation/next`, `POST …/invocation/{id}/response` and
//! `…/error`, `POST …/init/error`), served on a free loopback port, and the
//! function itself as a child process, killed and started again when an
//! invocation runs past its timeout, as Lambda does.
//!
//! ```no_run
//! # async fn example() {
//! use std::process::Command;
//! use std::time::Duration;
//! use idem_testkit::servers::lambda::{Invoked, LambdaRuntime};
//!
//! let lambda = LambdaRuntime::start().await.unwrap();
//! lambda.run_function(|| Command::new("target/debug/my-function"));
//! let event = serde_json::json!({"Records": []});
//! match lambda.invoke(&event, Duration::from_secs(3)).await {
//!     Invoked::Responded(body) => println!("{}", String::from_utf8_lossy(&body)),
//!     other => panic!("{other:?}"),
//! }
//! # }
//! ```

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::{mpsc, oneshot};

use crate::servers::{failed, ServerError};

/// The ARN the function is invoked as.
pub const FUNCTION_ARN: &str = "arn:aws:lambda:us-east-1:000000000000:function:idem-test";

/// How an invocation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invoked {
    /// The function posted this response.
    Responded(Bytes),
    /// The function posted this error.
    Failed(Bytes),
    /// No answer by the deadline: the function was killed and started
    /// again.
    TimedOut,
}

impl Invoked {
    /// The response as JSON; panics, saying what came instead, for
    /// anything else.
    pub fn json(&self) -> serde_json::Value {
        match self {
            Invoked::Responded(body) => serde_json::from_slice(body)
                .unwrap_or_else(|e| panic!("response is not JSON ({e}): {body:?}")),
            other => panic!("expected a response, got {other:?}"),
        }
    }
}

/// An invocation waiting for the function to fetch it.
struct Pending {
    id: String,
    deadline_ms: u64,
    event: Bytes,
}

/// What the Runtime API's handlers share.
struct Shared {
    queue: tokio::sync::Mutex<mpsc::UnboundedReceiver<Pending>>,
    replies: Mutex<HashMap<String, oneshot::Sender<Invoked>>>,
    init_errors: Mutex<Vec<Bytes>>,
}

/// How to start the function's process.
type Launcher = Box<dyn Fn() -> Command + Send + Sync>;

/// The Runtime API on loopback and the function process it serves.
pub struct LambdaRuntime {
    addr: SocketAddr,
    shared: Arc<Shared>,
    invocations: mpsc::UnboundedSender<Pending>,
    function: Mutex<Option<(Launcher, Child)>>,
    server: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for LambdaRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LambdaRuntime")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl LambdaRuntime {
    /// Serves the Runtime API on a free loopback port, on the current
    /// Tokio runtime.
    pub async fn start() -> Result<Self, ServerError> {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| failed(format!("binding the Lambda Runtime API: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| failed(format!("the Lambda Runtime API's address: {e}")))?;
        let (invocations, queue) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            queue: tokio::sync::Mutex::new(queue),
            replies: Mutex::new(HashMap::new()),
            init_errors: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(respond),
            )
            .route("/2018-06-01/runtime/invocation/{id}/error", post(fail))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state(Arc::clone(&shared));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            addr,
            shared,
            invocations,
            function: Mutex::new(None),
            server,
        })
    }

    /// `host:port`, the value of `AWS_LAMBDA_RUNTIME_API`.
    pub fn api(&self) -> String {
        self.addr.to_string()
    }

    /// The environment Lambda gives a function, for this Runtime API.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_LAMBDA_RUNTIME_API", self.api()),
            ("AWS_LAMBDA_FUNCTION_NAME", "idem-test".to_owned()),
            ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128".to_owned()),
            ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".to_owned()),
        ]
    }

    /// Starts the function: `launch()` with [`env`](Self::env) added, now
    /// and again after each timeout.
    pub fn run_function(&self, launch: impl Fn() -> Command + Send + Sync + 'static) {
        let launch: Launcher = Box::new(launch);
        let child = self.spawn(&launch);
        let old = self
            .function
            .lock()
            .expect("function")
            .replace((launch, child));
        if let Some((_, mut old)) = old {
            stop(&mut old);
        }
    }

    fn spawn(&self, launch: &Launcher) -> Child {
        let mut command = launch();
        command.envs(self.env());
        command.spawn().expect("spawn the function")
    }

    /// The process id of the function's current process.
    pub fn function_pid(&self) -> Option<u32> {
        let function = self.function.lock().expect("function");
        function.as_ref().map(|(_, child)| child.id())
    }

    /// Invokes the function with `event` and waits for its answer, at most
    /// `timeout` (the function's configured timeout: its deadline is now
    /// plus `timeout`). Past it the function's process is killed and
    /// started again, and the invocation is [`Invoked::TimedOut`]. One
    /// invocation at a time, as one Lambda execution environment takes
    /// them: the timeout runs from when it is queued.
    pub async fn invoke(&self, event: &serde_json::Value, timeout: Duration) -> Invoked {
        let id = format!("{:032x}", rand::random::<u128>());
        let (tx, rx) = oneshot::channel();
        self.shared
            .replies
            .lock()
            .expect("replies")
            .insert(id.clone(), tx);
        let deadline = SystemTime::now() + timeout;
        let deadline_ms = deadline
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or_default();
        let event = Bytes::from(serde_json::to_vec(event).expect("event JSON"));
        self.invocations
            .send(Pending {
                id: id.clone(),
                deadline_ms,
                event,
            })
            .expect("the Runtime API is running");
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(invoked)) => invoked,
            _ => {
                self.shared.replies.lock().expect("replies").remove(&id);
                self.restart();
                Invoked::TimedOut
            }
        }
    }

    /// Kills the function's process and starts it again.
    fn restart(&self) {
        let mut function = self.function.lock().expect("function");
        if let Some((launch, child)) = function.as_mut() {
            stop(child);
            *child = self.spawn(launch);
        }
    }

    /// What the function posted to `…/init/error`.
    pub fn init_errors(&self) -> Vec<Bytes> {
        self.shared.init_errors.lock().expect("init errors").clone()
    }
}

impl Drop for LambdaRuntime {
    fn drop(&mut self) {
        if let Some((_, mut child)) = self.function.lock().expect("function").take() {
            stop(&mut child);
        }
        self.server.abort();
    }
}

/// Kills the function's process by its handle and reaps it.
fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

async fn next(State(shared): State<Arc<Shared>>) -> (StatusCode, HeaderMap, Bytes) {
    let mut queue = shared.queue.lock().await;
    // An invocation whose caller gave up (it timed out before the function
    // fetched it) is dropped, as Lambda drops it.
    let pending = loop {
        match queue.recv().await {
            Some(p) if shared.replies.lock().expect("replies").contains_key(&p.id) => break p,
            Some(_) => continue,
            None => return (StatusCode::GONE, HeaderMap::new(), Bytes::new()),
        }
    };
    drop(queue);
    let mut headers = HeaderMap::new();
    let value = |v: &str| HeaderValue::from_str(v).expect("header value");
    headers.insert("lambda-runtime-aws-request-id", value(&pending.id));
    headers.insert(
        "lambda-runtime-deadline-ms",
        value(&pending.deadline_ms.to_string()),
    );
    headers.insert("lambda-runtime-invoked-function-arn", value(FUNCTION_ARN));
    headers.insert("content-type", value("application/json"));
    (StatusCode::OK, headers, pending.event)
}

async fn respond(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    body: Bytes,
) -> StatusCode {
    answer(&shared, &id, Invoked::Responded(body))
}

async fn fail(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    body: Bytes,
) -> StatusCode {
    answer(&shared, &id, Invoked::Failed(body))
}

fn answer(shared: &Shared, id: &str, invoked: Invoked) -> StatusCode {
    match shared.replies.lock().expect("replies").remove(id) {
        Some(reply) => {
            let _ = reply.send(invoked);
            StatusCode::ACCEPTED
        }
        None => StatusCode::BAD_REQUEST,
    }
}

async fn init_error(State(shared): State<Arc<Shared>>, body: Bytes) -> StatusCode {
    shared.init_errors.lock().expect("init errors").push(body);
    StatusCode::ACCEPTED
}

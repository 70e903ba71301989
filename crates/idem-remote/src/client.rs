//! One call of the claim API: a JSON request out, and the answer read as
//! JSON or turned into the [`StoreError`] it means (docs/design.md §5.5): no
//! answer, a 503 or a 5xx that says nothing are transient; a 409 is a lost
//! lease; any other answered problem is a definite refusal.

use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use idem::StoreError;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The most an answer may take: a record with a response at the API's
/// own limit, and its envelope.
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// The HTTP client and where the API is.
#[derive(Clone)]
pub(crate) struct Api {
    pub(crate) client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// `scheme://authority` and any path prefix, without a trailing `/`.
    pub(crate) base: String,
    pub(crate) token: Option<HeaderValue>,
    pub(crate) timeout: Duration,
}

/// A problem+json body, as far as it is read here.
#[derive(serde::Deserialize)]
struct Problem {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    detail: String,
}

/// Why a call did not get the answer it asked for, before it is known
/// which operation it was.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refused(String);

impl Api {
    /// `POST path` with `body`; the answer's JSON.
    pub(crate) async fn post<B: Serialize, A: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<A, StoreError> {
        let body = serde_json::to_vec(body)
            .map_err(|e| StoreError::Backend(format!("encoding the request: {e}").into()))?;
        let bytes = self.call(Method::POST, path, Bytes::from(body)).await?;
        decode(path, &bytes)
    }

    /// `POST path` with `body`, for operations answered 204.
    pub(crate) async fn post_empty<B: Serialize>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<(), StoreError> {
        let body = serde_json::to_vec(body)
            .map_err(|e| StoreError::Backend(format!("encoding the request: {e}").into()))?;
        self.call(Method::POST, path, Bytes::from(body))
            .await
            .map(drop)
            .map_err(StoreError::from)
    }

    /// `GET path?query`; `None` for a 404 (no such record).
    pub(crate) async fn get<A: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<Option<A>, StoreError> {
        let query: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(query)
            .finish();
        let target = format!("{path}?{query}");
        match self.call(Method::GET, &target, Bytes::new()).await {
            Ok(bytes) => decode(path, &bytes).map(Some),
            Err(NotFound) => Ok(None),
            Err(Other(error)) => Err(error),
        }
    }

    /// One exchange, under the timeout: the body of a 2xx answer, or the
    /// error the answer (or its absence) means.
    async fn call(&self, method: Method, target: &str, body: Bytes) -> Result<Bytes, Failed> {
        let uri: Uri = format!("{}{target}", self.base)
            .parse()
            .map_err(|e| Other(StoreError::Backend(format!("{target}: {e}").into())))?;
        let mut request = Request::builder().method(method).uri(uri);
        if !body.is_empty() {
            request = request.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(token) = &self.token {
            request = request.header(AUTHORIZATION, token.clone());
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| Other(StoreError::Backend(Box::new(e))))?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| Other(StoreError::Unavailable(Box::new(e))))?;
            let status = response.status();
            let bytes = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| Other(StoreError::Unavailable(e)))?
                .to_bytes();
            Ok::<_, Failed>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| {
                Other(StoreError::Unavailable(
                    format!("idem serve did not answer in {:?}", self.timeout).into(),
                ))
            })??;
        if status.is_success() {
            return Ok(bytes);
        }
        Err(problem(status, &bytes))
    }
}

/// What a call that was not answered 2xx failed with.
enum Failed {
    /// 404: no such record.
    NotFound,
    /// Anything else.
    Other(StoreError),
}
use Failed::{NotFound, Other};

impl From<Failed> for StoreError {
    fn from(failed: Failed) -> Self {
        match failed {
            NotFound => StoreError::Backend("404 from idem serve: no such route or record".into()),
            Other(error) => error,
        }
    }
}

/// The error an answer other than 2xx means.
fn problem(status: StatusCode, body: &[u8]) -> Failed {
    let found: Option<Problem> = serde_json::from_slice(body).ok();
    let (kind, detail) = found.map_or_else(
        || (String::new(), String::from_utf8_lossy(body).into_owned()),
        |p| (p.kind, p.detail),
    );
    let why = || Box::new(Refused(format!("{status} from idem serve: {detail}")));
    match status {
        StatusCode::CONFLICT if kind.ends_with("/lease-lost") => Other(StoreError::LeaseLost),
        StatusCode::NOT_FOUND if kind.ends_with("/not-found") => NotFound,
        StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::BAD_GATEWAY
        | StatusCode::GATEWAY_TIMEOUT
        | StatusCode::TOO_MANY_REQUESTS
        | StatusCode::REQUEST_TIMEOUT => Other(StoreError::Unavailable(why())),
        // A 5xx that is not idem serve's own problem (a proxy in front of
        // it, a server going down): nothing says the write was refused.
        s if s.is_server_error() && kind.is_empty() => Other(StoreError::Unavailable(why())),
        _ => Other(StoreError::Backend(why())),
    }
}

/// The JSON of a 2xx answer from `path`.
fn decode<A: DeserializeOwned>(path: &str, bytes: &[u8]) -> Result<A, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| {
        StoreError::Backend(format!("the answer of {path} is not what the API sends: {e}").into())
    })
}

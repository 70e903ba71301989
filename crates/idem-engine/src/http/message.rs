//! [`HttpRequest`] and [`HttpResponse`]: a request and its answer as a
//! binding hands them over (text and bytes, no HTTP types), and their
//! conversion to and from the `http` crate's.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;

use crate::error::EngineError;

/// A request as a framework adapter sees it.
#[derive(Debug, Clone, Default)]
pub struct HttpRequest {
    /// The method (`POST`).
    pub method: String,
    /// The path and query (`/charges?expand=customer`).
    pub target: String,
    /// Each header line, in order; a name may repeat.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The whole body.
    pub body: Vec<u8>,
    /// The route template the framework matched (`/orders/{id}`), which
    /// scopes keys instead of the path when given.
    pub route: Option<String>,
    /// The verified caller, when keys are scoped per tenant (see
    /// [`HttpOptions::tenant`](super::HttpOptions::tenant)).
    pub tenant: Option<String>,
}

/// An answer: the handler's, a replay, or idem's own (problem+json).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Each header line, in order; a name may repeat.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The whole body.
    pub body: Vec<u8>,
}

/// The route a request was matched to, as a request extension.
#[derive(Debug, Clone)]
pub(crate) struct Route(pub(crate) String);

/// The request's tenant, as a request extension.
#[derive(Debug, Clone)]
pub(crate) struct Tenant(pub(crate) String);

fn invalid(what: &str, reason: impl std::fmt::Display) -> EngineError {
    EngineError::Config(format!("{what}: {reason}"))
}

impl HttpRequest {
    /// As an `http` request, its route and tenant as extensions.
    pub(crate) fn into_http(self) -> Result<Request<Full<Bytes>>, EngineError> {
        let method = Method::from_bytes(self.method.as_bytes())
            .map_err(|e| invalid(&format!("the method {:?}", self.method), e))?;
        let mut request = Request::builder()
            .method(method)
            .uri(&self.target)
            .body(Full::new(Bytes::from(self.body)))
            .map_err(|e| invalid(&format!("the request target {:?}", self.target), e))?;
        let headers = request.headers_mut();
        for (name, value) in self.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| invalid(&format!("the header name {name:?}"), e))?;
            let value = HeaderValue::from_bytes(&value)
                .map_err(|e| invalid(&format!("the value of header {name}"), e))?;
            headers.append(name, value);
        }
        if let Some(route) = self.route {
            request.extensions_mut().insert(Route(route));
        }
        if let Some(tenant) = self.tenant {
            request.extensions_mut().insert(Tenant(tenant));
        }
        Ok(request)
    }
}

impl HttpResponse {
    /// As an `http` response, for the layer to store or pass on.
    pub(crate) fn into_http(self) -> Result<Response<Full<Bytes>>, String> {
        let status = StatusCode::from_u16(self.status)
            .map_err(|e| format!("the handler's status {}: {e}", self.status))?;
        let mut response = Response::new(Full::new(Bytes::from(self.body)));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| format!("the handler's header name {name:?}: {e}"))?;
            let value = HeaderValue::from_bytes(&value)
                .map_err(|e| format!("the handler's value of header {name}: {e}"))?;
            headers.append(name, value);
        }
        Ok(response)
    }

    /// The answer the layer gave, its body read whole.
    pub(crate) fn from_http(head: http::response::Parts, body: Bytes) -> Self {
        Self {
            status: head.status.as_u16(),
            headers: head
                .headers
                .iter()
                .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
                .collect(),
            body: body.to_vec(),
        }
    }
}

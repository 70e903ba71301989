//! Promises the engine's runtime settles: the work runs there, and its
//! answer reaches the JavaScript thread through the promise's own
//! threadsafe callback, with no second runtime in between (the Python
//! package's `aio.rs` does the same with `call_soon_threadsafe`).

use std::future::Future;
use std::sync::Arc;

use idem_engine::{EngineError, Local};
use napi::bindgen_prelude::{PromiseRaw, ToNapiValue};
use napi::{Env, JsValue};

use crate::errors::to_js;

/// A promise of `work`'s answer, made a JavaScript value by `convert` on
/// the JavaScript thread. `work` starts on the engine's runtime at once.
pub(crate) fn promise<'env, T, V, F, C>(
    env: &'env Env,
    local: &Arc<Local>,
    work: F,
    convert: C,
) -> napi::Result<PromiseRaw<'env, V>>
where
    F: Future<Output = Result<T, EngineError>> + Send + 'static,
    T: Send + 'static,
    V: ToNapiValue + 'static,
    C: FnOnce(T) -> napi::Result<V> + Send + 'static,
{
    let (deferred, promise) = env.create_deferred()?;
    local.settle(work, move |answer| match answer {
        Ok(answer) => deferred.resolve(move |_| convert(answer)),
        Err(error) => deferred.reject(to_js(error)),
    });
    Ok(PromiseRaw::new(env.raw(), promise.raw()))
}

/// The answer as it is.
pub(crate) fn same<T>(answer: T) -> napi::Result<T> {
    Ok(answer)
}

/// JSON bytes from the engine as a JavaScript string.
pub(crate) fn text(json: Vec<u8>) -> String {
    String::from_utf8_lossy(&json).into_owned()
}

//! Engine errors as JavaScript errors: the reason is JSON naming the
//! error class the JavaScript half throws (`kind`) and its fields.

use idem::step::StepError;
use idem_engine::EngineError;
use serde_json::json;

/// The error for `error`: its kind ([`EngineError::kind`]) says what
/// happened, its message what to do (the whole chain of causes, once),
/// and its fields what a caller branches on.
pub(crate) fn to_js(error: EngineError) -> napi::Error {
    let mut reason = json!({"kind": error.kind(), "message": idem::error_chain(&error)});
    match error {
        EngineError::InProgress { retry_after } => {
            reason["retryAfterMs"] = json!(retry_after.as_secs_f64() * 1000.0);
        }
        EngineError::KeyExpired { age } => {
            reason["ageMs"] = json!(age.as_secs_f64() * 1000.0);
        }
        EngineError::ReplayedFailure { class, message } => {
            reason["failureClass"] = json!(class.as_str());
            reason["failure"] = json!(message);
        }
        EngineError::Step(StepError::Parked { step, attempt }) => {
            reason["step"] = json!(step);
            reason["attempt"] = json!(attempt);
        }
        _ => {}
    }
    napi::Error::from_reason(reason.to_string())
}

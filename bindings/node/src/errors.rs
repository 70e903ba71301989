//! Engine errors as JavaScript errors: the reason is JSON naming the
//! error class the JavaScript half throws (`kind`) and its fields.

use idem::step::StepError;
use idem_engine::EngineError;
use serde_json::json;

/// The error for `error`: its kind says what happened, its message what
/// to do (the whole chain of causes, once).
pub(crate) fn to_js(error: EngineError) -> napi::Error {
    let message = idem::error_chain(&error);
    let reason = match error {
        EngineError::Url(_)
        | EngineError::Config(_)
        | EngineError::Key(_)
        | EngineError::Json { .. } => json!({"kind": "InvalidInput", "message": message}),
        EngineError::Open(_) | EngineError::Store(_) => {
            json!({"kind": "Unavailable", "message": message})
        }
        EngineError::InProgress { retry_after } => json!({
            "kind": "InProgress",
            "message": message,
            "retryAfterMs": retry_after.as_secs_f64() * 1000.0,
        }),
        EngineError::Mismatch => json!({"kind": "Mismatch", "message": message}),
        EngineError::ReplayedFailure {
            class,
            message: failure,
        } => json!({
            "kind": "ReplayedFailure",
            "message": message,
            "failureClass": class.as_str(),
            "failure": failure,
        }),
        EngineError::LeaseLost => json!({"kind": "LeaseLost", "message": message}),
        EngineError::TooLarge { .. } => json!({"kind": "ResultTooLarge", "message": message}),
        EngineError::Step(step) => match step {
            StepError::Parked { step, attempt } => json!({
                "kind": "StepInDoubt",
                "message": message,
                "step": step,
                "attempt": attempt,
            }),
            StepError::LeaseLost { .. } => json!({"kind": "LeaseLost", "message": message}),
            StepError::Store { .. } => json!({"kind": "Unavailable", "message": message}),
            _ => json!({"kind": "InvalidStep", "message": message}),
        },
        _ => json!({"kind": "IdemError", "message": message}),
    };
    napi::Error::from_reason(reason.to_string())
}

//! The console's changes: each a POST carrying the form token, each
//! confirmed on a page that says what will happen before it happens, each
//! done by the admin command of its name and logged.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use idem::{GetRecord, State as RecordState};
use serde::Deserialize;
use serde_json::Value;

use super::html::{self, escape, form, query};
use super::pages::{login_page, scope_param, store_problem};
use super::{auth, Shared};
use crate::{admin, failures};

/// The sign-in form.
#[derive(Debug, Deserialize)]
pub(super) struct SignIn {
    #[serde(default)]
    token: String,
}

/// Signs a browser in with the admin token.
pub(super) async fn sign_in(State(app): Shared, Form(form): Form<SignIn>) -> Response {
    if !app.console.token.is_token(form.token.trim()) {
        tracing::warn!(target: "idem::console::audit", action = "sign-in", "refused: wrong admin token");
        return login_page(StatusCode::UNAUTHORIZED, "That is not the admin token.");
    }
    tracing::info!(target: "idem::console::audit", action = "sign-in", "signed in");
    let mut response = Redirect::to("/console").into_response();
    if let Ok(cookie) = app.console.token.sign_in_cookie().parse() {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// Signs a browser out: a POST from the console's own pages (the cookie,
/// `SameSite=Strict`, is not sent with one another site starts).
pub(super) async fn sign_out(headers: HeaderMap) -> Response {
    if !auth::same_origin(&headers) {
        return html::problem(
            StatusCode::FORBIDDEN,
            "refused: the form was sent from another site's page",
        );
    }
    let mut response = Redirect::to("/console/login").into_response();
    if let Ok(cookie) = auth::sign_out_cookie().parse() {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// The fields every change carries.
#[derive(Debug, Deserialize)]
pub(super) struct Confirmed {
    #[serde(default)]
    form_token: String,
    #[serde(default)]
    confirm: String,
}

/// Refuses a change without the form token or from another origin.
fn checked(app: &super::App, headers: &HeaderMap, form_token: &str) -> Result<(), Box<Response>> {
    if !auth::same_origin(headers) {
        return Err(Box::new(html::problem(
            StatusCode::FORBIDDEN,
            "refused: the form was sent from another site's page",
        )));
    }
    if !app.console.token.is_form_token(form_token) {
        return Err(Box::new(html::problem(
            StatusCode::FORBIDDEN,
            "refused: the form's token is missing or stale; open the page again",
        )));
    }
    Ok(())
}

/// [`checked`], and the record the form names (its key as stored).
fn checked_record(
    app: &super::App,
    headers: &HeaderMap,
    form_token: &str,
    scope: &str,
    key: &str,
) -> Result<idem::RecordId, Box<Response>> {
    checked(app, headers, form_token)?;
    crate::record_id(scope, key)
        .map_err(|e| Box::new(html::problem(StatusCode::BAD_REQUEST, &e.to_string())))
}

/// The page that asks to confirm: what will happen, and a button that
/// sends the same form again with `confirm=yes`.
fn confirm_page(
    title: &str,
    what: &str,
    action: &str,
    token: &str,
    fields: &[(&str, &str)],
) -> Response {
    let mut fields = fields.to_vec();
    fields.push(("confirm", "yes"));
    let body = format!(
        "<div id=confirm-what>{what}</div><div id=confirm>{} <a href='/console'>or go back</a></div>",
        form(action, token, &fields, "Confirm")
    );
    html::page(title, &body)
}

/// `release`'s form.
#[derive(Debug, Deserialize)]
pub(super) struct ReleaseForm {
    scope: String,
    key: String,
    #[serde(flatten)]
    confirmed: Confirmed,
}

/// Releases a record (`idem release`), once confirmed.
pub(super) async fn release(
    State(app): Shared,
    headers: HeaderMap,
    Form(form): Form<ReleaseForm>,
) -> Response {
    let id = match checked_record(
        &app,
        &headers,
        &form.confirmed.form_token,
        &form.scope,
        &form.key,
    ) {
        Ok(id) => id,
        Err(refused) => return *refused,
    };
    if form.confirmed.confirm != "yes" {
        return confirm_page(
            "Release?",
            &format!(
                "Release key <code>{}</code> of scope <code>{}</code>: its record is deleted, and \
                 the next request with the key runs again. If its run took effect, that effect \
                 happens twice.",
                escape(&form.key),
                escape(&form.scope)
            ),
            "/console/release",
            &app.console.token.form_token(),
            &[("scope", &form.scope), ("key", &form.key)],
        );
    }
    let released = match admin::release(&app.store, &id).await {
        Ok(released) => released,
        Err(e) => return store_problem(&e),
    };
    app.console.changed(&id);
    tracing::info!(target: "idem::console::audit", action = "release", scope = %form.scope, key = %form.key, released, "console action");
    let said = if released {
        "Released: the next request with this key runs again."
    } else {
        "Nothing to release: the record was gone (expired, or released already)."
    };
    done_page("Released", said, &form.scope)
}

/// `resolve`'s form.
#[derive(Debug, Deserialize)]
pub(super) struct ResolveForm {
    scope: String,
    key: String,
    outcome: String,
    #[serde(default)]
    result: String,
    #[serde(flatten)]
    confirmed: Confirmed,
}

/// Resolves a parked record's step in doubt by `idem redrive`'s rules
/// for one record (which step, and when not to), once confirmed.
pub(super) async fn resolve(
    State(app): Shared,
    headers: HeaderMap,
    Form(form): Form<ResolveForm>,
) -> Response {
    let id = match checked_record(
        &app,
        &headers,
        &form.confirmed.form_token,
        &form.scope,
        &form.key,
    ) {
        Ok(id) => id,
        Err(refused) => return *refused,
    };
    let applied = match form.outcome.as_str() {
        "applied" => Some(form.result.as_str()),
        "not_applied" => None,
        other => {
            return html::problem(
                StatusCode::BAD_REQUEST,
                &format!("outcome {other:?} is neither applied nor not_applied"),
            )
        }
    };
    let action = match admin::resolution(applied) {
        Ok(resolution) => failures::Redrive::Resolve(resolution),
        Err(e) => return html::problem(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let record = match app.store.get(&id).await {
        Ok(Some(record)) if matches!(&record.state, RecordState::Failed { failure } if failure.is_parked()) => record,
        Ok(_) => {
            return html::problem(
                StatusCode::CONFLICT,
                &format!("{id} is not parked (absent, expired, or not failed with an unknown outcome); nothing changed"),
            )
        }
        Err(e) => return store_problem(&e.into()),
    };
    let confirmed = form.confirmed.confirm == "yes";
    let line = match failures::redrive_record(
        &app.store,
        (&id, &record),
        &action,
        !confirmed,
        &app.console.secrets,
    )
    .await
    {
        Ok(line) => line,
        Err(e) => return store_problem(&e),
    };
    if line["action"] == "skipped" {
        return html::problem(
            StatusCode::CONFLICT,
            &format!(
                "nothing changed: {}",
                line["why"].as_str().unwrap_or("skipped")
            ),
        );
    }
    let step = line["step"].as_str().unwrap_or_default();
    if !confirmed {
        let finding = match applied {
            Some(result) => format!(
                "took effect, with result <code>{}</code>: the next delivery resumes after it",
                escape(result)
            ),
            None => "did not take effect: the next delivery runs it".to_owned(),
        };
        return confirm_page(
            "Resolve?",
            &format!(
                "Step <code>{}</code> of key <code>{}</code> (scope <code>{}</code>) {finding}.",
                escape(step),
                escape(&form.key),
                escape(&form.scope)
            ),
            "/console/resolve",
            &app.console.token.form_token(),
            &[
                ("scope", &form.scope),
                ("key", &form.key),
                ("outcome", &form.outcome),
                ("result", &form.result),
            ],
        );
    }
    app.console.changed(&id);
    tracing::info!(target: "idem::console::audit", action = "resolve", scope = %form.scope, key = %form.key, step, outcome = %form.outcome, "console action");
    done_page(
        "Resolved",
        &format!(
            "Step {step:?} resolved {}; the record is released for its next delivery.",
            form.outcome
        ),
        &form.scope,
    )
}

/// `redrive`'s form.
#[derive(Debug, Deserialize)]
pub(super) struct RedriveForm {
    group: String,
    #[serde(default)]
    scope: String,
    action: String,
    #[serde(default)]
    result: String,
    #[serde(flatten)]
    confirmed: Confirmed,
}

/// Redrives a failure group (`idem redrive`): first what it would do (a
/// dry run), then, confirmed, the same for real.
pub(super) async fn redrive(
    State(app): Shared,
    headers: HeaderMap,
    Form(form): Form<RedriveForm>,
) -> Response {
    if let Err(refused) = checked(&app, &headers, &form.confirmed.form_token) {
        return *refused;
    }
    let scope = match scope_param(&form.scope) {
        Ok(scope) => scope,
        Err(response) => return *response,
    };
    let action = match form.action.as_str() {
        "release" => Ok(failures::Redrive::Release),
        "applied" => admin::resolution(Some(&form.result)).map(failures::Redrive::Resolve),
        "not_applied" => admin::resolution(None).map(failures::Redrive::Resolve),
        other => Err(anyhow::anyhow!(
            "action {other:?} is not release, applied or not_applied"
        )),
    };
    let action = match action {
        Ok(action) => action,
        Err(e) => return html::problem(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let dry_run = form.confirmed.confirm != "yes";
    let lines = match failures::redrive(
        &app.store,
        &form.group,
        &action,
        scope,
        super::pages::GROUPED,
        dry_run,
        &app.console.secrets,
    )
    .await
    {
        Ok(lines) => lines,
        Err(e) => return html::problem(StatusCode::CONFLICT, &format!("{e:#}")),
    };
    let table = redrive_table(&lines);
    if dry_run {
        return confirm_page(
            "Redrive?",
            &format!(
                "Group <code>{}</code>, {}: what would be done.{table}",
                escape(&form.group),
                escape(&form.action)
            ),
            "/console/redrive",
            &app.console.token.form_token(),
            &[
                ("group", &form.group),
                ("scope", &form.scope),
                ("action", &form.action),
                ("result", &form.result),
            ],
        );
    }
    for line in &lines {
        let (Some(scope), Some(key)) = (line["scope"].as_str(), line["key"].as_str()) else {
            continue;
        };
        if line["action"] != "skipped" {
            if let Ok(id) = crate::record_id(scope, key) {
                app.console.changed(&id);
            }
        }
    }
    let summary = lines.last().cloned().unwrap_or(Value::Null);
    tracing::info!(target: "idem::console::audit", action = "redrive", group = %form.group, how = %form.action, summary = %summary, "console action");
    html::page(
        "Redriven",
        &format!("<p>Group <code>{}</code>, {}:</p>{table}<p><a href='/console/failures'>Failures</a></p>", escape(&form.group), escape(&form.action)),
    )
}

/// How many records a redrive page lists (its summary counts them all).
const SHOWN: usize = 200;

/// `idem redrive`'s lines as a table, its summary below.
fn redrive_table(lines: &[Value]) -> String {
    let mut out = String::from(
        "<table id=redrive><tr><th>scope</th><th>key</th><th>action</th><th>why</th></tr>",
    );
    let (records, summary) = match lines.split_last() {
        Some((summary, records)) => (records, Some(summary)),
        None => (lines, None),
    };
    for line in records.iter().take(SHOWN) {
        let text = |name: &str| escape(line[name].as_str().unwrap_or_default());
        let _ = write!(
            out,
            "<tr class=redriven><td>{}</td><td>{}</td><td class=redrive-action>{}</td><td>{}</td></tr>",
            text("scope"),
            text("key"),
            text("action"),
            text("why")
        );
    }
    if records.len() > SHOWN {
        let _ = write!(
            out,
            "<tr><td colspan=4 class=note>… and {} more</td></tr>",
            records.len() - SHOWN
        );
    }
    out.push_str("</table>");
    if let Some(summary) = summary {
        let _ = write!(
            out,
            "<pre id=redrive-summary>{}</pre>",
            escape(&summary.to_string())
        );
    }
    out
}

/// The page after a change: what happened, and the way back.
fn done_page(title: &str, said: &str, scope: &str) -> Response {
    html::page(
        title,
        &format!(
            "<p id=done>{}</p><p><a href='/console/records?scope={}'>Records of the scope</a></p>",
            escape(said),
            query(scope)
        ),
    )
}

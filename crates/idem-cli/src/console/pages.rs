//! The console's pages: what is read, never changed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use axum::extract::Query;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Json;
use idem::{RecordId, Scope, State as RecordState};
use serde::Deserialize;
use serde_json::Value;

use super::html::{self, escape, form, query, time};
use super::Shared;
use crate::{admin, failures as groups, StateArg};

/// How many records the overview counts at most.
const COUNTED: usize = 10_000;
/// How many records a list shows at most.
const LISTED: usize = 200;
/// How many failed records the failure groups read at most (`idem
/// failures --limit` reads further).
pub(super) const GROUPED: usize = 10_000;

/// The sign-in page.
pub(super) async fn login() -> Response {
    login_page(StatusCode::OK, "")
}

/// The sign-in page with `error` above the form.
pub(super) fn login_page(status: axum::http::StatusCode, error: &str) -> Response {
    let error = if error.is_empty() {
        String::new()
    } else {
        format!("<p class=error id=problem>{}</p>", escape(error))
    };
    let body = format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>Sign in · idem console</title></head>\
         <body style='font:14px system-ui;margin:40px'><h1>idem console</h1>{error}\
         <form method=post action='/console/login'>\
         <label>Admin token <input id=token type=password name=token autocomplete=off autofocus></label> \
         <button id=sign-in>Sign in</button></form></body></html>"
    );
    html::html_response(status, body)
}

/// The overview: records by state (of the first 10,000 read), the charts,
/// and where to look next.
pub(super) async fn overview(axum::extract::State(app): Shared) -> Response {
    let records = match admin::collect(&app.store, None, None, COUNTED, |_| true).await {
        Ok(records) => records,
        Err(e) => return store_problem(&e),
    };
    let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
    let mut scopes: BTreeMap<&str, usize> = BTreeMap::new();
    for (id, record) in &records {
        *by_state.entry(record.state.kind().as_str()).or_default() += 1;
        if matches!(&record.state, RecordState::Failed { failure } if failure.is_parked()) {
            *by_state.entry("parked").or_default() += 1;
        }
        *scopes.entry(id.scope().as_str()).or_default() += 1;
    }
    let read = if records.len() >= COUNTED {
        format!("<p class=note>Counted over the first {COUNTED} records read.</p>")
    } else {
        String::new()
    };
    let mut body =
        format!("<h2>Records</h2>{read}<table id=by-state><tr><th>state</th><th>records</th></tr>");
    for state in ["in_progress", "completed", "failed", "parked", "released"] {
        let count = by_state.get(state).copied().unwrap_or(0);
        let _ = write!(
            body,
            "<tr><td><a href='/console/records?state={state}'>{state}</a></td>\
             <td class=count data-state={state}>{count}</td></tr>"
        );
    }
    body.push_str(
        "</table><h2>Scopes</h2><table id=scopes><tr><th>scope</th><th>records</th></tr>",
    );
    for (scope, count) in &scopes {
        let _ = write!(
            body,
            "<tr><td><a href='/console/records?scope={}'>{}</a></td><td>{count}</td></tr>",
            query(scope),
            escape(scope)
        );
    }
    body.push_str("</table><h2>Activity</h2>");
    match &app.console.history {
        Some(history) => {
            let points = history.points();
            let _ = write!(
                body,
                "<p class=note>Per {} s, this process's metrics; newest right.</p><div class=charts>",
                history.every().as_secs_f64()
            );
            for (id, title, value) in html::CHARTS {
                body.push_str(&html::chart(id, title, &points, value));
            }
            body.push_str("</div>");
        }
        None => body.push_str(
            "<p class=note>No charts: this process runs no handlers. The gateway's own \
             admin listener shows them.</p>",
        ),
    }
    html::page("Overview", &body)
}

/// `?state=&scope=&limit=` of the records page.
#[derive(Debug, Deserialize)]
pub(super) struct ListParams {
    #[serde(default)]
    state: String,
    #[serde(default)]
    scope: String,
    limit: Option<usize>,
}

/// Records of one state and scope (either may be left out), newest
/// update first, with a search by key.
pub(super) async fn records(
    axum::extract::State(app): Shared,
    Query(params): Query<ListParams>,
) -> Response {
    let state = match params.state.as_str() {
        "" => None,
        s => match <StateArg as clap::ValueEnum>::from_str(s, true) {
            Ok(state) => Some(state),
            Err(_) => {
                return html::problem(
                    StatusCode::BAD_REQUEST,
                    &format!(
                    "state {s:?} is not one of in_progress, completed, failed, parked, released"
                ),
                )
            }
        },
    };
    let scope = match scope_param(&params.scope) {
        Ok(scope) => scope,
        Err(response) => return *response,
    };
    let limit = params.limit.unwrap_or(LISTED).clamp(1, 1_000);
    let listed = match state {
        Some(StateArg::Parked) => {
            admin::list_parked(&app.store, scope, limit, &app.console.secrets).await
        }
        state => admin::list(&app.store, state.map(StateArg::kind), scope, limit).await,
    };
    let mut listed = match listed {
        Ok(listed) => listed,
        Err(e) => return store_problem(&e),
    };
    listed.sort_by(|a, b| {
        b["updated_at_ms"]
            .as_u64()
            .cmp(&a["updated_at_ms"].as_u64())
    });
    let mut body = format!(
        "<form method=post action='/console/search'>Find a key: \
         <input name=scope placeholder=scope value='{scope}'> \
         <input name=key id=search-key placeholder=key> <button id=search>Find</button></form>",
        scope = escape(&params.scope)
    );
    let _ = write!(
        body,
        "<p class=note>{} record(s){}{}.</p>\
         <table id=records><tr><th>scope</th><th>key</th><th>state</th><th>attempt</th>\
         <th>updated</th><th>expires</th><th>failure</th></tr>",
        listed.len(),
        if params.state.is_empty() {
            String::new()
        } else {
            format!(", {}", escape(&params.state))
        },
        if params.scope.is_empty() {
            String::new()
        } else {
            format!(", scope {}", escape(&params.scope))
        },
    );
    for record in &listed {
        body.push_str(&record_row(record));
    }
    body.push_str("</table>");
    html::page("Records", &body)
}

/// One record as a row of the records table.
fn record_row(record: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let (scope, key, state) = (
        text(&record["scope"]),
        text(&record["key"]),
        text(&record["state"]),
    );
    let failure = record
        .get("failure")
        .or_else(|| record.get("last_failure"))
        .map(|f| format!("{}: {}", text(&f["class"]), text(&f["message"])))
        .unwrap_or_default();
    format!(
        "<tr class=record data-key='{k}'><td>{s}</td><td><a href='/console/record?scope={qs}&amp;key={qk}'>{k}</a></td>\
         <td class='state-{st}'>{st}</td><td>{attempt}</td><td>{updated}</td><td>{expires}</td><td>{f}</td></tr>",
        s = escape(&scope),
        k = escape(&key),
        qs = query(&scope),
        qk = query(&key),
        st = escape(&state),
        attempt = record["attempt"],
        updated = time(record["updated_at_ms"].as_u64()),
        expires = time(record["expires_at_ms"].as_u64()),
        f = escape(&failure),
    )
}

/// `?scope=&key=`: a record, by the key as stored (the lists' links) or
/// as sent (the search).
#[derive(Debug, Deserialize)]
pub(super) struct RecordParams {
    #[serde(default)]
    scope: String,
    #[serde(default)]
    key: String,
}

/// The search by key: the key as a client sent it, hashed as the
/// gateway stores it, then its record's page. A POST, so the key as sent
/// stays out of the browser's history and any proxy's log.
pub(super) async fn search(
    axum::extract::State(app): Shared,
    axum::Form(params): axum::Form<RecordParams>,
) -> Response {
    if params.scope.is_empty() {
        return html::problem(
            StatusCode::BAD_REQUEST,
            "give the key's scope too: the gateway's is the method and path, as in `http POST /charges`",
        );
    }
    match crate::record_id(&params.scope, &params.key) {
        Ok(id) => {
            let id = app.console.secrets.stored_id(&id);
            Redirect::to(&format!(
                "/console/record?scope={}&key={}",
                query(id.scope().as_str()),
                query(id.key().as_str())
            ))
            .into_response()
        }
        Err(e) => html::problem(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

/// A record: its fields (its history: created, updated, attempt, fence),
/// its step journal, its stored response, and what can be done to it.
pub(super) async fn record(
    axum::extract::State(app): Shared,
    Query(params): Query<RecordParams>,
) -> Response {
    let id = match crate::record_id(&params.scope, &params.key) {
        Ok(id) => id,
        Err(e) => return html::problem(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let described = match admin::inspect(&app.store, &id, &app.console.secrets).await {
        Ok(Some(described)) => described,
        Ok(None) => {
            return html::problem(
                StatusCode::NOT_FOUND,
                &format!(
                    "no live record for scope {:?}, key {:?}",
                    params.scope, params.key
                ),
            )
        }
        Err(e) => return store_problem(&e),
    };
    html::page(
        &format!("Record {}", id.key().as_str()),
        &record_body(&app.console.token.form_token(), &id, &described),
    )
}

/// A record's page below its title.
fn record_body(form_token: &str, id: &RecordId, described: &Value) -> String {
    let (scope, key) = (id.scope().as_str(), id.key().as_str());
    let mut body = String::from("<table id=fields>");
    if let Some(fields) = described.as_object() {
        for (name, value) in fields
            .iter()
            .filter(|(n, _)| !matches!(n.as_str(), "steps" | "response" | "input"))
        {
            let shown = match (name.ends_with("_ms"), value) {
                (true, Value::Number(ms)) => {
                    format!("{} <span class=note>({ms})</span>", time(ms.as_u64()))
                }
                (_, Value::String(text)) => escape(text),
                _ => escape(&value.to_string()),
            };
            let _ = write!(
                body,
                "<tr><th>{}</th><td id='field-{0}'>{shown}</td></tr>",
                escape(name)
            );
        }
    }
    body.push_str("</table>");
    let parked = described["failure"]["class"] == "unknown";
    let steps = described["steps"].as_array().cloned().unwrap_or_default();
    if !steps.is_empty() {
        body.push_str(
            "<h2>Steps</h2><table id=steps><tr><th>step</th><th>state</th><th>result</th></tr>",
        );
        for step in &steps {
            let name = step["name"].as_str().unwrap_or_default();
            let state = step["state"].as_str().unwrap_or_default();
            let result = step.get("result").map(Value::to_string).unwrap_or_default();
            let _ = write!(
                body,
                "<tr class=step data-step='{n}'><td>{n}</td><td class=step-state>{s}</td><td><code>{r}</code></td></tr>",
                n = escape(name),
                s = escape(state),
                r = escape(&result),
            );
        }
        body.push_str("</table>");
    }
    for part in ["input", "response"] {
        if let Some(value) = described.get(part) {
            let pretty = serde_json::to_string_pretty(value).unwrap_or_default();
            let _ = write!(
                body,
                "<h2>{part}</h2><pre id={part}>{}</pre>",
                escape(&pretty)
            );
        }
    }
    // A gateway request in doubt is settled applied only by its upstream
    // (`--reconcile`): the result a step would journal is not a response.
    let started: Vec<&str> = steps
        .iter()
        .filter(|s| s["state"] == "started")
        .filter_map(|s| s["name"].as_str())
        .collect();
    let gateway_effect = !started.is_empty()
        && started
            .iter()
            .all(|name| idem::effect_mark_fence(name).is_some());
    body.push_str("<h2>Actions</h2>");
    if parked {
        let _ = write!(
            body,
            "<div id=resolve>Its outcome is unknown. Having checked what happened: {}<span class=note> \
             (its next delivery runs the step in doubt)</span><br>{}</div>",
            form(
                "/console/resolve",
                form_token,
                &[("scope", scope), ("key", key), ("outcome", "not_applied")],
                "Not applied…"
            ),
            if gateway_effect {
                "<span class=note>A request the gateway forwarded cannot be resolved applied \
                 here: its upstream's answer is not kept; the gateway's --reconcile asks it.</span>"
                    .to_owned()
            } else {
                resolve_applied_form(form_token, scope, key)
            },
        );
    }
    let _ = write!(
        body,
        "<div>{}<span class=note> deletes the record: the next request with its key runs again.</span></div>",
        form("/console/release", form_token, &[("scope", scope), ("key", key)], "Release…")
    );
    body
}

/// The form that resolves a parked record's step in doubt as applied,
/// with its result.
fn resolve_applied_form(form_token: &str, scope: &str, key: &str) -> String {
    format!(
        "<form class=inline method=post action='/console/resolve'>\
         <input type=hidden name=scope value='{s}'><input type=hidden name=key value='{k}'>\
         <input type=hidden name=outcome value=applied>\
         <input type=hidden name=form_token value='{t}'>\
         <input name=result class=applied-result placeholder='its result, as JSON'> \
         <button class=applied>Applied…</button><span class=note> (its next delivery resumes after it)</span></form>",
        s = escape(scope),
        k = escape(key),
        t = escape(form_token),
    )
}

/// `?scope=` of the failures page.
#[derive(Debug, Deserialize)]
pub(super) struct ScopeParam {
    #[serde(default)]
    scope: String,
}

/// Failed and parked records grouped by their failure, each with a
/// redrive form.
pub(super) async fn failures(
    axum::extract::State(app): Shared,
    Query(params): Query<ScopeParam>,
) -> Response {
    let scope = match scope_param(&params.scope) {
        Ok(scope) => scope,
        Err(response) => return *response,
    };
    let found = match groups::failures(&app.store, scope, GROUPED).await {
        Ok(found) => found,
        Err(e) => return store_problem(&e),
    };
    let token = app.console.token.form_token();
    let mut body = format!(
        "<p class=note>{} group(s). Redrive shows what it would do before it does it.</p>\
         <table id=failures><tr><th>group</th><th>state</th><th>class</th><th>message</th><th>records</th>\
         <th>first seen</th><th>last seen</th><th>keys</th><th>redrive</th></tr>",
        found.len()
    );
    for group in &found {
        let id = group["group"].as_str().unwrap_or_default();
        let state = group["state"].as_str().unwrap_or_default();
        let scopes: Vec<&str> = group["scopes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let keys: Vec<String> = group["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|k| match scopes.as_slice() {
                [scope] => format!(
                    "<a href='/console/record?scope={}&amp;key={}'>{}</a>",
                    query(scope),
                    query(k),
                    escape(k)
                ),
                _ => escape(k),
            })
            .collect();
        let actions = if state == "parked" {
            "<select name=action><option value=not_applied>not applied: run the step again</option>\
                 <option value=applied>applied: journal the result</option>\
                 <option value=release>release</option></select> \
                 <input name=result placeholder='result JSON (applied)'>"
                .to_owned()
        } else {
            "<input type=hidden name=action value=release>".to_owned()
        };
        let _ = write!(
            body,
            "<tr class=group data-group='{g}' data-count='{count}'><td><code>{g}</code></td><td>{st}</td><td>{class}</td>\
             <td>{pattern}</td><td>{count}</td><td>{first}</td><td>{last}</td><td>{keys}</td>\
             <td><form method=post action='/console/redrive'><input type=hidden name=group value='{g}'>\
             <input type=hidden name=scope value='{scope}'><input type=hidden name=form_token value='{t}'>\
             {actions} <button class=redrive>Redrive…</button></form></td></tr>",
            g = escape(id),
            st = escape(state),
            class = escape(group["class"].as_str().unwrap_or_default()),
            pattern = escape(group["pattern"].as_str().unwrap_or_default()),
            count = group["count"],
            first = time(group["first_seen_ms"].as_u64()),
            last = time(group["last_seen_ms"].as_u64()),
            keys = keys.join(" "),
            scope = escape(&params.scope),
            t = escape(&token),
        );
    }
    body.push_str("</table>");
    html::page("Failures", &body)
}

/// The chart figures as JSON, for scripts and dashboards.
pub(super) async fn history(axum::extract::State(app): Shared) -> Response {
    match &app.console.history {
        Some(history) => Json(serde_json::json!({
            "every_ms": u64::try_from(history.every().as_millis()).unwrap_or(u64::MAX),
            "points": history.points(),
        }))
        .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "this process keeps no metrics history\n",
        )
            .into_response(),
    }
}

/// A `scope` parameter, checked (empty: every scope).
pub(super) fn scope_param(scope: &str) -> Result<Option<Scope>, Box<Response>> {
    if scope.is_empty() {
        return Ok(None);
    }
    Scope::new(scope).map(Some).map_err(|e| {
        Box::new(html::problem(
            StatusCode::BAD_REQUEST,
            &format!("scope: {e}"),
        ))
    })
}

/// The page for a store that did not answer.
pub(super) fn store_problem(error: &anyhow::Error) -> Response {
    html::problem(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("the store did not answer: {error:#}"),
    )
}

//! MCP tool calls (JSON-RPC over MCP's streamable HTTP transport) keyed
//! by an argument of the call. An agent sees no HTTP headers, so a replay
//! is marked in the JSON-RPC result's `_meta`, and it answers the retry's
//! own JSON-RPC id, not the first call's: a client matches answers to
//! requests by id, and a retry is a new request.

use bytes::Bytes;
use serde_json::Value;

/// The `_meta` member a replayed tool result carries, set to `true`.
pub const MCP_REPLAYED_META: &str = "io.idem/replayed";

/// The default name of the tool argument holding the key.
pub const MCP_KEY_ARGUMENT: &str = "idempotency_key";

/// The JSON pointer to a `tools/call`'s argument `argument`.
pub(crate) fn key_pointer(argument: &str) -> String {
    let escaped = argument.replace('~', "~0").replace('/', "~1");
    format!("/params/arguments/{escaped}")
}

/// What a tool call's fingerprint covers: the method, the tool and its
/// arguments; not the JSON-RPC id, which differs between a call and its
/// retry, nor the params' `_meta` (a progress token is new per request).
pub(crate) fn fingerprint_fields() -> Vec<String> {
    ["/method", "/params/name", "/params/arguments"]
        .map(str::to_owned)
        .to_vec()
}

/// Whether a request body is a JSON-RPC `tools/call`.
pub(crate) fn is_tool_call(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body)
        .is_ok_and(|request| request.get("method").and_then(Value::as_str) == Some("tools/call"))
}

/// The JSON-RPC id of a request body, if it has one.
pub(crate) fn request_id(body: &[u8]) -> Option<Value> {
    let request: Value = serde_json::from_slice(body).ok()?;
    request.get("id").filter(|id| !id.is_null()).cloned()
}

/// A stored answer to a tool call, as the answer to the retry whose
/// JSON-RPC id is `id`: in a JSON body, or in each event of an event
/// stream (its `data:` lines joined, as the stream's reader joins them),
/// every JSON-RPC response gets `id` and a result marked replayed. `None`
/// when there is nothing to rewrite.
pub(crate) fn replayed(body: &[u8], event_stream: bool, id: &Value) -> Option<Bytes> {
    if !event_stream {
        return answer(body, id).map(Bytes::from);
    }
    let text = std::str::from_utf8(body).ok()?;
    let mut out = String::with_capacity(text.len() + 64);
    let mut changed = false;
    let mut event: Vec<&str> = Vec::new();
    for line in text.split_inclusive('\n') {
        event.push(line);
        if split_end(line).0.is_empty() {
            changed |= rewrite_event(&event, id, &mut out);
            event.clear();
        }
    }
    changed |= rewrite_event(&event, id, &mut out);
    changed.then(|| Bytes::from(out))
}

/// Writes one event (its lines, terminators kept) to `out`: with its data
/// rewritten into one `data:` line where it is a JSON-RPC response, as it
/// was otherwise. Whether it was rewritten.
fn rewrite_event(lines: &[&str], id: &Value, out: &mut String) -> bool {
    let data: Vec<&str> = lines
        .iter()
        .filter_map(|line| split_end(line).0.strip_prefix("data:"))
        .map(|data| data.strip_prefix(' ').unwrap_or(data))
        .collect();
    let Some(json) = (!data.is_empty())
        .then(|| answer(data.join("\n").as_bytes(), id))
        .flatten()
    else {
        lines.iter().for_each(|line| out.push_str(line));
        return false;
    };
    let mut written = false;
    for line in lines {
        let (content, end) = split_end(line);
        if !content.starts_with("data:") {
            out.push_str(line);
        } else if !written {
            written = true;
            out.push_str("data: ");
            out.push_str(&String::from_utf8_lossy(&json));
            out.push_str(end);
        }
    }
    true
}

/// A line without its terminator (`\n` or `\r\n`), and the terminator.
fn split_end(line: &str) -> (&str, &str) {
    for end in ["\r\n", "\n"] {
        if let Some(content) = line.strip_suffix(end) {
            return (content, end);
        }
    }
    (line, "")
}

/// One JSON-RPC response, re-addressed to `id` and, when it has a result,
/// marked replayed.
fn answer(json: &[u8], id: &Value) -> Option<Vec<u8>> {
    let mut response: Value = serde_json::from_slice(json).ok()?;
    let object = response.as_object_mut()?;
    if !(object.contains_key("result") || object.contains_key("error")) {
        return None;
    }
    object.insert("id".to_owned(), id.clone());
    if let Some(Value::Object(result)) = object.get_mut("result") {
        let meta = result
            .entry("_meta")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Value::Object(meta) = meta {
            meta.insert(MCP_REPLAYED_META.to_owned(), Value::Bool(true));
        }
    }
    serde_json::to_vec(&response).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_answer_takes_the_retry_id_and_a_replay_mark() {
        let stored =
            br#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"ok"}]}}"#;
        let out = replayed(stored, false, &Value::from(9)).expect("rewritten");
        let out: Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(out["id"], 9);
        assert_eq!(out["result"]["_meta"][MCP_REPLAYED_META], true);
        assert_eq!(out["result"]["content"][0]["text"], "ok");
    }

    #[test]
    fn an_event_stream_has_each_response_rewritten_and_the_rest_kept() {
        let stored = "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\r\n\r\n\
                      data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n";
        let out = replayed(stored.as_bytes(), true, &Value::from("req-2")).expect("rewritten");
        let out = String::from_utf8(out.to_vec()).expect("utf-8");
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("event: message"));
        let data: Value =
            serde_json::from_str(lines.next().expect("data").trim_start_matches("data: "))
                .expect("json");
        assert_eq!(data["id"], "req-2");
        assert_eq!(data["result"]["_meta"][MCP_REPLAYED_META], true);
        assert!(out.contains("\r\n\r\n"), "line ends kept: {out:?}");
        assert!(
            out.contains(r#"data: {"jsonrpc":"2.0","method":"notifications/progress"}"#),
            "a notification is left alone: {out}"
        );
        assert_eq!(replayed(b"event: ping\n\n", true, &Value::from(1)), None);
    }

    #[test]
    fn an_answer_split_over_several_data_lines_is_joined_and_rewritten() {
        let stored =
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"id\":1,\"result\":{}}\n\n";
        let out = replayed(stored.as_bytes(), true, &Value::from(5)).expect("rewritten");
        let out = String::from_utf8(out.to_vec()).expect("utf-8");
        let data: Vec<&str> = out.lines().filter(|l| l.starts_with("data:")).collect();
        assert_eq!(data.len(), 1, "{out}");
        let answer: Value =
            serde_json::from_str(data[0].trim_start_matches("data: ")).expect("json");
        assert_eq!(answer["id"], 5);
        assert!(
            out.starts_with("event: message\n") && out.ends_with("\n\n"),
            "{out:?}"
        );
    }

    #[test]
    fn the_key_argument_is_escaped_into_its_pointer() {
        assert_eq!(
            key_pointer("idempotency_key"),
            "/params/arguments/idempotency_key"
        );
        assert_eq!(key_pointer("a/b~c"), "/params/arguments/a~1b~0c");
        assert_eq!(
            request_id(br#"{"jsonrpc":"2.0","id":"x","method":"tools/call"}"#),
            Some(Value::from("x"))
        );
        assert_eq!(request_id(br#"{"jsonrpc":"2.0","method":"notify"}"#), None);
    }
}

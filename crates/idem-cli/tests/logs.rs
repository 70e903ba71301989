//! The binary's logs as a log file or a collector gets them: plain text
//! without terminal colour codes, or one JSON object per line.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// The first `n` lines `idem serve` writes to a pipe (not a terminal),
/// then the process is stopped.
fn first_lines(extra: &[&str], n: usize) -> Vec<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--store", "memory:"])
        .args(extra)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("IDEM_LOG")
        .env_remove("IDEM_LOG_FORMAT")
        .env_remove("NO_COLOR")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn idem");
    let stderr = child.stderr.take().expect("stderr");
    let lines: Vec<String> = BufReader::new(stderr)
        .lines()
        .take(n)
        .map(|l| l.expect("line"))
        .collect();
    child.kill().expect("kill");
    child.wait().expect("wait");
    lines
}

#[test]
fn text_logs_carry_no_colour_codes_when_not_on_a_terminal() {
    let lines = first_lines(&[], 2);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines.iter().any(|l| l.contains("idem serve ready")),
        "{lines:?}"
    );
    for line in &lines {
        assert!(!line.contains('\u{1b}'), "colour code in {line:?}");
    }
}

#[test]
fn json_logs_are_one_object_per_line() {
    let lines = first_lines(&["--log-format", "json"], 2);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let events: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    let ready = events
        .iter()
        .find(|e| e["message"] == "idem serve ready")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(ready["level"], "INFO");
    assert_eq!(ready["store"], "memory:");
    assert!(ready["listen"]
        .as_str()
        .is_some_and(|l| l.starts_with("127.0.0.1:")));
    assert!(ready["timestamp"].is_string());
}

/// A failure is one line, each cause once: the Redis client's error
/// carries its I/O cause in its own text, and was printed twice.
#[test]
fn a_failure_says_each_cause_once() {
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--store", "redis://127.0.0.1:1/", "stats"])
        .stdin(Stdio::null())
        .output()
        .expect("run idem");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stderr.lines().last().expect("an error line");
    assert!(
        line.starts_with("idem: cannot open the Redis store: could not connect to Redis"),
        "{line}"
    );
    assert_eq!(line.matches("refused").count(), 1, "{line}");
}

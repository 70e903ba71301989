//! A log subscriber's output kept in memory, for tests that assert on
//! what was logged: hand [`Captured`] to `tracing_subscriber::fmt()`'s
//! `with_writer` and read it back once the code under test has run.

use std::sync::{Arc, Mutex};

use serde_json::Value;

/// What a subscriber wrote, shared between the subscriber and the test.
#[derive(Debug, Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Everything written so far, as text.
    ///
    /// # Panics
    ///
    /// If the subscriber wrote bytes that are not UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().expect("lock").clone()).expect("utf-8")
    }

    /// Every line written so far, each a JSON event (a `json()` formatter).
    ///
    /// # Panics
    ///
    /// If a line is not JSON.
    pub fn lines(&self) -> Vec<Value> {
        self.text()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Self;

    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}

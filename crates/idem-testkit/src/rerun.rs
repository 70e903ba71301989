//! How a test starts a child process of itself: the test binary run again
//! with only one ignored test (the child's side), its output not captured.

/// The arguments that run the current test binary
/// (`std::env::current_exe()`) again with only the ignored test `name`,
/// printing what it prints.
pub fn only_ignored(name: &str) -> [&str; 5] {
    [
        "--exact",
        name,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]
}

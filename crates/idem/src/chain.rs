//! Errors as one line of text, for messages that are stored or shown.

use std::error::Error;

/// `error` and its sources as one line, `a: b: c`; a source whose text the
/// line already ends with (a wrapper that repeats its cause) is not
/// repeated.
pub fn error_chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreError;

    #[test]
    fn sources_follow_the_error_and_repeats_are_dropped() {
        let error = StoreError::Backend("item too large".into());
        assert_eq!(error_chain(&error), "store backend error: item too large");
        let io = std::io::Error::other("reset");
        assert_eq!(error_chain(&io), "reset");
    }
}

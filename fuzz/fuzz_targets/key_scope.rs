//! Key, scope and key-derivation parsing: never panics, and accepts
//! exactly what the rules say.
#![no_main]

use std::num::NonZeroUsize;
use std::time::Duration;

use idem::{derive, Key, KeyError, KeyRules, Scope, Timestamp};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let visible = |b: &u8| (0x21..=0x7E).contains(b);
    match Key::new(text) {
        Ok(key) => {
            assert_eq!(key.as_str(), text, "keys are never rewritten");
            assert!((1..=255).contains(&text.len()) && text.bytes().all(|b| visible(&b)));
        }
        Err(KeyError::Empty { .. }) => assert!(text.is_empty()),
        Err(KeyError::TooLong { len, max, .. }) => assert!(len == text.len() && len > max),
        Err(KeyError::InvalidByte { byte, index, .. }) => {
            assert_eq!(text.as_bytes()[index], byte);
            assert!(!visible(&byte));
        }
        Err(other) => panic!("unexpected key error {other:?}"),
    }
    let max = NonZeroUsize::new(1 + data.len() % 300).expect("non-zero");
    if let Ok(k) = KeyRules::default().max_len(max).parse(text) {
        assert!(k.as_str().len() <= max.get());
    }
    if let Ok(scope) = Scope::new(text) {
        assert!(scope.as_str().bytes().all(|b| (0x20..=0x7E).contains(&b)));
    }
    let parts: Vec<&str> = text.split(derive::COMPOSITE_SEPARATOR).collect();
    if let Ok(k) = derive::composite(&parts) {
        assert_eq!(k.as_str(), text, "a composite of the split parts is the text");
    }
    let at = Timestamp::from_millis(u64::from(data.len() as u32).wrapping_mul(1_000_003));
    let _ = derive::windowed(text, at, Duration::from_millis(data.first().copied().unwrap_or(0).into()));
    let _ = derive::uuid_v7_age(text, at, Duration::from_secs(86_400), Duration::from_secs(5));
});

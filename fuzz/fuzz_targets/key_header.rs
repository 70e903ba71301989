//! The `Idempotency-Key` header parser: never panics; a key it accepts
//! passes the key rules; a bare value is the key itself; and any accepted
//! key, written back as an RFC 8941 sf-string, parses to the same key.
#![no_main]

use http::HeaderValue;
use idem::{Key, KeyRules};
use idem_http::{parse_key, KeyHeaderError};
use libfuzzer_sys::fuzz_target;

const HEADER: &str = "Idempotency-Key";

fuzz_target!(|data: &[u8]| {
    let Ok(value) = HeaderValue::from_bytes(data) else { return };
    let rules = KeyRules::default();
    let parsed = parse_key(HEADER, &value, &rules);
    let Ok(text) = std::str::from_utf8(data) else {
        assert!(parsed.is_err(), "bytes that are not text are refused");
        return;
    };
    let trimmed = text.trim_matches([' ', '\t']);
    if !trimmed.starts_with('"') {
        assert_eq!(
            parsed.as_ref().map(Key::as_str).ok(),
            Key::new(trimmed).ok().as_ref().map(Key::as_str),
            "a bare value is the key itself"
        );
    }
    match parsed {
        Ok(key) => {
            assert!(Key::new(key.as_str()).is_ok(), "an accepted key passes the rules");
            let quoted = format!(
                "\"{}\"",
                key.as_str().replace('\\', "\\\\").replace('"', "\\\"")
            );
            let value = HeaderValue::from_str(&quoted).expect("an sf-string is a header value");
            let again = parse_key(HEADER, &value, &rules).expect("its sf-string parses");
            assert_eq!(again, key, "the sf-string form is the same key");
        }
        Err(KeyHeaderError::Repeated { .. }) => panic!("one value cannot be repeated"),
        Err(error) => assert!(error.to_string().contains(HEADER), "the error names the header"),
    }
});

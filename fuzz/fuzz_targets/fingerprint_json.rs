//! Canonical JSON and fingerprints: never panic; canonical output is valid
//! JSON, canonicalising it again changes nothing, and it fingerprints like
//! the input it came from.
#![no_main]

use idem::{canonical_json, Fingerprint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Fingerprint::of_bytes(data);
    let Ok(canonical) = canonical_json(data) else {
        assert!(Fingerprint::of_json(data).is_err());
        return;
    };
    serde_json::from_slice::<serde_json::Value>(&canonical).expect("canonical output is JSON");
    let again = canonical_json(&canonical).expect("canonical output canonicalises");
    assert_eq!(again, canonical, "canonicalisation is idempotent");
    assert_eq!(
        Fingerprint::of_json(data).expect("valid"),
        Fingerprint::of_json(&canonical).expect("valid"),
        "input and its canonical form share a fingerprint"
    );
    // Field selection with pointers taken from the data itself.
    let text = String::from_utf8_lossy(data);
    let pointers: Vec<String> = text.split('"').filter(|s| s.starts_with('/')).take(4).map(str::to_owned).collect();
    let _ = Fingerprint::of_json_fields(data, &pointers);
});

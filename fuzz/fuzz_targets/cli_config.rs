//! The gateway's `--config` TOML file: any text is a typed error or
//! settings the gateway can start with (durations within what stores hold,
//! an http:// upstream with a host), never a panic; the checked settings
//! then either build an executor or are refused with a configuration
//! error.
#![no_main]

use idem::store::LONGEST_HELD;
use idem::{Idempotency, MemoryStore};
use idem_cli::ProxyArgs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(file) = toml::from_str::<ProxyArgs>(text) else { return };
    let Ok(config) = file.proxy_config() else { return };
    assert_eq!(config.upstream.scheme_str(), Some("http"));
    assert!(config.upstream.authority().is_some());
    for held in [config.retention, config.lease, config.upstream_timeout] {
        assert!(held <= LONGEST_HELD, "{held:?} passes what stores hold");
    }
    let _ = Idempotency::builder(MemoryStore::new())
        .lease(config.lease)
        .retention(config.retention)
        .max_response_bytes(config.max_response_bytes)
        .build();
});

//! The README's and the guide's Rust examples, run as doc tests
//! (`cargo test -p idem-docs --doc`): what a user copies must compile and
//! do what the text says. Blocks that need setup carry it in hidden `# `
//! lines; none is marked `ignore`.
//!
//! The guide's chapters are modules here only so that rustdoc finds their
//! code blocks; read them with `scripts/guide` (mdBook) instead.

// The chapters link to each other the way mdBook resolves links.
#![allow(rustdoc::broken_intra_doc_links)]

#[doc = include_str!("../../README.md")]
pub mod readme {}

/// The guide's chapters, in the order of `guide/src/SUMMARY.md`.
pub mod guide {
    #[doc = include_str!("../guide/src/introduction.md")]
    pub mod introduction {}
    #[doc = include_str!("../guide/src/http-layer.md")]
    pub mod http_layer {}
    #[doc = include_str!("../guide/src/gateway.md")]
    pub mod gateway {}
    #[doc = include_str!("../guide/src/webhooks.md")]
    pub mod webhooks {}
    #[doc = include_str!("../guide/src/consumers.md")]
    pub mod consumers {}
    #[doc = include_str!("../guide/src/lambda.md")]
    pub mod lambda {}
    #[doc = include_str!("../guide/src/steps.md")]
    pub mod steps {}
    #[doc = include_str!("../guide/src/outbox.md")]
    pub mod outbox {}
    #[doc = include_str!("../guide/src/languages.md")]
    pub mod languages {}
    #[doc = include_str!("../guide/src/stores.md")]
    pub mod stores {}
    #[doc = include_str!("../guide/src/keeping.md")]
    pub mod keeping {}
    #[doc = include_str!("../guide/src/natural.md")]
    pub mod natural {}
    #[doc = include_str!("../guide/src/operating.md")]
    pub mod operating {}
}

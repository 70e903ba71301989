//! The layouts a [`StoredResponse`] has been stored in, and how each is
//! read back.
//!
//! Postcard writes a sequence of fields with no framing, and a `u16` as a
//! varint, so a status (100 to 999) always begins with a byte of `0x64` or
//! more. A layout that begins with a smaller byte names its version there.
//!
//! | layout | written by | first byte | fields |
//! |---|---|---|---|
//! | 0 | idem-http before trailers | the status | status, headers, body |
//! | 1 | every build since | the status | status, headers, body, trailers |
//! | 2 | a response kept less than whole, or by reference | `0x02` | 2, status, headers, body, trailers, [`Kept`] |
//!
//! A response kept whole is written in layout 1, which every build since
//! trailers reads: during a rolling upgrade, old and new processes replay
//! each other's records. Only what an older build could not honour (a body
//! left out or redacted) is written in layout 2; an older build answers
//! such a record as unreadable (500), never as something else.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeTuple, Serializer};
use serde::{Deserialize, Serialize};

use super::{Fields, StoredResponse};

/// The first byte of layout 2.
const LAYOUT_2: u8 = 2;

/// The smallest first byte of a postcard status (100).
const FIRST_STATUS_BYTE: u8 = 0x64;

/// What of the original response a [`StoredResponse`] holds, and so what
/// a replay of it says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Kept {
    /// The whole response, byte for byte.
    Full,
    /// The status and the headers chosen to be kept; no body.
    StatusOnly,
    /// The response with the values of chosen JSON fields and headers
    /// replaced before it was stored.
    Redacted,
    /// The whole response, its body in a blob store: the record keeps the
    /// blob's locator, digest and length, and an empty body.
    Reference(idem::blob::BlobRef),
}

impl Kept {
    /// The name a replay's `Idempotent-Replay-Kept` header carries.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Kept::Full => "full",
            Kept::StatusOnly => "status-only",
            Kept::Redacted => "redacted",
            Kept::Reference(_) => "reference",
        }
    }
}

/// Why `bytes` did not decode as a stored response, in words (postcard
/// keeps no message of its own).
pub(crate) fn explain(bytes: &[u8], error: &dyn std::error::Error) -> String {
    match bytes.first() {
        None => "the stored response is empty".to_owned(),
        Some(&first) if first < FIRST_STATUS_BYTE && first != LAYOUT_2 => format!(
            "the stored response is in layout {first}, newer than this build reads: upgrade idem"
        ),
        Some(&first) => {
            let layout = if first == LAYOUT_2 { "2" } else { "0 or 1" };
            format!("the stored response (layout {layout}) does not decode: {error}")
        }
    }
}

impl Serialize for StoredResponse {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if matches!(self.kept, Kept::Full) {
            let mut fields = serializer.serialize_tuple(4)?;
            fields.serialize_element(&self.status)?;
            fields.serialize_element(&self.headers)?;
            fields.serialize_element(&self.body)?;
            fields.serialize_element(&self.trailers)?;
            return fields.end();
        }
        let mut fields = serializer.serialize_tuple(6)?;
        fields.serialize_element(&LAYOUT_2)?;
        fields.serialize_element(&self.status)?;
        fields.serialize_element(&self.headers)?;
        fields.serialize_element(&self.body)?;
        fields.serialize_element(&self.trailers)?;
        fields.serialize_element(&self.kept)?;
        fields.end()
    }
}

impl<'de> Deserialize<'de> for StoredResponse {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_tuple(6, Layouts)
    }
}

struct Layouts;

fn next<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(
    seq: &mut A,
    what: &str,
) -> Result<T, A::Error> {
    seq.next_element()?
        .ok_or_else(|| de::Error::custom(format!("stored response ends before its {what}")))
}

impl<'de> Visitor<'de> for Layouts {
    type Value = StoredResponse;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a stored response in layout 0, 1 or 2")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StoredResponse, A::Error> {
        let first: u8 = next(&mut seq, "first byte")?;
        if first == LAYOUT_2 {
            return Ok(StoredResponse {
                status: next(&mut seq, "status")?,
                headers: next(&mut seq, "headers")?,
                body: next(&mut seq, "body")?,
                trailers: next(&mut seq, "trailers")?,
                kept: next(&mut seq, "policy")?,
            });
        }
        if first < FIRST_STATUS_BYTE {
            return Err(de::Error::custom(format!(
                "stored response layout {first} is newer than this build reads: upgrade idem-http"
            )));
        }
        // Layouts 0 and 1: the byte read was the start of the status's
        // varint (at most two bytes for a status under 16384).
        let status = if first & 0x80 == 0 {
            u16::from(first)
        } else {
            let high: u8 = next(&mut seq, "status")?;
            if high & 0x80 != 0 {
                return Err(de::Error::custom("stored status is out of range"));
            }
            u16::from(first & 0x7f) | u16::from(high) << 7
        };
        let headers: Fields = next(&mut seq, "headers")?;
        let body = next(&mut seq, "body")?;
        // Layout 0 ends after the body: reading its trailers runs out.
        let trailers = seq
            .next_element::<Fields>()
            .ok()
            .flatten()
            .unwrap_or_default();
        Ok(StoredResponse {
            status,
            headers,
            body,
            trailers,
            kept: Kept::Full,
        })
    }
}

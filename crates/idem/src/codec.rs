//! How responses are turned into stored bytes: a [`Codec`] (JSON by
//! default) and an envelope that compresses large responses with zstd.
//!
//! Stored layout: one format byte (`0` plain, `1` zstd) followed by the
//! codec's bytes, compressed or not.

use std::borrow::Cow;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::store::BoxError;

/// Serialises handler responses for storage and replay.
pub trait Codec: Send + Sync + 'static {
    /// Encodes a value.
    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, BoxError>;
    /// Decodes what [`encode`](Self::encode) produced.
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError>;
}

/// JSON through `serde_json`: readable in the admin tools, and the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Codec for Json {
    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(value)?)
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

const PLAIN: u8 = 0;
const ZSTD: u8 = 1;
const ZSTD_LEVEL: i32 = 3;

/// Wraps encoded bytes in the envelope, compressing them when they are
/// longer than `compress_above` and compression actually helps.
pub(crate) fn seal(encoded: Vec<u8>, compress_above: usize) -> Bytes {
    if encoded.len() > compress_above {
        if let Ok(packed) = zstd::bulk::compress(&encoded, ZSTD_LEVEL) {
            if packed.len() < encoded.len() {
                let mut out = Vec::with_capacity(packed.len() + 1);
                out.push(ZSTD);
                out.extend_from_slice(&packed);
                return out.into();
            }
        }
    }
    plain(&encoded)
}

/// `encoded` in the plain (uncompressed) envelope: what a store that
/// keeps responses in another form (the claim API keeps JSON) hands back
/// to the executor.
pub fn plain(encoded: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(encoded.len() + 1);
    out.push(PLAIN);
    out.extend_from_slice(encoded);
    out.into()
}

/// Opens an envelope, refusing to inflate past `max_len` bytes (a corrupt
/// or hostile record cannot exhaust memory): the codec's bytes.
pub fn open(stored: &[u8], max_len: usize) -> Result<Cow<'_, [u8]>, String> {
    match stored.split_first() {
        Some((&PLAIN, body)) => Ok(Cow::Borrowed(body)),
        Some((&ZSTD, body)) => inflate(body, max_len).map(Cow::Owned),
        Some((other, _)) => Err(format!("unknown envelope format byte {other}")),
        None => Err("empty stored response".to_owned()),
    }
}

/// Streams the frame out, never holding more than `max_len + 1` bytes, so
/// the allocation follows the real size rather than the limit.
fn inflate(body: &[u8], max_len: usize) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let decoder = zstd::stream::read::Decoder::new(body).map_err(|e| format!("zstd: {e}"))?;
    let mut out = Vec::new();
    let cap = u64::try_from(max_len).unwrap_or(u64::MAX).saturating_add(1);
    decoder
        .take(cap)
        .read_to_end(&mut out)
        .map_err(|e| format!("zstd: {e}"))?;
    if out.len() > max_len {
        return Err(format!(
            "stored response inflates past the limit of {max_len} bytes"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_stays_plain_large_is_compressed() {
        let small = seal(b"{\"a\":1}".to_vec(), 1024);
        assert_eq!(small[0], PLAIN);
        let big = vec![b'x'; 10_000];
        let sealed = seal(big.clone(), 1024);
        assert_eq!(sealed[0], ZSTD);
        assert!(sealed.len() < 200);
        assert_eq!(
            open(&sealed, 10_000).expect("opens").as_ref(),
            big.as_slice()
        );
    }

    #[test]
    fn refuses_to_inflate_past_the_limit_and_rejects_garbage() {
        let sealed = seal(vec![0u8; 100_000], 16);
        assert!(open(&sealed, 1000)
            .expect_err("too big")
            .contains("limit of 1000 bytes"));
        assert_eq!(open(&sealed, usize::MAX).expect("no limit").len(), 100_000);
        assert!(open(&[], 10).is_err());
        assert!(open(&[9, 1, 2], 10)
            .expect_err("bad")
            .contains("format byte 9"));
        assert!(open(&[ZSTD, 1, 2, 3], 10).is_err());
    }

    #[test]
    fn incompressible_data_stays_plain() {
        let noise: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let sealed = seal(noise.clone(), 16);
        assert_eq!(
            open(&sealed, 4096).expect("opens").as_ref(),
            noise.as_slice()
        );
    }
}

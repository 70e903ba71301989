//! The envelope a stored response lives in; its first byte names its
//! format:
//!
//! | byte | format | follows |
//! |---|---|---|
//! | `0` | plain | the codec's bytes |
//! | `1` | zstd | the codec's bytes, compressed |
//! | `2` | sealed | the key id's length and id, a nonce, and an envelope of format 0, 1 or 3 encrypted under that key ([`Keyring`]) |
//! | `3` | with messages | a 4-byte big-endian length, that many bytes of the run's outgoing messages ([`crate::outbox`]), then an envelope of format 0 or 1 |

use std::borrow::Cow;

use bytes::Bytes;

use super::keyring::{split_id, Keyring};

const PLAIN: u8 = 0;
const ZSTD: u8 = 1;
/// The first byte of an envelope that carries a run's outgoing messages.
pub(super) const WITH_MESSAGES: u8 = 3;
/// The first byte of a sealed envelope (and of a sealed step result).
pub(super) const SEALED: u8 = 2;
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

/// `inner` (an envelope of format 0 or 1) behind the run's outgoing
/// `messages`, as encoded by the outbox.
pub(super) fn with_messages(messages: &[u8], inner: &[u8]) -> Bytes {
    let len = u32::try_from(messages.len()).expect("messages are limited far below 4 GiB");
    let mut out = Vec::with_capacity(5 + messages.len() + inner.len());
    out.push(WITH_MESSAGES);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(messages);
    out.extend_from_slice(inner);
    out.into()
}

/// An envelope's messages and the envelope within them.
type Split<'a> = Option<(&'a [u8], &'a [u8])>;

/// An envelope of format 3 split into its messages and the envelope
/// within; `None` for any other format.
pub(super) fn split_messages(stored: &[u8]) -> Result<Split<'_>, String> {
    let Some(rest) = stored.strip_prefix(&[WITH_MESSAGES]) else {
        return Ok(None);
    };
    let (len, rest) = rest
        .split_first_chunk::<4>()
        .ok_or("stored response ends inside its messages' length")?;
    let len = usize::try_from(u32::from_be_bytes(*len)).unwrap_or(usize::MAX);
    if rest.len() < len {
        return Err(format!(
            "stored response names {len} bytes of messages and holds {}",
            rest.len()
        ));
    }
    let (messages, inner) = rest.split_at(len);
    if matches!(inner.first(), Some(&WITH_MESSAGES | &SEALED)) {
        return Err("stored response nests envelopes it never writes".to_owned());
    }
    Ok(Some((messages, inner)))
}

/// Opens an envelope, refusing to inflate past `max_len` bytes (a corrupt
/// or hostile record cannot exhaust memory): the codec's bytes. A sealed
/// envelope needs its keyring: see [`AtRest::open_response`](super::AtRest::open_response).
pub fn open(stored: &[u8], max_len: usize) -> Result<Cow<'_, [u8]>, String> {
    match stored.split_first() {
        Some((&PLAIN, body)) => Ok(Cow::Borrowed(body)),
        Some((&ZSTD, body)) => inflate(body, max_len).map(Cow::Owned),
        Some((&SEALED, sealed)) => Err(format!(
            "stored response is sealed with key {:?}: open it with the executor's keyring",
            split_id(sealed).map_or("?", |(id, _)| id)
        )),
        Some((&WITH_MESSAGES, _)) => match split_messages(stored)? {
            Some((_, inner)) => open(inner, max_len),
            None => unreachable!("the format byte was just read"),
        },
        Some((other, _)) => Err(format!("unknown envelope format byte {other}")),
        None => Err("empty stored response".to_owned()),
    }
}

/// What an envelope says of itself: its format's name (`plain`, `zstd`,
/// `sealed`, `unknown`) and, when sealed, the id of the key that sealed it.
pub fn envelope_of(stored: &[u8]) -> (&'static str, Option<&str>) {
    match stored.split_first() {
        Some((&PLAIN, _)) => ("plain", None),
        Some((&ZSTD, _)) => ("zstd", None),
        Some((&WITH_MESSAGES, _)) => ("with-messages", None),
        Some((&SEALED, sealed)) => ("sealed", split_id(sealed).ok().map(|(id, _)| id)),
        _ => ("unknown", None),
    }
}

/// `plain` sealed under the keyring's current key for `context`, behind
/// the sealed format byte.
pub(super) fn seal_with(keyring: &Keyring, plain: &[u8], context: &[u8]) -> Bytes {
    let mut out = vec![SEALED];
    keyring.seal(plain, context, &mut out);
    out.into()
}

/// What [`seal_with`] sealed, opened (`stored` must begin with the sealed
/// byte).
pub(super) fn open_with(
    keyring: Option<&Keyring>,
    stored: &[u8],
    context: &[u8],
) -> Result<Vec<u8>, String> {
    let sealed = stored.strip_prefix(&[SEALED]).unwrap_or(stored);
    match keyring {
        Some(keyring) => keyring.open(sealed, context),
        None => Err(format!(
            "sealed with key {:?}, and no keyring is configured",
            split_id(sealed).map_or("?", |(id, _)| id)
        )),
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
        assert!(open(&[SEALED, 1, b'k'], 10)
            .expect_err("sealed")
            .contains("key \"k\""));
        assert!(open(&[9, 1, 2], 10)
            .expect_err("bad")
            .contains("format byte 9"));
        assert!(open(&[ZSTD, 1, 2, 3], 10).is_err());
    }

    #[test]
    fn messages_ride_in_front_of_the_response() {
        let inner = seal(b"{\"a\":1}".to_vec(), 1024);
        let stored = with_messages(b"MSGS", &inner);
        assert_eq!(stored[0], WITH_MESSAGES);
        assert_eq!(open(&stored, 100).expect("opens").as_ref(), b"{\"a\":1}");
        let (messages, rest) = split_messages(&stored)
            .expect("splits")
            .expect("has messages");
        assert_eq!((messages, rest), (&b"MSGS"[..], &inner[..]));
        assert_eq!(split_messages(&inner).expect("plain"), None);
        assert!(split_messages(&[WITH_MESSAGES, 0, 0, 0, 9, 1])
            .expect_err("short")
            .contains("names 9 bytes"));
        assert!(split_messages(&[WITH_MESSAGES, 0, 0]).is_err());
        let nested = with_messages(b"", &with_messages(b"", &inner));
        assert!(open(&nested, 100).is_err());
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

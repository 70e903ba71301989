//! How a run's messages are laid out in its stored response's envelope:
//! a version byte (`1`), a count, then each message's id, destination,
//! headers and payload, every field length-prefixed (big-endian: `u16`
//! for the id, destination, header count and header names, `u32` for
//! header values and payloads).

use bytes::Bytes;

use super::Message;

const VERSION: u8 = 1;

/// The messages as a run stores them with its response (see
/// [`AtRest::seal_run`](crate::codec::AtRest::seal_run)).
pub fn encode(messages: &[Message]) -> Vec<u8> {
    let mut out = vec![VERSION];
    put_len(&mut out, messages.len(), 4);
    for m in messages {
        put(&mut out, m.id.as_bytes(), 2);
        put(&mut out, m.destination.as_bytes(), 2);
        put_len(&mut out, m.headers.len(), 2);
        for (name, value) in &m.headers {
            put(&mut out, name.as_bytes(), 2);
            put(&mut out, value.as_bytes(), 4);
        }
        put(&mut out, &m.payload, 4);
    }
    out
}

/// What [`encode`] wrote, or why the bytes are not that.
pub(crate) fn decode(bytes: &[u8]) -> Result<Vec<Message>, String> {
    let mut r = Reader(bytes);
    let version = r.take(1)?[0];
    if version != VERSION {
        return Err(format!("unknown messages layout {version}"));
    }
    let count = r.len(4)?;
    // Each message takes at least 12 bytes: no count can ask for more
    // than the bytes hold.
    let mut out = Vec::with_capacity(count.min(bytes.len() / 12));
    for _ in 0..count {
        let id = r.text(2)?;
        let destination = r.text(2)?;
        let headers = (0..r.len(2)?)
            .map(|_| Ok((r.text(2)?, r.text(4)?)))
            .collect::<Result<_, String>>()?;
        let payload = Bytes::copy_from_slice(r.field(4)?);
        out.push(Message {
            id,
            destination,
            payload,
            headers,
        });
    }
    if !r.0.is_empty() {
        return Err(format!("{} bytes follow the last message", r.0.len()));
    }
    Ok(out)
}

fn put_len(out: &mut Vec<u8>, len: usize, width: usize) {
    let len = u64::try_from(len).expect("lengths fit in 64 bits");
    out.extend_from_slice(&len.to_be_bytes()[8 - width..]);
}

/// `bytes` behind their length. The caller has checked the sizes: ids,
/// destinations and header names are limited to 64 KiB, values and
/// payloads by the run's limit.
fn put(out: &mut Vec<u8>, bytes: &[u8], width: usize) {
    put_len(out, bytes.len(), width);
    out.extend_from_slice(bytes);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "stored messages end early ({n} bytes wanted, {} left)",
                self.0.len()
            ));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn len(&mut self, width: usize) -> Result<usize, String> {
        let mut be = [0u8; 8];
        be[8 - width..].copy_from_slice(self.take(width)?);
        usize::try_from(u64::from_be_bytes(be)).map_err(|e| e.to_string())
    }

    fn field(&mut self, width: usize) -> Result<&'a [u8], String> {
        let n = self.len(width)?;
        self.take(n)
    }

    fn text(&mut self, width: usize) -> Result<String, String> {
        let field = self.field(width)?;
        String::from_utf8(field.to_vec()).map_err(|_| "a stored message field is not UTF-8".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let messages = vec![
            Message::new("orders", "{\"a\":1}").header("content-type", "application/json"),
            Message::new("audit", Bytes::new()),
        ];
        let bytes = encode(&messages);
        assert_eq!(decode(&bytes).expect("decodes"), messages);
        assert_eq!(decode(&encode(&[])).expect("empty"), vec![]);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut} decoded");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode(&long).expect_err("trailing").contains("follow"));
        assert!(decode(&[9]).expect_err("version").contains("layout 9"));
        assert!(
            decode(&[1, 255, 255, 255, 255]).is_err(),
            "a huge count is not trusted"
        );
    }
}

//! Cluster slots: which slot a key hashes to, and the slot map from
//! `CLUSTER SLOTS`.

use redis::Value;

/// The number of slots in a Redis Cluster.
pub(crate) const SLOTS: usize = 16_384;

/// The slot of `key`, by the Cluster's rule: CRC16 (XMODEM) of the hash
/// tag (the text between the first `{` and the next `}`, if not empty),
/// else of the whole key.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS as u16
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// One range of `CLUSTER SLOTS`: first and last slot and the master's
/// address.
pub(crate) type Range = (u16, u16, (String, u16));

/// Parses a `CLUSTER SLOTS` reply; `None` if it has another shape.
pub(crate) fn parse(reply: &Value) -> Option<Vec<Range>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(parts) = range else {
                return None;
            };
            let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(node))) =
                (parts.first(), parts.get(1), parts.get(2))
            else {
                return None;
            };
            let host = match node.first()? {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let Some(Value::Int(port)) = node.get(1) else {
                return None;
            };
            Some((
                u16::try_from(*first).ok()?,
                u16::try_from(*last).ok()?,
                (host, u16::try_from(*port).ok()?),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_the_cluster_rule_and_the_redis_crate() {
        // The CRC16 check value of the Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo{bar}baz"), slot(b"bar"));
        assert_eq!(
            slot(b"{}x"),
            slot(b"{}x"),
            "an empty tag hashes the whole key"
        );
        assert_ne!(slot(b"{}x"), slot(b""));
        for key in [
            "idem:0011:{abcdef}",
            "k",
            "a{b",
            "x{}y{z}",
            "{user1000}.following",
        ] {
            assert_eq!(
                format!("{:?}", redis::cluster_routing::Slot::for_key(key)),
                format!("Slot({})", slot(key.as_bytes())),
                "{key}"
            );
        }
    }

    #[test]
    fn cluster_slots_replies_parse() {
        let node = |port| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(5460), node(7000)]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node(7001)]),
        ]);
        assert_eq!(
            parse(&reply),
            Some(vec![
                (0, 5460, ("127.0.0.1".into(), 7000)),
                (5461, 16383, ("127.0.0.1".into(), 7001))
            ])
        );
        assert_eq!(parse(&Value::Nil), None);
    }
}

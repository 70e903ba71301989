//! What the Redis store reads back: any reply the server (or something
//! pretending to be it) sends, parsed as RESP and decoded as each script's
//! reply, is a value or a `Corrupt` error naming the record, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    idem_redis::fuzzing::decode_reply(data);
});

//! STUN message and attribute decoding: no panic on any input.
#![no_main]

use lastcall_turn_proto::stun::{decode_address, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Message::parse(data) {
        let txid = m.transaction_id();
        for a in m.attributes() {
            let _ = decode_address(a.value, &txid, true);
            let _ = m.check_fingerprint(a.offset, a.value);
            let _ = m.check_integrity_sha1(a.offset, a.value, b"key");
            let _ = m.check_integrity_sha256(a.offset, a.value, b"key");
        }
    }
});

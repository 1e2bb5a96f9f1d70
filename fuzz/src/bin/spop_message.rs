//! SPOP payloads: KV-LIST, LIST-OF-MESSAGES (typed data), the HELLO negotiation and
//! coraza-spoa's messages read from them (`lastcall_spop_proto::invariants::messages`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lastcall_spop_proto::invariants::messages(data));

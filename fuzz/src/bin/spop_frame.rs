//! SPOP frames as HAProxy sends them: splitting a stream into frames, and a connection fed
//! it after a good HELLO (`lastcall_spop_proto::invariants::frames`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lastcall_spop_proto::invariants::frames(data));

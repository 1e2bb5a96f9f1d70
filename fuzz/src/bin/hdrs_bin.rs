//! HAProxy's header blocks, binary (`req.hdrs_bin`) and text (`req.hdrs`)
//! (`lastcall_spop_proto::invariants::header_blocks`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lastcall_spop_proto::invariants::header_blocks(data));

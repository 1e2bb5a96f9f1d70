//! TCP/TLS stream framing and ChannelData: no panic, frames within the buffer.
#![no_main]

use lastcall_turn_proto::frame::parse_channel_data;
use lastcall_turn_proto::stream_frame_len;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(n)) = stream_frame_len(data) {
        assert!(n >= 4 && n <= data.len());
    }
    if let Some((_, payload)) = parse_channel_data(data) {
        assert!(payload.len() + 4 <= data.len());
    }
});

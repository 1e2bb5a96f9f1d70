//! `lastcall-turnload`: a microsecond-resolution TURN load generator.
fn main() {}

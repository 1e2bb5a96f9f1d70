//! `lastcall-turn`: a TURN/STUN relay that reads coturn's configuration and drains on SIGTERM.
fn main() {}

//! `lastcall-spoa`: an HAProxy SPOE agent running ModSecurity with the OWASP Core Rule Set.
fn main() {}

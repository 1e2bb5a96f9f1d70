//! `lastcall-turn`: a TURN/STUN relay that reads coturn's configuration and drains on SIGTERM.
#![forbid(unsafe_code)]

use lastcall_turn::config::{self, Parsed};

fn main() {
    let settings = match config::parse(std::env::args()) {
        Ok(Parsed::Run(s)) => s,
        Ok(Parsed::Print(text)) => {
            print!("{text}");
            std::process::exit(0);
        }
        Err(errors) => {
            eprintln!("lastcall-turn: configuration errors:");
            for p in &errors.0 {
                eprintln!("  - {p}");
            }
            std::process::exit(64);
        }
    };
    let _ = settings;
}

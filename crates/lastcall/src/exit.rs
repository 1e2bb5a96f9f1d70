//! Process exit statuses, one table for every lastcall daemon (sysexits-style values,
//! documented in README.md and `docs/termination.md`): the same failure exits with the
//! same status whichever daemon it happens in.

/// The drain finished: no session was left (or no more than `--drain-min-sessions`), or
/// a forced exit found nothing live.
pub const DRAINED: i32 = 0;
/// Configuration or usage error, found before any port is bound (`EX_USAGE`): a bad flag,
/// environment variable or file (including one that cannot be read), rules that do not
/// compile, a certificate that does not load.
pub const CONFIG: i32 = 64;
/// An internal error (`EX_SOFTWARE`): a part the daemon depends on failed in a way no
/// configuration explains (e.g. libmodsecurity cannot be initialised).
pub const SOFTWARE: i32 = 70;
/// The operating system refused what start-up needs (`EX_OSERR`): a port or socket path
/// that cannot be bound, the runtime's threads that cannot be started.
pub const OS_ERROR: i32 = 71;
/// `--drain-timeout` ran out and live sessions were cut (`EX_TEMPFAIL`: try elsewhere).
pub const DEADLINE: i32 = 75;
/// A forced exit (second SIGTERM/SIGINT while draining, SIGQUIT, `--on-sigterm exit`)
/// cut live sessions.
pub const FORCED: i32 = 76;

/// Every status, with its name and meaning (what the docs' tables say).
pub const TABLE: [(i32, &str, &str); 6] = [
    (DRAINED, "DRAINED", "drained: no session left (or at most `--drain-min-sessions`), or a forced exit that found nothing live"),
    (CONFIG, "CONFIG", "configuration or usage error, found before any port was bound"),
    (SOFTWARE, "SOFTWARE", "internal error: a part the daemon depends on failed (e.g. libmodsecurity cannot start)"),
    (OS_ERROR, "OS_ERROR", "the operating system refused what start-up needs: a port or socket path that cannot be bound, threads that cannot start"),
    (DEADLINE, "DEADLINE", "`--drain-timeout` ran out and live sessions were cut"),
    (FORCED, "FORCED", "a forced exit (second SIGTERM/SIGINT, SIGQUIT, `--on-sigterm exit`) cut live sessions"),
];

#[cfg(test)]
mod tests {
    use super::TABLE;

    /// README.md's and docs/termination.md's tables list every status with the same meaning.
    #[test]
    fn the_docs_list_every_status() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        for doc in ["README.md", "docs/termination.md"] {
            let text = std::fs::read_to_string(format!("{root}/{doc}")).unwrap();
            for (code, _, meaning) in TABLE {
                let row = format!("| {code} | {meaning} |");
                assert!(text.contains(&row), "{doc} lacks the row `{row}`");
            }
        }
    }
}

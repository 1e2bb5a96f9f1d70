//! Process exit statuses of a lastcall daemon (documented in `docs/termination.md`).

/// The drain finished: no session was left (or no more than `--drain-min-sessions`), or
/// a forced exit found nothing live.
pub const DRAINED: i32 = 0;
/// Configuration or usage error, found before any port is bound (`EX_USAGE`).
pub const CONFIG: i32 = 64;
/// `--drain-timeout` ran out and live sessions were cut.
pub const DEADLINE: i32 = 75;
/// A forced exit (second SIGTERM/SIGINT while draining, SIGQUIT, `--on-sigterm exit`)
/// cut live sessions.
pub const FORCED: i32 = 76;

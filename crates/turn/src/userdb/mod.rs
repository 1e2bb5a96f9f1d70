//! coturn's user databases, read as coturn 4.6-4.18 reads them: SQLite (`userdb`, Debian's
//! `/var/lib/turn/turndb`), PostgreSQL (`psql-userdb`, a libpq connection string) and Redis
//! (`redis-userdb`, coturn's connection string and key layout).
//!
//! What is read, and when:
//!
//! - **per new authentication**, off the packet path: a long-term user's key
//!   (`turnusers_lt`, `turn/realm/R/user/U/key`) or, with `use-auth-secret`, the realm's REST
//!   secrets (`turn_secret`, `turn/realm/R/secret`). The core asks ([`Lookup`]); this
//!   module's task runs the query with a bounded wait and hands the answer back; the core
//!   keeps it (bounded: see [`lastcall_turn_proto::CacheLimits`]) and replays the requests
//!   that waited.
//! - **every 5 seconds** (coturn's period): the realm's options (`turn_realm_option`:
//!   `max-bps`, `user-quota`, `total-quota`; unless `no-dynamic-realms`) and the peer lists
//!   (`allowed_peer_ip`, `denied_peer_ip`, rows of this realm or of none; unless
//!   `no-dynamic-ip-list`), merged with the configuration's; and `turn_origin_to_realm`, only
//!   to say in the log which origins coturn would have put in another realm (one realm is
//!   served).
//!
//! Not read: `oauth_key` (oAuth is not implemented: `oauth` is refused) and `admin_user`
//! (there is no web admin). A database that fails keeps what was read last (coturn empties
//! its peer lists then).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lastcall_turn_proto::{Answer, Bandwidth, IpRange, Lookup, Query, Quotas};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::config::userdb::{Source, UserDbConfig};
use crate::shared::ServerState;

pub(crate) mod postgres;
pub(crate) mod redis;
pub(crate) mod sqlite;

/// A query may take this long before its requests get 500 (the core's own bound, 3 s, is a
/// backstop behind it).
pub(crate) const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the realm's options and peer lists are read again (coturn: 5 s).
pub(crate) const REREAD: Duration = Duration::from_secs(5);
/// After a failed connection attempt, lookups fail at once for this long (a database that is
/// down costs each new authentication nothing but the 500).
pub(crate) const RECONNECT_AFTER: Duration = Duration::from_secs(1);
/// "Unavailable" log lines: one per window, with the count of the failures in between.
const UNAVAILABLE_LOG_WINDOW: Duration = Duration::from_secs(10);

/// A backend's failure, for the log.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub(crate) struct DbError(pub(crate) String);

impl DbError {
    pub(crate) fn new(e: impl std::fmt::Display) -> DbError {
        DbError(e.to_string())
    }
}

/// What the 5-second reread found for the realm.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RealmRows {
    /// `turn_realm_option` rows of the realm: (option, value).
    pub options: Vec<(String, String)>,
    /// `allowed_peer_ip` ranges of the realm or of none.
    pub allowed: Vec<String>,
    /// `denied_peer_ip` ranges of the realm or of none.
    pub denied: Vec<String>,
    /// `turn_origin_to_realm` rows naming another realm: (origin, realm).
    pub other_origins: Vec<(String, String)>,
}

/// One of the three databases.
#[derive(Clone)]
pub(crate) enum Backend {
    Sqlite(sqlite::Sqlite),
    Postgres(postgres::Postgres),
    Redis(redis::Redis),
}

impl Backend {
    fn open(source: &Source) -> Backend {
        match source {
            Source::Sqlite(path) => Backend::Sqlite(sqlite::Sqlite::open(path.clone())),
            Source::Postgres(spec) => Backend::Postgres(postgres::Postgres::new(spec.clone())),
            Source::Redis(spec) => Backend::Redis(redis::Redis::new(spec.clone())),
        }
    }

    /// The hex key of `user` in `realm`, if there is such a user.
    async fn user_key(&self, realm: &str, user: &str) -> Result<Option<String>, DbError> {
        match self {
            Backend::Sqlite(b) => b.user_key(realm, user).await,
            Backend::Postgres(b) => b.user_key(realm, user).await,
            Backend::Redis(b) => b.user_key(realm, user).await,
        }
    }

    /// The realm's REST secrets.
    async fn secrets(&self, realm: &str) -> Result<Vec<String>, DbError> {
        match self {
            Backend::Sqlite(b) => b.secrets(realm).await,
            Backend::Postgres(b) => b.secrets(realm).await,
            Backend::Redis(b) => b.secrets(realm).await,
        }
    }

    /// The realm's options, peer lists and other realms' origins.
    async fn realm(&self, realm: &str, what: Reread) -> Result<RealmRows, DbError> {
        match self {
            Backend::Sqlite(b) => b.realm(realm, what).await,
            Backend::Postgres(b) => b.realm(realm, what).await,
            Backend::Redis(b) => b.realm(realm, what).await,
        }
    }
}

/// What the reread reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reread {
    pub ip_lists: bool,
    pub realms: bool,
}

/// What the configuration itself says of what the database may change.
#[derive(Clone, Debug)]
pub(crate) struct Static {
    pub realm: String,
    pub allowed: Vec<IpRange>,
    pub denied: Vec<IpRange>,
    pub quotas: Quotas,
    pub bandwidth: Bandwidth,
}

/// The user database's task: lookups from the core, and the 5-second reread.
pub(crate) struct UserDb {
    backend: Backend,
    shared: Arc<ServerState>,
    fixed: Static,
    reread: Reread,
    health: Arc<Health>,
    describe: String,
}

/// Whether the database answers, for the log lines (one when it stops, one a window while it
/// is down with the count, one when it is back).
#[derive(Default)]
pub(crate) struct Health {
    state: Mutex<HealthState>,
}

#[derive(Default)]
struct HealthState {
    down_since: Option<Instant>,
    logged: Option<Instant>,
    failures: u64,
}

impl Health {
    fn failed(&self, what: &str, describe: &str, e: &DbError) {
        let now = Instant::now();
        let mut s = self.state.lock();
        s.failures += 1;
        let first = s.down_since.is_none();
        if first {
            s.down_since = Some(now);
        }
        let due = s
            .logged
            .is_none_or(|t| now.saturating_duration_since(t) >= UNAVAILABLE_LOG_WINDOW);
        if first || due {
            s.logged = Some(now);
            tracing::error!(database = %describe, failures = s.failures,
                "user database unavailable ({what}: {e}): new authentications get 500 \
                 (existing allocations keep relaying) until it answers");
        }
    }

    fn answered(&self, describe: &str) {
        let mut s = self.state.lock();
        if let Some(since) = s.down_since.take() {
            tracing::info!(database = %describe, failures = s.failures,
                down_for = ?since.elapsed(), "user database answers again");
            s.failures = 0;
            s.logged = None;
        }
    }
}

impl UserDb {
    /// Starts the task for `config` (inside a tokio runtime): it takes the core's lookups
    /// from `lookups` (the other end is the [`ServerState`]'s) and answers into `shared`.
    pub(crate) fn spawn(
        config: &UserDbConfig,
        fixed: Static,
        shared: &Arc<ServerState>,
        lookups: mpsc::UnboundedReceiver<Lookup>,
    ) {
        let db = UserDb {
            backend: Backend::open(&config.source),
            shared: Arc::clone(shared),
            fixed,
            reread: Reread {
                ip_lists: config.dynamic_ip_list,
                realms: config.dynamic_realms,
            },
            health: Arc::new(Health::default()),
            describe: config.source.describe(),
        };
        tracing::info!(database = %db.describe, "reading the user database");
        tokio::spawn(db.run(lookups));
    }

    async fn run(self, mut lookups: mpsc::UnboundedReceiver<Lookup>) {
        let this = Arc::new(self);
        let mut tick = tokio::time::interval(REREAD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut applied = Applied::default();
        loop {
            tokio::select! {
                l = lookups.recv() => match l {
                    Some(l) => {
                        let this = Arc::clone(&this);
                        tokio::spawn(async move { this.lookup(l).await });
                    }
                    None => return,
                },
                _ = tick.tick(), if this.reread.ip_lists || this.reread.realms => {
                    this.reread_realm(&mut applied).await;
                }
            }
        }
    }

    /// Runs one lookup and hands the answer to the core.
    async fn lookup(&self, l: Lookup) {
        let answer = match &l.query {
            Query::UserKey(user) => {
                let r = self.timed(self.backend.user_key(&l.realm, user)).await;
                match r {
                    Ok(Some(hex)) => match parse_key(&hex) {
                        Some(k) => Answer::Key(k),
                        None => {
                            tracing::warn!(user = %user, realm = %l.realm,
                                "the user database's key of this user is not 32 hex digits: the user is refused");
                            Answer::NoUser
                        }
                    },
                    Ok(None) => Answer::NoUser,
                    Err(e) => self.unavailable("a user's key", &e),
                }
            }
            Query::RestSecrets => match self.timed(self.backend.secrets(&l.realm)).await {
                Ok(secrets) => {
                    Answer::Secrets(secrets.into_iter().map(String::into_bytes).collect())
                }
                Err(e) => self.unavailable("the REST secrets", &e),
            },
        };
        if answer != Answer::Unavailable {
            self.health.answered(&self.describe);
        }
        let now = Instant::now();
        self.shared
            .run(|server| server.lookup_done(now, l.id, answer));
    }

    async fn timed<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, DbError>>,
    ) -> Result<T, DbError> {
        match tokio::time::timeout(QUERY_TIMEOUT, f).await {
            Ok(r) => r,
            Err(_) => Err(DbError(format!(
                "no answer within {} s",
                QUERY_TIMEOUT.as_secs()
            ))),
        }
    }

    fn unavailable(&self, what: &str, e: &DbError) -> Answer {
        self.health.failed(what, &self.describe, e);
        Answer::Unavailable
    }

    /// Reads the realm's options and peer lists again and gives the core what changed.
    async fn reread_realm(&self, applied: &mut Applied) {
        let rows = match self
            .timed(self.backend.realm(&self.fixed.realm, self.reread))
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                // What was read last stays.
                self.health
                    .failed("the realm's options and peer lists", &self.describe, &e);
                return;
            }
        };
        self.health.answered(&self.describe);
        if applied.rows.as_ref() == Some(&rows) {
            return;
        }
        let limits = realm_limits(&self.fixed, &rows.options);
        let (allowed, denied) = peer_lists(&self.fixed, &rows);
        if !rows.other_origins.is_empty()
            && applied.rows.as_ref().map(|r| &r.other_origins) != Some(&rows.other_origins)
        {
            let (origin, realm) = &rows.other_origins[0];
            tracing::error!(
                rows = rows.other_origins.len(), example = %format!("{origin} -> {realm}"),
                realm = %self.fixed.realm,
                "turn_origin_to_realm puts origins in other realms: lastcall-turn serves one \
                 realm, so their clients are challenged in this one (and their users of those \
                 realms are refused)"
            );
        }
        tracing::info!(
            user_quota = limits.0.per_user,
            total_quota = limits.0.total,
            max_bps = limits.1.max_bps,
            allowed_peer_ip = allowed.len(),
            denied_peer_ip = denied.len(),
            "user database: realm options and peer lists read"
        );
        self.shared.run(|server| {
            server.set_limits(limits.0, limits.1);
            server.set_peer_ranges(allowed, denied);
        });
        applied.rows = Some(rows);
    }
}

/// What the reread gave the core last.
#[derive(Default)]
struct Applied {
    rows: Option<RealmRows>,
}

/// The 16-byte key of coturn's hex `hmackey` (its first 32 hex digits, as coturn reads it;
/// `char(128)` columns come padded with spaces).
pub(crate) fn parse_key(hex: &str) -> Option<[u8; 16]> {
    let hex = hex.trim();
    let digits = hex.get(..32)?;
    let mut key = [0u8; 16];
    for (i, k) in key.iter_mut().enumerate() {
        *k = u8::from_str_radix(digits.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(key)
}

/// The configuration's quotas and `max-bps`, overridden by the realm's options (coturn's
/// `reread_realms`: a row removed falls back to the configuration). A value that is not a
/// number is logged and ignored (coturn would read it as 0: no limit).
pub(crate) fn realm_limits(fixed: &Static, options: &[(String, String)]) -> (Quotas, Bandwidth) {
    let (mut quotas, mut bandwidth) = (fixed.quotas, fixed.bandwidth);
    for (opt, value) in options {
        let parsed = value.trim().parse::<u64>();
        let Ok(n) = parsed else {
            tracing::error!(realm = %fixed.realm, option = %opt, value = %value,
                "turn_realm_option: not a number, ignored (the configuration's value stays)");
            continue;
        };
        let quota = u32::try_from(n).unwrap_or(u32::MAX);
        match opt.as_str() {
            "max-bps" => bandwidth.max_bps = n,
            "user-quota" => quotas.per_user = quota,
            "total-quota" => quotas.total = quota,
            other => tracing::error!(realm = %fixed.realm, option = %other,
                "turn_realm_option: unknown realm option (coturn knows max-bps, user-quota, total-quota)"),
        }
    }
    (quotas, bandwidth)
}

/// The configuration's peer lists with the database's ranges added (an allowed range wins
/// over a denied one, as in coturn). A range that does not parse is logged and skipped.
pub(crate) fn peer_lists(fixed: &Static, rows: &RealmRows) -> (Vec<IpRange>, Vec<IpRange>) {
    let parse = |table: &str, list: &[String], into: &mut Vec<IpRange>| {
        for r in list {
            match r.trim().parse::<IpRange>() {
                Ok(range) => into.push(range),
                Err(e) => tracing::error!(table, range = %r, "not an address range, skipped: {e}"),
            }
        }
    };
    let mut allowed = fixed.allowed.clone();
    let mut denied = fixed.denied.clone();
    parse("allowed_peer_ip", &rows.allowed, &mut allowed);
    parse("denied_peer_ip", &rows.denied, &mut denied);
    (allowed, denied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed() -> Static {
        Static {
            realm: "example.org".into(),
            allowed: Vec::new(),
            denied: vec!["10.0.0.0/8".parse().expect("range")],
            quotas: Quotas {
                per_user: 5,
                total: 100,
            },
            bandwidth: Bandwidth {
                max_bps: 0,
                capacity: 1000,
            },
        }
    }

    #[test]
    fn keys_as_turnadmin_writes_them() {
        // turnadmin -k -u gorst -r north.gov -p hero (coturn's own example).
        assert_eq!(
            parse_key("7da2270ccfa49786e0115366d3a3d14d"),
            Some([
                0x7d, 0xa2, 0x27, 0x0c, 0xcf, 0xa4, 0x97, 0x86, 0xe0, 0x11, 0x53, 0x66, 0xd3, 0xa3,
                0xd1, 0x4d
            ])
        );
        let padded = format!("{}{}", "00".repeat(16), " ".repeat(96));
        assert_eq!(parse_key(&padded), Some([0; 16]), "char(128) padding");
        for bad in [
            "",
            "7da2",
            "zz2270ccfa49786e0115366d3a3d14d0",
            "é".repeat(32).as_str(),
        ] {
            assert_eq!(parse_key(bad), None, "{bad:?}");
        }
    }

    /// coturn's realm options over the configuration's, as a table.
    #[test]
    fn realm_options_override_the_configuration_and_bad_values_are_ignored() {
        type Rows = Vec<(String, String)>;
        let opt = |o: &str, v: &str| (o.to_string(), v.to_string());
        let cases: Vec<(Rows, (u32, u32, u64))> = vec![
            (vec![], (5, 100, 0)),
            (vec![opt("user-quota", "2")], (2, 100, 0)),
            (
                vec![opt("total-quota", "7"), opt("max-bps", "64000")],
                (5, 7, 64000),
            ),
            (vec![opt("user-quota", "lots")], (5, 100, 0)),
            (vec![opt("user-quota", "-1")], (5, 100, 0)),
            (vec![opt("bps-capacity", "9")], (5, 100, 0)),
            (vec![opt("user-quota", "0")], (0, 100, 0)),
        ];
        for (rows, (user, total, bps)) in cases {
            let (q, b) = realm_limits(&fixed(), &rows);
            assert_eq!(
                (q.per_user, q.total, b.max_bps),
                (user, total, bps),
                "{rows:?}"
            );
            assert_eq!(b.capacity, 1000, "bps-capacity is the configuration's");
        }
    }

    #[test]
    fn peer_ranges_are_added_to_the_configurations() {
        let rows = RealmRows {
            allowed: vec!["172.17.13.200".into(), "not a range".into()],
            denied: vec!["172.17.13.133-172.17.14.56".into(), "123::45".into()],
            ..RealmRows::default()
        };
        let (allowed, denied) = peer_lists(&fixed(), &rows);
        assert_eq!(allowed.len(), 1);
        assert_eq!(denied.len(), 3);
    }
}

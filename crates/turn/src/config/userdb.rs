//! The user database options: `userdb` (`db`), `psql-userdb` (`sql-userdb`),
//! `redis-userdb`, `no-dynamic-ip-list`, `no-dynamic-realms` and our `userdb-cache-ttl`,
//! checked at start-up (the database itself is read by the `userdb` module): an SQLite file must
//! be coturn's, a connection string must parse and ask for nothing that is not implemented
//! (TLS); one database at a time.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lastcall::Source as At;
use redis::{ConnectionAddr, RedisConnectionInfo};
use rusqlite::{Connection, OpenFlags};

use super::check::Checker;

/// Which database, as the configuration named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `userdb=PATH`: an SQLite file (read only).
    Sqlite(PathBuf),
    /// `psql-userdb=CONNINFO`: a libpq connection string (`host=... dbname=... user=...
    /// password=...` or a `postgresql://` URI).
    Postgres(PgSpec),
    /// `redis-userdb=CONNINFO`: coturn's `ip=... port=... dbname=... password=...`.
    Redis(RedisSpec),
}

impl Source {
    /// The option that named it.
    pub fn option(&self) -> &'static str {
        match self {
            Source::Sqlite(_) => "userdb",
            Source::Postgres(_) => "psql-userdb",
            Source::Redis(_) => "redis-userdb",
        }
    }

    /// What the logs call it (no password).
    pub fn describe(&self) -> String {
        match self {
            Source::Sqlite(p) => format!("SQLite {}", p.display()),
            Source::Postgres(s) => format!("PostgreSQL {}", s.describe()),
            Source::Redis(s) => format!("Redis {}", s.describe()),
        }
    }
}

/// The user database options of the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserDbConfig {
    /// Where it is.
    pub source: Source,
    /// Read `allowed_peer_ip` / `denied_peer_ip` (off with coturn's `no-dynamic-ip-list`).
    pub dynamic_ip_list: bool,
    /// Read `turn_realm_option` (off with coturn's `no-dynamic-realms`).
    pub dynamic_realms: bool,
    /// Our `userdb-cache-ttl`: how long an answer that authenticates is used.
    pub cache_ttl: Duration,
}

/// `userdb-cache-ttl` when not given.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(10);

impl UserDbConfig {
    /// What the core keeps of the database's answers.
    pub fn cache_limits(&self) -> lastcall_turn_proto::CacheLimits {
        lastcall_turn_proto::CacheLimits {
            ttl: self.cache_ttl,
            ..lastcall_turn_proto::CacheLimits::default()
        }
    }
}

/// The user database: one of `userdb` (`db`), `psql-userdb` (`sql-userdb`), `redis-userdb`,
/// checked now (a connection string that parses; an SQLite file that is coturn's).
pub(super) fn read(c: &mut Checker<'_>) -> Option<UserDbConfig> {
    let dynamic_ip_list = !c.flag("no-dynamic-ip-list");
    let dynamic_realms = !c.flag("no-dynamic-realms");
    let cache_ttl = cache_ttl(c);
    let mut found: Vec<(&'static str, String, At)> = Vec::new();
    for name in ["userdb", "db", "psql-userdb", "sql-userdb", "redis-userdb"] {
        if let Some((v, source)) = c.raw.last(name) {
            found.push((name, v.clone(), source.clone()));
        }
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|(n, _, _)| *n).collect();
        c.require(
            found[1].0,
            &format!(
                "{} name more than one user database: give one",
                names.join(", ")
            ),
        );
        return None;
    }
    let (name, value, source) = found.pop()?;
    let parsed = match name {
        "userdb" | "db" => check_sqlite(&value).map(Source::Sqlite),
        "psql-userdb" | "sql-userdb" => PgSpec::parse(&value).map(Source::Postgres),
        _ => RedisSpec::parse(&value).map(Source::Redis),
    };
    match parsed {
        Ok(parsed) => Some(UserDbConfig {
            source: parsed,
            dynamic_ip_list,
            dynamic_realms,
            cache_ttl,
        }),
        Err(why) => {
            c.bad(&source, name, &value, &why);
            None
        }
    }
}

/// Our `userdb-cache-ttl`: 1 s to 1 h.
fn cache_ttl(c: &mut Checker<'_>) -> Duration {
    let Some((v, source)) = c.raw.last("userdb-cache-ttl") else {
        return DEFAULT_CACHE_TTL;
    };
    match lastcall::duration::parse(v) {
        Ok(d) if (Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&d) => d,
        Ok(_) => {
            let (v, source) = (v.clone(), source.clone());
            c.bad(&source, "userdb-cache-ttl", &v, "from 1s to 1h");
            DEFAULT_CACHE_TTL
        }
        Err(e) => {
            let (v, source) = (v.clone(), source.clone());
            c.bad(
                &source,
                "userdb-cache-ttl",
                &v,
                &format!("not a duration (10s, 1m): {e}"),
            );
            DEFAULT_CACHE_TTL
        }
    }
}

/// An SQLite `userdb` must be there and be coturn's (what could be checked of it without
/// waiting for a writer's lock).
fn check_sqlite(path: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(path.trim());
    match std::fs::metadata(&p) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err(format!("{}: not a file", p.display())),
        Err(e) => {
            return Err(format!(
                "{}: {e} (coturn would create an empty one; make it with turnadmin, e.g. \
                 turnadmin -a -b {} -u NAME -r REALM -p PASSWORD)",
                p.display(),
                p.display()
            ))
        }
    }
    check_schema(&p)?;
    Ok(p)
}

/// The tables coturn's schema has and this reads.
const TABLES: [&str; 6] = [
    "turnusers_lt",
    "turn_secret",
    "allowed_peer_ip",
    "denied_peer_ip",
    "turn_origin_to_realm",
    "turn_realm_option",
];

/// At start-up: `path` is an SQLite database with coturn's tables. A database locked by a
/// writer passes (it is read later).
pub(crate) fn check_schema(path: &Path) -> Result<(), String> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let c =
        Connection::open_with_flags(path, flags).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut missing = Vec::new();
    for table in TABLES {
        let sql = format!("select 1 from {table} limit 0");
        match c.prepare(&sql) {
            Ok(_) => {}
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {}
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseLocked) => {}
            Err(e) if e.to_string().contains("no such table") => missing.push(table),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{}: not coturn's user database (no table {}): make it with turnadmin (turnadmin -a \
         -b {} -u NAME -r REALM -p PASSWORD) or sqlite3 {} < /usr/share/coturn/schema.sql",
        path.display(),
        missing.join(", "),
        path.display(),
        path.display()
    ))
}

/// A checked connection string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgSpec {
    conninfo: String,
}

impl PgSpec {
    /// Checks `conninfo` (what start-up reports): it must parse, name a user and not ask for
    /// TLS.
    pub fn parse(conninfo: &str) -> Result<PgSpec, String> {
        let config: tokio_postgres::Config = conninfo
            .parse()
            .map_err(|e| format!("not a libpq connection string: {e}"))?;
        if config.get_user().is_none() {
            return Err(
                "no user= (libpq would take the login name; lastcall-turn needs it written)".into(),
            );
        }
        if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            return Err(
                "TLS to PostgreSQL is not implemented: use sslmode=disable or \
                 prefer (a trusted network, or a local TLS proxy)"
                    .into(),
            );
        }
        if config.get_hosts().is_empty() {
            return Err("no host= (libpq would use its Unix socket; give host=/var/run/postgresql or an address)".into());
        }
        Ok(PgSpec {
            conninfo: conninfo.to_string(),
        })
    }

    /// Hosts and database, without the password.
    pub fn describe(&self) -> String {
        let Ok(c) = self.conninfo.parse::<tokio_postgres::Config>() else {
            return "(unparsable)".into();
        };
        let hosts: Vec<String> = c
            .get_hosts()
            .iter()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(h) => h.clone(),
                tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        format!(
            "{} database {} user {}",
            hosts.join(","),
            c.get_dbname().unwrap_or("(the user's)"),
            c.get_user().unwrap_or("")
        )
    }

    /// The configuration to connect with: its `connect_timeout` at most `bound` (a
    /// connection attempt is a query's wait: bounded like one).
    pub(crate) fn connect_config(
        &self,
        bound: Duration,
    ) -> Result<tokio_postgres::Config, tokio_postgres::Error> {
        let mut c: tokio_postgres::Config = self.conninfo.parse()?;
        let bound = c
            .get_connect_timeout()
            .copied()
            .map_or(bound, |t| t.min(bound));
        c.connect_timeout(bound);
        if c.get_application_name().is_none() {
            c.application_name("lastcall-turn");
        }
        Ok(c)
    }
}

/// coturn's Redis connection string, checked.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSpec {
    host: String,
    port: u16,
    db: i64,
    user: Option<String>,
    password: Option<String>,
    connect_timeout: Option<Duration>,
}

impl std::fmt::Debug for RedisSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl RedisSpec {
    /// Parses coturn's `key=value` list (space separated; coturn's synonyms: `host`, `ip`,
    /// `addr`, `ipaddr`, `hostaddr`; `dbname`, `db`, `database`; `user`, `uname`, `name`,
    /// `username`; `password`, `pwd`, `passwd`, `secret`; `port`, `p`; `connect_timeout`,
    /// `timeout`). Defaults: 127.0.0.1, 6379, database 0.
    pub fn parse(conninfo: &str) -> Result<RedisSpec, String> {
        let mut spec = RedisSpec {
            host: "127.0.0.1".into(),
            port: 6379,
            db: 0,
            user: None,
            password: None,
            connect_timeout: None,
        };
        for token in conninfo.split(' ').filter(|t| !t.is_empty()) {
            let Some((key, value)) = token.split_once('=') else {
                return Err(format!("{token:?} is not key=value"));
            };
            let number = |what: &str| {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("{key}={value}: {what} must be a number"))
            };
            match key {
                "host" | "ip" | "addr" | "ipaddr" | "hostaddr" => spec.host = value.into(),
                "dbname" | "db" | "database" => {
                    spec.db = i64::try_from(number("the database")?).map_err(|e| e.to_string())?
                }
                "user" | "uname" | "name" | "username" => spec.user = Some(value.into()),
                "password" | "pwd" | "passwd" | "secret" => spec.password = Some(value.into()),
                "port" | "p" => {
                    spec.port = u16::try_from(number("the port")?)
                        .map_err(|_| format!("{key}={value}: not a port"))?
                }
                "connect_timeout" | "timeout" => {
                    let s = number("the timeout")?;
                    spec.connect_timeout = (s > 0).then(|| Duration::from_secs(s));
                }
                "tls" | "ssl" | "tls-ca" | "ca" | "cacert" | "tls-capath" | "capath"
                | "tls-cert" | "cert" | "tls-key" | "clientkey" | "tls-sni" | "sni"
                | "servername" | "tls-verify" | "verify" => {
                    if matches!(key, "tls" | "ssl") && matches!(value, "0" | "false" | "off" | "no")
                    {
                        continue;
                    }
                    return Err(format!(
                        "{key}: TLS to Redis is not implemented (use a trusted network or a \
                         local TLS proxy, and leave the tls keys out)"
                    ));
                }
                other => return Err(format!("unknown key {other:?} (coturn's keys: host, port, dbname, user, password, connect_timeout)")),
            }
        }
        if spec.host.is_empty() {
            return Err("host= is empty".into());
        }
        Ok(spec)
    }

    /// Host, port and database, without the password.
    pub fn describe(&self) -> String {
        format!("{}:{} database {}", self.host, self.port, self.db)
    }

    /// `connect_timeout`, if given.
    pub(crate) fn connect_timeout(&self) -> Option<Duration> {
        self.connect_timeout
    }

    /// What the redis crate connects with.
    pub(crate) fn connection_info(&self) -> redis::RedisResult<redis::ConnectionInfo> {
        use redis::IntoConnectionInfo;
        let mut redis = RedisConnectionInfo::default().set_db(self.db);
        if let Some(u) = &self.user {
            redis = redis.set_username(u);
        }
        if let Some(p) = &self.password {
            redis = redis.set_password(p);
        }
        let info = ConnectionAddr::Tcp(self.host.clone(), self.port).into_connection_info()?;
        Ok(info.set_redis_settings(redis))
    }
}

#[cfg(test)]
mod pg_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn connection_strings_as_libpq_users_write_them() {
        let ok = [
            "host=127.0.0.1 dbname=coturn user=turn password=turn connect_timeout=30",
            "postgresql://turn:secret@db.example:5432/coturn",
            "host=/var/run/postgresql dbname=coturn user=turn",
            "host=db sslmode=prefer user=turn",
        ];
        for c in ok {
            assert!(PgSpec::parse(c).is_ok(), "{c}: {:?}", PgSpec::parse(c));
        }
        let refused = [
            ("host=db dbname=coturn", "no user="),
            ("host=db user=t sslmode=require", "TLS to PostgreSQL"),
            ("user=t dbname=coturn", "no host="),
            (
                "host=db user=t sslmode=verify-full",
                "not a libpq connection string",
            ),
            ("nonsense", "not a libpq connection string"),
        ];
        for (c, why) in refused {
            let e = PgSpec::parse(c).expect_err(c);
            assert!(e.contains(why), "{c}: {e}");
        }
        let d = PgSpec::parse("host=127.0.0.1 dbname=coturn user=turn password=hunter2")
            .expect("parse")
            .describe();
        assert!(!d.contains("hunter2"), "{d}");
        assert!(d.contains("127.0.0.1") && d.contains("coturn"), "{d}");
    }

    #[test]
    fn a_connection_attempt_waits_no_longer_than_a_query() {
        let c = PgSpec::parse("host=db user=t connect_timeout=30")
            .expect("parse")
            .connect_config(Duration::from_secs(2))
            .expect("config");
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(2)));
    }
}
#[cfg(test)]
mod redis_tests {
    use super::*;

    #[test]
    fn coturns_connection_strings() {
        let s =
            RedisSpec::parse("ip=127.0.0.1 dbname=2 password=turn port=6380 connect_timeout=30")
                .expect("coturn's example");
        assert_eq!(
            (s.host.as_str(), s.port, s.db, s.password.as_deref()),
            ("127.0.0.1", 6380, 2, Some("turn"))
        );
        assert_eq!(s.connect_timeout, Some(Duration::from_secs(30)));
        assert!(!s.describe().contains("turn "), "{}", s.describe());
        let d = RedisSpec::parse("").expect("defaults");
        assert_eq!((d.host.as_str(), d.port, d.db), ("127.0.0.1", 6379, 0));
        let syn = RedisSpec::parse("host=redis db=3 username=u pwd=p p=1").expect("synonyms");
        assert_eq!(
            (syn.host.as_str(), syn.db, syn.user.as_deref(), syn.port),
            ("redis", 3, Some("u"), 1)
        );
        assert!(RedisSpec::parse("tls=0").is_ok());
        for (bad, why) in [
            ("tls=1", "TLS to Redis is not implemented"),
            ("cacert=/x", "TLS to Redis is not implemented"),
            ("port=70000", "not a port"),
            ("dbname=x", "must be a number"),
            ("color=blue", "unknown key"),
            ("justaword", "is not key=value"),
        ] {
            let e = RedisSpec::parse(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}

#[cfg(test)]
mod config_tests {
    use super::super::{parse, Parsed, Settings};
    use super::*;

    /// A file with coturn's tables (the statements of coturn's SQLite driver, our copy).
    fn coturn_sqlite(dir: &Path) -> PathBuf {
        let p = dir.join("turndb");
        let c = Connection::open(&p).expect("create");
        c.execute_batch(
            "CREATE TABLE turnusers_lt (realm varchar(127) default '', name varchar(512), hmackey char(128), PRIMARY KEY (realm,name));
             CREATE TABLE turn_secret (realm varchar(127) default '', value varchar(127), primary key (realm,value));
             CREATE TABLE allowed_peer_ip (realm varchar(127) default '', ip_range varchar(256), primary key (realm,ip_range));
             CREATE TABLE denied_peer_ip (realm varchar(127) default '', ip_range varchar(256), primary key (realm,ip_range));
             CREATE TABLE turn_origin_to_realm (origin varchar(127),realm varchar(127),primary key (origin));
             CREATE TABLE turn_realm_option (realm varchar(127) default '', opt varchar(32), value varchar(128), primary key (realm,opt));",
        )
        .expect("schema");
        p
    }

    fn run(args: &[&str]) -> Result<Settings, Vec<String>> {
        let all: Vec<&str> = ["lastcall-turn", "-n", "--realm=example.org"]
            .iter()
            .chain(args)
            .copied()
            .collect();
        match parse(all) {
            Ok(Parsed::Run(s)) => Ok(*s),
            Ok(Parsed::Print(p)) => panic!("printed {p}"),
            Ok(Parsed::Validated(_)) => panic!("unexpected --validate"),
            Err(e) => Err(e.iter().map(ToString::to_string).collect()),
        }
    }

    #[test]
    fn a_database_is_credentials_enough_and_decides_what_the_core_looks_up() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = coturn_sqlite(dir.path());
        let db = db.to_str().expect("path");
        let cases: [(&[&str], lastcall_turn_proto::DatabaseKeys); 3] = [
            (&["--userdb", db], lastcall_turn_proto::DatabaseKeys::Users),
            (
                &["--lt-cred-mech", "-b", db],
                lastcall_turn_proto::DatabaseKeys::Users,
            ),
            // use-auth-secret without a static-auth-secret: the database's turn_secret.
            (
                &["--use-auth-secret", "--db", db],
                lastcall_turn_proto::DatabaseKeys::RestSecrets,
            ),
        ];
        for (args, keys) in cases {
            let s = run(args).unwrap_or_else(|e| panic!("{args:?}: {e:?}"));
            let core = s.turn.core_config();
            let d = core.auth.database.expect("a database");
            assert_eq!(d.keys, keys, "{args:?}");
            assert_eq!(d.cache.ttl, DEFAULT_CACHE_TTL);
            assert!(core.auth.required());
            assert!(!core.auth.allow_anonymous);
        }
        let s = run(&[
            "--userdb",
            db,
            "--userdb-cache-ttl=2s",
            "--no-dynamic-ip-list",
        ])
        .expect("options");
        let u = s.turn.userdb.expect("userdb");
        assert_eq!(u.cache_ttl, Duration::from_secs(2));
        assert!(!u.dynamic_ip_list && u.dynamic_realms);
        let s = run(&["-e", "host=127.0.0.1 dbname=coturn user=turn password=pw"])
            .expect("psql-userdb");
        assert!(matches!(
            s.turn.userdb.map(|u| u.source),
            Some(Source::Postgres(_))
        ));
        let s = run(&["-N", "ip=127.0.0.1 dbname=2 password=pw"]).expect("redis-userdb");
        assert!(matches!(
            s.turn.userdb.map(|u| u.source),
            Some(Source::Redis(_))
        ));
    }

    /// What start-up says, as a table: every problem names the option and never a password.
    #[test]
    fn a_database_that_cannot_be_used_is_a_start_up_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("empty.db");
        Connection::open(&empty).expect("create an empty database");
        let empty = empty.to_str().expect("path").to_string();
        let db = coturn_sqlite(dir.path());
        let db = db.to_str().expect("path").to_string();
        let cases: Vec<(Vec<&str>, &str)> = vec![
            (
                vec!["--userdb", "/nonexistent/turndb"],
                "make it with turnadmin",
            ),
            (
                vec!["--userdb", &empty],
                "not coturn's user database (no table turnusers_lt",
            ),
            (vec!["--userdb", "/tmp"], "not a file"),
            (
                vec!["--userdb", &db, "-N", "ip=127.0.0.1"],
                "name more than one user database",
            ),
            (
                vec!["-e", "host=db dbname=coturn password=hunter2"],
                "psql-userdb=(connection string): no user=",
            ),
            (
                vec!["-e", "host=db user=u password=hunter2 sslmode=require"],
                "TLS to PostgreSQL is not implemented",
            ),
            (
                vec!["-N", "ip=r password=hunter2 tls=1"],
                "TLS to Redis is not implemented",
            ),
            (
                vec!["--userdb", &db, "--userdb-cache-ttl=0"],
                "from 1s to 1h",
            ),
            (
                vec!["--userdb", &db, "--userdb-cache-ttl=soon"],
                "not a duration",
            ),
            (
                vec!["--userdb", &db, "--no-auth"],
                "no-auth and credentials",
            ),
            (
                vec!["--mysql-userdb", "host=db"],
                "use userdb (SQLite), psql-userdb (PostgreSQL) or redis-userdb (Redis)",
            ),
            (
                vec!["--mongo-userdb", "mongodb://db"],
                "use userdb (SQLite), psql-userdb (PostgreSQL) or redis-userdb (Redis)",
            ),
        ];
        for (args, want) in cases {
            let errs = run(&args).map(|_| ()).expect_err(&format!("{args:?}"));
            let all = errs.join("\n");
            assert!(all.contains(want), "{args:?}: {all}");
            assert!(!all.contains("hunter2"), "a password printed: {all}");
        }
    }
}

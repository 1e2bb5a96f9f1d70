//! coturn's Redis user database (`redis-userdb`): coturn's connection string
//! (`ip=127.0.0.1 dbname=2 password=turn port=6379 connect_timeout=30`) and key layout
//! (`turndb/schema.userdb.redis`): `turn/realm/R/user/U/key` (the hex key),
//! `turn/realm/R/secret` (a set of REST secrets), `turn/realm/R/max-bps`, `.../user-quota`,
//! `.../total-quota`, the sets `turn/realm/R/allowed-peer-ip` and `.../denied-peer-ip`,
//! `turn/origin/O` (a realm).
//!
//! One multiplexed connection, opened again when it fails. Not implemented: TLS to Redis
//! (coturn 4.7's `tls=1` and its `tls-*` keys are refused at start-up).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, AsyncConnectionConfig, ConnectionAddr, RedisConnectionInfo};
use tokio::sync::Mutex;

use super::{DbError, RealmRows, Reread, QUERY_TIMEOUT, RECONNECT_AFTER};

/// Most `turn/origin/*` keys looked at by the reread (only to warn of other realms).
const ORIGIN_SCAN_LIMIT: usize = 10_000;

/// coturn's Redis connection string, checked.
#[derive(Clone, PartialEq, Eq)]
pub struct Spec {
    host: String,
    port: u16,
    db: i64,
    user: Option<String>,
    password: Option<String>,
    connect_timeout: Option<Duration>,
}

impl std::fmt::Debug for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Spec {
    /// Parses coturn's `key=value` list (space separated; coturn's synonyms: `host`, `ip`,
    /// `addr`, `ipaddr`, `hostaddr`; `dbname`, `db`, `database`; `user`, `uname`, `name`,
    /// `username`; `password`, `pwd`, `passwd`, `secret`; `port`, `p`; `connect_timeout`,
    /// `timeout`). Defaults: 127.0.0.1, 6379, database 0.
    pub fn parse(conninfo: &str) -> Result<Spec, String> {
        let mut spec = Spec {
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

    fn connection_info(&self) -> Result<redis::ConnectionInfo, DbError> {
        use redis::IntoConnectionInfo;
        let mut redis = RedisConnectionInfo::default().set_db(self.db);
        if let Some(u) = &self.user {
            redis = redis.set_username(u);
        }
        if let Some(p) = &self.password {
            redis = redis.set_password(p);
        }
        let info = ConnectionAddr::Tcp(self.host.clone(), self.port)
            .into_connection_info()
            .map_err(DbError::new)?;
        Ok(info.set_redis_settings(redis))
    }
}

#[derive(Default)]
struct State {
    conn: Option<MultiplexedConnection>,
    failed_at: Option<Instant>,
}

/// The Redis backend.
#[derive(Clone)]
pub(crate) struct Redis {
    spec: Spec,
    state: Arc<Mutex<State>>,
}

impl Redis {
    pub(crate) fn new(spec: Spec) -> Redis {
        Redis {
            spec,
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    async fn conn(&self) -> Result<MultiplexedConnection, DbError> {
        let mut s = self.state.lock().await;
        if let Some(c) = &s.conn {
            return Ok(c.clone());
        }
        if s.failed_at.is_some_and(|t| t.elapsed() < RECONNECT_AFTER) {
            return Err(DbError("could not connect a moment ago".into()));
        }
        let connect = self
            .spec
            .connect_timeout
            .map_or(QUERY_TIMEOUT, |t| t.min(QUERY_TIMEOUT));
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(QUERY_TIMEOUT));
        let r = match self
            .spec
            .connection_info()
            .and_then(|info| redis::Client::open(info).map_err(DbError::new))
        {
            Ok(client) => client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(DbError::new),
            Err(e) => Err(e),
        };
        match r {
            Ok(c) => {
                s.conn = Some(c.clone());
                s.failed_at = None;
                Ok(c)
            }
            Err(e) => {
                s.failed_at = Some(Instant::now());
                Err(e)
            }
        }
    }

    /// Runs `f` on the connection; a failure drops it (the next query connects again).
    async fn with<T, F, Fut>(&self, f: F) -> Result<T, DbError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let c = self.conn().await?;
        match f(c).await {
            Ok(v) => Ok(v),
            Err(e) => {
                if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                    self.state.lock().await.conn = None;
                }
                Err(DbError::new(e))
            }
        }
    }

    pub(crate) async fn user_key(
        &self,
        realm: &str,
        user: &str,
    ) -> Result<Option<String>, DbError> {
        let key = format!("turn/realm/{realm}/user/{user}/key");
        self.with(|mut c| async move { c.get::<_, Option<String>>(key).await })
            .await
    }

    pub(crate) async fn secrets(&self, realm: &str) -> Result<Vec<String>, DbError> {
        let key = format!("turn/realm/{realm}/secret");
        self.with(|mut c| async move { c.smembers::<_, Vec<String>>(key).await })
            .await
    }

    pub(crate) async fn realm(&self, realm: &str, what: Reread) -> Result<RealmRows, DbError> {
        let realm = realm.to_string();
        self.with(|mut c| async move {
            let mut rows = RealmRows::default();
            if what.realms {
                for opt in ["max-bps", "total-quota", "user-quota"] {
                    let v: Option<String> = c.get(format!("turn/realm/{realm}/{opt}")).await?;
                    if let Some(v) = v {
                        rows.options.push((opt.to_string(), v));
                    }
                }
                rows.options.sort();
                rows.other_origins = other_origins(&mut c, &realm).await?;
            }
            if what.ip_lists {
                for (kind, into) in [("allowed", &mut rows.allowed), ("denied", &mut rows.denied)] {
                    // coturn reads every realm's set and keeps this realm's (a realm-less
                    // set, `turn/realm//...`, counts for every realm).
                    let mut list: Vec<String> = c
                        .smembers(format!("turn/realm/{realm}/{kind}-peer-ip"))
                        .await?;
                    let global: Vec<String> =
                        c.smembers(format!("turn/realm//{kind}-peer-ip")).await?;
                    list.extend(global);
                    list.sort();
                    *into = list;
                }
            }
            Ok(rows)
        })
        .await
    }
}

/// `turn/origin/*` keys whose realm is another (SCAN, not KEYS: the server is not blocked).
async fn other_origins(
    c: &mut MultiplexedConnection,
    realm: &str,
) -> redis::RedisResult<Vec<(String, String)>> {
    let mut keys: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("turn/origin/*")
            .arg("COUNT")
            .arg(1000)
            .query_async(c)
            .await?;
        keys.extend(batch);
        cursor = next;
        if cursor == 0 || keys.len() >= ORIGIN_SCAN_LIMIT {
            break;
        }
    }
    keys.sort();
    let mut out = Vec::new();
    for k in keys {
        let v: Option<String> = c.get(&k).await?;
        if let Some(v) = v.filter(|v| v != realm) {
            out.push((k.trim_start_matches("turn/origin/").to_string(), v));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coturns_connection_strings() {
        let s = Spec::parse("ip=127.0.0.1 dbname=2 password=turn port=6380 connect_timeout=30")
            .expect("coturn's example");
        assert_eq!(
            (s.host.as_str(), s.port, s.db, s.password.as_deref()),
            ("127.0.0.1", 6380, 2, Some("turn"))
        );
        assert_eq!(s.connect_timeout, Some(Duration::from_secs(30)));
        assert!(!s.describe().contains("turn "), "{}", s.describe());
        let d = Spec::parse("").expect("defaults");
        assert_eq!((d.host.as_str(), d.port, d.db), ("127.0.0.1", 6379, 0));
        let syn = Spec::parse("host=redis db=3 username=u pwd=p p=1").expect("synonyms");
        assert_eq!(
            (syn.host.as_str(), syn.db, syn.user.as_deref(), syn.port),
            ("redis", 3, Some("u"), 1)
        );
        assert!(Spec::parse("tls=0").is_ok());
        for (bad, why) in [
            ("tls=1", "TLS to Redis is not implemented"),
            ("cacert=/x", "TLS to Redis is not implemented"),
            ("port=70000", "not a port"),
            ("dbname=x", "must be a number"),
            ("color=blue", "unknown key"),
            ("justaword", "is not key=value"),
        ] {
            let e = Spec::parse(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}

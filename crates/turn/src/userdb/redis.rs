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
use std::time::Instant;

use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, AsyncConnectionConfig};
use tokio::sync::Mutex;

use super::{DbError, RealmRows, Reread, QUERY_TIMEOUT, RECONNECT_AFTER};
use crate::config::userdb::RedisSpec as Spec;

/// Most `turn/origin/*` keys looked at by the reread (only to warn of other realms).
const ORIGIN_SCAN_LIMIT: usize = 10_000;

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
            .connect_timeout()
            .map_or(QUERY_TIMEOUT, |t| t.min(QUERY_TIMEOUT));
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(QUERY_TIMEOUT));
        let r = match self
            .spec
            .connection_info()
            .map_err(DbError::new)
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

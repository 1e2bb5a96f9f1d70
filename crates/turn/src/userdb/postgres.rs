//! coturn's PostgreSQL user database (`psql-userdb`, `sql-userdb`): a libpq connection
//! string, coturn's queries (`turndb/schema.sql`), one connection whose queries are
//! pipelined, opened again when it fails.
//!
//! What libpq would do and this does not: TLS (`sslmode=require`, `verify-ca`,
//! `verify-full` are refused at start-up; `prefer`, libpq's default, connects without it),
//! the `PG*` environment variables and `~/.pgpass`, and a default user (give `user=`).

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls, Statement};

use super::{DbError, RealmRows, Reread, QUERY_TIMEOUT, RECONNECT_AFTER};
use crate::config::userdb::PgSpec as Spec;

/// One open connection and its statements.
struct Conn {
    client: Client,
    user_key: Statement,
    secrets: Statement,
}

#[derive(Default)]
struct State {
    conn: Option<Arc<Conn>>,
    failed_at: Option<Instant>,
}

/// The PostgreSQL backend.
#[derive(Clone)]
pub(crate) struct Postgres {
    spec: Spec,
    state: Arc<Mutex<State>>,
}

impl Postgres {
    pub(crate) fn new(spec: Spec) -> Postgres {
        Postgres {
            spec,
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    /// The open connection, or a new one (not tried again within [`RECONNECT_AFTER`] of a
    /// failure).
    async fn conn(&self) -> Result<Arc<Conn>, DbError> {
        let mut s = self.state.lock().await;
        if let Some(c) = &s.conn {
            if !c.client.is_closed() {
                return Ok(Arc::clone(c));
            }
            s.conn = None;
        }
        if s.failed_at.is_some_and(|t| t.elapsed() < RECONNECT_AFTER) {
            return Err(DbError("could not connect a moment ago".into()));
        }
        match self.connect().await {
            Ok(c) => {
                let c = Arc::new(c);
                s.conn = Some(Arc::clone(&c));
                s.failed_at = None;
                Ok(c)
            }
            Err(e) => {
                s.failed_at = Some(Instant::now());
                Err(e)
            }
        }
    }

    async fn connect(&self) -> Result<Conn, DbError> {
        let config = self
            .spec
            .connect_config(QUERY_TIMEOUT)
            .map_err(DbError::new)?;
        let (client, connection) = tokio::time::timeout(QUERY_TIMEOUT, config.connect(NoTls))
            .await
            .map_err(|_| DbError("connect: no answer".into()))?
            .map_err(DbError::new)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("PostgreSQL connection ended: {e}");
            }
        });
        let user_key = client
            .prepare("select hmackey from turnusers_lt where name=$1 and realm=$2")
            .await
            .map_err(DbError::new)?;
        let secrets = client
            .prepare("select value from turn_secret where realm=$1")
            .await
            .map_err(DbError::new)?;
        Ok(Conn {
            client,
            user_key,
            secrets,
        })
    }

    /// Forgets the connection after a query failed (the next query connects again).
    async fn failed(&self, c: &Arc<Conn>) {
        let mut s = self.state.lock().await;
        if s.conn.as_ref().is_some_and(|cur| Arc::ptr_eq(cur, c)) {
            s.conn = None;
        }
    }

    pub(crate) async fn user_key(
        &self,
        realm: &str,
        user: &str,
    ) -> Result<Option<String>, DbError> {
        let c = self.conn().await?;
        match c.client.query_opt(&c.user_key, &[&user, &realm]).await {
            Ok(row) => row
                .map(|r| r.try_get::<_, Option<String>>(0))
                .transpose()
                .map(Option::flatten)
                .map_err(DbError::new),
            Err(e) => {
                self.failed(&c).await;
                Err(DbError::new(e))
            }
        }
    }

    pub(crate) async fn secrets(&self, realm: &str) -> Result<Vec<String>, DbError> {
        let c = self.conn().await?;
        match c.client.query(&c.secrets, &[&realm]).await {
            Ok(rows) => rows
                .iter()
                .filter_map(|r| r.try_get::<_, Option<String>>(0).transpose())
                .collect::<Result<_, _>>()
                .map_err(DbError::new),
            Err(e) => {
                self.failed(&c).await;
                Err(DbError::new(e))
            }
        }
    }

    pub(crate) async fn realm(&self, realm: &str, what: Reread) -> Result<RealmRows, DbError> {
        let c = self.conn().await?;
        let r = realm_rows(&c.client, realm, what).await;
        if r.is_err() {
            self.failed(&c).await;
        }
        r
    }
}

async fn pairs(client: &Client, sql: &str, realm: &str) -> Result<Vec<(String, String)>, DbError> {
    let rows = client.query(sql, &[&realm]).await.map_err(DbError::new)?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get::<_, Option<String>>(0)?.unwrap_or_default(),
                r.try_get::<_, Option<String>>(1)?.unwrap_or_default(),
            ))
        })
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(DbError::new)
}

async fn realm_rows(client: &Client, realm: &str, what: Reread) -> Result<RealmRows, DbError> {
    let mut rows = RealmRows::default();
    if what.realms {
        rows.options = pairs(
            client,
            "select opt,value from turn_realm_option where realm=$1 order by opt",
            realm,
        )
        .await?;
        rows.other_origins = pairs(
            client,
            "select origin,realm from turn_origin_to_realm where coalesce(realm,'')<>$1 order by origin",
            realm,
        )
        .await?;
    }
    if what.ip_lists {
        for (table, into) in [
            ("allowed_peer_ip", &mut rows.allowed),
            ("denied_peer_ip", &mut rows.denied),
        ] {
            let sql = format!(
                "select ip_range, '' from {table} where coalesce(realm,'')='' or realm=$1 order by ip_range"
            );
            *into = pairs(client, &sql, realm)
                .await?
                .into_iter()
                .map(|(r, _)| r)
                .collect();
        }
    }
    Ok(rows)
}

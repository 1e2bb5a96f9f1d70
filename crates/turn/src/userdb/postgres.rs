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

/// A checked connection string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    conninfo: String,
}

impl Spec {
    /// Checks `conninfo` (what start-up reports): it must parse, name a user and not ask for
    /// TLS.
    pub fn parse(conninfo: &str) -> Result<Spec, String> {
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
        Ok(Spec {
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

    fn config(&self) -> Result<tokio_postgres::Config, DbError> {
        let mut c: tokio_postgres::Config = self.conninfo.parse().map_err(DbError::new)?;
        // A connection attempt is a query's wait: bounded like one.
        let bound = c
            .get_connect_timeout()
            .copied()
            .map_or(QUERY_TIMEOUT, |t| t.min(QUERY_TIMEOUT));
        c.connect_timeout(bound);
        if c.get_application_name().is_none() {
            c.application_name("lastcall-turn");
        }
        Ok(c)
    }
}

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
        let config = self.spec.config()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_as_libpq_users_write_them() {
        let ok = [
            "host=127.0.0.1 dbname=coturn user=turn password=turn connect_timeout=30",
            "postgresql://turn:secret@db.example:5432/coturn",
            "host=/var/run/postgresql dbname=coturn user=turn",
            "host=db sslmode=prefer user=turn",
        ];
        for c in ok {
            assert!(Spec::parse(c).is_ok(), "{c}: {:?}", Spec::parse(c));
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
            let e = Spec::parse(c).expect_err(c);
            assert!(e.contains(why), "{c}: {e}");
        }
        let d = Spec::parse("host=127.0.0.1 dbname=coturn user=turn password=hunter2")
            .expect("parse")
            .describe();
        assert!(!d.contains("hunter2"), "{d}");
        assert!(d.contains("127.0.0.1") && d.contains("coturn"), "{d}");
    }

    #[test]
    fn a_connection_attempt_waits_no_longer_than_a_query() {
        let c = Spec::parse("host=db user=t connect_timeout=30")
            .expect("parse")
            .config()
            .expect("config");
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(2)));
    }
}

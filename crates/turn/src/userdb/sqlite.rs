//! coturn's SQLite user database (`userdb=PATH`; Debian's package makes
//! `/var/lib/turn/turndb`, `turnadmin -b PATH` writes it), read on one thread of its own
//! through one read-only connection, with coturn's queries.
//!
//! The file is opened read only (nothing here writes; a read-only root file system is fine)
//! and again after an error (a file replaced by a copy is picked up). A writer holding the
//! database (turnadmin, `sqlite3`) makes a query wait at most [`BUSY_TIMEOUT`], then fail:
//! the new authentications waiting for it get 500.

use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension};
use tokio::sync::oneshot;

use super::{DbError, RealmRows, Reread, RECONNECT_AFTER};

/// How long a query waits for a writer's lock.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_millis(1500);

/// A query for the SQLite thread.
enum Job {
    UserKey {
        realm: String,
        user: String,
        reply: oneshot::Sender<Result<Option<String>, DbError>>,
    },
    Secrets {
        realm: String,
        reply: oneshot::Sender<Result<Vec<String>, DbError>>,
    },
    Realm {
        realm: String,
        what: Reread,
        reply: oneshot::Sender<Result<RealmRows, DbError>>,
    },
}

/// The handle to the SQLite thread.
#[derive(Clone)]
pub(crate) struct Sqlite {
    jobs: std_mpsc::Sender<Job>,
}

impl Sqlite {
    /// Starts the thread that reads `path` (it opens the file at its first query).
    pub(crate) fn open(path: PathBuf) -> Sqlite {
        let (jobs, rx) = std_mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("turn-userdb-sqlite".into())
            .spawn(move || serve(&path, &rx));
        if let Err(e) = spawned {
            tracing::error!("cannot start the SQLite thread: {e}");
        }
        Sqlite { jobs }
    }

    async fn ask<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, DbError>>) -> Job,
    ) -> Result<T, DbError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(job(reply))
            .map_err(|_| DbError("the SQLite thread has ended".into()))?;
        answer
            .await
            .map_err(|_| DbError("the SQLite thread dropped the query".into()))?
    }

    pub(crate) async fn user_key(
        &self,
        realm: &str,
        user: &str,
    ) -> Result<Option<String>, DbError> {
        let (realm, user) = (realm.to_string(), user.to_string());
        self.ask(|reply| Job::UserKey { realm, user, reply }).await
    }

    pub(crate) async fn secrets(&self, realm: &str) -> Result<Vec<String>, DbError> {
        let realm = realm.to_string();
        self.ask(|reply| Job::Secrets { realm, reply }).await
    }

    pub(crate) async fn realm(&self, realm: &str, what: Reread) -> Result<RealmRows, DbError> {
        let realm = realm.to_string();
        self.ask(|reply| Job::Realm { realm, what, reply }).await
    }
}

/// The thread: one query at a time, the connection opened (again) when needed.
fn serve(path: &Path, jobs: &std_mpsc::Receiver<Job>) {
    let mut conn: Option<Connection> = None;
    let mut failed_at: Option<Instant> = None;
    while let Ok(job) = jobs.recv() {
        if conn.is_none() {
            if failed_at.is_some_and(|t| t.elapsed() < RECONNECT_AFTER) {
                answer_err(job, DbError("could not be opened a moment ago".into()));
                continue;
            }
            match open(path) {
                Ok(c) => {
                    conn = Some(c);
                    failed_at = None;
                }
                Err(e) => {
                    failed_at = Some(Instant::now());
                    answer_err(job, e);
                    continue;
                }
            }
        }
        let Some(c) = conn.as_ref() else {
            continue;
        };
        if !run(c, job) {
            // An error: open the file again next time (it may have been replaced).
            conn = None;
        }
    }
}

fn open(path: &Path) -> Result<Connection, DbError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let c = Connection::open_with_flags(path, flags)
        .map_err(|e| DbError(format!("{}: {e}", path.display())))?;
    c.busy_timeout(BUSY_TIMEOUT).map_err(DbError::new)?;
    Ok(c)
}

fn answer_err(job: Job, e: DbError) {
    match job {
        Job::UserKey { reply, .. } => drop(reply.send(Err(e))),
        Job::Secrets { reply, .. } => drop(reply.send(Err(e))),
        Job::Realm { reply, .. } => drop(reply.send(Err(e))),
    }
}

/// Runs one job; `false` if the database failed.
fn run(c: &Connection, job: Job) -> bool {
    match job {
        Job::UserKey { realm, user, reply } => {
            let r = user_key(c, &realm, &user);
            let ok = r.is_ok();
            let _ = reply.send(r);
            ok
        }
        Job::Secrets { realm, reply } => {
            let r = strings(c, "select value from turn_secret where realm=?1", &realm);
            let ok = r.is_ok();
            let _ = reply.send(r);
            ok
        }
        Job::Realm { realm, what, reply } => {
            let r = realm_rows(c, &realm, what);
            let ok = r.is_ok();
            let _ = reply.send(r);
            ok
        }
    }
}

fn user_key(c: &Connection, realm: &str, user: &str) -> Result<Option<String>, DbError> {
    let mut st = c
        .prepare_cached("select hmackey from turnusers_lt where name=?1 and realm=?2")
        .map_err(DbError::new)?;
    st.query_row([user, realm], |row| row.get::<_, Option<String>>(0))
        .optional()
        .map(Option::flatten)
        .map_err(DbError::new)
}

/// The non-null first column of `sql` with `?1` = `realm`.
fn strings(c: &Connection, sql: &str, realm: &str) -> Result<Vec<String>, DbError> {
    let mut st = c.prepare_cached(sql).map_err(DbError::new)?;
    let rows = st
        .query_map([realm], |row| row.get::<_, Option<String>>(0))
        .map_err(DbError::new)?;
    let mut out = Vec::new();
    for r in rows {
        if let Some(v) = r.map_err(DbError::new)? {
            out.push(v);
        }
    }
    Ok(out)
}

/// Two text columns of `sql` with `?1` = `realm`.
fn pairs(c: &Connection, sql: &str, realm: &str) -> Result<Vec<(String, String)>, DbError> {
    let mut st = c.prepare_cached(sql).map_err(DbError::new)?;
    let rows = st
        .query_map([realm], |row| {
            Ok((
                row.get::<_, Option<String>>(0)?.unwrap_or_default(),
                row.get::<_, Option<String>>(1)?.unwrap_or_default(),
            ))
        })
        .map_err(DbError::new)?;
    rows.collect::<Result<_, _>>().map_err(DbError::new)
}

fn realm_rows(c: &Connection, realm: &str, what: Reread) -> Result<RealmRows, DbError> {
    let mut rows = RealmRows::default();
    if what.realms {
        rows.options = pairs(
            c,
            "select opt,value from turn_realm_option where realm=?1 order by opt",
            realm,
        )?;
        rows.other_origins = pairs(
            c,
            "select origin,realm from turn_origin_to_realm where coalesce(realm,'')<>?1 order by origin",
            realm,
        )?;
    }
    if what.ip_lists {
        for (table, into) in [
            ("allowed_peer_ip", &mut rows.allowed),
            ("denied_peer_ip", &mut rows.denied),
        ] {
            let sql = format!(
                "select ip_range from {table} where coalesce(realm,'')='' or realm=?1 order by ip_range"
            );
            *into = strings(c, &sql, realm)?;
        }
    }
    Ok(rows)
}

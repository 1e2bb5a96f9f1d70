//! lastcall-turn reading coturn's user databases while they change and while they fail,
//! against the real thing: an SQLite file, a PostgreSQL server and a redis-server (Debian's,
//! started here on loopback, `userdb_servers`), every user, secret and realm option written
//! by coturn's own `turnadmin` (`LASTCALL_TURNADMIN` names another, e.g. coturn 4.18's:
//! `scripts/peer-run sid /usr/bin/turnadmin`), and coturn's `turnutils_uclient` as the first
//! client.
//!
//! Each database gets the same story, with `userdb-cache-ttl=1s`:
//!
//! 1. a user turnadmin added before the start relays with uclient; a live call starts;
//! 2. a user added while the server runs allocates at once; removed, it is refused once the
//!    TTL has passed;
//! 3. the realm's `user-quota` set with turnadmin and a denied peer range added are read
//!    within the 5-second reread: a second allocation of the user gets 486, the peer 403;
//! 4. the database fails (SQLite: a writer's lock; PostgreSQL: the server killed; Redis: the
//!    server frozen with SIGSTOP): a new user's Allocate gets 500 within the bounded wait and
//!    the log says why, once; the live call keeps relaying and refreshing;
//! 5. the database comes back: the log says so and the new user allocates;
//! 6. the live call lost nothing.
//!
//! And the TURN REST API with its secrets kept in the database: one secret rotated with
//! turnadmin (`-s` the new, `-X` the old) while the server runs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use lastcall_testkit::turn::{TurnClient, TurnError};

use super::common::{free_udp_tcp_port, Peer, Turn, Uclient, WAIT};
use super::userdb_servers::{turnadmin, Postgres, Redis, SqliteLock};

const REALM: &str = "example.org";
/// How long uclient may take for a short call.
const UCLIENT_LIMIT: Duration = Duration::from_secs(30);
/// The server's own bounds (crates/turn/src/userdb): a query waits at most 2 s, the core
/// gives a lookup 3 s; a failed answer is asked again after 1 s, a failed connection tried
/// again after 1 s. A test waits these out where it must, never longer.
const LOOKUP_BOUND: Duration = Duration::from_secs(3);
const RECHECK: Duration = Duration::from_millis(1100);
/// `userdb-cache-ttl` of these tests.
const TTL: Duration = Duration::from_secs(1);

/// One of the three databases, and how turnadmin and the test's own tools reach it.
enum Db {
    Sqlite {
        dir: tempfile::TempDir,
        lock: Option<SqliteLock>,
    },
    Postgres(Postgres),
    Redis(Redis),
}

impl Db {
    /// An SQLite file that turnadmin makes (it creates coturn's tables on first use).
    fn sqlite() -> Db {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::Sqlite { dir, lock: None };
        db.admin(&["-l"]);
        db
    }

    fn path(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("turndb")
    }

    /// turnadmin's option naming this database.
    fn admin_args(&self) -> [String; 2] {
        match self {
            Db::Sqlite { dir, .. } => ["-b".into(), Db::path(dir).display().to_string()],
            Db::Postgres(p) => ["-e".into(), p.conninfo()],
            Db::Redis(r) => ["-N".into(), r.conninfo()],
        }
    }

    /// lastcall-turn's option naming it, as coturn's turnserver.conf would.
    fn server_arg(&self) -> String {
        match self {
            Db::Sqlite { dir, .. } => format!("--userdb={}", Db::path(dir).display()),
            Db::Postgres(p) => format!("--psql-userdb={}", p.conninfo()),
            Db::Redis(r) => format!("--redis-userdb={}", r.conninfo()),
        }
    }

    fn admin(&self, args: &[&str]) -> String {
        let db = self.admin_args();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(db.iter().map(String::as_str));
        turnadmin(&all)
    }

    fn add_user(&self, user: &str, password: &str) {
        self.admin(&["-a", "-u", user, "-r", REALM, "-p", password]);
    }

    fn delete_user(&self, user: &str) {
        self.admin(&["-d", "-u", user, "-r", REALM]);
    }

    /// `turnadmin -g --user-quota N` (0 removes the option, as turnadmin documents).
    fn user_quota(&self, n: u32) {
        self.admin(&["-g", "-r", REALM, "--user-quota", &n.to_string()]);
    }

    /// A denied peer range of the realm (turnadmin has no command for it: SQL or redis-cli).
    fn deny_peer(&self, range: &str) {
        let sql =
            format!("insert into denied_peer_ip (realm, ip_range) values ('{REALM}', '{range}')");
        match self {
            Db::Sqlite { dir, .. } => {
                let ok = std::process::Command::new("/usr/bin/sqlite3")
                    .arg(Db::path(dir))
                    .arg(&sql)
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "sqlite3 {sql}");
            }
            Db::Postgres(p) => p.psql("coturn", &sql),
            Db::Redis(r) => {
                r.cli(&["sadd", &format!("turn/realm/{REALM}/denied-peer-ip"), range]);
            }
        }
    }

    /// The database stops answering.
    fn fail(&mut self) {
        match self {
            Db::Sqlite { dir, lock } => *lock = Some(SqliteLock::take(&Db::path(dir))),
            Db::Postgres(p) => p.kill(),
            Db::Redis(r) => r.freeze(),
        }
    }

    /// It answers again.
    fn recover(&mut self) {
        match self {
            Db::Sqlite { lock, .. } => *lock = None,
            Db::Postgres(p) => p.run(),
            Db::Redis(r) => r.thaw(),
        }
    }
}

/// lastcall-turn on free ports with `extra` (a database and its mode).
fn start(extra: &[String]) -> Turn {
    let port = free_udp_tcp_port();
    let admin = format!("127.0.0.1:{}", lastcall_testkit::free_port());
    let mut args: Vec<String> = [
        "-n",
        "--listening-ip=127.0.0.1",
        &format!("--listening-port={port}"),
        "--relay-ip=127.0.0.1",
        &format!("--realm={REALM}"),
        "--allow-loopback-peers",
        &format!("--admin-addr={admin}"),
        "--userdb-cache-ttl=1s",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    args.extend(extra.iter().cloned());
    Turn::spawn(args, port, 0, admin)
}

fn server(turn: &Turn) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], turn.port))
}

/// A short call of uclient's with long-term credentials (its default mode: an RTP and an
/// RTCP allocation, so twice the messages).
fn uclient_long_term(turn: &Turn, peer: &Peer, user: &str, password: &str) {
    Uclient::new(turn.port)
        .peer(peer.port)
        .credentials(&["-u", user, "-w", password])
        .messages(20)
        .gap_ms(5)
        .run(UCLIENT_LIMIT)
        .assert_all_echoed(40);
}

fn code(r: Result<SocketAddr, TurnError>) -> Option<u16> {
    match r {
        Ok(_) => None,
        Err(TurnError::Code { code, .. }) => Some(code),
        Err(e) => panic!("no answer: {e:?}"),
    }
}

/// The story of the module docs for long-term users in `db`.
fn users_change_and_the_database_fails(mut db: Db) {
    db.add_user("carol", "carolpass");
    let peer = Peer::start();
    let turn = start(&[db.server_arg(), "--lt-cred-mech".into()]);
    // 1. coturn's client, with the user turnadmin wrote; then our live call.
    uclient_long_term(&turn, &peer, "carol", "carolpass");
    let peer_addr = SocketAddr::from(([127, 0, 0, 1], peer.port));
    let mut call = TurnClient::long_term(server(&turn), "carol", "carolpass");
    call.call(peer_addr, 0x4000).expect("carol's call");
    call.stream(Duration::from_millis(20));
    call.wait_received(10, WAIT);

    // 2. Added while it runs: found at once. Removed: refused once the TTL has passed.
    db.add_user("dave", "davepass");
    let mut dave = TurnClient::long_term(server(&turn), "dave", "davepass");
    assert_eq!(code(dave.allocate(600)), None, "dave, just added");
    db.delete_user("dave");
    std::thread::sleep(TTL + Duration::from_millis(100));
    let mut dave2 = TurnClient::long_term(server(&turn), "dave", "davepass");
    assert_eq!(code(dave2.allocate(600)), Some(401), "dave, removed");
    // The allocation dave made keeps its key (coturn's session key): it still refreshes.
    dave.refresh(600).expect("dave's existing allocation");

    // 3. A realm option and a peer range, read within the 5-second reread.
    let mark = turn.pod.log_len();
    db.user_quota(1);
    db.deny_peer("127.0.0.2");
    turn.pod
        .wait_for_log_after(mark, "user_quota=1", Duration::from_secs(15));
    let line = turn
        .pod
        .wait_for_log_after(mark, "denied_peer_ip=1", Duration::from_secs(15));
    assert!(line.contains("realm options and peer lists read"), "{line}");
    let mut second = TurnClient::long_term(server(&turn), "carol", "carolpass");
    assert_eq!(
        code(second.allocate(600)),
        Some(486),
        "carol's second allocation"
    );
    let denied = SocketAddr::from(([127, 0, 0, 2], 9));
    match call.create_permission(denied) {
        Err(TurnError::Code { code: 403, .. }) => {}
        other => panic!("a peer the database denies: {other:?}"),
    }

    // 4. The database fails: a new user waits the bounded time and gets 500; the call goes on.
    db.add_user("erin", "erinpass");
    let mark = turn.pod.log_len();
    db.fail();
    let asked = Instant::now();
    let mut erin = TurnClient::long_term(server(&turn), "erin", "erinpass");
    assert_eq!(code(erin.allocate(600)), Some(500), "erin, database down");
    let waited = asked.elapsed();
    assert!(
        waited < LOOKUP_BOUND + Duration::from_secs(2),
        "the 500 took {waited:?}"
    );
    let line = turn
        .pod
        .wait_for_log_after(mark, "user database unavailable", WAIT);
    assert!(line.contains("new authentications get 500"), "{line}");
    call.refresh(600).expect("refresh during the outage");
    call.channel_bind(0x4000, peer_addr)
        .expect("channel refresh during the outage");
    let during = call.received();
    call.wait_received(during + 25, WAIT);

    // 5. It comes back: after the recheck and reconnect bounds, erin allocates.
    db.recover();
    std::thread::sleep(RECHECK);
    let mut erin2 = TurnClient::long_term(server(&turn), "erin", "erinpass");
    assert_eq!(code(erin2.allocate(600)), None, "erin, database back");
    turn.pod
        .wait_for_log_after(mark, "user database answers again", WAIT);
    let unavailable_lines = turn.pod.logs()[mark..]
        .iter()
        .filter(|l| l.contains("user database unavailable"))
        .count();
    assert!(
        (1..=3).contains(&unavailable_lines),
        "rate-limited: {unavailable_lines} lines"
    );

    // 6. Nothing of the call was lost.
    call.stop_stream(Duration::from_secs(2));
    let split = call.split(Instant::now());
    assert!(split.sent() > 100, "{split:?}");
    assert_eq!(split.lost(), 0, "{split:?}");
    assert!(
        turn.metric("lastcall_turn_userdb_lookups_total")
            .unwrap_or(0.0)
            >= 4.0
    );
    assert!(
        turn.metric("lastcall_turn_userdb_unavailable_total")
            .unwrap_or(0.0)
            >= 1.0
    );
}

/// The TURN REST API with its secrets in `db` only: one rotated while the server runs.
fn a_rest_secret_rotates_in_the_database(db: &Db) {
    db.admin(&["-s", "old-secret", "-r", REALM]);
    let peer = Peer::start();
    let turn = start(&[db.server_arg(), "--use-auth-secret".into()]);
    let rest = |secret: &str| {
        Uclient::new(turn.port)
            .peer(peer.port)
            .credentials(&["-W", secret, "-u", "restuser"])
            .gap_ms(5)
            .run(UCLIENT_LIMIT)
    };
    rest("old-secret").assert_all_echoed(20);
    db.admin(&["-s", "new-secret", "-r", REALM]);
    db.admin(&["-X", "old-secret", "-r", REALM]);
    // The kept secrets are asked again once they fail to verify a credential and are a
    // second old, and dropped at the TTL.
    std::thread::sleep(RECHECK.max(TTL));
    rest("new-secret").assert_all_echoed(20);
    let old = rest("old-secret");
    assert_ne!(
        old.status,
        Some(0),
        "the rotated-out secret:\n{}",
        old.output
    );
}

#[test]
fn sqlite_written_by_turnadmin() {
    let db = Db::sqlite();
    a_rest_secret_rotates_in_the_database(&db);
    users_change_and_the_database_fails(db);
}

#[test]
fn postgresql_from_debian() {
    let db = Db::Postgres(Postgres::start());
    a_rest_secret_rotates_in_the_database(&db);
    users_change_and_the_database_fails(db);
}

#[test]
fn redis_from_debian() {
    let db = Db::Redis(Redis::start());
    a_rest_secret_rotates_in_the_database(&db);
    users_change_and_the_database_fails(db);
}

//! The databases the user-database tests start, from Debian's packages, on loopback and
//! ephemeral ports, each in a directory of its own: PostgreSQL (`/usr/lib/postgresql/*/bin`,
//! not whatever `initdb` is on the PATH, so a fresh CI machine behaves the same) and
//! redis-server; and coturn's `turnadmin` ([`peers::coturn`]), which writes to all three as it
//! does for coturn's users.
//!
//! PostgreSQL refuses to run as root: as root (CI) the server runs as the `postgres` system
//! user that Debian's package makes, on a directory given to it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lastcall_testkit::{self as testkit, peers};

/// The password of the databases' users.
pub(crate) const DB_PASSWORD: &str = "turn-db-pw";
/// The Redis database number coturn's example uses.
const REDIS_DB: &str = "2";

/// Runs coturn's `turnadmin` with `args`; panics with its output unless it exits 0.
pub(crate) fn turnadmin(args: &[&str]) -> String {
    let out = peers::coturn("turnadmin")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run turnadmin");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "turnadmin {args:?}: {text}");
    text
}

/// Sends `sig` to `child` (`kill -SIG`).
fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{sig} {}", child.id());
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
fn listening(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

fn wait_listening(port: u16, what: &str, log: &Path) {
    let deadline = Instant::now() + testkit::WAIT;
    while !listening(port) {
        assert!(
            Instant::now() < deadline,
            "{what} never listened on {port}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The uid and gid of system user `name` (`/etc/passwd`).
fn system_user(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&name))
            .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
    })
}

/// A PostgreSQL server of Debian's, with coturn's schema (Debian's coturn package ships it)
/// in database `coturn`, owned by user `turn` (password [`DB_PASSWORD`], SCRAM).
pub(crate) struct Postgres {
    child: Option<Child>,
    bin: PathBuf,
    dir: tempfile::TempDir,
    /// Its TCP port on 127.0.0.1.
    pub port: u16,
    /// The user to run it as, when this process is root.
    user: Option<(u32, u32)>,
}

impl Postgres {
    /// Makes a cluster and starts the server; waits until it answers.
    pub(crate) fn start() -> Postgres {
        let bin = debian_postgres_bin();
        let dir = tempfile::tempdir().expect("tempdir");
        let user = (lastcall_testkit::procfs::euid() == 0).then(|| {
            system_user("postgres").expect(
                "postgres refuses to run as root and there is no postgres user: install \
                 Debian's postgresql package (scripts/setup.sh)",
            )
        });
        let pwfile = dir.path().join("pw");
        std::fs::write(&pwfile, DB_PASSWORD).expect("password file");
        if let Some((uid, gid)) = user {
            for p in [dir.path(), pwfile.as_path()] {
                std::os::unix::fs::chown(p, Some(uid), Some(gid)).expect("chown");
            }
        }
        let mut pg = Postgres {
            child: None,
            bin,
            dir,
            port: testkit::free_port(),
            user,
        };
        let data = pg.data();
        let out = pg
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "turn",
                "--auth=scram-sha-256",
                "--no-sync",
                "-E",
                "UTF8",
            ])
            .arg(format!("--pwfile={}", pwfile.display()))
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pg.run();
        pg.psql("postgres", "create database coturn");
        pg.psql_file("coturn", Path::new("/usr/share/coturn/schema.sql"));
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    /// Starts (again) the server on the same directory and port.
    pub(crate) fn run(&mut self) {
        let log = self.dir.path().join("postgres.log");
        let file = std::fs::File::create(&log).expect("log file");
        if let Some((uid, gid)) = self.user {
            std::os::unix::fs::chown(&log, Some(uid), Some(gid)).expect("chown log");
        }
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir.path())
            // fsync=off is safe here (a killed server keeps what the kernel has);
            // synchronous_commit stays on: a commit must survive the test's SIGKILL.
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start postgres");
        self.child = Some(child);
        wait_listening(self.port, "postgres", &log);
    }

    /// Stops the server at once (SIGKILL): clients see their connections reset.
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // The postmaster's children go with it; the port is free once they have gone.
        let deadline = Instant::now() + testkit::WAIT;
        while listening(self.port) {
            assert!(Instant::now() < deadline, "postgres still listening");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The libpq connection string of database `coturn`, as coturn's users write it.
    pub(crate) fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} dbname=coturn user=turn password={DB_PASSWORD} connect_timeout=30",
            self.port
        )
    }

    fn psql_command(&self, db: &str) -> Command {
        let mut cmd = Command::new(self.bin.join("psql"));
        cmd.arg(format!(
            "host=127.0.0.1 port={} dbname={db} user=turn password={DB_PASSWORD}",
            self.port
        ))
        .args(["-v", "ON_ERROR_STOP=1", "-q"])
        .stdin(Stdio::null());
        cmd
    }

    /// Runs `sql` in database `db` with psql.
    pub(crate) fn psql(&self, db: &str, sql: &str) {
        let out = self
            .psql_command(db)
            .args(["-c", sql])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn psql_file(&self, db: &str, file: &Path) {
        let out = self
            .psql_command(db)
            .arg("-f")
            .arg(file)
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql -f {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The newest `/usr/lib/postgresql/N/bin` with an `initdb` (Debian's layout).
fn debian_postgres_bin() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b).expect(
        "no /usr/lib/postgresql/*/bin/initdb: install Debian's postgresql (scripts/setup.sh)",
    )
}

/// A redis-server of Debian's with a password, nothing saved to disk.
pub(crate) struct Redis {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Its TCP port on 127.0.0.1.
    pub port: u16,
}

impl Redis {
    /// Starts it; waits until it listens.
    pub(crate) fn start() -> Redis {
        let mut r = Redis {
            child: None,
            dir: tempfile::tempdir().expect("tempdir"),
            port: testkit::free_port(),
        };
        r.run();
        r
    }

    fn run(&mut self) {
        let log = self.dir.path().join("redis.log");
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new("/usr/bin/redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--requirepass",
                DB_PASSWORD,
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start redis-server (Debian's redis-server package, scripts/setup.sh)");
        self.child = Some(child);
        wait_listening(self.port, "redis-server", &log);
    }

    /// Freezes the server (SIGSTOP): connections stay open and nothing answers, the worst a
    /// database can do to its clients.
    pub(crate) fn freeze(&self) {
        if let Some(c) = &self.child {
            signal(c, "STOP");
        }
    }

    /// Lets a frozen server go on (SIGCONT).
    pub(crate) fn thaw(&self) {
        if let Some(c) = &self.child {
            signal(c, "CONT");
        }
    }

    /// coturn's connection string for it (coturn's example's database number).
    pub(crate) fn conninfo(&self) -> String {
        format!(
            "ip=127.0.0.1 dbname={REDIS_DB} password={DB_PASSWORD} port={} connect_timeout=30",
            self.port
        )
    }

    /// Runs a redis-cli command on coturn's database.
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("/usr/bin/redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-a", DB_PASSWORD, "--no-auth-warning", "-n", REDIS_DB])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli");
        assert!(out.status.success(), "redis-cli {args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(&c, "CONT");
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An SQLite write lock held by Debian's `sqlite3` (BEGIN EXCLUSIVE), until dropped: every
/// reader waits, as behind a long `turnadmin` or a backup.
pub(crate) struct SqliteLock {
    child: Child,
    /// sqlite3's input: the transaction lasts while it is open.
    _input: std::process::ChildStdin,
}

impl SqliteLock {
    /// Takes the lock on `db`; returns once it is held.
    pub(crate) fn take(db: &Path) -> SqliteLock {
        use std::io::{BufRead, Write};
        let mut child = Command::new("/usr/bin/sqlite3")
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run sqlite3 (Debian's sqlite3 package, scripts/setup.sh)");
        let mut input = child.stdin.take().expect("stdin");
        writeln!(input, "BEGIN EXCLUSIVE;\nselect 'locked';").expect("write");
        input.flush().expect("flush");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read");
        assert_eq!(line.trim(), "locked", "sqlite3 did not take the lock");
        SqliteLock {
            child,
            _input: input,
        }
    }
}

impl Drop for SqliteLock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

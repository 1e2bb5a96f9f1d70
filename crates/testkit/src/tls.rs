//! Self-signed certificates for the TLS listeners under test, made with the openssl CLI.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A self-signed P-256 certificate and key (PEM, `NAME-cert.pem` and `NAME-key.pem` in
/// `dir`) for CN `cn`, valid two days. For clients that do not verify it (coturn's uclient
/// with `-S`, browsers told to ignore certificate errors) or check only its subject.
pub fn self_signed(dir: &Path, name: &str, cn: &str) -> (PathBuf, PathBuf) {
    make(dir, name, cn, &[])
}

/// The same for a server at `ip`, which a verifying client (rustls) accepts once it trusts
/// the certificate: CN and subjectAltName `ip`, and not a CA (basicConstraints CA:FALSE).
pub fn self_signed_for_ip(dir: &Path, name: &str, ip: &str) -> (PathBuf, PathBuf) {
    let san = format!("subjectAltName=IP:{ip}");
    make(
        dir,
        name,
        ip,
        &[
            "-addext",
            &san,
            "-addext",
            "basicConstraints=critical,CA:FALSE",
        ],
    )
}

fn make(dir: &Path, name: &str, cn: &str, extra: &[&str]) -> (PathBuf, PathBuf) {
    let cert = dir.join(format!("{name}-cert.pem"));
    let key = dir.join(format!("{name}-key.pem"));
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj", &format!("/CN={cn}")])
        .args(extra)
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run openssl");
    assert!(status.success(), "openssl req failed");
    (cert, key)
}

/// A directory laid out and updated as the kubelet lays out and updates a Secret volume
/// (its `AtomicWriter`): the files are in a timestamped directory `..<time>`, `..data` is a
/// symlink to it, and each visible name is a symlink `NAME -> ..data/NAME`. An update writes
/// a new timestamped directory, points a new symlink `..data_tmp` at it, renames that over
/// `..data` (the one atomic step), adds visible symlinks for new names and removes the old
/// directory. The visible files are never written: only `..data` changes.
#[derive(Debug)]
pub struct SecretVolume {
    dir: PathBuf,
    updates: u32,
}

impl SecretVolume {
    /// The volume in `dir` (created if missing) holding `files` (name, content).
    pub fn new(dir: &Path, files: &[(&str, &[u8])]) -> SecretVolume {
        std::fs::create_dir_all(dir).expect("create the volume directory");
        let mut v = SecretVolume {
            dir: dir.to_path_buf(),
            updates: 0,
        };
        v.update(files);
        v
    }

    /// The visible path of `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Replaces the volume's content with `files`, in the kubelet's steps.
    pub fn update(&mut self, files: &[(&str, &[u8])]) {
        use std::os::unix::fs::symlink;
        self.updates += 1;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos();
        let name = format!("..{stamp}_{}", self.updates);
        let ts = self.dir.join(&name);
        std::fs::create_dir(&ts).expect("create the timestamped directory");
        for (file, content) in files {
            std::fs::write(ts.join(file), content).expect("write a file of the volume");
        }
        let data = self.dir.join("..data");
        let old = std::fs::read_link(&data).ok();
        let tmp = self.dir.join("..data_tmp");
        symlink(&name, &tmp).expect("symlink ..data_tmp");
        std::fs::rename(&tmp, &data).expect("rename ..data_tmp over ..data");
        for (file, _) in files {
            let visible = self.dir.join(file);
            if std::fs::symlink_metadata(&visible).is_err() {
                symlink(Path::new("..data").join(file), &visible).expect("visible symlink");
            }
        }
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.join(old)).expect("remove the old directory");
        }
    }
}

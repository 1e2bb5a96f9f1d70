"""docker/Dockerfile's CRS, built for real with the binaries this checkout built
(`BINARIES=prebuilt`: no cargo in the image, so a build takes seconds): the same path a
release build takes, with a stand-in release, since no CRS release can be fetched here and
none is vendored.

The stand-in is made here (`standin_tree`): the layout of a CRS 4 release archive
(`coreruleset-X/crs-setup.conf.example`, `rules/REQUEST-901-INITIALIZATION.conf` with its
`SecComponentSignature`, a few rules of our own that score and block), signed with an
OpenPGP key generated for the test, and served with its signature and the key by an HTTP
server on loopback. The build is given those URLs and the test key's fingerprint in place of
the CRS project's (`CRS_URL`, `CRS_SIGNATURE_URL`, `CRS_KEY_URL`, `CRS_KEY_FINGERPRINT`):

- the release path: the build checks the signature and the release's version line, the
  agent names the tree and its release (`show-rules`, the image's `org.lastcall.crs.version`
  label), compiles it (`-validate`: the rule count, printed) on the image's libmodsecurity
  (its version, printed);
- it fails, saying why, when the archive is not the one signed (a rule added that turns the
  engine off), when the
  key served is not the pinned one, and when the release's version line differs from
  CRS_VERSION;
- the offline path (`CRS_ARCHIVE` in docker/crs/ with `CRS_SHA256`): the same tree, checked
  against the checksum given; a wrong or missing checksum fails the build;
- `CRS_VERSION=debian` (the tests' images, scripts/images.sh --crs debian): Debian's CRS 3.3
  laid out the same way, loaded;
- the archive in the build context changes nothing else: the build without CRS_ARCHIVE is
  answered from the cache entirely, and the source stage copies no part of docker/."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import os
import re
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from enginelib import BASE_IMAGE, DOCKER, REPO, SPOA_IMAGE, Engine, measured
from imagelib import stages, target_dir

CRS_DIR = REPO / "docker" / "crs"
PREBUILT = REPO / "docker" / "prebuilt"
IN_IMAGE = "/usr/share/lastcall-spoa/crs"
STANDIN = "4.0.0-standin"

# The stand-in's rules: our own text, in the shape CRS 4 gives them (initialization that
# defaults the paranoia level and threshold, a detection rule that adds to the inbound
# score, the blocking evaluation). Rule 901181 has the form CRS 4.25.1 introduced (a `ctl:`
# removing an XPath target, `XML://@*`), which libmodsecurity 3.0.16 compiles and 3.0.14
# refuses ("Expecting an action"): the image's default engine must load it.
SETUP = """\
# A stand-in for a CRS 4 release's crs-setup.conf.example (tests/images/test_crs_release.py).
SecDefaultAction "phase:1,log,auditlog,pass"
SecDefaultAction "phase:2,log,auditlog,pass"
SecAction "id:900990,phase:1,pass,t:none,nolog,setvar:tx.crs_setup_version=400"
"""
RULES = {
    "REQUEST-901-INITIALIZATION.conf": f"""\
SecComponentSignature "OWASP_CRS/{STANDIN}"
SecRule &TX:blocking_paranoia_level "@eq 0" "id:901120,phase:1,pass,t:none,nolog,setvar:tx.blocking_paranoia_level=1"
SecRule &TX:inbound_anomaly_score_threshold "@eq 0" "id:901100,phase:1,pass,t:none,nolog,setvar:tx.inbound_anomaly_score_threshold=5"
SecAction "id:901200,phase:1,pass,t:none,nolog,setvar:tx.blocking_inbound_anomaly_score=0"
SecAction "id:901181,phase:2,pass,t:none,nolog,ctl:ruleRemoveTargetByTag=attack-sqli;XML://@*"
""",
    "REQUEST-942-APPLICATION-ATTACK-SQLI.conf": """\
SecRule ARGS "@detectSQLi" "id:942100,phase:2,block,t:none,t:urlDecodeUni,log,msg:'stand-in: SQL injection (libinjection)',severity:'CRITICAL',setvar:'tx.blocking_inbound_anomaly_score=+5'"
""",
    "REQUEST-949-BLOCKING-EVALUATION.conf": """\
SecRule TX:BLOCKING_INBOUND_ANOMALY_SCORE "@ge %{tx.inbound_anomaly_score_threshold}" "id:949110,phase:2,deny,status:403,t:none,log,msg:'stand-in: inbound anomaly score exceeded'"
""",
}
STANDIN_RULES = sum(1 for text in [*RULES.values(), SETUP] for line in text.splitlines()
                    if line.startswith(("SecRule ", "SecAction ")))


def standin_tree(path: Path, version: str = STANDIN, extra: str = "") -> str:
    """The stand-in release as a .tar.gz (`coreruleset-VERSION/...`), `extra` appended to its
    last rule file; returns its SHA-256."""
    with tarfile.open(path, "w:gz") as tar:
        def add(name: str, text: str) -> None:
            data = text.encode()
            info = tarfile.TarInfo(f"coreruleset-{version}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
        add("crs-setup.conf.example", SETUP)
        for name, text in RULES.items():
            text = text.replace(f"OWASP_CRS/{STANDIN}", f"OWASP_CRS/{version}")
            add(f"rules/{name}", text + (extra if name == list(RULES)[-1] else ""))
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Signer:
    """An OpenPGP key made for the test (ed25519, no passphrase, its own GNUPGHOME)."""

    def __init__(self, home: Path, name: str) -> None:
        self.home = home
        home.mkdir(mode=0o700)
        self.gpg("--quick-generate-key", f"{name} <crs-test@invalid>", "ed25519", "sign", "never")
        cols = self.gpg("--with-colons", "--fingerprint").stdout
        self.fingerprint = re.search(r"^fpr:+([0-9A-F]{40}):", cols, re.M).group(1)

    def gpg(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["gpg", "--batch", "--homedir", str(self.home), "--passphrase", "",
                               "--pinentry-mode", "loopback", *args],
                              capture_output=True, text=True, check=True, timeout=120)

    def sign(self, path: Path, out: Path) -> None:
        self.gpg("--armor", "--detach-sign", "--output", str(out), str(path))

    def export(self, out: Path) -> None:
        self.gpg("--armor", "--output", str(out), "--export", self.fingerprint)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class Served:
    """A directory served over HTTP on loopback (a thread of this process)."""

    def __init__(self, root: Path) -> None:
        handler = functools.partial(_Quiet, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_for_built_binaries() -> Path:
    """target/debug's daemons (scripts/test.sh builds them after it starts this group and
    touches LASTCALL_BUILT_MARKER when done: waited for, bounded)."""
    marker = os.environ.get("LASTCALL_BUILT_MARKER")
    if marker:
        deadline = time.monotonic() + 3600
        while not Path(marker).exists():
            assert time.monotonic() < deadline, "scripts/test.sh never finished building"
            time.sleep(1)
    target = target_dir() / "debug"
    if not (target / "lastcall-spoa").exists() or not (target / "lastcall-turn").exists():
        pytest.skip("the daemons are not built (cargo build -p lastcall-spoa -p lastcall-turn)")
    return target


def prebuilt() -> None:
    """The prebuilt stage's inputs, as scripts/images.sh --binaries prebuilt makes them."""
    target = wait_for_built_binaries()
    PREBUILT.mkdir(exist_ok=True)
    for binary in ("lastcall-spoa", "lastcall-turn"):
        subprocess.run(["objcopy", "--strip-debug", str(target / binary), str(PREBUILT / binary)], check=True)


def build(engine: Engine, tag: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [DOCKER, "build", "--network", "host", "--progress", "plain", "-f", "docker/Dockerfile",
            "--target", "spoa", "--build-arg", f"DEBIAN_IMAGE={BASE_IMAGE}", "--build-arg", "BINARIES=prebuilt",
            # As scripts/images.sh: this machine's mirror may be a snapshot past testing's Valid-Until.
            "--build-arg", "APT_CHECK_VALID_UNTIL=no", *args, "-t", tag, "."]
    # BuildKit, as scripts/images.sh uses it: only the stages the target needs are built (the
    # legacy builder would pull every FROM, the Rust image included).
    env = {**engine.env, "DOCKER_BUILDKIT": "1"}
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)


def why(out: subprocess.CompletedProcess[str]) -> str:
    """The build's own messages (`CRS: ...`, the agent's errors) and its last lines."""
    lines = out.stderr.splitlines()
    said = [l for l in lines if re.match(r"#\d+ [\d.]+ ", l)]
    return "\n".join(said[-20:] + lines[-3:])[-6000:]


def validate(engine: Engine, image: str) -> tuple[int, str]:
    """`-validate` in the image: (rules compiled, its line); asserts it passed."""
    out = engine.docker("run", "--rm", "--network", "none", image, "-validate", check=False)
    found = re.search(r"configuration OK: 1 application\(s\), (\d+) rules", out.stdout)
    assert out.returncode == 0 and found, out.stdout + out.stderr
    return int(found.group(1)), out.stdout.strip()


def engine_version(engine: Engine, image: str) -> tuple[int, ...]:
    out = engine.docker("run", "--rm", "--network", "none", image, "--version").stdout
    found = re.search(r"\(engine: ModSecurity (\d+)\.(\d+)\.(\d+)\)", out)
    assert found, out
    return tuple(int(x) for x in found.groups())


def label(engine: Engine, image: str) -> str:
    return engine.docker("image", "inspect", "-f", '{{ index .Config.Labels "org.lastcall.crs.version" }}',
                         image).stdout.strip()


@pytest.fixture()
def release(tmp_path: Path):
    """The stand-in release, its signature and the test key, served on loopback; plus a
    second key (not the pinned one) and a tampered copy of the archive."""
    www = tmp_path / "www"
    www.mkdir()
    sha = standin_tree(www / f"v{STANDIN}.tar.gz")
    signer = Signer(tmp_path / "gnupg", "lastcall CRS stand-in signer")
    signer.sign(www / f"v{STANDIN}.tar.gz", www / f"coreruleset-{STANDIN}.tar.gz.asc")
    signer.export(www / "security.asc")
    other = Signer(tmp_path / "gnupg-other", "someone else")
    other.export(www / "other.asc")
    # Tampered: a valid archive of the same release with one rule more (an allow-all a
    # build without the check would take), under the original's signature.
    standin_tree(www / "tampered.tar.gz",
                 extra='SecAction "id:949001,phase:1,pass,t:none,nolog,ctl:ruleEngine=Off"\n')
    served = Served(www)
    try:
        yield {"served": served, "sha": sha, "fingerprint": signer.fingerprint, "dir": www}
    finally:
        served.close()


def release_args(release: dict, archive: str | None = None, key: str = "security.asc",
                 version: str = STANDIN) -> list[str]:
    s = release["served"]
    args = {
        "CRS_VERSION": version,
        "CRS_URL": s.url(archive or f"v{STANDIN}.tar.gz"),
        "CRS_SIGNATURE_URL": s.url(f"coreruleset-{STANDIN}.tar.gz.asc"),
        "CRS_KEY_URL": s.url(key),
        "CRS_KEY_FINGERPRINT": release["fingerprint"],
    }
    return [w for k, v in args.items() for w in ("--build-arg", f"{k}={v}")]


def test_the_crs_release_path_verifies_and_loads_the_release(engine: Engine, release: dict) -> None:
    prebuilt()
    tag = "lastcall/lastcall-spoa:crs-release-test"
    bad = "lastcall/lastcall-spoa:crs-release-bad"
    try:
        started = time.monotonic()
        out = build(engine, tag, *release_args(release))
        took = time.monotonic() - started
        assert out.returncode == 0, why(out)
        assert f"CRS {STANDIN}: good signature by {release['fingerprint']}" in out.stderr, why(out)

        # The agent names the tree and its release, and compiles it on the image's engine.
        rules = engine.docker("run", "--rm", "--network", "none", tag, "show-rules").stdout
        assert rules.startswith(f"# CRS: OWASP_CRS/{STANDIN} in {IN_IMAGE}\n"), rules[:300]
        assert f"Include {IN_IMAGE}/crs-setup.conf.example" in rules, rules[-3000:]
        assert f"Include {IN_IMAGE}/rules/*.conf" in rules, rules[-3000:]
        assert label(engine, tag) == STANDIN
        env = engine.docker("image", "inspect", "-f", "{{json .Config.Env}}", tag).stdout
        assert f"LASTCALL_SPOA_CRS_DIR={IN_IMAGE}" in env, env
        count, line = validate(engine, tag)
        version = engine_version(engine, tag)
        # The image's engine (ENGINE=forky): libmodsecurity 3.0.16 or a later 3.0.x, which
        # compiled rule 901181 above.
        assert (3, 0, 16) <= version < (3, 1), version
        # The same image on Debian's CRS 3.3 (the tests' image): the difference is the rule
        # sets' own rules, so the stand-in's are all compiled.
        debian_count, _ = validate(engine, SPOA_IMAGE)
        measured(f"CRS release path (prebuilt binaries, stand-in release {STANDIN} served on loopback, "
                 f"signed by a test key): built in {took:.0f} s; engine ModSecurity "
                 f"{'.'.join(map(str, version))}; {line}; {STANDIN_RULES} of them the stand-in's; "
                 f"Debian's CRS 3.3 image: {debian_count} rules")
        assert count > STANDIN_RULES

        # ENGINE=trixie (Debian 13's 3.0.14) refuses that rule: the build fails with the
        # agent's error naming the file and the line.
        older = build(engine, bad, *release_args(release), "--build-arg", "ENGINE=trixie")
        assert older.returncode != 0, why(older)
        refused = re.search(r"REQUEST-901-INITIALIZATION\.conf:(\d+)[^\n]*Expecting an action", older.stderr)
        assert refused and int(refused.group(1)) == 5, why(older)
        measured(f"ENGINE=trixie (libmodsecurity 3.0.14) refuses the stand-in's rule 901181 at "
                 f"REQUEST-901-INITIALIZATION.conf:{refused.group(1)}: {refused.group(0)[-120:]}")

        # The archive is not the one signed: one rule more.
        tampered = build(engine, bad, *release_args(release, archive="tampered.tar.gz"))
        assert tampered.returncode != 0, why(tampered)
        assert (f"is not signed by CRS_KEY_FINGERPRINT={release['fingerprint']}" in tampered.stderr
                and "BADSIG" in tampered.stderr), why(tampered)
        # The key served is not the pinned one.
        other = build(engine, bad, *release_args(release, key="other.asc"))
        assert other.returncode != 0, why(other)
        assert f"is not the key CRS_KEY_FINGERPRINT={release['fingerprint']} names" in other.stderr, \
            why(other)
        # A good signature on a release that is not CRS_VERSION.
        wrong = build(engine, bad, *release_args(release, version="4.99.0"))
        assert wrong.returncode != 0, why(wrong)
        assert f"the archive is CRS {STANDIN} (its REQUEST-901-INITIALIZATION.conf), not CRS_VERSION=4.99.0" \
            in wrong.stderr, why(wrong)
    finally:
        engine.docker("rmi", "-f", tag, bad, check=False)


def test_the_offline_archive_path(engine: Engine, tmp_path: Path) -> None:
    prebuilt()
    name = f"coreruleset-{STANDIN}-offline.tar.gz"
    archive = CRS_DIR / name
    tag = "lastcall/lastcall-spoa:crs-archive-test"
    plain = "lastcall/lastcall-spoa:crs-archive-none"
    bad = "lastcall/lastcall-spoa:crs-archive-bad"
    # Without an archive, before one is in the context (the cache's baseline): Debian's CRS.
    try:
        assert build(engine, plain, "--build-arg", "CRS_VERSION=debian").returncode == 0
        sha = standin_tree(archive)
        out = build(engine, tag, "--build-arg", f"CRS_VERSION={STANDIN}", "--build-arg", f"CRS_ARCHIVE={name}",
                    "--build-arg", f"CRS_SHA256={sha}")
        assert out.returncode == 0, why(out)
        rules = engine.docker("run", "--rm", "--network", "none", tag, "show-rules").stdout
        assert rules.startswith(f"# CRS: OWASP_CRS/{STANDIN} in {IN_IMAGE}\n"), rules[:300]
        assert label(engine, tag) == STANDIN
        count, _ = validate(engine, tag)

        wrong = "0" * 64
        failed = build(engine, bad, "--build-arg", f"CRS_VERSION={STANDIN}", "--build-arg", f"CRS_ARCHIVE={name}",
                       "--build-arg", f"CRS_SHA256={wrong}")
        assert failed.returncode != 0, why(failed)
        assert (f"CRS_SHA256 does not match docker/crs/{name}: the file's SHA-256 is {sha}, CRS_SHA256 is {wrong}"
                in failed.stderr), why(failed)
        none = build(engine, bad, "--build-arg", f"CRS_VERSION={STANDIN}", "--build-arg", f"CRS_ARCHIVE={name}")
        assert none.returncode != 0 and f"CRS_ARCHIVE={name} needs CRS_SHA256" in none.stderr, why(none)

        # Debian's CRS, laid out like a release: loaded, its release named.
        shown = engine.docker("run", "--rm", "--network", "none", plain, "show-rules").stdout
        found = re.match(rf"# CRS: OWASP_CRS/(3\.3\.\d+) in {IN_IMAGE}\n", shown)
        assert found, shown[:300]
        debian_count, _ = validate(engine, plain)
        assert label(engine, plain) == "debian"
        measured(f"CRS offline archive path: stand-in {STANDIN} loads ({count} rules); "
                 f"CRS_VERSION=debian: OWASP_CRS/{found.group(1)}, {debian_count} rules")

        # With the archive in the context, the build without CRS_ARCHIVE is the one before:
        # every step of the crs and spoa stages from the cache.
        again = build(engine, plain, "--build-arg", "CRS_VERSION=debian")
        assert again.returncode == 0, why(again)
        log = again.stderr.splitlines()
        steps = {l.split()[0]: l for l in log if re.match(r"#\d+ \[(spoa|crs) \d+/\d+\] (RUN|COPY) ", l)}
        cached = {l.split()[0] for l in log if l.endswith(" CACHED")}
        assert steps and set(steps) <= cached, [steps[k] for k in sorted(set(steps) - cached)] or why(again)
    finally:
        archive.unlink(missing_ok=True)
        engine.docker("rmi", "-f", tag, plain, bad, check=False)


def test_the_source_stage_copies_no_docker_inputs() -> None:
    """The cargo build stage copies the workspace only (Cargo.toml, Cargo.lock, crates/):
    an archive in docker/crs/ or binaries in docker/prebuilt/ never invalidate it; the crs
    stage copies the named archive only; the engine's apt set-up comes from its own stage,
    which copies its script only."""
    s = stages()
    copies = [a for i, a in s["source"] if i == "COPY"]
    assert copies == ["--from=engine-apt /apt/ /etc/apt/", "Cargo.toml Cargo.lock ./", "crates/ crates/"], copies
    assert [a for i, a in s["engine-apt"] if i == "COPY"] == ["docker/engine-apt.sh /engine-apt.sh"]
    assert [a for i, a in s["crs"] if i == "COPY"] == ["docker/crs/${CRS_ARCHIVE:-README.md} /crs-in/"]
    runtime = [a for i, a in s["spoa"] if i == "COPY"]
    assert "--from=crs /crs /usr/share/lastcall-spoa/crs" in runtime, runtime


def test_the_crs_key_fingerprint_is_written_once() -> None:
    """The CRS project's key fingerprint (its INSTALL.md and SECURITY.md name it) is the
    Dockerfile's CRS_KEY_FINGERPRINT default and is written nowhere else in the tree, in
    full or as its 16-digit key id."""
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    found = re.findall(r"^ARG CRS_KEY_FINGERPRINT=([0-9A-F]{40})$", dockerfile, re.M)
    assert len(found) == 1, found
    fpr = found[0]
    assert dockerfile.count(fpr) == 1
    files = subprocess.run(["git", "grep", "-l", "-i", "-e", fpr, "-e", fpr[-16:]], cwd=REPO,
                           capture_output=True, text=True).stdout.split()
    assert files == ["docker/Dockerfile"], files

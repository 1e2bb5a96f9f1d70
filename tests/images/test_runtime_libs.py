"""Runtime completeness of the images, checked without a container engine: every shared
library a daemon binary loads (`ldd`, the whole transitive set) must come (`dpkg -S`) from a
package that the binary's runtime stage in docker/Dockerfile has, so the image cannot fail
at start with "error while loading shared libraries". A stage has:

- the packages of its base image, debian:bookworm-slim. That image is Debian 12's minimal
  bootstrap (debuerreotype, `debootstrap --variant=minbase`): the packages of Priority
  `required` (which include every `Essential: yes` one) plus apt, with their dependencies.
  The set is computed from this machine's dpkg database (also Debian 12): installed
  packages that are Essential or Priority required, plus apt, closed over Depends and
  Pre-Depends. A required package not installed here is missing from the set, which can
  only make the test stricter, never laxer.
- the packages its `apt-get install` lines name, closed over Depends and Pre-Depends as
  apt resolves them (the first installed alternative of `a | b`, providers of virtual
  packages); Recommends only if the stage does not pass `--no-install-recommends`. Each
  named package must be installed here, or the test cannot vouch for it and fails.

Which binary: the image ships `cargo build --release`. This checks every daemon binary
built in this checkout, debug and release (CI builds debug before these tests; a release
build is checked too when present). The set of shared libraries is fixed by the link
line, which is the same in both profiles: std links libc, libm and libgcc_s, and
crates/modsec/build.rs adds libmodsecurity through pkg-config, with no dependence on the
profile (the profile changes code generation, optimisation and debug info, not what is
linked). Building release just for this test would cost many minutes of a shared 2-core
machine for the same answer.

Also checked: the files the agent's default application loads at start (Debian's CRS:
crs-setup.conf, the rules and their data files) come from the spoa stage's packages, and
the ENTRYPOINT is the file the stage copies the binary to. Not covered: libraries loaded
with dlopen() at run time (ldd cannot see them; the daemons load none themselves)."""

from __future__ import annotations

import glob
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

from imagelib import apt_installed, built, entrypoint, measured, stages

DAEMONS = {"spoa": "lastcall-spoa", "turn": "lastcall-turn"}
BASE_IMAGE = "debian:bookworm-slim"


@lru_cache(maxsize=1)
def installed() -> dict[str, dict[str, str]]:
    """Installed packages: {name: {priority, essential, depends, provides}}."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f",
         "${Package}\t${db:Status-Abbrev}\t${Priority}\t${Essential}\t${Pre-Depends}, ${Depends}\t${Recommends}\t${Provides}\n"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    pkgs: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        name, status, priority, essential, depends, recommends, provides = line.split("\t")
        if not status.startswith("ii"):
            continue
        pkgs[name] = {"priority": priority, "essential": essential, "depends": depends,
                      "recommends": recommends, "provides": provides}
    return pkgs


@lru_cache(maxsize=1)
def providers() -> dict[str, list[str]]:
    """Virtual package -> installed packages that provide it."""
    result: dict[str, list[str]] = {}
    for name, info in installed().items():
        for item in info["provides"].split(","):
            virtual = item.split("(")[0].strip()
            if virtual:
                result.setdefault(virtual, []).append(name)
    return result


def resolve(alternative: str) -> str | None:
    name = alternative.split("(")[0].strip().split(":")[0]
    if name in installed():
        return name
    provided = providers().get(name, [])
    return provided[0] if provided else None


def closure(roots: list[str], recommends: bool = False) -> dict[str, str]:
    """{package: why it is there}, over Depends and Pre-Depends (and Recommends if asked)."""
    why: dict[str, str] = {r: "named" for r in roots}
    todo = list(roots)
    while todo:
        pkg = todo.pop()
        info = installed()[pkg]
        fields = info["depends"] + (", " + info["recommends"] if recommends else "")
        for group in fields.split(","):
            group = group.strip()
            if not group:
                continue
            for alt in group.split("|"):  # apt takes the first alternative it can install
                dep = resolve(alt)
                if dep is not None:
                    if dep not in why:
                        why[dep] = f"dependency of {pkg}"
                        todo.append(dep)
                    break
    return why


@lru_cache(maxsize=1)
def base_packages() -> dict[str, str]:
    roots = [n for n, i in installed().items() if i["priority"] == "required" or i["essential"] == "yes"]
    roots.append("apt")
    return closure(roots)


def stage_packages(target: str) -> tuple[list[str], dict[str, str]]:
    stage = stages()[target]
    assert stage[0] == ("FROM", BASE_IMAGE), f"{target} is built FROM {stage[0][1]}, not {BASE_IMAGE}"
    named = apt_installed(stage)
    missing = [p for p in named if p not in installed()]
    assert not missing, f"{target} installs {missing}, not installed here: cannot check what they provide"
    runs = " ".join(a for i, a in stage if i == "RUN")
    return named, closure(named, recommends=bool(named) and "--no-install-recommends" not in runs)


def aliases(path: str) -> list[str]:
    """`path`, its real path, and their merged-/usr twins (dpkg records one of them)."""
    candidates = [path, os.path.realpath(path)]
    for p in list(candidates):
        candidates.append(p[len("/usr"):] if p.startswith("/usr/") else "/usr" + p)
    return list(dict.fromkeys(candidates))


def owners(paths: list[str]) -> dict[str, str | None]:
    """{path: the package that ships it (`dpkg -S`), or None}, in one dpkg call."""
    candidates = {p: aliases(p) for p in paths}
    wanted = sorted({c for cs in candidates.values() for c in cs})
    # dpkg -S exits 1 when some pattern matches nothing; the others are still listed.
    run = subprocess.run(["dpkg", "-S", *wanted], capture_output=True, text=True, timeout=120)
    shipped_by: dict[str, str] = {}
    for line in run.stdout.splitlines():
        if line.startswith("diversion "):
            continue
        pkgs, _, shipped = line.partition(": ")
        shipped_by[shipped] = pkgs.split(",")[0].strip().split(":")[0]
    return {p: next((shipped_by[c] for c in cs if c in shipped_by), None) for p, cs in candidates.items()}


LDD_LINE = re.compile(r"^\s*(\S+)(?: => (\S+|not found))?(?: \(0x[0-9a-f]+\))?\s*$")


def shared_libraries(binary: Path) -> dict[str, str]:
    """{soname: resolved path} from ldd; a library ldd cannot find fails here."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True, timeout=60).stdout
    libs: dict[str, str] = {}
    for line in out.splitlines():
        m = LDD_LINE.match(line)
        assert m, f"unexpected ldd line: {line!r}"
        name, path = m.group(1), m.group(2)
        assert path != "not found", f"{binary.name}: {name} not found by ldd (here, already)"
        if path is None:
            if name.startswith("linux-vdso") or name.startswith("linux-gate"):
                continue  # provided by the kernel
            path = name  # the dynamic loader, printed by its path
        libs[name] = path
    return libs


def binaries(name: str) -> list[Path]:
    found = built(name, ("release", "debug"))
    if not found:
        pytest.skip(f"{name} is not built (cargo build -p {name})")
    return found


def check(binary: Path, target: str) -> tuple[list[str], set[str], set[str], list[str]]:
    """(problems, packages credited to the stage, to the base image, names installed) for
    `binary` in `target`'s runtime stage."""
    base = base_packages()
    named, extra = stage_packages(target)
    libs = shared_libraries(binary)
    assert libs, "ldd listed nothing: not a dynamic executable?"
    problems: list[str] = []
    from_base: set[str] = set()
    from_stage: set[str] = set()
    shipped = owners(sorted(libs.values()))
    for soname, path in sorted(libs.items()):
        pkg = shipped[path]
        if pkg is None:
            problems.append(f"{soname} ({path}) belongs to no Debian package")
        elif pkg in extra:  # credit the stage first: what is left relies on the base image
            from_stage.add(pkg)
        elif pkg in base:
            from_base.add(pkg)
        else:
            problems.append(f"{soname} ({path}) is in {pkg}, which neither {BASE_IMAGE} nor "
                            f"`apt-get install {' '.join(named) or '(nothing)'}` provides")
    return problems, from_stage, from_base, named


@pytest.mark.parametrize("target", sorted(DAEMONS))
def test_every_shared_library_is_in_the_runtime_stage(target: str) -> None:
    for binary in binaries(DAEMONS[target]):
        problems, from_stage, from_base, named = check(binary, target)
        assert not problems, f"{binary}:\n  " + "\n  ".join(problems)
        measured(f"{target} image, {binary.parent.name} {binary.name}: {len(shared_libraries(binary))} "
                 f"shared libraries, all provided: by `apt-get install {' '.join(named) or '(nothing)'}` "
                 f"with its dependencies ({', '.join(sorted(from_stage)) or '-'}), the rest by "
                 f"{BASE_IMAGE} ({', '.join(sorted(from_base)) or '-'})")


def test_the_check_finds_a_missing_library() -> None:
    """The agent's binary in the TURN image (which installs nothing) must fail the check,
    naming libmodsecurity: the check can fail."""
    problems, _, _, _ = check(binaries("lastcall-spoa")[0], "turn")
    assert any("libmodsecurity.so.3" in p and "libmodsecurity3" in p for p in problems), problems


def test_base_set_is_plausible() -> None:
    """Guards the base-set computation itself: the minimal packages are in, the WAF is not."""
    base = base_packages()
    for pkg in ("libc6", "libgcc-s1", "dpkg", "apt", "bash", "coreutils"):
        assert pkg in base, f"{pkg} missing from the computed {BASE_IMAGE} set"
    for pkg in ("libmodsecurity3", "modsecurity-crs", "libcurl3-gnutls", "libxml2", "liblua5.3-0"):
        assert pkg not in base, f"{pkg} is not in {BASE_IMAGE}, yet the computed set has it"
    measured(f"{BASE_IMAGE} package set computed here: {len(base)} packages (required/Essential + apt, with dependencies)")


def test_the_default_rule_set_is_in_the_spoa_stage() -> None:
    """lastcall-spoa with no --config loads Debian's CRS (crates/modsec/src/crs.rs); the
    chart's default configuration includes the same files."""
    _, extra = stage_packages("spoa")
    files = ["/etc/modsecurity/crs/crs-setup.conf"]
    files += glob.glob("/usr/share/modsecurity-crs/rules/*")
    files += [f for f in ("/etc/modsecurity/crs/REQUEST-900-EXCLUSION-RULES-BEFORE-CRS.conf",
                          "/etc/modsecurity/crs/RESPONSE-999-EXCLUSION-RULES-AFTER-CRS.conf") if os.path.exists(f)]
    assert len(files) > 20, "modsecurity-crs is not installed here (bash scripts/setup.sh installs it)"
    shipped = owners(files)
    strays = {f: pkg for f, pkg in shipped.items() if pkg not in extra}
    assert not strays, f"CRS files not from the spoa stage's packages: {strays}"
    measured(f"spoa image: {len(files)} CRS files the default application loads, all from {sorted(set(shipped.values()))}")


@pytest.mark.parametrize("target", sorted(DAEMONS))
def test_entrypoint_is_the_copied_binary(target: str) -> None:
    stage = stages()[target]
    entry = entrypoint(stage)
    copies = [a.split() for i, a in stage if i == "COPY"]
    dests = [words[-1] for words in copies if any(w.startswith("--from=build") for w in words)]
    assert entry[0] in dests, f"ENTRYPOINT {entry[0]} is not where the binary is copied ({dests})"
    assert Path(entry[0]).name == DAEMONS[target]

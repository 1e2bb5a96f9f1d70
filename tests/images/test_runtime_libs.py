"""Runtime completeness of the images, checked in the built images themselves (Debian 13
runtime stages, from scripts/images.sh): every shared library a daemon loads (`ldd`, run in
the image, the whole transitive set) must be found, and must come (`dpkg -S`, in the image)
from a package the image has for a reason the Dockerfile states:

- the packages of its base image (the `DEBIAN_IMAGE` build argument: here the debootstrap
  base scripts/images.sh makes, debian:trixie-slim's recipe), read from the base image's
  own dpkg database;
- the packages its runtime stage's `apt-get install` names (lastcall-spoa:
  `libmodsecurity3t64`; lastcall-turn: `dumb-init`), with their Depends and
  Pre-Depends as apt resolved them (Recommends only without `--no-install-recommends`).

The image must hold exactly that set, nothing more, and the WAF library must be
libmodsecurity 3.0.16 (or a later 3.0.x update), the default ENGINE's (forky's build, with
the libraries docker/engine-apt.sh pins to trixie-backports: the closure above still holds). The check can fail: the agent's binary
in the TURN image (which has no libmodsecurity) is reported missing libmodsecurity.so.3. Also
checked: the CRS files the agent's default application loads are the crs stage's tree, and the ENTRYPOINT is the file the stage copies the binary to. Not covered:
libraries loaded with dlopen() at run time (ldd cannot see them; the daemons load none)."""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

from enginelib import BASE_IMAGE, SPOA_IMAGE, TURN_IMAGE, Engine, measured
from imagelib import apt_installed, stages

IMAGES = {"spoa": SPOA_IMAGE, "turn": TURN_IMAGE}
BINARY = {"spoa": "/usr/local/bin/lastcall-spoa", "turn": "/usr/local/bin/lastcall-turn"}
FIELDS = "${Package}\t${db:Status-Abbrev}\t${Version}\t${Pre-Depends}, ${Depends}\t${Recommends}\t${Provides}\n"
LDD_LINE = re.compile(r"^\s*(\S+)(?: => (\S+|not found))?(?: \(0x[0-9a-f]+\))?\s*$")


def in_image(engine: Engine, image: str, *argv: str, mounts: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`argv` run in a throwaway container of `image` (no network, as the image's user)."""
    extra = [a for m in mounts for a in ("--mount", m)]
    return engine.docker("run", "--rm", "--network", "none", *extra, "--entrypoint", argv[0], image, *argv[1:],
                         check=False, timeout=120)


@lru_cache(maxsize=None)
def packages(engine: Engine, image: str) -> dict[str, dict[str, str]]:
    """The image's installed packages: {name: {version, depends, recommends, provides}}."""
    out = in_image(engine, image, "dpkg-query", "-W", "-f", FIELDS)
    assert out.returncode == 0, out.stderr
    pkgs = {}
    for line in out.stdout.splitlines():
        name, status, version, depends, recommends, provides = line.split("\t")
        if status.startswith("ii"):
            pkgs[name.split(":")[0]] = {"version": version, "depends": depends, "recommends": recommends,
                                        "provides": provides}
    return pkgs


def closure(pkgs: dict[str, dict[str, str]], roots: list[str], recommends: bool) -> dict[str, str]:
    """{package: why}, over Depends and Pre-Depends (and Recommends), as resolved in `pkgs`
    (the first alternative that is installed, or a provider of a virtual package)."""
    provided: dict[str, str] = {}
    for name, info in pkgs.items():
        for item in info["provides"].split(","):
            virtual = item.split("(")[0].strip()
            if virtual:
                provided.setdefault(virtual, name)

    def resolve(alt: str) -> str | None:
        name = alt.split("(")[0].strip().split(":")[0]
        return name if name in pkgs else provided.get(name)

    why = {r: "named" for r in roots}
    todo = list(roots)
    while todo:
        pkg = todo.pop()
        info = pkgs[pkg]
        fields = info["depends"] + (", " + info["recommends"] if recommends else "")
        for group in fields.split(","):
            for alt in group.strip().split("|") if group.strip() else []:
                dep = resolve(alt)
                if dep is not None:
                    if dep not in why:
                        why[dep] = f"dependency of {pkg}"
                        todo.append(dep)
                    break
    return why


def stage(target: str) -> tuple[list[str], bool]:
    """(packages the stage's `apt-get install` names, whether Recommends come too)."""
    st = stages()[target]
    assert st[0] == ("FROM", "${DEBIAN_IMAGE}"), f"{target} is built FROM {st[0][1]}, not the DEBIAN_IMAGE argument"
    runs = " ".join(a for i, a in st if i == "RUN")
    named = apt_installed(st)
    return named, bool(named) and "--no-install-recommends" not in runs


def libraries(engine: Engine, image: str, binary: str, mounts: tuple[str, ...] = ()) -> dict[str, str | None]:
    """{soname: path in the image, or None when ldd cannot find it there}."""
    out = in_image(engine, image, "ldd", binary, mounts=mounts)
    assert out.returncode in (0, 1), f"ldd {binary} in {image}: {out.stderr}"
    libs: dict[str, str | None] = {}
    for line in out.stdout.splitlines():
        m = LDD_LINE.match(line)
        assert m, f"unexpected ldd line: {line!r}"
        name, path = m.group(1), m.group(2)
        if path is None:
            if name.startswith("linux-vdso"):
                continue  # provided by the kernel
            path = name  # the dynamic loader, printed by its path
        libs[name] = None if path == "not found" else path
    return libs


def owners(engine: Engine, image: str, paths: list[str]) -> dict[str, str | None]:
    """{path: the package that ships it in the image (`dpkg -S`), or None}. dpkg records
    one spelling of a path (merged /usr: /lib/x is /usr/lib/x), so both are asked for."""
    variants = {p: [p, p[4:] if p.startswith("/usr/") else "/usr" + p] for p in paths}
    wanted = sorted({v for vs in variants.values() for v in vs})
    out = in_image(engine, image, "dpkg", "-S", *wanted)
    shipped: dict[str, str] = {}
    for line in out.stdout.splitlines():
        if line.startswith("diversion "):
            continue
        pkg, _, path = line.partition(": ")
        shipped[path] = pkg.split(",")[0].strip().split(":")[0]
    return {p: next((shipped[v] for v in vs if v in shipped), None) for p, vs in variants.items()}


def problems(engine: Engine, target: str, image: str, binary: str, mounts: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    base = packages(engine, BASE_IMAGE)
    named, recommends = stage(target)
    # Credit the base image first: what is left is what the stage's install brought.
    allowed = closure(packages(engine, image), named, recommends) | dict.fromkeys(base, "base image")
    libs = libraries(engine, image, binary, mounts)
    assert libs, "ldd listed nothing: not a dynamic executable?"
    found = {soname: path for soname, path in libs.items() if path is not None}
    shipped = owners(engine, image, sorted(set(found.values())))
    out = [f"{soname} not found in {image}" for soname, path in libs.items() if path is None]
    credited: dict[str, str] = {}
    for soname, path in sorted(found.items()):
        pkg = shipped[path]
        if pkg is None:
            out.append(f"{soname} ({path}) belongs to no package of {image}")
        elif pkg not in allowed:
            out.append(f"{soname} ({path}) is in {pkg}, which neither {BASE_IMAGE} nor "
                       f"`apt-get install {' '.join(named) or '(nothing)'}` brings")
        else:
            credited[pkg] = allowed[pkg]
    return out, credited


@pytest.mark.parametrize("target", sorted(IMAGES))
def test_every_shared_library_is_in_the_runtime_stage(engine: Engine, target: str) -> None:
    image = IMAGES[target]
    found, credited = problems(engine, target, image, BINARY[target])
    assert not found, f"{image}:\n  " + "\n  ".join(found)
    from_stage = sorted(p for p, why in credited.items() if why != "base image")
    measured(f"{image}: {len(libraries(engine, image, BINARY[target]))} shared libraries, all found in the image; "
             f"from the stage's packages: {', '.join(from_stage) or '-'}; the rest from the base image")


@pytest.mark.parametrize("target", sorted(IMAGES))
def test_the_image_holds_the_base_and_the_named_packages_only(engine: Engine, target: str) -> None:
    image = IMAGES[target]
    have = packages(engine, image)
    base = packages(engine, BASE_IMAGE)
    named, recommends = stage(target)
    want = set(base) | set(closure(have, named, recommends))
    assert set(have) == want, (f"{image}: unexplained {sorted(set(have) - want)}, "
                               f"missing {sorted(want - set(have))}")
    if target == "spoa":
        version = have["libmodsecurity3t64"]["version"]
        upstream = tuple(int(x) for x in version.split("-")[0].split("."))
        assert (3, 0, 16) <= upstream < (3, 1), f"libmodsecurity3t64 {version}: 3.0.16 or a 3.0.x update expected (ENGINE=forky)"
        assert named == ["libmodsecurity3t64"], f"{image} installs {named}"
        measured(f"{image}: {len(have)} packages = {len(base)} of {BASE_IMAGE} + {len(want - set(base))} from "
                 f"`apt-get install {' '.join(named)}`; libmodsecurity3t64 {version}")
    else:
        # The TURN image installs dumb-init alone: wire's coturn chart runs its command under
        # /usr/bin/dumb-init (docs/coming-from-coturn.md#wire).
        assert named == ["dumb-init"], f"{image} installs {named}"
        measured(f"{image}: {len(have)} packages = {len(base)} of {BASE_IMAGE} + {len(want - set(base))} from "
                 f"`apt-get install {' '.join(named)}`")


def test_the_turn_image_has_what_wires_chart_runs(engine: Engine) -> None:
    """wire's coturn chart runs `/usr/bin/dumb-init -- /bin/sh -c '... sed ...; exec
    /usr/bin/turnserver -c ...'`, a preStop `/usr/local/bin/pre-stop-hook`, its reloader
    looks for a process named turnserver, and its config names
    `CA-file=/etc/ssl/certs/ca-certificates.crt` unless `ca.enabled`: those paths are in the
    image, the middle two this image's binary under those names, the last Debian's bundle."""
    out = in_image(engine, TURN_IMAGE, "/bin/sh", "-c",
                   "for c in dumb-init sed cat; do command -v $c || exit 1; done"
                   " && readlink -f /usr/bin/turnserver /usr/local/bin/pre-stop-hook"
                   " && grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt"
                   " && /usr/bin/dumb-init --version")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.split()
    assert lines[:3] == ["/usr/bin/dumb-init", "/usr/bin/sed", "/usr/bin/cat"], out.stdout
    assert lines[3:5] == [BINARY["turn"], BINARY["turn"]], out.stdout
    cas = int(lines[5])
    assert cas > 100, f"/etc/ssl/certs/ca-certificates.crt holds {cas} certificates"
    measured(f"{TURN_IMAGE}: /usr/bin/dumb-init ({(out.stdout + out.stderr).strip().splitlines()[-1]}), sed, cat; "
             f"/usr/bin/turnserver and /usr/local/bin/pre-stop-hook -> {BINARY['turn']}; "
             f"/etc/ssl/certs/ca-certificates.crt with {cas} CA certificates")


def test_the_check_finds_a_missing_library(engine: Engine, tmp_path: Path) -> None:
    """The agent's binary, taken out of its image, in the TURN image (which has no
    libmodsecurity) fails the check, naming libmodsecurity: the check can fail."""
    name = "lc-runtime-libs-copy"
    engine.docker("rm", "-f", name, check=False)
    engine.docker("create", "--name", name, SPOA_IMAGE)
    try:
        engine.docker("cp", f"{name}:{BINARY['spoa']}", str(tmp_path / "lastcall-spoa"))
    finally:
        engine.docker("rm", "-f", name, check=False)
    mount = f"type=bind,src={tmp_path / 'lastcall-spoa'},dst=/x/lastcall-spoa,readonly"
    found, _ = problems(engine, "turn", TURN_IMAGE, "/x/lastcall-spoa", mounts=(mount,))
    assert any("libmodsecurity.so.3 not found" in p for p in found), found


def test_the_default_rule_set_is_in_the_spoa_stage(engine: Engine) -> None:
    """lastcall-spoa with no --config loads the CRS in LASTCALL_SPOA_CRS_DIR (the crs stage's
    tree, docker/Dockerfile); the chart's default configuration includes the same files.
    They are in the image, in no package (the stage copies them), and the agent names their
    release."""
    env = engine.inspect(SPOA_IMAGE)["Config"]["Env"]
    assert "LASTCALL_SPOA_CRS_DIR=/usr/share/lastcall-spoa/crs" in env, env
    listing = in_image(engine, SPOA_IMAGE, "sh", "-c",
                       "ls -d /usr/share/lastcall-spoa/crs/crs-setup.conf* /usr/share/lastcall-spoa/crs/rules/*")
    files = listing.stdout.split()
    assert len(files) > 20 and any(f.endswith("REQUEST-901-INITIALIZATION.conf") for f in files), \
        listing.stdout + listing.stderr
    shipped = {f: pkg for f, pkg in owners(engine, SPOA_IMAGE, files).items() if pkg}
    assert not shipped, f"CRS files from packages: {shipped}"
    rules = in_image(engine, SPOA_IMAGE, BINARY["spoa"], "show-rules").stdout
    release = rules.splitlines()[0]
    assert release.startswith("# CRS: OWASP_CRS/") and release.endswith(" in /usr/share/lastcall-spoa/crs"), release
    measured(f"{SPOA_IMAGE}: {len(files)} CRS files the default application loads, copied by the crs stage; "
             f"{release[2:]}")


@pytest.mark.parametrize("target", sorted(IMAGES))
def test_entrypoint_is_the_copied_binary(engine: Engine, target: str) -> None:
    st = stages()[target]
    copies = [a.split() for i, a in st if i == "COPY"]
    # Straight from the build, or through turn-caps (which copies it from the build and sets
    # its file capability).
    built = ("--from=binaries", "--from=turn-caps")
    dests = [words[-1] for words in copies if any(w.startswith(built) for w in words)]
    config = engine.inspect(IMAGES[target])["Config"]
    assert config["Entrypoint"] == [BINARY[target]] and BINARY[target] in dests, (config["Entrypoint"], dests)
    assert config["User"] == "65532:65532" and config["StopSignal"] == "SIGTERM", config
    out = in_image(engine, IMAGES[target], BINARY[target], "--version")
    assert out.returncode == 0 and out.stdout.startswith(f"lastcall-{target} "), out.stdout + out.stderr

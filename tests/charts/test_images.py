"""docker/Dockerfile against what the charts expect of the images (this reads the file; the
built images are checked in tests/images): the base images as build arguments with no
registry needed, the targets the chart image names refer to, non-root uid 65532,
SIGTERM as the stop signal, the binary itself as an exec-form ENTRYPOINT (PID 1, signals
delivered, no shell or init shim), and the charts' default ports exposed."""

from __future__ import annotations

import json

import pytest

from chartlib import REPO, load

DOCKERFILE = REPO / "docker" / "Dockerfile"


def stages() -> dict[str, list[tuple[str, str]]]:
    """{target: [(INSTRUCTION, arguments)]}, continuation lines joined."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    result: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, args = line.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            words = args.split()
            current = words[2] if len(words) >= 3 and words[1].upper() == "AS" else words[0]
            result[current] = [("FROM", words[0])]
        elif current is not None:
            result[current].append((instr, args.strip()))
    return result


def one(stage: list[tuple[str, str]], instr: str) -> str:
    found = [a for i, a in stage if i == instr]
    assert len(found) == 1, f"{instr} appears {len(found)} times"
    return found[0]


@pytest.mark.parametrize(
    "chart,target,binary,ports",
    [
        ("lastcall-spoa", "spoa", "lastcall-spoa", ["9000/tcp", "9901/tcp"]),
        ("lastcall-turn", "turn", "lastcall-turn", ["3478/udp", "3478/tcp", "5349/tcp", "9641/tcp"]),
    ],
)
def test_runtime_stage(chart: str, target: str, binary: str, ports: list[str]) -> None:
    all_stages = stages()
    assert one(all_stages["source"], "FROM") == "${RUST_IMAGE}"
    stage = all_stages[target]
    assert one(stage, "FROM") == "${DEBIAN_IMAGE}"
    assert one(stage, "USER") == "65532:65532"
    assert one(stage, "STOPSIGNAL") == "SIGTERM"
    entry = json.loads(one(stage, "ENTRYPOINT"))
    assert entry == [f"/usr/local/bin/{binary}"], "exec form, the binary itself"
    assert set(one(stage, "EXPOSE").split()) == set(ports)
    labels = one(stage, "LABEL")
    for key in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert f'org.opencontainers.image.title="{binary}"' in labels
    with load(chart) as c:
        values = c.values
        app_version = c.metadata["appVersion"]
    assert values["image"]["repository"] == f"lastcall/{binary}"
    assert 'ARG VERSION=' + app_version in DOCKERFILE.read_text()
    # The daemon is PID 1: no init shim starts it (the TURN image carries dumb-init for wire's
    # chart, whose own command line runs it; the image's entry point does not).
    for instr, args in stage:
        if instr in ("ENTRYPOINT", "CMD"):
            assert "tini" not in args and "dumb-init" not in args


def global_args() -> dict[str, str]:
    """The `ARG NAME=default` lines before the first FROM (usable in FROM lines)."""
    out = {}
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if line.upper().startswith("FROM "):
            break
        if line.upper().startswith("ARG "):
            name, _, default = line[4:].strip().partition("=")
            out[name] = default
    return out


def test_base_images_are_build_arguments_defaulting_to_the_official_ones() -> None:
    """Offline builds pass local bases (scripts/images.sh); users get Debian 13's official
    images. No `# syntax=` line (it would fetch a frontend image) and every FROM is a build
    argument, an earlier stage or `scratch`, so nothing needs a registry."""
    args = global_args()
    assert args["DEBIAN_IMAGE"] == "debian:trixie-slim"
    assert args["RUST_IMAGE"] == "rust:1-trixie"
    assert args["BINARIES"] == "source"
    text = DOCKERFILE.read_text()
    assert not [ln for ln in text.splitlines() if ln.lower().startswith("# syntax")], "a `# syntax=` line needs a registry"
    names: set[str] = set()
    for name, stage in stages().items():
        base = one(stage, "FROM")
        assert base in names or base == "scratch" or (base.startswith("${") and base[2:-1] in args), (
            f"stage {name} is built FROM {base}: neither a build argument, an earlier stage nor scratch")
        names.add(name)
    assert one(stages()["binaries"], "FROM") == "${BINARIES}" and {"source", "prebuilt"} <= names
    for target in ("spoa", "turn"):
        labels = one(stages()[target], "LABEL")
        assert 'org.opencontainers.image.base.name="${DEBIAN_IMAGE}"' in labels


def test_spoa_runtime_has_only_the_waf_packages() -> None:
    run = " ".join(a for i, a in stages()["spoa"] if i == "RUN")
    assert "libmodsecurity3t64" in run and "modsecurity-crs" not in run
    # The CRS is the crs stage's tree (a verified release, or Debian's laid out like one).
    assert "modsecurity-crs" in " ".join(a for i, a in stages()["crs"] if i == "RUN")
    assert "-dev" not in run and "--no-install-recommends" in run
    # The turn image installs dumb-init alone, for wire's chart (docs/coming-from-coturn.md#wire),
    # and names its binary as that chart expects.
    turn = [a for i, a in stages()["turn"] if i == "RUN"]
    assert len(turn) == 2 and "install -y --no-install-recommends dumb-init   &&" in turn[0], turn
    assert turn[1].split() == [
        "ln", "-s", "/usr/local/bin/lastcall-turn", "/usr/bin/turnserver", "&&",
        "ln", "-s", "/usr/local/bin/lastcall-turn", "/usr/local/bin/pre-stop-hook",
    ], turn

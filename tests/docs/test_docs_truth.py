"""The docs stay true: every `cargo nextest` / `cargo test` command in docs/ and the READMEs
names packages and test binaries that exist, and its filters (`-E` filtersets, test-name
filters) select at least one test, as `cargo nextest list` evaluates them; every repository
path they name exists. A failure names the file, the line and the token.

Run after the workspace's tests are built with the features CI builds them with
(scripts/test.sh runs it right after `cargo nextest run`): the listing then builds nothing.
LASTCALL_DOCS_FEATURES (default lastcall-turn/kernel-relay) must match that build."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
FEATURES = os.environ.get("LASTCALL_DOCS_FEATURES", "lastcall-turn/kernel-relay")

# Paths of other repositories that read like ours.
FOREIGN = {"charts/coturn", "charts/coraza-spoa"}  # wire-server's and corazawaf's charts

# Where a repository path starts; anything else in backticks is not taken for one.
ROOTS = ("crates/", "charts/", "docs/", "scripts/", "tests/", "bench/", "docker/", "fuzz/", ".ci/", ".config/")


@dataclass(frozen=True)
class Mention:
    file: str
    line: int
    text: str

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def doc_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"], cwd=REPO, capture_output=True, text=True, check=True)
    files = []
    for name in out.stdout.split():
        p = Path(name)
        if p.parts[0] == "docs" or p.name == "README.md":
            files.append(REPO / p)
    return sorted(files)


def spans(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line, text, in a fenced block) of every code line of fenced blocks (joined over `\\`
    continuations) and every inline code span (which may cross a line break)."""
    lines = path.read_text().split("\n")
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("```"):
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith("```"):
                start, text = i + 1, lines[i]
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text[:-1] + " " + lines[i].strip()
                yield start, text, True
                i += 1
            i += 1
            continue
        prose.append((i + 1, lines[i]))
        i += 1
    # Inline spans: over each paragraph of prose, with the line each span starts on.
    para: list[tuple[int, str]] = []
    for n, text in prose + [(0, "")]:
        if text.strip():
            para.append((n, text))
            continue
        if para:
            joined = "\n".join(t for _, t in para)
            for m in re.finditer(r"(`+)(.+?)\1", joined, flags=re.S):
                line = para[0][0] + joined.count("\n", 0, m.start())
                yield line, m.group(2).replace("\n", " "), False
            para = []


def commands() -> list[Mention]:
    """Every `cargo nextest run|list` and `cargo test` command, cut at a pipe, `&&`, `;` or
    a comment."""
    out = []
    for path in doc_files():
        rel = str(path.relative_to(REPO))
        for line, text, _ in spans(path):
            for m in re.finditer(r"cargo (?:nextest (?:run|list)|test)\b", text):
                cmd = re.split(r"\s(?:\||&&|;|#|2>&1)\s?|\s(?:\||#)$", text[m.start():])[0]
                out.append(Mention(rel, line, cmd.strip()))
    return out


@dataclass
class Parsed:
    packages: list[str]
    workspace: bool
    tests: list[str]  # --test NAME
    lib: bool
    filtersets: list[str]
    names: list[str]
    exact: bool
    ignored: str | None  # None, "only", "all"


FLAGS_WITH_VALUE = {"-j", "--jobs", "--test-threads", "--retries", "--profile", "-P", "--target-dir",
                    "--message-format", "--color", "--manifest-path", "--partition", "--target"}
FLAGS = {"--locked", "--no-capture", "--nocapture", "--no-fail-fast", "--release", "--all-targets",
         "--frozen", "--offline", "-q", "--quiet", "-v", "--verbose", "--doc", "--bins", "--examples",
         "--show-output", "--success-output", "--failure-output", "--status-level", "--final-status-level"}


def parse(m: Mention) -> Parsed:
    try:
        words = shlex.split(m.text)
    except ValueError as e:
        raise AssertionError(f"{m.where()}: `{m.text}` does not parse as a shell command: {e}") from None
    words = words[3:] if words[1] == "nextest" else words[2:]
    p = Parsed([], False, [], False, [], [], False, None)
    after_dashes = False
    i = 0
    while i < len(words):
        w = words[i]
        value = words[i + 1] if i + 1 < len(words) else None
        if after_dashes:  # libtest's own arguments (cargo test ... -- ARGS)
            if w == "--exact":
                p.exact = True
            elif w == "--ignored":
                p.ignored = "only"
            elif w == "--include-ignored":
                p.ignored = "all"
            elif w in ("--test-threads", "--skip"):
                i += 1
            elif not w.startswith("-"):
                p.names.append(w)
        elif w == "--":
            after_dashes = True
        elif w in ("-p", "--package"):
            p.packages.append(value or "")
            i += 1
        elif w in ("--workspace", "--all"):
            p.workspace = True
        elif w == "--test":
            p.tests.append(value or "")
            i += 1
        elif w == "--lib":
            p.lib = True
        elif w in ("-E", "--filterset", "--filter-expr"):
            p.filtersets.append(value or "")
            i += 1
        elif w == "--run-ignored":
            p.ignored = {"ignored-only": "only", "only": "only", "all": "all"}.get(value or "", "default")
            i += 1
        elif w in ("--features", "-F"):
            i += 1  # the listing is built with FEATURES
        elif w in FLAGS_WITH_VALUE:
            i += 1
        elif w in FLAGS or w.startswith("--") and "=" in w:
            pass
        elif w.startswith("-"):
            raise AssertionError(f"{m.where()}: `{m.text}`: option {w} is not one this test knows; teach it")
        else:
            p.names.append(w)
        i += 1
    return p


@lru_cache(maxsize=1)
def metadata() -> dict:
    out = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"],
                         cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@lru_cache(maxsize=1)
def build() -> tuple[str, str]:
    """The workspace's test binaries, built with FEATURES (fresh after `cargo nextest run`), as
    nextest's reuse-build files: every listing after this one runs the binaries, no cargo."""
    tmp = Path(tempfile.mkdtemp(prefix="docs-truth-"))
    bins, meta = tmp / "binaries.json", tmp / "cargo-metadata.json"
    out = subprocess.run(
        ["cargo", "nextest", "list", "--workspace", "--locked", "--features", FEATURES,
         "--list-type", "binaries-only", "--message-format", "json"],
        cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    bins.write_text(out.stdout)
    out = subprocess.run(["cargo", "metadata", "--format-version", "1", "--locked"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    meta.write_text(out.stdout)
    return str(bins), str(meta)


@lru_cache(maxsize=None)
def listed(filtersets: tuple[str, ...], names: tuple[str, ...], ignored: str) -> int:
    """How many tests `cargo nextest list` selects, over the whole workspace built with
    FEATURES (so that nothing is built again for a doc's `-p`)."""
    bins, meta = build()
    args = ["cargo", "nextest", "list", "--binaries-metadata", bins, "--cargo-metadata", meta,
            "--message-format", "json", "--run-ignored", ignored]
    for f in filtersets:
        args += ["-E", f]
    args += ["--", *names] if names else []
    out = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise AssertionError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "cargo nextest list failed")
    data = json.loads(out.stdout)
    return sum(
        1
        for suite in data["rust-suites"].values()
        for case in suite["testcases"].values()
        if case["filter-match"]["status"] == "matches"
    )


def check_command(m: Mention) -> list[str]:
    p = parse(m)
    problems = []
    packages = {pkg["name"]: pkg for pkg in metadata()["packages"]}
    for name in p.packages:
        if name not in packages:
            problems.append(f"{m.where()}: `-p {name}`: no such package (the workspace has {', '.join(sorted(packages))})")
    scope_pkgs = [packages[n] for n in p.packages if n in packages] or list(packages.values())
    test_targets = {t["name"] for pkg in scope_pkgs for t in pkg["targets"] if "test" in t["kind"]}
    for t in p.tests:
        if t not in test_targets:
            problems.append(
                f"{m.where()}: `--test {t}`: no such test binary (there are: {', '.join(sorted(test_targets))}; "
                f"a module is selected with -E 'test(/^{t}::/)')"
            )
    if problems:
        return problems
    scope = []
    if p.packages and not p.workspace:
        scope.append(" | ".join(f"package({n})" for n in p.packages))
    if p.tests:
        scope.append(" | ".join(f"(kind(test) & binary({t}))" for t in p.tests))
    if p.lib:
        scope.append("kind(lib)")
    names = list(p.names)
    if p.exact and names:
        scope.append(" | ".join(f"test(={n})" for n in names))
        names = []
    base = " & ".join(f"({s})" for s in scope)
    filtersets = [f"{base} & ({f})" if base else f for f in p.filtersets] or ([base] if base else [])
    try:
        n = listed(tuple(filtersets), tuple(names), {"only": "only", "all": "all"}.get(p.ignored or "", "default"))
    except AssertionError as e:
        return [f"{m.where()}: `{m.text}`: {e}"]
    if n == 0:
        token = " ".join([*(f"-E '{f}'" for f in p.filtersets), *p.names]) or m.text
        problems.append(f"{m.where()}: `{m.text}`: {token} selects no test")
    return problems


def test_documented_test_commands_select_tests() -> None:
    found = commands()
    assert len(found) > 20, f"only {len(found)} commands found: the extraction is broken"
    build()
    with ThreadPoolExecutor(max_workers=4) as pool:  # each listing mostly waits on processes
        problems = [p for ps in pool.map(check_command, found) for p in ps]
    assert not problems, "test commands in the docs that select nothing:\n" + "\n".join(problems)


def path_mentions() -> Iterator[tuple[Mention, Path]]:
    """Repository paths in code spans and blocks, and relative link targets, with the file
    they must exist in (the repository root, or the page's directory for links)."""
    for path in doc_files():
        rel = str(path.relative_to(REPO))
        text = path.read_text()
        for line, span, block in spans(path):
            # A VAR=value assignment names what a command makes (FUZZ_CORPUS_DIR=fuzz/corpus).
            span = re.sub(r"\b[A-Z_]+=\S+", " ", span)
            for word in re.split(r"[\s`'\"(),=]+", span):
                word = word.rstrip(".:;")
                if not word.startswith(ROOTS) or any(c in word for c in "*<>{}$[]|~") or "..." in word:
                    continue
                # A placeholder component (fuzz/seeds/NAME/) or another repository's path.
                if re.search(r"/[A-Z][A-Z_]+(/|\.|$)", word) or word.rstrip("/") in FOREIGN:
                    continue
                word = re.sub(r":\d+(-\d+)?$", "", word).split("#")[0]
                if word.startswith(("crates/*/",)) or word.endswith("/NAME.rs"):
                    continue
                yield Mention(rel, line, word), REPO
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1).split("#")[0]
            if not target or re.match(r"^[a-z]+:", target):
                continue
            line = text.count("\n", 0, m.start()) + 1
            yield Mention(rel, line, target), path.parent


def test_documented_paths_exist() -> None:
    problems = []
    for m, base in path_mentions():
        target = (base / m.text).resolve()
        if target.exists():
            continue
        repo_rel = str(target.relative_to(REPO)) if target.is_relative_to(REPO) else m.text
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", repo_rel], cwd=REPO)
        if repo_rel.startswith("target/") or ignored.returncode == 0:
            continue  # made by a build or a run (target/, docker/prebuilt/)
        problems.append(f"{m.where()}: `{m.text}` does not exist")
    assert not problems, "paths in the docs that do not exist:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "text,wanted",
    [
        ("cargo nextest run -p lastcall-spoa --test hostile", "`--test hostile`: no such test binary"),
        ("cargo nextest run -p lastcall-turn -E 'test(/^no_such_module::/)'", "selects no test"),
        ("cargo nextest run -p lastcall-nope", "`-p lastcall-nope`: no such package"),
    ],
)
def test_a_wrong_command_is_named(text: str, wanted: str) -> None:
    problems = check_command(Mention("docs/x.md", 7, text))
    assert problems and problems[0].startswith("docs/x.md:7: ") and wanted in problems[0], problems


# --- docs/development.md's crate map against the tree ------------------------------------

DEVELOPMENT = REPO / "docs" / "development.md"


def crate_sections() -> dict[str, list[str]]:
    """Each `The modules of `crates/NAME`` section: the backticked names in its table's first
    column (`a::b`, `a/b` and file names alike)."""
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in DEVELOPMENT.read_text().splitlines():
        m = re.match(r"The modules of `crates/([a-z-]+)`", line)
        if m:
            current = m.group(1)
            sections[current] = []
        elif current and line.startswith("| ") and not line.startswith("| module") and not line.startswith("|---"):
            first = line.split("|")[1]
            sections[current].extend(re.findall(r"`([^`]+)`", first))
        elif current and sections[current] and not line.startswith("|"):
            current = None
    return sections


def module_files(crate: str) -> dict[str, Path]:
    """A crate's modules under src/ by path (`engine::conn`), lib.rs and main.rs left out; a
    test module (`tests.rs`, or a file under a `tests/` directory) is its parent's."""
    src = REPO / "crates" / crate / "src"
    out: dict[str, Path] = {}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src)
        if rel.as_posix() in ("lib.rs", "main.rs"):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "mod":
            parts = parts[:-1]
        if len(parts) > 1 and ("tests" in parts[:-1] or parts[-1] == "tests"):
            continue
        out["::".join(parts)] = f
    return out


def normalize(name: str) -> str:
    return name.removesuffix(".rs").replace("/", "::")


@pytest.mark.parametrize("crate", sorted(p.name for p in (REPO / "crates").iterdir() if (p / "src").is_dir()))
def test_the_crate_map_lists_every_module_and_no_other(crate: str) -> None:
    sections = crate_sections()
    assert crate in sections, f"docs/development.md has no `The modules of `crates/{crate}`` section"
    listed = {normalize(n) for n in sections[crate]}
    tree = module_files(crate)
    missing = sorted(m for m in tree if m not in listed)
    stale = sorted(
        n for n in listed
        if n not in tree
        and n not in ("main", "lib", f"lastcall_{crate}".replace("-", "_"), "lastcall_modsec")
        and not any(
            (REPO / "crates" / crate / d / (n.replace("::", "/") + ".rs")).exists() for d in ("", "src")
        )
    )
    assert not missing, f"docs/development.md, crates/{crate}: modules not in the map: {missing}"
    assert not stale, f"docs/development.md, crates/{crate}: the map names modules that are not there: {stale}"


def test_the_crate_map_check_names_a_missing_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a map whose `engine::down` row names another module misses it."""
    text = DEVELOPMENT.read_text().replace("| `engine::down` |", "| `engine::dawn` |")
    assert text != DEVELOPMENT.read_text(), "the map has no engine::down row"
    copy = tmp_path / "development.md"
    copy.write_text(text)
    monkeypatch.setattr(__import__(__name__), "DEVELOPMENT", copy)
    with pytest.raises(AssertionError, match=r"not in the map: \[.*'engine::down'"):
        test_the_crate_map_lists_every_module_and_no_other("spoa")

"""A corazawaf chart user translating their values: every key of that chart's values
(tests/charts/fixtures/corazawaf-values-keys.yaml, written by hand from its values.yaml) is
either mapped to a key of this chart that renders, or refused by the schema as they wrote it
(never silently ignored), and docs/coming-from-coraza-spoa.md's table names each one with
its replacement."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from chartlib import REPO, render

KEYS: dict[str, dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "corazawaf-values-keys.yaml").read_text()
)
DOC = REPO / "docs" / "coming-from-coraza-spoa.md"


def nested(path: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    d = out
    parts = path.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = copy.deepcopy(value)
    return out


def deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_the_fixture_covers_their_chart() -> None:
    # Every top-level key of their values.yaml (December 2026), and each entry is one of the two.
    top = {k.split(".")[0] for k in KEYS}
    assert top == {
        "image", "imagePullSecrets", "nameOverride", "fullnameOverride", "namespaceOverride",
        "replicaCount", "podAnnotations", "podLabels", "podSecurityContext", "securityContext",
        "serviceAccount", "autoscaling", "podDisruptionBudget", "resources", "livenessProbe",
        "readinessProbe", "nodeSelector", "tolerations", "affinity", "topologySpreadConstraints",
        "priorityClassName", "terminationGracePeriodSeconds", "volumes", "volumeMounts",
        "initContainers", "sidecarContainers", "metrics", "service", "config", "rules",
        "addChecksumConfigAnnotation", "daemonSet", "verticalPodAutoscaler",
    }  # fmt: skip
    for key, entry in KEYS.items():
        assert ("ours" in entry) != ("refused" in entry), key


@pytest.mark.parametrize("key", [k for k, e in KEYS.items() if "ours" in e])
def test_mapped_key_renders(key: str) -> None:
    entry = KEYS[key]
    values = deep_merge(entry.get("with", {}), nested(entry["ours"], entry["value"]))
    r = render("lastcall-spoa", values)
    assert r.workload()


@pytest.mark.parametrize("key", [k for k, e in KEYS.items() if "refused" in e])
def test_refused_key_is_refused_as_written(key: str) -> None:
    """Their key at their path: the schema refuses it (a value this chart ignored would be a
    setting the user believes in and does not have)."""
    sample: Any = {"x": 1} if key in ("livenessProbe", "readinessProbe") else "x"
    with pytest.raises(Exception, match="(?i)schema"):
        render("lastcall-spoa", nested(key, sample))


def test_migration_table_names_every_key() -> None:
    text = DOC.read_text()
    section = text.split("## From the corazawaf chart to this chart", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", section, flags=re.S)))
    missing = [k for k in KEYS if k not in named]
    assert not missing, f"keys not in the migration table: {missing}"
    for key, entry in KEYS.items():
        if "refused" in entry:
            (row,) = [line for line in section.splitlines() if f"`{key}`" in line and line.startswith("|")]
            replacement = entry["refused"]
            assert replacement in row, f"{key}: the row does not name {replacement}: {row}"


def test_log_file_and_memory_target_render() -> None:
    r = render(
        "lastcall-spoa",
        {
            "agent": {"config": {"log_file": "/dev/stderr", "applications": [{"name": "default"}]}},
            "autoscaling": {"enabled": True, "targetMemoryUtilizationPercentage": 75},
        },
    )
    cfg = yaml.safe_load(r.one("ConfigMap", "-agent")["data"]["config.yaml"])
    assert cfg["log_file"] == "/dev/stderr"
    metrics = {m["resource"]["name"]: m["resource"]["target"]["averageUtilization"] for m in r.one("HorizontalPodAutoscaler")["spec"]["metrics"]}
    assert metrics == {"cpu": 70, "memory": 75}
    plain = render("lastcall-spoa", {"autoscaling": {"enabled": True}})
    assert [m["resource"]["name"] for m in plain.one("HorizontalPodAutoscaler")["spec"]["metrics"]] == ["cpu"]

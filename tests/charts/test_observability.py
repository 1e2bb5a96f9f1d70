"""The dashboards and alert rules both charts ship (charts/*/files/): rendered by the opt-in
templates grafana-dashboard.yaml and prometheusrule.yaml byte for byte (no second copy can
drift), valid for Kubernetes, the rules accepted by `promtool check rules` as a file and as
rendered, and their promtool unit tests (tests/rules/*.test.yaml) passing. Which metric names
they use is checked against real daemons by the Rust tests (crates/demo/tests/demo.rs,
crates/turn/tests/turn/dashboards.rs)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from chartlib import CHARTS, K8S_VERSIONS, REPO, render, validate

CHARTS_NAMES = ("lastcall-spoa", "lastcall-turn")
ON = {"grafanaDashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}


def promtool() -> str:
    binary = shutil.which("promtool")
    assert binary, "promtool is not installed (Debian's prometheus package: bash scripts/setup.sh)"
    return binary


def files(chart: str) -> Path:
    return CHARTS / chart / "files"


def rule_files(chart: str) -> list[Path]:
    """The rule files a chart ships (each a rule file on its own)."""
    return sorted(files(chart).glob("prometheus-rules*.yaml"))


def rules(chart: str) -> list[dict[str, Any]]:
    return [r for path in rule_files(chart) for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def recorded_names(expr: str) -> set[str]:
    return set(re.findall(r"\b([a-zA-Z_]+:[a-zA-Z0-9_:]+)\b", expr))


@pytest.mark.parametrize("chart", CHARTS_NAMES)
def test_off_by_default(chart: str) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in render(chart, {}).objects}
    assert not [k for k in kinds if k[0] == "PrometheusRule"], kinds
    assert not [k for k in kinds if k[1].endswith("-dashboard")], kinds


@pytest.mark.parametrize("chart", CHARTS_NAMES)
def test_dashboard_configmap_is_the_file(chart: str) -> None:
    r = render(chart, ON)
    cm = r.one("ConfigMap", "-dashboard")
    assert cm["metadata"]["name"] == f"rel-{chart}-dashboard"
    assert cm["metadata"]["namespace"] == "ns"
    # The label Grafana's dashboard sidecar selects on by default.
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["app.kubernetes.io/instance"] == "rel"
    text = (files(chart) / "grafana-dashboard.json").read_text()
    assert list(cm["data"]) == [f"{chart}.json"]
    assert cm["data"][f"{chart}.json"] == text.rstrip("\n"), "the ConfigMap differs from the file"
    dash = json.loads(cm["data"][f"{chart}.json"])
    assert dash["uid"] == chart and dash["title"] == chart
    for version in K8S_VERSIONS:
        validate(cm, version)


@pytest.mark.parametrize("chart", CHARTS_NAMES)
def test_dashboard_labels_annotations_namespace(chart: str) -> None:
    values = {
        "grafanaDashboard": {
            "enabled": True,
            "labels": {"grafana_dashboard": None, "dashboards": "lastcall"},
            "annotations": {"grafana_folder": "lastcall"},
            "namespace": "monitoring",
        }
    }
    cm = render(chart, values).one("ConfigMap", "-dashboard")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["dashboards"] == "lastcall"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["annotations"] == {"grafana_folder": "lastcall"}


def dashboard_panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


@pytest.mark.parametrize("chart", CHARTS_NAMES)
def test_dashboard_is_well_formed(chart: str) -> None:
    """Every panel has a unique id, a place on the 24-column grid that overlaps no other, the
    data source variable, and queries; every variable used is defined."""
    dash = json.loads((files(chart) / "grafana-dashboard.json").read_text())
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "namespace", "job", "instance"} <= variables
    panels = dashboard_panels(dash)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panel {p['title']!r} overlaps another at {(x, y)}"
                cells.add((x, y))
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        assert p.get("description"), f"panel {p['title']!r} has no description"
        for t in p["targets"]:
            for var in re.findall(r"\$\{?(\w+)", t["expr"]):
                assert var.startswith("__") or var in variables, f"{p['title']}: ${var} undefined"


@pytest.mark.parametrize("chart", CHARTS_NAMES)
def test_prometheusrule_is_the_file(chart: str, tmp_path: Path) -> None:
    values = {
        "prometheusRule": {
            "enabled": True,
            "labels": {"release": "kube-prometheus-stack"},
            "additionalRules": [
                {"alert": "MyOwn", "expr": "lastcall_sessions > 1000", "for": "5m", "labels": {"severity": "info"}}
            ],
        }
    }
    r = render(chart, values)
    rule = r.one("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "ns"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    from_file = yaml.safe_load((files(chart) / "prometheus-rules.yaml").read_text())["groups"]
    groups = rule["spec"]["groups"]
    assert groups[: len(from_file)] == from_file, "the PrometheusRule differs from the file"
    extra = [g for g in groups if g["name"] == f"rel-{chart}-additional"]
    assert extra and extra[0]["rules"] == values["prometheusRule"]["additionalRules"]
    # What the Prometheus Operator hands Prometheus is a rule file of these groups.
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump({"groups": groups}))
    out = subprocess.run([promtool(), "check", "rules", str(rendered)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("chart", CHARTS_NAMES)
def test_promtool_checks_the_file(chart: str) -> None:
    """Each shipped rule file on its own: promtool accepts it, and every recorded series an
    expression reads (a `name:with:colons`) is recorded in the same file."""
    alerts = []
    for path in rule_files(chart):
        out = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        groups = yaml.safe_load(path.read_text())["groups"]
        recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
        for g in groups:
            for rule in g["rules"]:
                needed = recorded_names(rule["expr"])
                assert needed <= recorded, f"{path.name}: {rule.get('alert') or rule.get('record')} reads {needed - recorded}, recorded elsewhere"
                if "alert" not in rule:
                    continue
                alerts.append(rule["alert"])
                assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
                assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
    assert len(alerts) >= 5, alerts


def test_the_check_sees_a_recording_rule_from_elsewhere() -> None:
    """The check above can fail: the quota alert without its recording rule reads a series
    recorded nowhere in its file."""
    (alert,) = [r for r in rules("lastcall-turn") if r.get("alert") == "LastcallTurnAllocationQuotaNearLimit"]
    assert recorded_names(alert["expr"]) == {"lastcall_turn:total_quota"}


@pytest.mark.parametrize("chart", CHARTS_NAMES)
def test_promtool_unit_tests(chart: str) -> None:
    """Every alert of the file fires in tests/rules/CHART.test.yaml, and is also seen not to."""
    test = REPO / "tests" / "rules" / f"{chart}.test.yaml"
    out = subprocess.run(
        [promtool(), "test", "rules", test.name], cwd=test.parent, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    alerts = {r["alert"] for r in rules(chart) if "alert" in r}
    assert set(yaml.safe_load(test.read_text())["rule_files"]) == {
        f"../../charts/{chart}/files/{p.name}" for p in rule_files(chart)
    }
    cases = [c for t in yaml.safe_load(test.read_text())["tests"] for c in t.get("alert_rule_test", [])]
    fired = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert alerts == fired, f"alerts never seen firing: {alerts - fired}"
    assert alerts == quiet, f"alerts never seen quiet: {alerts - quiet}"


@pytest.mark.parametrize("chart", CHARTS_NAMES)
def test_runbook_links_exist(chart: str) -> None:
    """Each rule's runbook is a heading of docs/operations.md."""
    doc = (REPO / "docs" / "operations.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", doc, flags=re.M)
    }
    for rule in rules(chart):
        if "alert" in rule:
            page, _, anchor = rule["annotations"]["runbook"].partition("#")
            assert page == "docs/operations.md", rule["alert"]
            assert anchor in anchors, f"{rule['alert']}: no heading for #{anchor} in docs/operations.md"


def test_turn_quota_recording_rule() -> None:
    """turn.totalQuota (or prometheusRule.totalQuota) renders prometheus-rules-quota.yaml's group
    with lastcall_turn:total_quota set for the ServiceMonitor's targets (namespace, service) and
    the alert unchanged; no quota, no group."""

    def quota_group(values: dict[str, Any]) -> list[dict[str, Any]]:
        r = render("lastcall-turn", values)
        groups = r.one("PrometheusRule")["spec"]["groups"]
        return [g for g in groups if g["name"] == "rel-lastcall-turn-quota"]

    assert quota_group({"prometheusRule": {"enabled": True}}) == []
    on = {"enabled": True}
    (g,) = quota_group({"prometheusRule": on, "turn": {"totalQuota": 500}})
    r = render("lastcall-turn", {"prometheusRule": on, "turn": {"totalQuota": 500}, "service": {"enabled": True}})
    service = r.one("Service", "-headless")["metadata"]["name"]
    (from_file,) = yaml.safe_load((files("lastcall-turn") / "prometheus-rules-quota.yaml").read_text())["groups"]
    record, *alerts = g["rules"]
    assert record == {
        "record": "lastcall_turn:total_quota",
        "expr": "vector(500)",
        "labels": {"namespace": "ns", "service": service},
    }
    assert alerts == from_file["rules"][1:], "the quota alert differs from the file"
    (g,) = quota_group({"prometheusRule": {**on, "totalQuota": 40}, "turn": {"totalQuota": 500}})
    assert g["rules"][0]["expr"] == "vector(40)"
    assert quota_group({"prometheusRule": {**on, "totalQuota": 0}, "turn": {"totalQuota": 500}}) == []


@pytest.mark.parametrize("chart", CHARTS_NAMES)
@pytest.mark.parametrize(
    "values",
    [
        {"grafanaDashboard": {"enabled": "yes"}},
        {"grafanaDashboard": {"labels": {"a": 1}}},
        {"grafanaDashboard": {"folder": "x"}},
        {"prometheusRule": {"rules": []}},
        {"prometheusRule": {"additionalRules": [{"expr": "up"}]}},
        {"prometheusRule": {"additionalRules": [{"alert": "A", "expr": "up", "severity": "x"}]}},
    ],
    ids=["enabled-not-bool", "label-not-string", "unknown-key", "rules-not-a-key", "rule-without-name", "rule-unknown-field"],
)
def test_schema_rejects(chart: str, values: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="(?i)schema|values|invalid|additional"):
        render(chart, values)

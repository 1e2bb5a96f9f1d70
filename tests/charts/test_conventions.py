"""The conventions a chart user expects, in both charts: image.digest, revisionHistoryLimit,
ServiceMonitor scrapeTimeout/relabelings/metricRelabelings, a PodMonitor,
podDisruptionBudget.minAvailable, pod labels beyond the selector's (version, part-of,
commonLabels) with the selector unchanged; the turn chart's extraContainers and
shareProcessNamespace. Each rendered, valid for the Kubernetes API, and refused by the schema
where two settings exclude each other."""

from __future__ import annotations

from typing import Any

import pytest

from chartlib import K8S_VERSIONS, all_containers, render, validate

CHARTS_NAMES = ["lastcall-spoa", "lastcall-turn"]
DIGEST = "sha256:" + "0123456789abcdef" * 4

# Every workload kind each chart renders.
WORKLOADS = {
    "lastcall-spoa": [{}, {"daemonSet": {"enabled": True}}, {"mode": "sidecar"}],
    "lastcall-turn": [{}, {"kind": "StatefulSet"}],
}


def refused(chart: str, values: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="(?i)schema"):
        render(chart, values)


def valid(r: Any) -> None:
    for obj in r.objects:
        for v in K8S_VERSIONS:
            validate(obj, v)


@pytest.mark.parametrize("chart", CHARTS_NAMES)
def test_image_digest(chart: str) -> None:
    image = chart.replace("lastcall-", "lastcall/lastcall-")
    for base in WORKLOADS[chart]:
        plain = render(chart, base)
        pinned = render(chart, {**base, "image": {"tag": "1.2.3", "digest": DIGEST}})
        ours = [c["image"] for c in all_containers(plain.pod_spec()) if c["image"].startswith(image)]
        assert ours and all(i == f"{image}:0.1.0" for i in ours), ours
        pinned_images = [c["image"] for c in all_containers(pinned.pod_spec()) if c["image"].startswith(image)]
        assert pinned_images == [f"{image}:1.2.3@{DIGEST}"] * len(ours)
    refused(chart, {"image": {"digest": "sha256:abc"}})
    refused(chart, {"image": {"digest": "latest"}})


@pytest.mark.parametrize("chart", CHARTS_NAMES)
def test_revision_history_limit(chart: str) -> None:
    for base in WORKLOADS[chart]:
        assert render(chart, base).workload()["spec"]["revisionHistoryLimit"] == 10
        r = render(chart, {**base, "revisionHistoryLimit": 3})
        assert r.workload()["spec"]["revisionHistoryLimit"] == 3
        valid(r)
    refused(chart, {"revisionHistoryLimit": -1})


@pytest.mark.parametrize("chart", CHARTS_NAMES)
@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
def test_monitors(chart: str, monitor: str) -> None:
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]
    drop = [{"sourceLabels": ["__name__"], "regex": "go_.*", "action": "drop"}]
    values = {
        "metrics": {
            monitor: {
                "enabled": True,
                "interval": "15s",
                "scrapeTimeout": "10s",
                "labels": {"release": "prom"},
                "relabelings": relabel,
                "metricRelabelings": drop,
            }
        }
    }
    r = render(chart, values)
    kind = monitor[0].upper() + monitor[1:]
    other = "PodMonitor" if kind == "ServiceMonitor" else "ServiceMonitor"
    assert r.of_kind(other) == []
    m = r.one(kind)
    assert m["metadata"]["labels"]["release"] == "prom"
    (ep,) = m["spec"]["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"]
    assert ep == {
        "port": "admin",
        "path": "/metrics",
        "interval": "15s",
        "scrapeTimeout": "10s",
        "relabelings": relabel,
        "metricRelabelings": drop,
    }
    # It finds the pods (PodMonitor) or the Service (ServiceMonitor) and their admin port.
    selector = m["spec"]["selector"]["matchLabels"]
    if kind == "PodMonitor":
        pod = r.workload()["spec"]["template"]
        assert selector.items() <= pod["metadata"]["labels"].items()
        ports = [p["name"] for c in all_containers(pod["spec"]) for p in c.get("ports", [])]
    else:
        services = [s for s in r.of_kind("Service") if s["spec"]["selector"] == selector]
        assert services
        ports = [p["name"] for s in services for p in s["spec"]["ports"]]
    assert "admin" in ports
    # Without the optional fields: only what is set.
    (ep,) = list(render(chart, {"metrics": {monitor: {"enabled": True}}}).one(kind)["spec"].values())[-1]
    assert ep == {"port": "admin", "path": "/metrics", "interval": "30s"}
    refused(chart, {"metrics": {monitor: {"enabled": True, "scrapeTimeout": "ten"}}})


@pytest.mark.parametrize("chart", CHARTS_NAMES)
def test_one_monitor_not_both(chart: str) -> None:
    refused(chart, {"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}})


@pytest.mark.parametrize("chart", CHARTS_NAMES)
def test_pdb_min_available(chart: str) -> None:
    base = {"kind": "StatefulSet"} if chart == "lastcall-turn" else {}
    (pdb,) = render(chart, base).of_kind("PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    for wanted in (1, "50%", 0):
        r = render(chart, {**base, "podDisruptionBudget": {"maxUnavailable": None, "minAvailable": wanted}})
        spec = r.one("PodDisruptionBudget")["spec"]
        assert spec["minAvailable"] == wanted and "maxUnavailable" not in spec
        valid(r)
    # Both: the schema says no.
    refused(chart, {**base, "podDisruptionBudget": {"minAvailable": 1}})
    refused(chart, {**base, "podDisruptionBudget": {"maxUnavailable": None, "minAvailable": "half"}})


def test_no_pdb_for_a_daemonset() -> None:
    """A node drain does not evict DaemonSet pods: neither chart renders a budget for one."""
    assert render("lastcall-spoa", {"daemonSet": {"enabled": True}}).of_kind("PodDisruptionBudget") == []
    assert render("lastcall-turn", {"kind": "DaemonSet"}).of_kind("PodDisruptionBudget") == []
    assert render("lastcall-spoa", {"mode": "sidecar"}).of_kind("PodDisruptionBudget")


@pytest.mark.parametrize("chart", CHARTS_NAMES)
def test_labels(chart: str) -> None:
    for base in WORKLOADS[chart]:
        plain = render(chart, base)
        r = render(chart, {**base, "commonLabels": {"team": "edge", "cost-center": "42"}, "podLabels": {"p": "1"}})
        w = r.workload()
        # The selector (immutable on a live workload) is the same as without any of them.
        assert w["spec"]["selector"] == plain.workload()["spec"]["selector"]
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/version"] == "0.1.0"
        assert labels["app.kubernetes.io/part-of"] == "lastcall"
        assert labels["team"] == "edge" and labels["cost-center"] == "42" and labels["p"] == "1"
        assert w["spec"]["selector"]["matchLabels"].items() <= labels.items()
        for obj in r.objects:
            got = obj["metadata"]["labels"]
            assert got["team"] == "edge" and got["app.kubernetes.io/part-of"] == "lastcall", obj["kind"]
        valid(r)
    refused(chart, {"commonLabels": {"app.kubernetes.io/instance": "other"}})
    refused(chart, {"commonLabels": {"app.kubernetes.io/version": "9"}})
    refused(chart, {"commonLabels": {"n": 1}})


def test_turn_extra_containers_and_shared_process_namespace() -> None:
    reloader = {
        "name": "cert-reloader",
        "image": "example/reloader:1",
        "args": ["--watch=/etc/lastcall-turn/tls", "--signal=SIGUSR2", "--process=lastcall-turn"],
        "volumeMounts": [{"name": "tls", "mountPath": "/etc/lastcall-turn/tls", "readOnly": True}],
        "securityContext": {"runAsUser": 65532, "allowPrivilegeEscalation": False},
    }
    plain = render("lastcall-turn", {})
    assert "shareProcessNamespace" not in plain.pod_spec()
    assert [c["name"] for c in plain.pod_spec()["containers"]] == ["turn"]
    for kind in ("DaemonSet", "StatefulSet"):
        r = render(
            "lastcall-turn",
            {
                "kind": kind,
                "tls": {"enabled": True, "existingSecret": "turn-tls"},
                "extraContainers": [reloader],
                "shareProcessNamespace": True,
            },
        )
        spec = r.pod_spec()
        assert spec["shareProcessNamespace"] is True
        assert [c["name"] for c in spec["containers"]] == ["turn", "cert-reloader"]
        assert spec["containers"][1] == reloader
        valid(r)
    refused("lastcall-turn", {"shareProcessNamespace": "yes"})
    refused("lastcall-turn", {"extraContainers": {"name": "x"}})

"""Probes that keep each pod's rollout short, in every rendering of both charts: each
container has a startup probe asked every second (so a new pod is seen started within a
second of binding its port, whatever the kubelet version), with a budget of at least a
minute for slow starts (the CRS compiles on a busy node); readiness and liveness, which the
kubelet holds back until the startup probe has passed, on the same port; readiness asked
at least every 2 s, so even a kubelet that waits for the next period after the startup
probe passes sees the pod Ready within startup + readiness period = 3 s; and liveness that
cannot kill a container during the chart's own budget for a drain's slow moments (3
failures 10 s apart).

The tests in tests/cri measure the real figure: the time from a container's start to the
pod being Ready, through containerd's CRI with a kubelet-like prober."""

from __future__ import annotations

from typing import Any

import pytest

from chartlib import all_containers, render

RENDERINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "spoa-standalone": ("lastcall-spoa", {}),
    "spoa-sidecar-native": ("lastcall-spoa", {"mode": "sidecar"}),
    "spoa-sidecar-classic": ("lastcall-spoa", {"mode": "sidecar", "sidecar": {"native": False}}),
    "turn-daemonset": ("lastcall-turn", {}),
    "turn-statefulset": ("lastcall-turn", {"kind": "StatefulSet"}),
}
STARTUP_PERIOD = 1
STARTUP_BUDGET = 60
READINESS_PERIOD = 2


def port_of(probe: dict[str, Any]) -> Any:
    handler = probe.get("httpGet") or probe.get("tcpSocket")
    assert handler, f"probe without httpGet or tcpSocket: {probe}"
    return handler["port"]


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_every_container_has_a_fast_startup_probe(name: str) -> None:
    chart, values = RENDERINGS[name]
    for c in all_containers(render(chart, values).pod_spec()):
        startup, ready, live = c.get("startupProbe"), c.get("readinessProbe"), c.get("livenessProbe")
        assert startup and ready and live, f"{name}/{c['name']}: startup, readiness and liveness probes expected"
        assert startup.get("periodSeconds") == STARTUP_PERIOD, f"{name}/{c['name']}: startupProbe {startup}"
        assert startup["periodSeconds"] * startup["failureThreshold"] >= STARTUP_BUDGET, (
            f"{name}/{c['name']}: a start may take {STARTUP_BUDGET} s on a busy node")
        assert startup.get("initialDelaySeconds", 0) == 0 and ready.get("initialDelaySeconds", 0) == 0
        assert port_of(startup) == port_of(ready), f"{name}/{c['name']}: startup and readiness on other ports"
        assert ready["periodSeconds"] <= READINESS_PERIOD, f"{name}/{c['name']}: readiness every {ready['periodSeconds']} s"
        assert STARTUP_PERIOD + ready["periodSeconds"] <= 3
        assert live["periodSeconds"] * live.get("failureThreshold", 3) >= 30, f"{name}/{c['name']}: a hasty liveness probe"


def test_turn_startup_probe_values_are_used() -> None:
    """The TURN chart's `probes.startup` values reach the pod (and the schema takes them)."""
    c = next(all_containers(render("lastcall-turn", {"probes": {"startup": {
        "periodSeconds": 2, "timeoutSeconds": 3, "failureThreshold": 90}}}).pod_spec()))
    assert c["startupProbe"] == {"httpGet": {"path": "/readyz", "port": "admin"}, "periodSeconds": 2,
                                 "timeoutSeconds": 3, "failureThreshold": 90}

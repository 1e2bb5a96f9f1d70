"""lastcall-spoa's sidecar pod (HAProxy + agent), as the chart renders it, through
containerd's CRI: HAProxy from Debian 13's haproxy package (docker/haproxy.Dockerfile,
STOPSIGNAL SIGUSR1 like the official image) and the agent image, in one pod network
namespace, the rendered haproxy.cfg and spoe.cfg from the ConfigMap volume, the probes,
the rendered grace period and security context (both as uid 65532, read-only root).

Two replicas behind a Service, the Service being the load's choice of a ready endpoint for
each new connection, as the endpoints reach it one second late (kube-proxy's lag), rolled
(maxSurge 1, maxUnavailable 0) under load, in both sidecar modes:

- native (an init container with restartPolicy Always): the kubelet starts HAProxy only
  after the agent's startup probe passed, and stops the agent only after HAProxy exited;
- classic (a second container, `--on-sigterm linger`): both are stopped at once and the
  agent serves HAProxy until HAProxy has closed its connections to it.

0 failed requests; HAProxy and the agent exit 0 in the right order, well before SIGKILL."""

from __future__ import annotations

import random
from typing import Any, Iterator

import pytest

from chartlib import render
from cluster import CriCluster
from controllers import Deployment, Endpoints
from enginelib import HAPROXY_IMAGE, assert_runs_as_rendered, measured
from loadlib import PROCESSING, Load, Origin
from nodes import Cluster

DELAY = 2


def values(native: bool, origin: int, **extra: Any) -> dict[str, Any]:
    repository, tag = HAPROXY_IMAGE.split(":")
    return {
        "mode": "sidecar",
        "gracefulTermination": {"shutdownDelaySeconds": DELAY, "drainTimeoutSeconds": 20},
        "sidecar": {"native": native, "replicaCount": 2, "agentExitSeconds": 3,
                    "haproxy": {"image": {"repository": repository, "tag": tag},
                                "timeouts": {"processing": PROCESSING},
                                "backendServers": [{"name": "app", "address": f"{Cluster.EDGE}:{origin}"}]}},
        **extra,
    }


@pytest.fixture()
def origin(cluster: CriCluster) -> Iterator[Origin]:
    o = Origin(cluster.edge, host=Cluster.EDGE)
    yield o
    o.close()


@pytest.mark.parametrize("mode", ["native", "classic"])
def test_sidecar_pods_roll_under_load_without_a_failed_request(cluster: CriCluster, origin: Origin, mode: str) -> None:
    native = mode == "native"
    first = render("lastcall-spoa", values(native, origin.port))
    second = render("lastcall-spoa", values(native, origin.port, podAnnotations={"rollout": "2"}))
    endpoints = Endpoints(cluster.timeline, f"edge-{mode}", lag=1.0)
    deployment = Deployment(f"edge-{mode}", cluster.kubelets, cluster.timeline, endpoints)
    rng = random.Random(7)
    edge = cluster.edge

    def service() -> tuple[str | None, str, int]:
        view = endpoints.current()
        assert view, "no ready endpoint"
        return edge, rng.choice(view).ip, 8080

    load = None
    try:
        old = deployment.create(first)
        if native:  # HAProxy started only once the agent's startup probe had passed
            for pod in old:
                agent_up = next(t for t, who, what in cluster.timeline.events
                                if who == pod.who and what == "agent: startup probe passed")
                haproxy_start = next(t for t, who, what in cluster.timeline.events
                                     if who == pod.who and what.startswith("haproxy: started"))
                assert agent_up <= haproxy_start, cluster.timeline.text()
        for name in ("haproxy", "agent"):  # both processes run as the pod's securityContext says
            assert_runs_as_rendered(old[0].pid(name), old[0].spec, old[0].runs[name].spec)
        endpoints.wait_for(lambda v: len(v) == 2)
        load = Load(service, workers=4)
        load.wait_sent(200)
        new = deployment.rollout(second)
        load.wait_sent(load.sent() + 200)
        counts = load.stop()
    finally:
        if load is not None:
            load.stop()
        endpoints.stop()
    timeline = cluster.timeline.text()
    assert counts.failed == 0, f"{load.summary()}\n{timeline}"
    assert counts.blocked > 0 and counts.passed > 0, load.summary()
    report = []
    for pod in old:
        h, a = pod.runs["haproxy"], pod.runs["agent"]
        for run in (h, a):
            assert run.exit_code == 0, f"{pod.who} {run.spec.name}: exit {run.exit_code} ({run.reason})\n{pod.describe()}\n{timeline}"
            assert run.exited_at - pod.deleted_at < pod.spec.grace, f"{pod.who} {run.spec.name}: SIGKILL would come first"  # type: ignore[operator]
        assert h.stop_sent_at is not None and a.stop_sent_at is not None
        if native:
            assert a.stop_sent_at >= h.exited_at, "the native sidecar was stopped before HAProxy had exited"  # type: ignore[operator]
        else:
            assert abs(a.stop_sent_at - h.stop_sent_at) < 1.0, "a classic pod's containers are stopped together"
            # Lingering: it served HAProxy through HAProxy's `grace` (new requests still
            # taken), then left once HAProxy had closed its SPOP connections.
            assert a.exited_at >= a.stop_sent_at + DELAY - 0.2, "the lingering agent left during HAProxy's grace"  # type: ignore[operator]
        report.append(f"{pod.who}: HAProxy exit 0 {h.exited_at - pod.deleted_at:.1f} s, agent signalled "  # type: ignore[operator]
                      f"{a.stop_sent_at - pod.deleted_at:.1f} s, exit 0 {a.exited_at - pod.deleted_at:.1f} s "  # type: ignore[operator]
                      "after deletion")
    for pod in new:
        assert all(r.restarts == 0 for r in pod.runs.values())
        first_start = min(r.started_at for r in pod.runs.values())
        report.append(f"{pod.who} ready {pod.ready_at - first_start:.2f} s after its first container started")  # type: ignore[operator]
    measured(f"cri spoa sidecar pods ({mode}) rolled under load: {load.summary()}; " + "; ".join(report))

"""lastcall-spoa's standalone Deployment, as the chart renders it, through containerd's CRI
on the two test hosts (pod network: each agent its own address from its node's pod range),
behind an HAProxy on the edge host set up as the chart's NOTES say (one server per agent,
`option spop-check`, `inter 1s fall 2 rise 1`, fail-closed). The Service's endpoints reach
HAProxy the way its DNS resolution of the headless Service would: a server gets a ready
agent's address, and goes to MAINT when the agent leaves the endpoints, one second late
(Endpoints.lag), through HAProxy's runtime API.

A rollout (maxSurge 1, maxUnavailable 0) under a steady load of benign requests and
attacks: 0 failed requests, the WAF's verdicts all through; every old agent exits 0 after
its shutdown delay, once HAProxy has closed its connections, well before SIGKILL."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

import netns
from chartlib import render
from cluster import CriCluster
from controllers import Deployment, Endpoints
from enginelib import assert_runs_as_rendered, measured
from kubelet import Pod, wait_until
from loadlib import Load, Origin, haproxy_config, spoe_config

DELAY = 2
VALUES = {"replicaCount": 2, "gracefulTermination": {"shutdownDelaySeconds": DELAY, "drainTimeoutSeconds": 20}}
SLOTS = 8


class EdgeHAProxy:
    """Debian's HAProxy on the edge host; its agent servers follow the endpoints."""

    def __init__(self, edge: str, tmp: Path, origin: int):
        binary = shutil.which("haproxy")
        assert binary, "haproxy is not installed (scripts/setup.sh installs it)"
        self.sock = tmp / "haproxy.sock"
        (tmp / "spoe.cfg").write_text(spoe_config())
        self.port = netns.free_port_in(edge)
        (tmp / "haproxy.cfg").write_text(haproxy_config(f"127.0.0.1:{self.port}", f"127.0.0.1:{origin}", [],
                                                        str(tmp / "spoe.cfg"), str(self.sock), template=SLOTS))
        self.log = tmp / "haproxy.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([*netns.exec_prefix(edge), binary, "-db", "-f", str(tmp / "haproxy.cfg")],
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.slots: dict[str, int] = {}  # pod uid -> server slot (never reused)
        self.version = subprocess.run([binary, "-v"], capture_output=True, text=True).stdout.splitlines()[0]

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(self.sock))
            s.sendall(line.encode() + b"\n")
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        return out.decode()

    def sync(self, view: list[Pod]) -> None:
        """What the resolvers of a server-template do when the DNS answer changes."""
        ready = {p.uid: p for p in view}
        for uid, slot in self.slots.items():
            if uid not in ready:
                self.command(f"set server coraza-spoa/agent{slot} state maint")
        for uid, pod in ready.items():
            if uid not in self.slots:
                slot = len(self.slots) + 1
                assert slot <= SLOTS, "more agents than server slots"
                self.slots[uid] = slot
                self.command(f"set server coraza-spoa/agent{slot} addr {pod.ip} port 9000")
                self.command(f"set server coraza-spoa/agent{slot} state ready")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture()
def origin(cluster: CriCluster) -> Iterator[Origin]:
    o = Origin(cluster.edge)
    yield o
    o.close()


def evaluations(edge: str, pod: Pod) -> float:
    got = netns.http_get(edge, pod.ip, 9901, "/metrics")
    assert got and got[0] == 200, f"{pod.who} /metrics: {got}"
    line = next(ln for ln in got[1].splitlines() if ln.startswith("spoa_evaluation_duration_seconds_count "))
    return float(line.split()[1])


def test_spoa_deployment_rolls_behind_haproxy_without_a_failed_request(
        cluster: CriCluster, origin: Origin, tmp_path: Path) -> None:
    first = render("lastcall-spoa", VALUES)
    second = render("lastcall-spoa", {**VALUES, "podAnnotations": {"rollout": "2"}})
    endpoints = Endpoints(cluster.timeline, "waf", lag=1.0)
    haproxy = EdgeHAProxy(cluster.edge, tmp_path, origin.port)
    endpoints.on_change(haproxy.sync)
    deployment = Deployment("waf", cluster.kubelets, cluster.timeline, endpoints)
    load = None
    try:
        old = deployment.create(first)
        st = assert_runs_as_rendered(old[0].pid("agent"), old[0].spec, old[0].runs["agent"].spec)
        endpoints.wait_for(lambda v: len(v) == 2)
        edge = cluster.edge
        load = Load(lambda: (edge, "127.0.0.1", haproxy.port), workers=4)
        load.wait_sent(200)
        before = {p.uid: evaluations(edge, p) for p in old}
        assert all(before.values()), f"an agent got no work before the rollout: {before}"
        new = deployment.rollout(second)
        # A new pod joins HAProxy's backend once its endpoint has propagated (the lag) and
        # HAProxy's checks pass: the load goes on until each new agent has evaluated
        # something (bounded), then 200 more requests.
        wait_until("work on every new agent", lambda: all(evaluations(edge, p) for p in new),
                   timeout=60, timeline=cluster.timeline)
        load.wait_sent(load.sent() + 200)
        counts = load.stop()
        after = {p.uid: evaluations(edge, p) for p in new}
    finally:
        if load is not None:
            load.stop()
        endpoints.stop()
        haproxy.close()
    timeline = cluster.timeline.text()
    assert counts.failed == 0, f"{load.summary()}\n{haproxy.log.read_text()[-3000:]}\n{timeline}"
    assert counts.blocked > 0 and counts.passed > 0, load.summary()
    assert all(after.values()), f"a new agent got no work: {after}"
    report = []
    for pod in old:
        run = pod.runs["agent"]
        assert run.exit_code == 0, f"{pod.who}: exit {run.exit_code} ({run.reason})\n{pod.describe()}\n{timeline}"
        took = run.exited_at - pod.deleted_at  # type: ignore[operator]
        assert DELAY - 0.5 <= took < pod.spec.grace, f"{pod.who} exited {took:.2f} s after deletion"
        report.append(f"{pod.who} exit 0 {took:.1f} s after deletion")
    for pod in new:
        run = pod.runs["agent"]
        assert run.restarts == 0
        report.append(f"{pod.who} ready {pod.ready_at - run.started_at:.2f} s after start")  # type: ignore[operator]
    measured(f"cri spoa Deployment rollout behind {haproxy.version} on the edge host: {load.summary()}; "
             + "; ".join(report) + f"; agent process uid {st['Uid'].split()[0]}, groups {st['Groups']}, "
             f"CapEff {st['CapEff']}, NoNewPrivs {st['NoNewPrivs']}, Seccomp {st['Seccomp']}, read-only root")

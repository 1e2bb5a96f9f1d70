"""The controllers' side of a rollout, small and in-process, driving the kubelets of
kubelet.py: a DaemonSet (one pod per node, `updateStrategy.rollingUpdate.maxUnavailable`
nodes at a time: the old pod is deleted and gone before the new one starts, as host ports
require, then `minReadySeconds`), a Deployment (`strategy.rollingUpdate` with maxSurge and
maxUnavailable: a new pod must be ready and available before an old one is deleted), and
the ready endpoints of a Service as its consumers see them (`Endpoints`: ready and not
terminating, delivered `lag` seconds late, like kube-proxy rules or DNS records).

They read what the chart rendered (strategy, minReadySeconds, replicas, the pod template)
and nothing else; there is no API server, scheduler or EndpointSlice object
(docs/kubernetes.md, "What the CRI tests do not cover")."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from chartlib import Rendered
from kubelet import Kubelet, Pod, Timeline
from podspec import PodSpec

POLL = 0.05
READY_TIMEOUT = 180.0


def pod_spec(rendered: Rendered, extra_secrets: dict[str, dict[str, str]] | None = None) -> PodSpec:
    return PodSpec(rendered.workload()["spec"]["template"], rendered.objects, extra_secrets)


def labels(rendered: Rendered) -> dict[str, str]:
    return {str(k): str(v) for k, v in rendered.workload()["spec"]["template"]["metadata"]["labels"].items()}


def int_or_percent(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        share = int(value[:-1]) * total / 100
        return int(-(-share // 1)) if round_up else int(share)
    return int(value)


class Endpoints:
    """A Service's ready endpoints, as the consumers see them: the endpoint controller's
    view (pods ready and not terminating) reaches them `lag` seconds after it changed."""

    def __init__(self, timeline: Timeline, name: str, lag: float = 1.0):
        self.timeline = timeline
        self.name = name
        self.lag = lag
        self.pods: list[Pod] = []
        self.view: list[Pod] = []
        self.observers: list[Callable[[list[Pod]], None]] = []
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"endpoints {name}", daemon=True)
        self.thread.start()

    def add(self, pod: Pod) -> None:
        with self.lock:
            self.pods.append(pod)

    def current(self) -> list[Pod]:
        with self.lock:
            return list(self.view)

    def on_change(self, fn: Callable[[list[Pod]], None]) -> None:
        self.observers.append(fn)

    def _run(self) -> None:
        last: list[Pod] = []
        pending: list[tuple[float, list[Pod]]] = []
        while not self.done.wait(POLL):
            with self.lock:
                truth = [p for p in self.pods if p.is_ready()]
            if truth != last:
                last = truth
                pending.append((time.monotonic() + self.lag, truth))
            while pending and pending[0][0] <= time.monotonic():
                _, view = pending.pop(0)
                with self.lock:
                    self.view = view
                self.timeline.add(f"endpoints/{self.name}", "seen: " + (", ".join(f"{p.name}={p.ip}" for p in view) or "none"))
                for fn in self.observers:
                    fn(view)

    def wait_for(self, check: Callable[[list[Pod]], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not check(self.current()):
            assert time.monotonic() < deadline, f"endpoints/{self.name}: {self.current()}\n{self.timeline.text()}"
            time.sleep(POLL)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)


class DaemonSet:
    """One pod per node, rolled as the DaemonSet controller does with RollingUpdate and
    no surge (host network: the new pod needs the old one's ports)."""

    def __init__(self, name: str, kubelets: dict[str, Kubelet], timeline: Timeline,
                 secrets: dict[str, dict[str, str]] | None = None):
        self.name = name
        self.kubelets = kubelets
        self.timeline = timeline
        self.secrets = secrets or {}
        self.pods: dict[str, Pod] = {}
        self.generation = 0
        self.history: list[Pod] = []

    def _run(self, node: str, rendered: Rendered) -> Pod:
        pod = self.kubelets[node].run_pod(pod_spec(rendered, self.secrets),
                                          f"{self.name}-g{self.generation}-{node}", labels=labels(rendered))
        self.pods[node] = pod
        self.history.append(pod)
        return pod

    def create(self, rendered: Rendered) -> None:
        assert rendered.workload()["kind"] == "DaemonSet"
        for node in self.kubelets:
            self._run(node, rendered)
        for pod in self.pods.values():
            pod.wait_ready(READY_TIMEOUT)

    def rollout(self, rendered: Rendered, before_delete: Callable[[str, Pod], None] | None = None,
                while_draining: Callable[[str, Pod], None] | None = None) -> None:
        """Replaces every node's pod with one of `rendered`; `before_delete(node, old)` runs
        before a node's old pod is deleted, `while_draining(node, old)` right after."""
        spec = rendered.workload()["spec"]
        strategy = spec["updateStrategy"]
        assert strategy["type"] == "RollingUpdate"
        max_unavailable = int_or_percent(strategy["rollingUpdate"]["maxUnavailable"], len(self.kubelets), False) or 1
        min_ready = int(spec.get("minReadySeconds", 0))
        self.generation += 1
        nodes = list(self.kubelets)
        for i in range(0, len(nodes), max_unavailable):
            batch = nodes[i:i + max_unavailable]
            terminations = []
            for node in batch:
                old = self.pods[node]
                if before_delete:
                    before_delete(node, old)
                terminations.append((node, old, old.delete()))
                if while_draining:
                    while_draining(node, old)
            for node, old, t in terminations:
                t.join(timeout=old.spec.grace + 120)
                assert old.gone.is_set(), f"{old.who} still terminating\n{self.timeline.text()}"
                self._run(node, rendered)
            for node in batch:
                self.pods[node].wait_ready(READY_TIMEOUT)
                self.timeline.add(f"daemonset/{self.name}", f"{node}: new pod ready; minReadySeconds {min_ready}")
            time.sleep(min_ready)  # the controller counts the pod available only after this


class Deployment:
    """`replicas` pods spread over the nodes, rolled as the Deployment controller does with
    RollingUpdate: at most replicas + maxSurge pods that are not terminating, at least
    replicas - maxUnavailable of them available (ready for minReadySeconds)."""

    def __init__(self, name: str, kubelets: dict[str, Kubelet], timeline: Timeline, endpoints: Endpoints | None = None):
        self.name = name
        self.kubelets = kubelets
        self.timeline = timeline
        self.endpoints = endpoints
        self.pods: list[Pod] = []
        self.terminations: list[tuple[Pod, threading.Thread]] = []
        self.count = 0

    def _run(self, rendered: Rendered) -> Pod:
        nodes = list(self.kubelets)
        node = nodes[self.count % len(nodes)]
        self.count += 1
        pod = self.kubelets[node].run_pod(pod_spec(rendered), f"{self.name}-{self.count}", labels=labels(rendered))
        self.pods.append(pod)
        if self.endpoints is not None:
            self.endpoints.add(pod)
        return pod

    def create(self, rendered: Rendered) -> list[Pod]:
        spec = rendered.workload()["spec"]
        assert rendered.workload()["kind"] == "Deployment"
        made = [self._run(rendered) for _ in range(int(spec["replicas"]))]
        for pod in made:
            pod.wait_ready(READY_TIMEOUT)
        return made

    def rollout(self, rendered: Rendered) -> list[Pod]:
        spec = rendered.workload()["spec"]
        replicas = int(spec["replicas"])
        ru = spec["strategy"]["rollingUpdate"]
        surge = int_or_percent(ru["maxSurge"], replicas, True)
        unavailable = int_or_percent(ru["maxUnavailable"], replicas, False)
        assert surge + unavailable > 0
        min_ready = int(spec.get("minReadySeconds", 0))
        old = [p for p in self.pods if not p.stopping.is_set()]
        new: list[Pod] = []
        while old:
            live = len(old) + len(new)
            available = len(new) + len([p for p in old if p.is_ready()])
            if live < replicas + surge and len(new) < replicas:
                pod = self._run(rendered)
                new.append(pod)
                pod.wait_ready(READY_TIMEOUT)
                time.sleep(min_ready)
                continue
            if available - 1 >= replicas - unavailable:
                victim = old.pop(0)
                self.terminations.append((victim, victim.delete()))
                continue
            time.sleep(POLL)
        while len(new) < replicas:
            pod = self._run(rendered)
            new.append(pod)
            pod.wait_ready(READY_TIMEOUT)
        for victim, t in self.terminations:
            t.join(timeout=victim.spec.grace + 120)
            assert victim.gone.is_set(), f"{victim.who} still terminating\n{self.timeline.text()}"
        return new

"""The chart conventions that change a pod, set together and run through containerd's CRI
(kubelet.py), in both charts: charts/lastcall-spoa's standalone Deployment and
charts/lastcall-turn's DaemonSet; then each chart's `helm test` hook pod against the running
release. (tests/charts/test_conventions.py renders and schema-checks every convention;
revisionHistoryLimit, the monitors and the PodDisruptionBudget change no pod.)

- `commonLabels` and the version/part-of labels (defaults): the pod sandbox containerd runs
  carries exactly the labels the chart rendered for the pod, commonLabels among them;
- `image.digest`: the pods run `repository:tag@sha256:...`. containerd resolves such a
  reference only if it has an image record named `repository@sha256:...`: a pull makes one
  (the CRI's PullImage records repo:tag and repo@digest), `ctr images import` (how the
  images reach these nodes, without a registry) does not unless told `--digests`. So the
  test first shows the pinned reference does not resolve on the nodes (a pinned pod would
  not start) and that another digest never does, then records `repository@<the manifest
  digest containerd holds>` on each node as a pull would (nodes.Node.record_repo_digest),
  and the pinned pods run on that image; the container's image ID reported by the runtime
  is then the repo digest (what `kubectl get pod -o jsonpath='{..imageID}'` shows);
- turn's `extraContainers` with `shareProcessNamespace: true`: a small container (the turn
  image's /bin/sh in a loop) runs beside the daemon, finds it in the shared PID namespace
  (the PID it sees is the daemon's, in the pod's namespace), and signals it as a certificate
  reloader would (SIGHUP as the daemon's uid): the daemon reloads its TLS certificate;
- the daemons serve: spoa answers HAProxy's SPOP health check, turn a STUN Binding request
  (the hook's own checks) and its TLS port;
- the `helm test` hook (templates/tests/pod.yaml, files/helm-test.sh in the daemon's image,
  restartPolicy Never): run as a pod on a node against the release, it resolves the Service's
  name through the cluster DNS (clusterdns.py: the names published with the ready pods'
  addresses) and exits 0; with the daemon stopped (SIGSTOP: a hung daemon whose address is
  still published, as within the readiness probe's period or a DNS answer's TTL) it exits
  non-zero at its /readyz check, and the kubelet takes the pod out of readiness too; the
  daemon then goes on (SIGCONT) without a restart."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
from cri_api.v1 import api_pb2 as cri

import netns
from chartlib import Rendered, render
from clusterdns import ClusterDNS
from cluster import CriCluster
from controllers import DaemonSet, Deployment, labels
from enginelib import SPOA_IMAGE, TURN_IMAGE, measured, process_status
from kubelet import Pod, wait_until
from nodes import Cluster, Node
from podspec import PodSpec

COMMON = {"team": "rtc", "cost-center": "c42"}
GRACE = {"gracefulTermination": {"shutdownDelaySeconds": 1, "drainTimeoutSeconds": 10}}
NAMESPACE = "ns"  # chartlib renders the release "rel" in namespace "ns"
HOOK_TIMEOUT = 60.0
FIND_DAEMON = ('for d in /proc/[0-9]*; do [ "$(cat "$d/comm" 2>/dev/null)" = lastcall-turn ] '
               '&& echo "${d#/proc/}"; done; true')
# The extra container: the turn image's own shell, looking for the daemon every 2 s and saying
# which PID it sees (a reloader's loop, without the reload).
EXTRA = {
    "name": "reloader",
    "image": TURN_IMAGE,
    "command": ["/bin/sh", "-c",
                f'while :; do echo "daemon: $({{ {FIND_DAEMON}; }} | tr "\\n" " ")"; sleep 2; done'],
    "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]}},
}


@pytest.fixture()
def dns(cluster: CriCluster) -> Iterator[ClusterDNS]:
    d = ClusterDNS(cluster.edge, Cluster.EDGE)
    try:
        yield d
    finally:
        d.close()


def pin(nodes: list[Node], image: str) -> str:
    """The image's digest, recorded as `repo@digest` on every node (see the module docstring);
    checks first that the pinned reference does not resolve without the record."""
    digests = {n.name: n.manifest_digest(image) for n in nodes}
    assert len(set(digests.values())) == 1, f"{image}: the nodes hold different manifests: {digests}"
    digest = next(iter(digests.values()))
    pinned, other = f"{image}@{digest}", f"{image}@sha256:{'0' * 64}"
    for n in nodes:
        n.forget_repo_digest(image)
        wait_until(f"{pinned} unknown on {n.name}", lambda: n.image_id(pinned) is None, 10)
        assert n.image_id(other) is None
        n.record_repo_digest(image)
        wait_until(f"{pinned} resolved on {n.name}", lambda: n.image_id(pinned) == n.image_id(image), 10)
        assert n.image_id(other) is None, "a digest that is not the image's resolved"
    return digest


def unpin(nodes: list[Node], image: str) -> None:
    for n in nodes:
        n.forget_repo_digest(image)


def sandbox_labels(pod: Pod) -> dict[str, str]:
    st = pod.node.runtime.PodSandboxStatus(cri.PodSandboxStatusRequest(pod_sandbox_id=pod.sandbox), timeout=30)
    return {k: v for k, v in st.status.labels.items() if not k.startswith("io.kubernetes.")}


def container_image(pod: Pod, container: str) -> tuple[str, str]:
    """(the image the runtime says the container runs, its image ID as `kubectl` shows it)."""
    st = pod.node.runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=pod.runs[container].id),
                                          timeout=30).status
    return st.image.image, st.image_ref


def assert_pod_as_rendered(pod: Pod, rendered: Rendered, container: str, digest: str) -> None:
    got = sandbox_labels(pod)
    assert got == labels(rendered), f"{pod.who}: sandbox labels {got}"
    for k, v in COMMON.items():
        assert got[k] == v
    assert got["app.kubernetes.io/part-of"] == "lastcall" and got["app.kubernetes.io/version"]
    spec_image = rendered.pod_spec()["containers"][0]["image"]
    assert spec_image.endswith(f"@{digest}"), spec_image
    _, image_ref = container_image(pod, container)
    assert image_ref.endswith(f"@{digest}"), f"{pod.who} {container}: image ID {image_ref}"


def run_hook(cluster: CriCluster, dns: ClusterDNS, rendered: Rendered, node: str) -> tuple[int, str, float]:
    """The release's `helm test` pod, run to completion on `node`: (its exit code, its log,
    seconds from its creation to its completion). The Service name it is given is asked of
    the cluster DNS (with the pod's search path: the full name among the queries)."""
    hook = rendered.one("Pod", "-test")
    host = next(e["value"] for e in hook["spec"]["containers"][0]["env"] if e["name"] == "HOST")
    asked = len(dns.queries)
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "test"
    hook_labels = {str(k): str(v) for k, v in hook["metadata"]["labels"].items()}
    for k, v in COMMON.items():
        assert hook_labels[k] == v
    started = time.monotonic()
    pod = cluster.kubelets[node].run_pod(PodSpec(hook, rendered.objects), hook["metadata"]["name"],
                                         namespace=NAMESPACE, labels=hook_labels)
    assert sandbox_labels(pod) == hook_labels
    codes = pod.wait_completed(HOOK_TIMEOUT)
    took = time.monotonic() - started
    log = pod.logs("test")
    assert f"{host}.cluster.local" in dns.queries[asked:], f"{host}: not asked of the cluster DNS: {dns.queries}"
    pod.delete()  # the hook-delete-policy's hook-succeeded, or the next run's before-hook-creation
    return codes["test"], log, took


def hook_fails_on_a_hung_daemon(cluster: CriCluster, dns: ClusterDNS, rendered: Rendered, pods: list[Pod],
                                container: str, node: str) -> tuple[int, str, float]:
    pids = [p.pid(container) for p in pods]
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        code, log, took = run_hook(cluster, dns, rendered, node)
        # The kubelet sees it too (readiness: every 2 s, one failure).
        wait_until("the stopped pods unready", lambda: not any(p.is_ready() for p in pods), 15, cluster.timeline)
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)
    for p in pods:
        p.wait_ready(30)
        assert p.runs[container].restarts == 0, p.describe()
    return code, log, took


def test_spoa_deployment_conventions_and_helm_test(cluster: CriCluster, dns: ClusterDNS) -> None:
    nodes = list(cluster.cluster.nodes.values())
    digest = pin(nodes, SPOA_IMAGE)
    try:
        values: dict[str, Any] = {"replicaCount": 1, "commonLabels": COMMON, "image": {"digest": digest}, **GRACE}
        rendered = render("lastcall-spoa", values)
        assert rendered.workload()["kind"] == "Deployment"
        deployment = Deployment("waf", cluster.kubelets, cluster.timeline)
        (pod,) = deployment.create(rendered)
        ready = pod.ready_at - pod.runs["agent"].started_at  # type: ignore[operator]
        assert_pod_as_rendered(pod, rendered, "agent", digest)
        got = netns.http_get(cluster.edge, pod.ip, 9901, "/readyz")
        assert got and got[0] == 200, got
        dns.publish("rel-lastcall-spoa", NAMESPACE, [pod.ip])
        code, log, took = run_hook(cluster, dns, rendered, "a")
        assert code == 0, log
        assert "/readyz: 200" in log and "frame type 101" in log, log
        bad, bad_log, bad_took = hook_fails_on_a_hung_daemon(cluster, dns, rendered, [pod], "agent", "a")
        assert bad != 0 and "/readyz: no answer" in bad_log, bad_log
        assert pod.runs["agent"].restarts == 0 and not pod.errors, pod.describe()
    finally:
        unpin(nodes, SPOA_IMAGE)
    measured(f"cri spoa Deployment with commonLabels, version/part-of labels and image.digest ({digest[:19]}...): "
             f"ready {ready:.2f} s after its container started; helm test pod: exit 0 in {took:.1f} s "
             f"(creation to completion; /readyz + SPOP HAPROXY-HELLO through the Service's DNS name), "
             f"exit {bad} in {bad_took:.1f} s with the agent stopped (SIGSTOP)")


def test_turn_daemonset_conventions_extra_container_and_helm_test(
        cluster: CriCluster, dns: ClusterDNS, tmp_path: Path) -> None:
    nodes = list(cluster.cluster.nodes.values())
    digest = pin(nodes, TURN_IMAGE)
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "2", "-subj", "/CN=turn.test", "-keyout", str(tmp_path / "tls.key"),
                        "-out", str(tmp_path / "tls.crt")], check=True, capture_output=True, timeout=60)
        tls = {"tls.crt": (tmp_path / "tls.crt").read_text(), "tls.key": (tmp_path / "tls.key").read_text()}
        values: dict[str, Any] = {
            "turn": {"realm": "turn.test", "auth": {"value": "s3cret-for-the-test"}},
            "tls": {"enabled": True, "existingSecret": "turn-tls"},
            "commonLabels": COMMON, "image": {"digest": digest},
            "extraContainers": [{**EXTRA, "image": f"{TURN_IMAGE}@{digest}"}], "shareProcessNamespace": True,
            **GRACE,
        }
        rendered = render("lastcall-turn", values)
        assert rendered.workload()["kind"] == "DaemonSet"
        assert rendered.pod_spec()["shareProcessNamespace"] is True
        ds = DaemonSet("turn", cluster.kubelets, cluster.timeline, secrets={"turn-tls": tls})
        ds.create(rendered)
        pods = list(ds.pods.values())
        ready = [p.ready_at - p.runs["turn"].started_at for p in pods]  # type: ignore[operator]
        for pod in pods:
            assert_pod_as_rendered(pod, rendered, "turn", digest)
            _, extra_ref = container_image(pod, "reloader")
            assert extra_ref.endswith(f"@{digest}"), extra_ref
            # The extra container sees the daemon: the PID it finds is the daemon's in the pod.
            daemon_pid = int(process_status(pod.pid("turn"))["NSpid"].split()[-1])
            wait_until(f"{pod.who}: the reloader's loop sees the daemon",
                       lambda: f"daemon: {daemon_pid} " in pod.logs("reloader", 5), 10, cluster.timeline)
            seen = exec_in(pod, "reloader", FIND_DAEMON)
            assert seen.split() == [str(daemon_pid)], seen
            # ... and can signal it, as a reloader does: the daemon reloads its certificate.
            before = pod.logs("turn", 500).count("TLS certificate reloaded")
            exec_in(pod, "reloader", f"kill -HUP {daemon_pid}")
            wait_until(f"{pod.who}: the daemon's reload",
                       lambda: pod.logs("turn", 500).count("TLS certificate reloaded") > before, 10, cluster.timeline)
            assert pod.is_ready() and pod.runs["turn"].restarts == 0 and pod.runs["reloader"].restarts == 0
        dns.publish("rel-lastcall-turn-headless", NAMESPACE, [p.ip for p in pods])
        code, log, took = run_hook(cluster, dns, rendered, "a")
        assert code == 0, log
        assert "/readyz: 200" in log and "answer type 0101" in log, log
        bad, bad_log, bad_took = hook_fails_on_a_hung_daemon(cluster, dns, rendered, pods, "turn", "a")
        assert bad != 0 and "/readyz: no answer" in bad_log, bad_log
        assert not [p.errors for p in pods if p.errors]
    finally:
        unpin(nodes, TURN_IMAGE)
    measured(f"cri turn DaemonSet with commonLabels, version/part-of labels, image.digest, extraContainers + "
             f"shareProcessNamespace (the extra container finds the daemon's PID and SIGHUPs it: certificate "
             f"reloaded): ready {', '.join(f'{r:.2f}' for r in ready)} s after the daemon's container started; "
             f"helm test pod: exit 0 in {took:.1f} s (creation to completion; /readyz + STUN Binding over TCP "
             f"through the headless Service's DNS name), exit {bad} in {bad_took:.1f} s with the daemons stopped "
             f"(SIGSTOP)")


def exec_in(pod: Pod, container: str, script: str, timeout: int = 10) -> str:
    try:
        got = pod.node.runtime.ExecSync(cri.ExecSyncRequest(container_id=pod.runs[container].id,
                                                            cmd=["/bin/sh", "-c", script], timeout=timeout),
                                        timeout=timeout + 10)
    except grpc.RpcError as e:
        raise AssertionError(f"{pod.who} {container}: exec {script!r}: {e.code()} {e.details()}") from e
    out = got.stdout.decode(errors="replace")
    assert got.exit_code == 0, f"{pod.who} {container}: {script!r} exited {got.exit_code}: {out}{got.stderr!r}"
    return out

"""lastcall-turn's DaemonSet, as the chart renders it, on two test hosts through
containerd's CRI (kubelet.py, controllers.py): host network (the node's address from
`fieldRef: status.podIP`), the shared secret from a Secret through `secretKeyRef` and
`$(TURN_STATIC_AUTH_SECRET)`, turnserver.conf from the ConfigMap volume, the TLS
certificate from a kubernetes.io/tls Secret's volume (served on 5349), the probes with
their periods, the rendered grace period, uid 65532 and the rest of the security context
(checked on the container's process).

A rollout (a new pod template) with calls in flight, node by node (`maxUnavailable: 1`):
before a node's pod is deleted a call starts on it (coturn's turnutils_uclient over TCP
through the relay to turnutils_peer on the edge host); once the pod is Refusing, a new
Allocate there gets 300 Try Alternate naming the other node (`turn.alternateServers`), and
a new uclient call to the draining node is relayed by the other one. The call in flight
loses nothing, the old pod exits 0 right after it ended, SIGKILL never comes, and the new
pod is ready and available (minReadySeconds) before the next node is rolled."""

from __future__ import annotations

import secrets
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

from chartlib import render
from cluster import CriCluster
from controllers import DaemonSet
from enginelib import assert_runs_as_rendered, measured
from imagelib import Call, Peer, TurnClient
from kubelet import Pod, wait_until
import netns
from nodes import Cluster

DELAY = 2
PORT = 3478
TLS_PORT = 5349
ADMIN = 9641


def values(secret: str, **extra: Any) -> dict[str, Any]:
    return {
        "turn": {"realm": "turn.test", "auth": {"value": secret},
                 "alternateServers": [f"{ip}:{PORT}" for ip, _ in Cluster.NODES.values()],
                 "allowedPeerIPs": ["198.18.0.0-198.18.0.255"]},
        "tls": {"enabled": True, "existingSecret": "turn-tls"},
        "gracefulTermination": {"shutdownDelaySeconds": DELAY, "drainTimeoutSeconds": 60},
        **extra,
    }


def tls_secret(tmp: Path) -> dict[str, str]:
    """A kubernetes.io/tls Secret's data (tls.crt, tls.key): a self-signed certificate."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", "/CN=turn.test", "-keyout", str(tmp / "tls.key"),
                    "-out", str(tmp / "tls.crt")], check=True, capture_output=True, timeout=60)
    return {"tls.crt": (tmp / "tls.crt").read_text(), "tls.key": (tmp / "tls.key").read_text()}


def served_certificate(edge: str, ip: str) -> bytes:
    """The certificate (DER) the TURN server presents on its TLS port."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with netns.connect(edge, (ip, TLS_PORT), timeout=10) as raw, ctx.wrap_socket(raw) as tls:
        return tls.getpeercert(binary_form=True) or b""


def metric(edge: str, ip: str, name: str) -> float:
    got = netns.http_get(edge, ip, ADMIN, "/metrics")
    assert got and got[0] == 200, f"GET http://{ip}:{ADMIN}/metrics: {got}"
    for line in got[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in {ip}'s /metrics")


def test_turn_daemonset_rolls_two_hosts_with_alternates(cluster: CriCluster, tmp_path: Path) -> None:
    secret = secrets.token_hex(16)
    first, second = render("lastcall-turn", values(secret)), render("lastcall-turn", values(secret, logLevel="debug"))
    assert first.pod_spec() != second.pod_spec()
    tls = tls_secret(tmp_path)
    ds = DaemonSet("turn", cluster.kubelets, cluster.timeline, secrets={"turn-tls": tls})
    ds.create(first)
    edge, ips = cluster.edge, cluster.addresses
    # What the pod runs with: the security context, and the TLS Secret's volume serving.
    pod = ds.pods["a"]
    st = assert_runs_as_rendered(pod.pid("turn"), pod.spec, pod.runs["turn"].spec)
    expected = ssl.PEM_cert_to_DER_cert(tls["tls.crt"])
    for node in ds.pods:
        assert served_certificate(edge, ips[node]) == expected, f"{node} serves another certificate on {TLS_PORT}"
    other = {"a": "b", "b": "a"}
    peer = Peer(Cluster.EDGE, edge)
    in_flight: dict[str, Call] = {}
    redirected: dict[str, tuple[int, tuple[str, int] | None, Call, float]] = {}
    try:
        for node, pod in ds.pods.items():
            assert pod.ip == ips[node], "a host-network pod's IP is its node's"

        def before_delete(node: str, old: Pod) -> None:
            sessions = metric(edge, ips[node], "lastcall_sessions")
            call = Call(ips[node], PORT, peer.addr, secret, f"in-flight-{node}", messages=400, gap_ms=20, ns=edge)
            in_flight[node] = call
            wait_until(f"the call on {node} to allocate",
                       lambda: metric(edge, ips[node], "lastcall_sessions") > sessions, 30, cluster.timeline)
            cluster.timeline.add(f"test/{node}", "call in flight")

        def while_draining(node: str, old: Pod) -> None:
            time.sleep(DELAY + 0.5)  # Refusing by now
            client = TurnClient(PORT, secret, host=ips[node], ns=edge)
            try:
                ok, code = client.allocate()
                alternate = client.alternate()
            finally:
                client.close()
            created = metric(edge, ips[other[node]], "lastcall_turn_allocations_created_total")
            call = Call(ips[node], PORT, peer.addr, secret, f"new-{node}", messages=100, gap_ms=10, ns=edge).wait()
            moved = metric(edge, ips[other[node]], "lastcall_turn_allocations_created_total") - created
            redirected[node] = (code, alternate, call, moved)
            cluster.timeline.add(f"test/{node}", f"new Allocate -> {code} {alternate}; new call moved: {moved}")

        ds.rollout(second, before_delete, while_draining)
        for call in in_flight.values():
            call.wait()
    finally:
        peer.close()
    timeline = cluster.timeline.text()
    report = []
    for old in ds.history[:2]:  # the first generation
        node = old.node.name
        run = old.runs["turn"]
        call = in_flight[node]
        call.assert_all_echoed()
        assert run.exit_code == 0, f"{old.who} exit {run.exit_code} ({run.reason})\n{old.describe()}\n{timeline}"
        assert run.exited_at is not None and old.deleted_at is not None and call.ended_at is not None
        assert run.exited_at - old.deleted_at < old.spec.grace, "SIGKILL would have come first"
        assert call.ended_at - 1.0 <= run.exited_at <= call.ended_at + 5.0, (
            f"{old.who} exited {run.exited_at - call.ended_at:+.2f} s from its last call's end\n{timeline}")
        code, alternate, new_call, moved = redirected[node]
        assert code == 300 and alternate == (ips[other[node]], PORT), (code, alternate)
        new_call.assert_all_echoed()
        assert moved >= 1, f"the new call to {node} was not relayed by {other[node]}\n{new_call.output[-2000:]}"
        report.append(f"{node}: exit 0 {run.exited_at - old.deleted_at:.1f} s after deletion "
                      f"({1000 * (run.exited_at - call.ended_at):+.0f} ms from the call's end, grace {old.spec.grace} s)")
    for pod in ds.pods.values():
        run = pod.runs["turn"]
        assert run.restarts == 0 and pod.ready_at is not None
        report.append(f"new {pod.node.name}: ready {pod.ready_at - run.started_at:.2f} s after its container started")
    assert not [p.errors for p in ds.history if p.errors], [p.errors for p in ds.history]
    measured("cri turn DaemonSet rollout on 2 hosts (calls in flight: 0 lost; new Allocates during the drain -> "
             "300 Try Alternate, relayed by the other host): " + "; ".join(report)
             + f"; pod process uid {st['Uid'].split()[0]}, CapEff {st['CapEff']}, NoNewPrivs {st['NoNewPrivs']}, "
             f"Seccomp {st['Seccomp']}, read-only root; TLS on {TLS_PORT} from the Secret volume")

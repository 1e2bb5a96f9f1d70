"""lastcall-turn's pod with the chart's per-node and privileged-port values, through
containerd's CRI on the two test hosts (kubelet.py): TURNS on port 443 (the chart adds
NET_BIND_SERVICE, its one capability, and keeps the pod's uid 65532 and
allowPrivilegeEscalation false: the image's binary has the file capability
cap_net_bind_service=p, raised by the daemon; checked on the process), a relay address per node from
`turn.externalIPs` (a ConfigMap volume read through `fieldRef: spec.nodeName` and
`--external-ip-file=.../$(NODE_NAME)`: each node's Allocate hands out its own external
address), and the shared values (a rendered ServiceAccount's name, automountServiceAccountToken
false, topologySpreadConstraints, extraEnv, extraVolumes, extraVolumeMounts) on a pod that
runs. Then a drain with a call in flight: nothing lost, exit 0."""

from __future__ import annotations

import secrets
import socket
import ssl
import struct
from pathlib import Path
from typing import Any

from chartlib import render
from cluster import CriCluster
from controllers import DaemonSet
from enginelib import measured, process_status
from imagelib import Call, Peer, TurnClient
from kubelet import wait_until
import netns
from nodes import Cluster
from test_turn_daemonset import metric, tls_secret

PORT = 3478
TLS_PORT = 443
EXTERNAL = {"a": "203.0.113.1", "b": "203.0.113.2"}
A_XOR_RELAYED = 0x0016
MAGIC = 0x2112A442
NET_BIND_SERVICE = 1 << 10


def values(secret: str) -> dict[str, Any]:
    return {
        "turn": {"realm": "turn.test", "auth": {"value": secret}, "tlsListeningPort": TLS_PORT,
                 "externalIPs": EXTERNAL, "allowedPeerIPs": ["198.18.0.0-198.18.0.255"]},
        "tls": {"enabled": True, "existingSecret": "turn-tls"},
        "gracefulTermination": {"shutdownDelaySeconds": 1, "drainTimeoutSeconds": 60},
        "serviceAccount": {"create": True},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                       "whenUnsatisfiable": "DoNotSchedule",
                                       "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "lastcall-turn"}}}],
        "extraEnv": [{"name": "LASTCALL_TEST_EXTRA", "value": "from-extraEnv"}],
        "extraVolumes": [{"name": "scratch", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }


def relayed(client: TurnClient) -> str:
    """The IPv4 XOR-RELAYED-ADDRESS of the client's last answer."""
    raw = client.last[A_XOR_RELAYED]
    assert raw[1] == 1, "an IPv4 relay address"
    return socket.inet_ntoa(struct.pack(">I", struct.unpack(">I", raw[4:8])[0] ^ MAGIC))


def test_turn_pod_on_443_with_one_capability_and_its_nodes_external_ip(cluster: CriCluster, tmp_path: Path) -> None:
    secret = secrets.token_hex(16)
    rendered = render("lastcall-turn", values(secret))
    spec = rendered.pod_spec()
    assert spec["serviceAccountName"] == "rel-lastcall-turn" and spec["automountServiceAccountToken"] is False
    tls = tls_secret(tmp_path)
    ds = DaemonSet("turn443", cluster.kubelets, cluster.timeline, secrets={"turn-tls": tls})
    ds.create(rendered)
    edge, ips = cluster.edge, cluster.addresses
    report = []
    for node, pod in ds.pods.items():
        st = process_status(pod.pid("turn"))
        # The pod's non-root uid with NET_BIND_SERVICE alone, in every set that matters, under
        # no_new_privs (allowPrivilegeEscalation: false): runc's permitted set before the exec
        # holds the added capability, so the file capability's =p is granted; nothing else.
        assert st["Uid"].split() == ["65532"] * 4, st["Uid"]
        for key in ("CapEff", "CapPrm", "CapBnd"):
            assert int(st[key], 16) == NET_BIND_SERVICE, f"{node} {key} {st[key]}"
        assert int(st["CapAmb"], 16) == 0 and st["NoNewPrivs"] == "1"
        assert "CAP_NET_BIND_SERVICE raised from the permitted set for tls-listening-port 443" in \
            pod.logs("turn", tail=200), pod.logs("turn")
        env = Path(f"/proc/{pod.pid('turn')}/environ").read_bytes().split(b"\0")
        assert b"LASTCALL_TEST_EXTRA=from-extraEnv" in env
        assert b"NODE_NAME=" + node.encode() in env
        # TLS on 443, from the Secret's volume.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with netns.connect(edge, (ips[node], TLS_PORT), timeout=10) as raw, ctx.wrap_socket(raw) as conn:
            assert conn.getpeercert(binary_form=True) == ssl.PEM_cert_to_DER_cert(tls["tls.crt"])
        # The node's own external address from the map.
        client = TurnClient(PORT, secret, host=ips[node], ns=edge)
        try:
            ok, code = client.allocate()
            assert ok, f"{node}: Allocate -> {code}"
            assert relayed(client) == EXTERNAL[node], f"{node} hands out {relayed(client)}"
        finally:
            client.close()
        report.append(f"{node}: 443 bound as uid {st['Uid'].split()[0]} with CapEff {st['CapEff']} "
                      f"NoNewPrivs {st['NoNewPrivs']}, relay address {EXTERNAL[node]}")

    # A call in flight across the drain of node a's pod: nothing lost, exit 0.
    peer = Peer(Cluster.EDGE, edge)
    try:
        call = Call(ips["a"], PORT, peer.addr, secret, "in-flight", messages=150, gap_ms=20, ns=edge)
        old = ds.pods["a"]
        sessions = metric(edge, ips["a"], "lastcall_sessions")
        wait_until("the call to allocate", lambda: metric(edge, ips["a"], "lastcall_sessions") > sessions, 30,
                   cluster.timeline)
        old.delete().join()
        call.wait()
    finally:
        peer.close()
    call.assert_all_echoed()
    run = old.runs["turn"]
    assert run.exit_code == 0, f"exit {run.exit_code} ({run.reason})\n{old.describe()}"
    assert run.exited_at is not None and call.ended_at is not None
    # uclient leaves its probe allocation behind: the drain reclaims it 30 s after its last
    # packet (--drain-idle-timeout; 3 s reclaimed the call itself on a loaded machine, whose
    # uclient had not sent its first datagram yet).
    assert run.exited_at - call.ended_at < 30 + 5, "the left-over probe allocation held the drain"
    assert not [p.errors for p in ds.history if p.errors]
    measured("cri turn pod with per-node external IPs and TLS on 443: " + "; ".join(report)
             + f"; a call across the drain: all echoed, exit 0 {run.exited_at - old.deleted_at:.1f} s after deletion")

"""wire's coturn StatefulSet with only the image changed to lastcall-turn, through containerd's
CRI on a test host (kubelet.py): the pod as wire's chart renders it (tests/cri/wirechart.py:
host network, fsGroup 31338, the configuration template from the ConfigMap turned into
turnserver.conf by the chart's own command line under dumb-init, one static-auth-secret per
line of the zrest secrets file, the probes on `GET /` at 9641), three ways:

- default values: the pod starts and is ready; a call with credentials as Wire's backend
  (brig) issues them (zrest; coturn's uclient over TCP) relays through the pod's deletion:
  the kubelet's SIGTERM reaches dumb-init, which passes it on, the daemon drains (a new
  Allocate gets 403), the call goes on to its end, nothing lost, exit 0 inside Kubernetes'
  default 30 s grace;
- `tls.enabled` with a client CA (`ca.secretRef`): the daemon's own certificate watch and the
  reloader sidecar in the shared PID namespace both see the TLS Secret change (the sidecar
  sends SIGUSR2 to `turnserver`, which reaches the daemon); the certificate
  served on 5349 is the new one, and a TURN-over-TLS call (client certificate) in progress
  goes on through the reload, nothing lost;
- `coturnGracefulTermination: true` with `tls.enabled` and the chart's default
  `CA-file=/etc/ssl/certs/ca-certificates.crt` (the image's Debian bundle): the pod starts, a
  TLS client without a certificate is refused (coturn's meaning of CA-file), and at deletion
  the kubelet's preStop `/usr/local/bin/pre-stop-hook "$POD_IP" 9641` drains the daemon
  (SIGUSR1: new Allocates 403 at once) and the call (over UDP) relays to its end; the daemon
  exits 0 once its last allocation is gone (uclient leaves one that drain-idle-timeout
  reclaims) and no SIGTERM reaches it.

The peer of the calls stands on a public address (192.0.3.100, added to the edge host;
the test network is isolated, nothing leaves it): wire's configuration denies every
special-purpose range, the test network's 198.18.0.0/15 among them, as does lastcall-turn's
built-in policy, which refuses private ranges (RFC 1918, CGNAT, ULA) too where wire's list
leaves them open. A Wire installation whose peers (SFT servers, other relays) are on private
addresses needs allowed-peer-ip, which wire's chart cannot add: docs/coming-from-coturn.md."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import ssl
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

import netns
import wirechart
from cluster import CriCluster
from enginelib import measured, process_status
from imagelib import Call, Peer, TurnClient
from kubelet import Pod, wait_until
from nodes import Cluster

PORT, TLS_PORT, ADMIN = 3478, 5349, 9641
NODE = "a"
PEER_ADDRESS = "192.0.3.100"  # public: not in wire's denied-peer-ip list, nor in the built-in policy
USER = uuid.UUID("6e0c8f3c-7a1b-4c2d-9e8f-0123456789ab")
TEMPLATE = Path(__file__).resolve().parents[2] / "crates/turn/tests/data/wire-coturn.conf.template"


def brig_letters(user: uuid.UUID) -> str:
    """brig's `r`: the first 16 bytes of SHA-256 over the user id's bytes, read
    little-endian, in base 26 with digits a-z."""
    n = int.from_bytes(hashlib.sha256(user.bytes).digest()[:16], "little")
    letters = ""
    while True:
        letters = chr(ord("a") + n % 26) + letters
        n //= 26
        if n == 0:
            return letters


def zrest_password(secret: str, username: str) -> str:
    """base64 of HMAC-SHA512 of the whole username, keyed with the secret."""
    return base64.b64encode(hmac.new(secret.encode(), username.encode(), hashlib.sha512).digest()).decode()


def brig_credentials(secret: str, user: uuid.UUID, ttl: int) -> tuple[str, str]:
    """A zrest username and password as brig issues them (issue 40's scheme)."""
    username = f"d={int(time.time()) + ttl}.v=1.k=0.t=s.r={brig_letters(user)}"
    return username, zrest_password(secret, username)


def test_the_credentials_are_brigs() -> None:
    """The issue's vectors (computed independently of this code)."""
    assert brig_letters(USER) == "bwnyqvzygtvuprnypsbylimxakrk"
    assert zrest_password("Wire-TURN-secret-example", "sft-d=1700000000.v=1.k=0.t=s.r=abc123") == (
        "JYrnjMi1+TdOftExDYKs5EiIohYdgWwfHTT8PRFDbKAChO3X8DHlsRV1SOUJECyTL3msxlKf5Igfja2ARkNcWg==")


def test_the_process_tests_template_is_this_render() -> None:
    """crates/turn/tests/turn/wire.rs runs the daemon on a copy of this builder's config (the
    values its header names): one source, or this fails."""
    ours = wirechart.config_template(wirechart.merged(
        {"ratelimit": {"override": True}, "coturnTurnExternalIP": "__COTURN_EXT_IP__"}))
    theirs = [line for line in TEMPLATE.read_text().splitlines() if line and not line.startswith("#")]
    assert ours.splitlines() == theirs


@pytest.fixture()
def peer(cluster: CriCluster) -> Iterator[Peer]:
    """coturn's echo peer on the edge host, on a public address the nodes route to it."""
    net = cluster.cluster.net
    assert net is not None
    edge_ns = net.ns("edge")
    netns.run("ip", "netns", "exec", edge_ns, "ip", "addr", "add", f"{PEER_ADDRESS}/32", "dev", "eth0")
    for name in Cluster.NODES:
        net.route(name, f"{PEER_ADDRESS}/32", Cluster.EDGE)
    p = Peer(PEER_ADDRESS, cluster.edge)
    try:
        yield p
    finally:
        p.close()
        for name in Cluster.NODES:
            netns.run("ip", "netns", "exec", net.ns(name), "ip", "route", "del", f"{PEER_ADDRESS}/32", check=False)
        netns.run("ip", "netns", "exec", edge_ns, "ip", "addr", "del", f"{PEER_ADDRESS}/32", "dev", "eth0",
                  check=False)


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def server_certificate(tmp: Path, name: str) -> dict[str, str]:
    """A kubernetes.io/tls Secret's data: a self-signed certificate (as cert-manager's would
    be, for the client that does not check it here)."""
    key, crt = tmp / f"{name}.key", tmp / f"{name}.crt"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
            "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(crt))
    return {"tls.crt": crt.read_text(), "tls.key": key.read_text()}


def client_ca(tmp: Path) -> tuple[str, Path, Path]:
    """(a CA's PEM, a client certificate it signed, its key)."""
    ca_key, ca_crt = tmp / "ca.key", tmp / "ca.crt"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
            "-subj", "/CN=Wire test client CA", "-keyout", str(ca_key), "-out", str(ca_crt))
    key, csr, crt, ext = tmp / "client.key", tmp / "client.csr", tmp / "client.crt", tmp / "client.ext"
    ext.write_text("basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=wire-client",
            "-keyout", str(key), "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
            "-days", "2", "-extfile", str(ext), "-out", str(crt))
    return ca_crt.read_text(), crt, key


def tls_handshake(edge: str, ip: str, client: tuple[Path, Path] | None) -> tuple[bytes, str]:
    """(the certificate the server presents on its TLS port, DER; what became of the
    connection after the handshake: "open", or the server's refusal)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3  # the server's certificate comes before its verdict
    if client is not None:
        ctx.load_cert_chain(str(client[0]), str(client[1]))
    with netns.connect(edge, (ip, TLS_PORT), timeout=10) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True) or b""
        tls.settimeout(1.0)
        try:
            tls.recv(1)
            outcome = "open"
        except (TimeoutError, ssl.SSLWantReadError):
            outcome = "open"
        except (ssl.SSLError, ConnectionError) as e:
            outcome = f"refused: {e}"
        return der, outcome


def metric(edge: str, ip: str, name: str) -> float:
    got = netns.http_get(edge, ip, ADMIN, "/metrics")
    assert got and got[0] == 200, f"GET http://{ip}:{ADMIN}/metrics: {got}"
    for line in got[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in {ip}'s /metrics")


def zrest_client(ip: str, edge: str, username: str, password: str) -> TurnClient:
    c = TurnClient(PORT, "", host=ip, ns=edge)
    c.username, c.password = username, password
    return c


def start(cluster: CriCluster, spec: wirechart.PodSpec, name: str = "coturn-0") -> tuple[Pod, float]:
    """Runs the pod on the node; (the pod, seconds from its creation to ready)."""
    asked = time.monotonic()
    pod = cluster.kubelets[NODE].run_pod(spec, name, labels={"app": "coturn"})
    ready = pod.wait_ready(90)
    return pod, ready - asked


def check_generated_config(pod: Pod, spec: wirechart.PodSpec, secrets_lines: list[str]) -> None:
    """turnserver.conf as the chart's command line wrote it: the template with the node's
    address for the placeholders, then one static-auth-secret= line per secret."""
    node_ip = pod.ip
    template = spec.configmaps["coturn"]["coturn.conf.template"]
    want = template.replace("__COTURN_EXT_IP__", node_ip).replace("__COTURN_POD_IP__", node_ip)
    want = want.replace("__COTURN_HOST_IP__", node_ip) + "".join(f"static-auth-secret={s}\n" for s in secrets_lines)
    got = (pod.volumes["coturn-config"] / "turnserver.conf").read_text()
    assert got == want, f"generated config:\n{got}"
    assert (pod.volumes["external-ip"] / "ip").read_text() == node_ip


def daemon_pid(pod: Pod) -> int:
    """The `turnserver` process of the coturn container (dumb-init's child)."""
    init = pod.pid("coturn")
    children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    assert len(children) == 1, f"dumb-init's children: {children}"
    pid = int(children[0])
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "turnserver"
    assert Path(f"/proc/{init}/comm").read_text().strip() == "dumb-init"
    return pid


def test_wires_statefulset_drains_a_call_through_the_pods_deletion(cluster: CriCluster, peer: Peer) -> None:
    secret_list = [secrets.token_hex(16), secrets.token_hex(16)]
    spec = wirechart.render({"secrets": {"zrestSecrets": secret_list}})
    assert spec.grace == 30 and not spec.share_process_namespace
    pod, to_ready = start(cluster, spec)
    edge, ip = cluster.edge, pod.ip
    check_generated_config(pod, spec, secret_list)
    daemon = daemon_pid(pod)
    st = process_status(daemon)
    # Made with the second secret: every static-auth-secret line is tried.
    username, password = brig_credentials(secret_list[1], USER, 3600)
    # Over TCP (the chart's coturn-tcp port): coturn's uclient ends its allocations when it
    # closes the connection, where over UDP it leaves one for the server to reclaim (the
    # graceful test below), which under the default 30 s grace would race the SIGKILL.
    call = Call(ip, PORT, peer.addr, "", username, messages=600, gap_ms=20, tcp=True, ns=edge,
                password=password)
    wait_until("the call to allocate", lambda: metric(edge, ip, "lastcall_sessions") >= 1, 30, cluster.timeline)
    time.sleep(1.0)  # the call relays a while before the deletion
    deletion = pod.delete()
    wait_until("the drain to refuse", lambda: metric(edge, ip, "lastcall_drain_phase") == 2, 30, cluster.timeline)
    late = zrest_client(ip, edge, username, password)
    try:
        ok, code = late.allocate()
    finally:
        late.close()
    cluster.timeline.add("test", f"new Allocate while draining: {code}")
    call.wait()
    deletion.join(60)
    timeline = cluster.timeline.text()
    totals = call.assert_all_echoed()
    run = pod.runs["coturn"]
    assert not ok and code == 403, f"a new Allocate during the drain: {ok} {code}\n{timeline}"
    assert run.exit_code == 0, f"exit {run.exit_code} ({run.reason})\n{pod.describe()}\n{timeline}"
    assert run.exited_at is not None and pod.deleted_at is not None and call.ended_at is not None
    assert run.exited_at - pod.deleted_at < spec.grace - 1, "SIGKILL was near"
    assert run.exited_at >= call.ended_at - 1.0, f"exited {run.exited_at - call.ended_at:+.2f} s from the call's end"
    logs = pod.logs("coturn", 400)
    assert "SIGTERM" in logs and not pod.errors, (logs, pod.errors)
    measured(f"cri wire StatefulSet (default values, lastcall-turn image): ready {to_ready:.2f} s after creation "
             f"(init container, dumb-init, sh, sed, daemon as uid {st['Uid'].split()[0]}, groups {st['Groups']}); "
             f"a zrest call over TCP of {totals['sent']} messages through the deletion: {totals['received']} echoed, "
             f"{totals['lost']} lost; new Allocate during the drain {code}; exit 0 "
             f"{run.exited_at - pod.deleted_at:.1f} s after deletion "
             f"({1000 * (run.exited_at - call.ended_at):+.0f} ms from the call's end, grace {spec.grace} s)")


def test_the_reloader_sidecars_sigusr2_reloads_the_certificate_during_a_tls_call(
        cluster: CriCluster, peer: Peer, tmp_path: Path) -> None:
    secret_list = [secrets.token_hex(16)]
    first, second = server_certificate(tmp_path, "turn-one.test"), server_certificate(tmp_path, "turn-two.test")
    ca, client_crt, client_key = client_ca(tmp_path)
    spec = wirechart.render(
        {"secrets": {"zrestSecrets": secret_list}, "tls": {"enabled": True, "secretRef": "coturn-tls"},
         "ca": {"enabled": True, "secretRef": "wire-ca"}},
        extra_secrets={"coturn-tls": first, "wire-ca": {"ca-certificates.crt": ca}})
    assert spec.share_process_namespace
    assert "CA-file=/secrets-ca/ca-certificates.crt" in spec.configmaps["coturn"]["coturn.conf.template"]
    pod, to_ready = start(cluster, spec)
    edge, ip = cluster.edge, pod.ip
    check_generated_config(pod, spec, secret_list)
    daemon = daemon_pid(pod)
    reloader = pod.pid("coturn-cert-reloader")
    assert os.readlink(f"/proc/{daemon}/ns/pid") == os.readlink(f"/proc/{reloader}/ns/pid"), \
        "shareProcessNamespace: one PID namespace"
    before, outcome = tls_handshake(edge, ip, (client_crt, client_key))
    assert before == ssl.PEM_cert_to_DER_cert(first["tls.crt"]) and outcome == "open", outcome

    username, password = brig_credentials(secret_list[0], USER, 3600)
    call = Call(ip, TLS_PORT, peer.addr, "", username, messages=500, gap_ms=20, tcp=True, ns=edge,
                password=password, extra=("-S", "-i", str(client_crt), "-k", str(client_key)))
    wait_until("the TLS call to allocate", lambda: metric(edge, ip, "lastcall_sessions") >= 1, 30, cluster.timeline)
    swapped = cluster.timeline.add("test", "the TLS Secret updated")
    pod.spec.update_secret("coturn-tls", second, pod.volumes)
    new = ssl.PEM_cert_to_DER_cert(second["tls.crt"])
    served = wait_until("the new certificate to be served",
                        lambda: tls_handshake(edge, ip, (client_crt, client_key))[0] == new, 30, cluster.timeline)
    reloaded_in = served - swapped
    assert call.proc.poll() is None, "the call ended before the reload: make it longer"
    call.wait()
    totals = call.assert_all_echoed()
    reloader_log = pod.logs("coturn-cert-reloader", 50)
    coturn_log = pod.logs("coturn", 400)
    assert f"signal SIGUSR2 sent to turnserver (pid {daemon_pid_in_ns(daemon)})" in reloader_log, reloader_log
    # The daemon sees the Secret's files change by itself (its certificate watch, usually
    # first) and the sidecar's SIGUSR2 reaches it too: the new pair is installed by one of
    # them or both, never with a failure.
    assert "SIGUSR2 received: reloading" in coturn_log, coturn_log
    assert 1 <= coturn_log.count("TLS certificate reloaded") <= 2, coturn_log
    assert metric(edge, ip, "lastcall_turn_tls_reload_failures_total") == 0
    measured(f"cri wire StatefulSet (tls.enabled, ca.secretRef; reloader sidecar, shareProcessNamespace): ready "
             f"{to_ready:.2f} s after creation; Secret updated -> new certificate served {reloaded_in:.2f} s later "
             f"(the daemon's own watch of the files, then the sidecar's SIGUSR2); the TURN-over-TLS call with a client certificate through the "
             f"reload: {totals['sent']} sent, {totals['received']} echoed, {totals['lost']} lost")


def daemon_pid_in_ns(pid: int) -> int:
    """The pid the pod's PID namespace gives a process (what the sidecar sees)."""
    ns_pids = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("NSpid:")]
    return int(ns_pids[0].split()[-1])


def test_graceful_termination_drains_through_the_prestop_hook(cluster: CriCluster, peer: Peer,
                                                               tmp_path: Path) -> None:
    secret_list = [secrets.token_hex(16)]
    cert = server_certificate(tmp_path, "turn.test")
    spec = wirechart.render(
        {"secrets": {"zrestSecrets": secret_list}, "coturnGracefulTermination": True,
         "tls": {"enabled": True, "secretRef": "coturn-tls"}},
        extra_secrets={"coturn-tls": cert})
    assert spec.grace == 43200
    template = spec.configmaps["coturn"]["coturn.conf.template"]
    assert "CA-file=/etc/ssl/certs/ca-certificates.crt" in template, "wire's default CA-file"
    pod, to_ready = start(cluster, spec)
    edge, ip = cluster.edge, pod.ip
    daemon_pid(pod)
    # wire's default CA-file: TLS clients need a certificate from a CA of Debian's bundle,
    # as in coturn; one without is refused after the server showed its certificate.
    der, outcome = tls_handshake(edge, ip, None)
    assert der == ssl.PEM_cert_to_DER_cert(cert["tls.crt"]) and outcome.startswith("refused"), outcome

    username, password = brig_credentials(secret_list[0], USER, 3600)
    call = Call(ip, PORT, peer.addr, "", username, messages=400, gap_ms=20, tcp=False, ns=edge,
                password=password)
    wait_until("the call to allocate", lambda: metric(edge, ip, "lastcall_sessions") >= 1, 30, cluster.timeline)
    time.sleep(1.0)  # the call relays a while before the deletion
    deletion = pod.delete()
    run = pod.runs["coturn"]
    wait_until("the preStop hook to start", lambda: run.prestop_started_at is not None, 30, cluster.timeline)
    wait_until("the drain to refuse", lambda: metric(edge, ip, "lastcall_drain_phase") == 2, 30, cluster.timeline)
    late = zrest_client(ip, edge, username, password)
    try:
        ok, code = late.allocate()
    finally:
        late.close()
    cluster.timeline.add("test", f"new Allocate while draining: {code}")
    assert run.prestop_ended_at is None, f"the hook returned with the call up: {run.prestop_output}"
    call.wait()
    deletion.join(60)
    timeline = cluster.timeline.text()
    totals = call.assert_all_echoed()
    logs = pod.logs("coturn", 400)
    assert not ok and code == 403, f"a new Allocate during the drain: {ok} {code}\n{timeline}"
    assert "pre-stop-hook: SIGUSR1 to turnserver" in logs and "SIGUSR1" in logs, logs
    assert run.exit_code == 0, f"exit {run.exit_code} ({run.reason})\n{pod.describe()}\n{timeline}"
    assert run.exited_at is not None and pod.deleted_at is not None and call.ended_at is not None
    assert run.exited_at >= call.ended_at - 1.0, f"exited {run.exited_at - call.ended_at:+.2f} s from the call's end"
    # The kubelet sends its StopContainer after the hook returns, whatever is left: the
    # daemon had drained and exited on the hook's SIGUSR1, no SIGTERM reached it.
    assert "SIGTERM" not in logs, logs
    assert run.prestop_ended_at is not None and abs(run.prestop_ended_at - run.exited_at) < 2.0, timeline
    assert not pod.errors, pod.errors
    hook = ("returned 0" if run.prestop_exit == 0 else
            f"ended with the container ({run.prestop_exit if run.prestop_exit is not None else run.prestop_output})")
    measured(f"cri wire StatefulSet (coturnGracefulTermination, tls.enabled with CA-file "
             f"/etc/ssl/certs/ca-certificates.crt): ready {to_ready:.2f} s after creation; TLS without a client "
             f"certificate refused; preStop pre-stop-hook drained (new Allocate {code}); the zrest UDP call (the "
             f"allocation uclient leaves behind reclaimed by drain-idle-timeout, 30 s): "
             f"{totals['sent']} sent, {totals['received']} echoed, {totals['lost']} lost; exit 0 "
             f"{run.exited_at - pod.deleted_at:.1f} s after deletion "
             f"({1000 * (run.exited_at - call.ended_at):+.0f} ms from the call's end), no SIGTERM reached it; "
             f"the hook {hook} {run.prestop_ended_at - run.exited_at:+.2f} s from the exit")

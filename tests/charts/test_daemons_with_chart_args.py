"""The built daemons started the way the charts start them: the rendered arguments and
configuration file, with what the kubelet would substitute ($(POD_IP), the secret) and
addresses moved to loopback. Each must become live and ready on the probe paths, fall
unready on SIGTERM, and exit 0 well within the rendered terminationGracePeriodSeconds.
Skipped when the daemon is not built (scripts/test.sh builds them before these tests)."""

from __future__ import annotations

import http.client
import secrets
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from chartlib import built_binary, container, flag, probe_path, render

START_TIMEOUT = 60.0  # rules compile at start; the machine is busy
POLL = 0.05


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_udp_tcp_port() -> int:
    """A port free for both UDP and TCP on 127.0.0.1: a TURN listener binds both (a free UDP
    port may be a TCP connection's local port on a busy machine)."""
    while True:
        port = free_port(socket.SOCK_DGRAM)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            try:
                t.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def http_status(port: int, path: str) -> int | None:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", path)
        status = conn.getresponse().status
        conn.close()
        return status
    except OSError:
        return None


def wait_for(what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc.poll() is not None:
            pytest.fail(f"daemon exited ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        time.sleep(POLL)
    pytest.fail(f"timed out after {timeout}s waiting for {what}:\n{log.read_text()[-4000:]}")


def run_like_kubelet(
    argv: list[str],
    agent: dict[str, Any],
    admin_port: int,
    grace: int,
    tmp: Path,
    when_ready: Callable[[], None] | None = None,
) -> None:
    log = tmp / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp)
    try:
        live, ready = probe_path(agent, "livenessProbe"), probe_path(agent, "readinessProbe")
        wait_for("readiness", lambda: http_status(admin_port, ready) == 200, proc, log, START_TIMEOUT)
        assert http_status(admin_port, live) == 200
        if when_ready is not None:
            when_ready()
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # Readiness falls at once (or the process is already gone); liveness never falls.
        saw_unready = False
        while proc.poll() is None and time.monotonic() - signalled < grace:
            status = http_status(admin_port, ready)
            if status is not None and status != 200:
                saw_unready = True
                assert http_status(admin_port, live) in (200, None)
                break
            time.sleep(POLL)
        try:
            code = proc.wait(timeout=max(1.0, grace - (time.monotonic() - signalled)))
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running at terminationGracePeriodSeconds={grace}:\n{log.read_text()[-4000:]}")
        assert code == 0, f"exit status {code} after SIGTERM with nothing in flight:\n{log.read_text()[-4000:]}"
        assert saw_unready or time.monotonic() - signalled < 1.0, "readiness never fell during the drain"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def kubelet_args(args: list[str], env: dict[str, str], replace: dict[str, str]) -> list[str]:
    out = []
    for a in args:
        for name, value in env.items():
            a = a.replace(f"$({name})", value)
        for old, new in replace.items():
            a = a.replace(old, new)
        out.append(a)
    return out


TURN_EXTRA: dict[str, dict[str, Any]] = {
    "defaults": {},
    # Every turnserver.conf line the chart can write (TLS aside: it needs certificate files).
    "rich": {
        "turn": {
            "externalIP": "203.0.113.7/127.0.0.1",
            "deniedPeerIPs": ["198.51.100.0-198.51.100.255"],
            "allowedPeerIPs": ["10.20.0.0-10.20.255.255"],
            "userQuota": 10,
            "totalQuota": 1000,
            "maxAllocateLifetime": 1800,
            "alternateServers": ["192.0.2.10:3478", "[2001:db8::10]:3478"],
            "extraConfig": "stale-nonce=600\nno-multicast-peers\n",
            "tcp": False,
            "auth": {"extraKeys": ["previous"]},
        },
        "gracefulTermination": {"drainMinAllocations": 0},
    },
    # TLS from the mounted kubernetes.io/tls Secret (a self-signed pair made here).
    "tls": {"tls": {"enabled": True, "existingSecret": "turn-tls"}},
}


def self_signed(directory: Path) -> None:
    directory.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "2", "-subj", "/CN=turn.example.com",
         "-keyout", str(directory / "tls.key"), "-out", str(directory / "tls.crt")],
        check=True, capture_output=True, timeout=60,
    )


@pytest.mark.parametrize("extra", sorted(TURN_EXTRA))
def test_turn_runs_as_the_chart_starts_it(extra: str, tmp_path: Path) -> None:
    binary = built_binary("lastcall-turn")
    if binary is None:
        pytest.skip("lastcall-turn is not built")
    admin_port = free_port()
    turn_port = free_udp_tcp_port()
    relay = free_port(socket.SOCK_DGRAM)
    values: dict[str, Any] = {
        "admin": {"port": admin_port},
        "gracefulTermination": {"shutdownDelaySeconds": 1, "drainTimeoutSeconds": 10, "marginSeconds": 5},
    }
    for key, sub in TURN_EXTRA[extra].items():
        values.setdefault(key, {}).update(sub)
    values.setdefault("turn", {}).update({"listeningPort": turn_port, "minPort": relay, "maxPort": relay + 20})
    replace: dict[str, str] = {}
    when_ready: Callable[[], None] | None = None
    if extra == "tls":
        values["turn"]["tlsListeningPort"] = free_port()
        self_signed(tmp_path / "tls")
        replace["/etc/lastcall-turn/tls/"] = f"{tmp_path / 'tls'}/"

        def when_ready() -> None:  # the TLS listener serves the mounted certificate
            ctx = ssl.create_default_context(cafile=str(tmp_path / "tls" / "tls.crt"))
            ctx.check_hostname = False
            with socket.create_connection(("127.0.0.1", values["turn"]["tlsListeningPort"]), timeout=5) as raw:
                with ctx.wrap_socket(raw) as tls:
                    assert tls.version() in ("TLSv1.2", "TLSv1.3")
    rendered = render("lastcall-turn", values)
    turn = container(rendered.pod_spec(), "turn")
    conf = tmp_path / "turnserver.conf"
    text = rendered.one("ConfigMap")["data"]["turnserver.conf"]
    for old, new in replace.items():
        text = text.replace(old, new)
    conf.write_text(text)
    env = {"POD_IP": "127.0.0.1", "TURN_STATIC_AUTH_SECRET": secrets.token_hex(16)}
    env.update({f"TURN_STATIC_AUTH_SECRET_{i}": secrets.token_hex(16) for i in range(4)})
    argv = [str(binary)] + kubelet_args(turn["args"], env, {"/etc/lastcall-turn/config/turnserver.conf": str(conf)})
    assert flag(argv, "admin-addr") == f"127.0.0.1:{admin_port}"
    assert not [a for a in argv if "$(" in a], "every $(VAR) the chart uses is defined in the pod"
    run_like_kubelet(argv, turn, admin_port, rendered.grace(), tmp_path, when_ready)


@pytest.mark.parametrize("mode", ["standalone", "sidecar-native", "sidecar-classic"])
def test_spoa_runs_as_the_chart_starts_it(mode: str, tmp_path: Path) -> None:
    binary = built_binary("lastcall-spoa")
    if binary is None:
        pytest.skip("lastcall-spoa is not built")
    admin_port, spop_port = free_port(), free_port()
    values: dict[str, Any] = {
        "agent": {"port": spop_port},
        "admin": {"port": admin_port, "address": "127.0.0.1"},
        "gracefulTermination": {"shutdownDelaySeconds": 1, "drainTimeoutSeconds": 10, "marginSeconds": 5},
    }
    if mode != "standalone":
        values["mode"] = "sidecar"
        values["sidecar"] = {"native": mode == "sidecar-native", "agentExitSeconds": 3}
    rendered = render("lastcall-spoa", values)
    agent = container(rendered.pod_spec(), "agent")
    cfg = yaml.safe_load(rendered.one("ConfigMap", "-agent")["data"]["config.yaml"])
    assert cfg["bind"].endswith(f":{spop_port}")
    cfg["bind"] = f"127.0.0.1:{spop_port}"  # tests listen on loopback only
    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    argv = [str(binary)] + kubelet_args(agent["args"], {}, {"/etc/lastcall-spoa/config.yaml": str(conf)})
    run_like_kubelet(argv, agent, admin_port, rendered.grace(), tmp_path)


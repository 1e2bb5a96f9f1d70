"""The `helm test` hook of both charts: a Pod (hook `test`) running the chart's
files/helm-test.sh with bash in the daemon's own image, valid for Kubernetes and pointed at
the release's Service. With the daemons built, the rendered script runs here against a daemon
started as the chart starts it (addresses on loopback): it passes, and fails when what answers
is not the daemon."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from chartlib import K8S_VERSIONS, built_binary, container, render, validate
from test_daemons_with_chart_args import free_port, free_udp_tcp_port, http_status, kubelet_args, run_like_kubelet
from test_sidecar_pod import Pod, dump, get, origin, wait_until  # noqa: F401 (origin: a fixture)


def hook(chart: str, values: dict[str, Any] | None = None) -> dict[str, Any]:
    r = render(chart, values)
    pod = r.one("Pod", "-test")
    for v in K8S_VERSIONS:
        validate(pod, v)
    return pod


def run_script(pod: dict[str, Any], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["bash", "-c"]
    return subprocess.run(
        ["bash", "-c", c["args"][0]],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "chart,values",
    [
        ("lastcall-spoa", {}),
        ("lastcall-spoa", {"mode": "sidecar"}),
        ("lastcall-turn", {}),
        ("lastcall-turn", {"kind": "StatefulSet", "turn": {"tcp": False}}),
    ],
    ids=["spoa-standalone", "spoa-sidecar", "turn-daemonset", "turn-udp"],
)
def test_hook_pod(chart: str, values: dict[str, Any]) -> None:
    pod = hook(chart, values)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert "hook-succeeded" in pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    assert pod["spec"]["restartPolicy"] == "Never"
    c = pod["spec"]["containers"][0]
    r = render(chart, values)
    daemon = container(r.pod_spec(), "agent" if chart == "lastcall-spoa" else "turn")
    assert c["image"] == daemon["image"]
    # The script is the file, unchanged.
    assert c["args"] == [(Path(__file__).parents[2] / "charts" / chart / "files" / "helm-test.sh").read_text()]
    env = {e["name"]: e["value"] for e in c["env"]}
    # The Service it names exists and serves the ports it uses.
    host = env["HOST"].split(".")[0]
    svc = r.one("Service", host.removeprefix("rel-lastcall-spoa").removeprefix("rel-lastcall-turn") or "-lastcall-spoa")
    ports = {str(p["port"]): p for p in svc["spec"]["ports"]}
    assert ports[env["ADMIN_PORT"]]["name"] == "admin"
    if chart == "lastcall-spoa":
        used = env.get("SPOP_PORT") or env["HTTP_PORT"]
        assert ports[used]["name"] == ("spop" if "SPOP_PORT" in env else "http")
    else:
        p = [x for x in svc["spec"]["ports"] if str(x["port"]) == env["TURN_PORT"] and x["protocol"] == env["TRANSPORT"].upper()]
        assert p, (env, svc["spec"]["ports"])


def test_no_turn_hook_without_the_headless_service() -> None:
    assert render("lastcall-turn", {"service": {"enabled": False}}).of_kind("Pod") == []


def test_spoa_hook_script_against_the_agent(tmp_path: Path) -> None:
    binary = built_binary("lastcall-spoa")
    if binary is None:
        pytest.skip("lastcall-spoa is not built")
    admin_port, spop_port = free_port(), free_port()
    values: dict[str, Any] = {
        "agent": {"port": spop_port},
        "admin": {"port": admin_port, "address": "127.0.0.1"},
        "gracefulTermination": {"shutdownDelaySeconds": 1, "drainTimeoutSeconds": 10, "marginSeconds": 5},
    }
    rendered = render("lastcall-spoa", values)
    pod = hook("lastcall-spoa", values)
    agent = container(rendered.pod_spec(), "agent")
    cfg = yaml.safe_load(rendered.one("ConfigMap", "-agent")["data"]["config.yaml"])
    cfg["bind"] = f"127.0.0.1:{spop_port}"
    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    argv = [str(binary)] + kubelet_args(agent["args"], {}, {"/etc/lastcall-spoa/config.yaml": str(conf)})

    def check() -> None:
        base = {"HOST": "127.0.0.1", "ADMIN_PORT": str(admin_port)}
        ok = run_script(pod, {**base, "SPOP_PORT": str(spop_port)})
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "frame type 101" in ok.stdout
        # An HTTP server where the agent should be: no AGENT-HELLO, the test fails.
        wrong = run_script(pod, {**base, "SPOP_PORT": str(admin_port)})
        assert wrong.returncode != 0, wrong.stdout
        # Nothing on the admin port: fails at /readyz.
        gone = run_script(pod, {**base, "ADMIN_PORT": str(free_port()), "SPOP_PORT": str(spop_port)})
        assert gone.returncode != 0, gone.stdout

    run_like_kubelet(argv, agent, admin_port, rendered.grace(), tmp_path, check)


@pytest.mark.parametrize("transport", ["tcp", "udp"])
def test_turn_hook_script_against_the_server(transport: str, tmp_path: Path) -> None:
    binary = built_binary("lastcall-turn")
    if binary is None:
        pytest.skip("lastcall-turn is not built")
    admin_port, turn_port = free_port(), free_udp_tcp_port()
    relay = free_port(socket.SOCK_DGRAM)
    values: dict[str, Any] = {
        "admin": {"port": admin_port},
        "turn": {"listeningPort": turn_port, "minPort": relay, "maxPort": relay + 20, "tcp": transport == "tcp"},
        "gracefulTermination": {"shutdownDelaySeconds": 1, "drainTimeoutSeconds": 10, "marginSeconds": 5},
    }
    rendered = render("lastcall-turn", values)
    pod = hook("lastcall-turn", values)
    env_of_pod = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env_of_pod["TRANSPORT"] == transport
    turn = container(rendered.pod_spec(), "turn")
    conf = tmp_path / "turnserver.conf"
    conf.write_text(rendered.one("ConfigMap")["data"]["turnserver.conf"])
    env = {"POD_IP": "127.0.0.1", "TURN_STATIC_AUTH_SECRET": secrets.token_hex(16)}
    argv = [str(binary)] + kubelet_args(turn["args"], env, {"/etc/lastcall-turn/config/turnserver.conf": str(conf)})

    def check() -> None:
        base = {"HOST": "127.0.0.1", "ADMIN_PORT": str(admin_port), "TRANSPORT": transport}
        ok = run_script(pod, {**base, "TURN_PORT": str(turn_port)})
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "answer type 0101" in ok.stdout
        # Something else where the TURN server should be: the test fails.
        other = str(admin_port) if transport == "tcp" else str(free_port(socket.SOCK_DGRAM))
        wrong = run_script(pod, {**base, "TURN_PORT": other})
        assert wrong.returncode != 0, wrong.stdout

    run_like_kubelet(argv, turn, admin_port, rendered.grace(), tmp_path, check)


def test_spoa_sidecar_hook_script_through_haproxy(origin: int, tmp_path: Path) -> None:
    """Sidecar mode: the script's attack goes through the real HAProxy with the rendered
    configuration and is denied by the agent (403); sent straight to the origin it is not,
    and the test fails."""
    pod_run = Pod(True, origin, tmp_path)
    hook_pod = hook(
        "lastcall-spoa",
        {"mode": "sidecar", "admin": {"port": pod_run.admin_port}, "sidecar": {"service": {"port": pod_run.http_port}}},
    )
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with open(tmp_path / "agent.log", "wb") as out:
            procs["agent"] = subprocess.Popen(pod_run.agent_argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        wait_until("agent ready", lambda: http_status(pod_run.admin_port, "/readyz") == 200, procs, tmp_path)
        with open(tmp_path / "haproxy.log", "wb") as out:
            procs["haproxy"] = subprocess.Popen(pod_run.haproxy_argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        wait_until("HAProxy ready", lambda: get(pod_run.health_port, "/healthz") == 200, procs, tmp_path)
        base = {"HOST": "127.0.0.1", "ADMIN_PORT": str(pod_run.admin_port)}
        ok = run_script(hook_pod, {**base, "HTTP_PORT": str(pod_run.http_port)})
        assert ok.returncode == 0, ok.stdout + ok.stderr + dump(tmp_path)
        assert "403" in ok.stdout
        wrong = run_script(hook_pod, {**base, "HTTP_PORT": str(origin)})
        assert wrong.returncode != 0, wrong.stdout
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

"""The sidecar pod of charts/lastcall-spoa, run for real on loopback: the rendered HAProxy
configuration (real HAProxy) in front of the built
agent with its rendered arguments and config, and a small origin server. Checks that the
WAF verdicts come through, then stops the pod the way the kubelet does in each mode and
checks that no request fails while HAProxy is still listening and that both processes exit
0 well within the rendered terminationGracePeriodSeconds.

- classic: SIGUSR1 to HAProxy (its image's STOPSIGNAL) and SIGTERM to the agent at once;
  the agent lingers until HAProxy has gone.
- native: SIGUSR1 to HAProxy; SIGTERM to the agent only once HAProxy has exited.

HAProxy runs as `haproxy -db` (one process). The haproxy image runs `-W -db` (master-worker);
the configuration behaves the same, but HAProxy 2.6's master was seen to drop a SIGUSR1 that
arrives within a fraction of a second of its start, which would make this test flaky.

Skipped when the agent is not built."""

from __future__ import annotations

import http.client
import http.server
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from chartlib import built_binary, container, render
from test_daemons_with_chart_args import free_port, http_status, kubelet_args

TIMEOUT = 60.0
POLL = 0.05


class Origin(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        body = b"origin ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def origin() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def get(port: int, path: str) -> int | None:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp.status
    except OSError:
        return None


def wait_until(what: str, check: Any, procs: dict[str, subprocess.Popen[bytes]], logs: Path) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if check():
            return
        for name, proc in procs.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited ({proc.returncode}) before {what}:\n{dump(logs)}")
        time.sleep(POLL)
    pytest.fail(f"timed out waiting for {what}:\n{dump(logs)}")


def dump(logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("*.log")))


@pytest.mark.parametrize("native", [True, False], ids=["native", "classic"])
def test_sidecar_pod_stops_without_failing_a_request(native: bool, origin: int, tmp_path: Path) -> None:
    agent_bin = built_binary("lastcall-spoa")
    if agent_bin is None:
        pytest.skip("lastcall-spoa is not built")
    haproxy_bin = shutil.which("haproxy")
    assert haproxy_bin, "haproxy is not installed (bash scripts/setup.sh installs it)"
    http_port, health_port, spop_port, admin_port = (free_port() for _ in range(4))
    rendered = render(
        "lastcall-spoa",
        {
            "mode": "sidecar",
            "sidecar": {
                "native": native,
                "agentExitSeconds": 3,
                "haproxy": {
                    "httpPort": http_port,
                    "healthPort": health_port,
                    "backendServers": [{"name": "app", "address": f"127.0.0.1:{origin}"}],
                },
            },
            "agent": {"port": spop_port},
            "admin": {"port": admin_port, "address": "127.0.0.1"},
            "gracefulTermination": {"shutdownDelaySeconds": 2, "drainTimeoutSeconds": 8, "marginSeconds": 3},
        },
    )
    grace = rendered.grace()
    cms = {cm["metadata"]["name"]: cm["data"] for cm in rendered.of_kind("ConfigMap")}
    hp = cms["rel-lastcall-spoa-haproxy"]
    (tmp_path / "spoe.cfg").write_text(hp["spoe.cfg"])
    cfg = hp["haproxy.cfg"].replace("/usr/local/etc/haproxy/spoe.cfg", str(tmp_path / "spoe.cfg"))
    for port in (http_port, health_port):  # tests listen on loopback only
        assert f"bind :{port}\n" in cfg
        cfg = cfg.replace(f"bind :{port}\n", f"bind 127.0.0.1:{port}\n")
    (tmp_path / "haproxy.cfg").write_text(cfg)
    agent_cfg = yaml.safe_load(cms["rel-lastcall-spoa-agent"]["config.yaml"])
    assert agent_cfg["bind"] == f"127.0.0.1:{spop_port}"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(agent_cfg))
    agent = container(rendered.pod_spec(), "agent")
    agent_argv = [str(agent_bin)] + kubelet_args(
        agent["args"], {}, {"/etc/lastcall-spoa/config.yaml": str(tmp_path / "config.yaml")}
    )

    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with open(tmp_path / "agent.log", "wb") as out:
            procs["agent"] = subprocess.Popen(agent_argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        if native:  # the kubelet starts HAProxy once the sidecar's startup probe passes
            wait_until("agent ready", lambda: http_status(admin_port, "/readyz") == 200, procs, tmp_path)
        with open(tmp_path / "haproxy.log", "wb") as out:
            procs["haproxy"] = subprocess.Popen(
                [haproxy_bin, "-db", "-f", str(tmp_path / "haproxy.cfg")],
                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
            )
        # HAProxy's readiness: up once spop-check sees the agent.
        wait_until("HAProxy ready", lambda: get(health_port, "/healthz") == 200, procs, tmp_path)
        # The pod gets traffic once every container's readiness probe passes. In classic mode
        # HAProxy can report ready before the agent listens (HAProxy 2.6 starts a checked
        # server UP, before its first check): the agent's own probe is what holds traffic back.
        wait_until("pod ready", lambda: http_status(admin_port, "/readyz") == 200, procs, tmp_path)
        assert get(http_port, "/hello") == 200, dump(tmp_path)
        assert get(http_port, "/?q=%3Cscript%3Ealert(1)%3C/script%3E") == 403, dump(tmp_path)

        # Stop the pod.
        stopped = time.monotonic()
        procs["haproxy"].send_signal(signal.SIGUSR1)
        if not native:
            procs["agent"].send_signal(signal.SIGTERM)
        # HAProxy keeps listening for `grace` (shutdownDelaySeconds): traffic that still
        # arrives while endpoints propagate is served, and checked by the WAF.
        failures, served = [], 0
        while time.monotonic() - stopped < 1.5:
            status = get(http_port, f"/late/{served}")
            served += 1
            if status != 200:
                failures.append(status)
        assert not failures, f"{len(failures)} of {served} requests failed after the stop signal: {failures}"
        assert get(http_port, "/?q=%3Cscript%3Ealert(1)%3C/script%3E") == 403
        assert get(health_port, "/healthz") != 200, "readiness must fall at the stop signal"

        remaining = grace - (time.monotonic() - stopped)
        haproxy_code = procs["haproxy"].wait(timeout=remaining)
        if native:  # the kubelet signals a native sidecar after the main containers exit
            procs["agent"].send_signal(signal.SIGTERM)
        remaining = grace - (time.monotonic() - stopped)
        agent_code = procs["agent"].wait(timeout=max(remaining, 0.1))
        assert (haproxy_code, agent_code) == (0, 0), dump(tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running at terminationGracePeriodSeconds={grace}:\n{dump(tmp_path)}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

"""The sidecar pod of charts/lastcall-spoa, run for real on loopback: the rendered HAProxy
configuration (real HAProxy) in front of the built
agent with its rendered arguments and config, and a small origin server. Checks that the
WAF verdicts come through, then stops the pod the way the kubelet does in each mode and
checks that no request fails while HAProxy is still listening and that both processes exit
0 well within the rendered terminationGracePeriodSeconds.

- classic: SIGUSR1 to HAProxy (its image's STOPSIGNAL) and SIGTERM to the agent at once;
  the agent lingers until HAProxy has gone.
- native: SIGUSR1 to HAProxy; SIGTERM to the agent only once HAProxy has exited.

It also checks HAProxy's readiness against an agent that hangs (SIGSTOP): never ready then.

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


class Pod:
    """The rendered sidecar pod's two programs, written out to run on loopback."""

    def __init__(self, native: bool, origin: int, tmp_path: Path) -> None:
        agent_bin = built_binary("lastcall-spoa")
        if agent_bin is None:
            pytest.skip("lastcall-spoa is not built")
        haproxy_bin = shutil.which("haproxy")
        assert haproxy_bin, "haproxy is not installed (bash scripts/setup.sh installs it)"
        self.http_port, self.health_port, spop_port, self.admin_port = (free_port() for _ in range(4))
        rendered = render(
            "lastcall-spoa",
            {
                "mode": "sidecar",
                "sidecar": {
                    "native": native,
                    "agentExitSeconds": 3,
                    "haproxy": {
                        "httpPort": self.http_port,
                        "healthPort": self.health_port,
                        "backendServers": [{"name": "app", "address": f"127.0.0.1:{origin}"}],
                    },
                },
                "agent": {"port": spop_port},
                "admin": {"port": self.admin_port, "address": "127.0.0.1"},
                "gracefulTermination": {"shutdownDelaySeconds": 2, "drainTimeoutSeconds": 8, "marginSeconds": 3},
            },
        )
        self.grace = rendered.grace()
        cms = {cm["metadata"]["name"]: cm["data"] for cm in rendered.of_kind("ConfigMap")}
        hp = cms["rel-lastcall-spoa-haproxy"]
        (tmp_path / "spoe.cfg").write_text(hp["spoe.cfg"])
        cfg = hp["haproxy.cfg"].replace("/usr/local/etc/haproxy/spoe.cfg", str(tmp_path / "spoe.cfg"))
        for port in (self.http_port, self.health_port):  # tests listen on loopback only
            assert f"bind :{port}\n" in cfg
            cfg = cfg.replace(f"bind :{port}\n", f"bind 127.0.0.1:{port}\n")
        (tmp_path / "haproxy.cfg").write_text(cfg)
        agent_cfg = yaml.safe_load(cms["rel-lastcall-spoa-agent"]["config.yaml"])
        assert agent_cfg["bind"] == f"127.0.0.1:{spop_port}"
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(agent_cfg))
        agent = container(rendered.pod_spec(), "agent")
        self.agent_argv = [str(agent_bin)] + kubelet_args(
            agent["args"], {}, {"/etc/lastcall-spoa/config.yaml": str(tmp_path / "config.yaml")}
        )
        self.haproxy_argv = [haproxy_bin, "-db", "-f", str(tmp_path / "haproxy.cfg")]


@pytest.mark.parametrize("native", [True, False], ids=["native", "classic"])
def test_sidecar_pod_stops_without_failing_a_request(native: bool, origin: int, tmp_path: Path) -> None:
    pod = Pod(native, origin, tmp_path)
    http_port, health_port, admin_port, grace = pod.http_port, pod.health_port, pod.admin_port, pod.grace
    agent_argv = pod.agent_argv

    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with open(tmp_path / "agent.log", "wb") as out:
            procs["agent"] = subprocess.Popen(agent_argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        if native:  # the kubelet starts HAProxy once the sidecar's startup probe passes
            wait_until("agent ready", lambda: http_status(admin_port, "/readyz") == 200, procs, tmp_path)
        with open(tmp_path / "haproxy.log", "wb") as out:
            procs["haproxy"] = subprocess.Popen(pod.haproxy_argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        # HAProxy's readiness asks, in one probe, whether it is stopping, whether its
        # spop-check has the agent UP and whether the agent is ready: once it passes, a
        # request passes. (In classic mode the two start at once, and HAProxy 2.6 starts a
        # checked server UP before its first check; CI once saw HAProxy ready, then the
        # agent ready, and a request fail with 500 in between, when readiness was nbsrv only.)
        wait_until("HAProxy ready", lambda: get(health_port, "/healthz") == 200, procs, tmp_path)
        assert get(http_port, "/hello") == 200, dump(tmp_path)
        assert http_status(admin_port, "/readyz") == 200, "HAProxy's readiness implies the agent's"
        assert get(http_port, "/?q=%3Cscript%3Ealert(1)%3C/script%3E") == 403, dump(tmp_path)

        # Stop the pod.
        stopped = time.monotonic()
        procs["haproxy"].send_signal(signal.SIGUSR1)
        if not native:
            procs["agent"].send_signal(signal.SIGTERM)
        # HAProxy keeps listening for `grace` (shutdownDelaySeconds, 2 s): traffic that still
        # arrives while endpoints propagate is served, and checked by the WAF (every fourth
        # request an attack). Each request starts in the first 1.5 s, inside the delay: one
        # started after the loop, once a slow debug-build answer had used the margin (load 19),
        # found the listener gone.
        failures, served, attacks = [], 0, 0
        while (at := time.monotonic() - stopped) < 1.5:
            attack = served % 4 == 3
            status = get(http_port, "/late?q=%3Cscript%3Ealert(1)%3C/script%3E" if attack else f"/late/{served}")
            served += 1
            attacks += attack
            if status != (403 if attack else 200):
                failures.append((round(at, 3), "attack" if attack else "benign", status))
        assert attacks, "no attack was sent after the stop signal"
        assert not failures, f"{len(failures)} of {served} requests failed after the stop signal: {failures}"
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


def test_sidecar_pod_is_not_ready_while_the_agent_hangs(origin: int, tmp_path: Path) -> None:
    """HAProxy's readiness must not pass for an agent that accepts connections but does not
    answer (stopped with SIGSTOP once ready, before HAProxy starts, as in classic mode where
    both start at once). HAProxy 2.6 starts its checked agent server UP, and the first
    spop-check waits `inter` (1 s) for a HELLO that never comes: readiness on nbsrv alone
    passed during that second. Once the agent resumes, the pod becomes ready and serves."""
    pod = Pod(False, origin, tmp_path)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with open(tmp_path / "agent.log", "wb") as out:
            procs["agent"] = subprocess.Popen(pod.agent_argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        wait_until("agent ready", lambda: http_status(pod.admin_port, "/readyz") == 200, procs, tmp_path)
        procs["agent"].send_signal(signal.SIGSTOP)
        with open(tmp_path / "haproxy.log", "wb") as out:
            procs["haproxy"] = subprocess.Popen(pod.haproxy_argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        # Probe from HAProxy's start until its first check has failed (it logs the agent
        # DOWN), and for one more check interval after that.
        answers: list[int | None] = []
        wait_until("HAProxy's health listener", lambda: get(pod.health_port, "/healthz") is not None, procs, tmp_path)
        def agent_down() -> bool:
            answers.append(get(pod.health_port, "/healthz"))
            return "agent is DOWN" in (tmp_path / "haproxy.log").read_text()
        wait_until("HAProxy's first check to fail", agent_down, procs, tmp_path)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            answers.append(get(pod.health_port, "/healthz"))
            time.sleep(POLL)
        assert answers and 200 not in answers, f"ready with a hung agent: {answers}\n{dump(tmp_path)}"
        assert get(pod.http_port, "/hello") == 500, "fail-closed: no verdict, no request"

        procs["agent"].send_signal(signal.SIGCONT)
        wait_until("pod ready", lambda: get(pod.health_port, "/healthz") == 200, procs, tmp_path)
        assert get(pod.http_port, "/hello") == 200, dump(tmp_path)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()

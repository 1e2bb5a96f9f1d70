"""charts/lastcall-spoa: render with several value sets, lint, validate every object against
the Kubernetes API schemas, and check the termination invariants."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from chartlib import (
    CHARTS,
    K8S_VERSIONS,
    OLDEST,
    all_containers,
    assert_no_nested_mounts,
    assert_no_prestop,
    built_binary,
    container,
    flag,
    haproxy_check,
    merged_values,
    probe_path,
    render,
    seconds,
    validate,
)

CHART = "lastcall-spoa"

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "standalone-tuned": {
        "replicaCount": 3,
        "gracefulTermination": {
            "shutdownDelaySeconds": 10,
            "drainTimeoutSeconds": 120,
            "marginSeconds": 15,
            "drainMinSessions": 1,
        },
        "admin": {"port": 9100, "tokenSecret": {"name": "spoa-admin", "key": "tok"}},
        "agent": {"port": 12345, "logFormat": "text", "logLevel": "debug", "extraArgs": ["--foo=bar"]},
        "podDisruptionBudget": {"maxUnavailable": "25%"},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
        "service": {"headless": False},
    },
    "standalone-grace-override": {
        "gracefulTermination": {"terminationGracePeriodSeconds": 600},
    },
    "sidecar-native": {"mode": "sidecar"},
    "sidecar-classic": {"mode": "sidecar", "sidecar": {"native": False}},
    "sidecar-native-response-check": {
        "mode": "sidecar",
        "sidecar": {
            "replicaCount": 4,
            "agentExitSeconds": 8,
            "haproxy": {
                "responseCheck": True,
                "failClosed": False,
                "backendServers": [
                    {"name": "web1", "address": "web-0.web.ns.svc.cluster.local:8080"},
                    {"name": "web2", "address": "10.1.2.3:80"},
                ],
                "timeouts": {"processing": "1s"},
            },
            "extraContainers": [
                {"name": "app", "image": "example/app:1", "ports": [{"containerPort": 8081}]}
            ],
        },
        "gracefulTermination": {"shutdownDelaySeconds": 3, "drainTimeoutSeconds": 60},
    },
    "sidecar-classic-tuned": {
        "mode": "sidecar",
        "sidecar": {"native": False, "agentExitSeconds": 3},
        "gracefulTermination": {"shutdownDelaySeconds": 8, "drainTimeoutSeconds": 45, "marginSeconds": 7},
    },
    "off-standalone": {"gracefulTermination": {"enabled": False}},
    "off-sidecar-classic": {
        "mode": "sidecar",
        "sidecar": {"native": False},
        "gracefulTermination": {"enabled": False},
    },
    "existing-configmap": {"agent": {"existingConfigMap": "my-waf"}},
}


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def case(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], Any]:
    values = VALUE_SETS[request.param]
    return request.param, merged_values(CHART, values), render(CHART, values)


def _agent(rendered: Any) -> dict[str, Any]:
    return container(rendered.pod_spec(), "agent")


def _haproxy_configs(rendered: Any) -> tuple[str, str]:
    cm = rendered.one("ConfigMap", "-haproxy")
    return cm["data"]["haproxy.cfg"], cm["data"]["spoe.cfg"]


def test_lint_default_and_strict() -> None:
    report = helm_python.lint(CHARTS / CHART, strict=True, kube_version="v1.29.0")
    errors = [m for m in report["messages"] if m["severity"] >= 2]
    assert not errors and not report["errors"], report


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_each_value_set(name: str) -> None:
    report = helm_python.lint(CHARTS / CHART, VALUE_SETS[name], kube_version="v1.29.0")
    errors = [m for m in report["messages"] if m["severity"] >= 3]
    assert not errors and not report["errors"], report


def test_every_object_valid_for_kubernetes(case: Any) -> None:
    name, values, rendered = case
    versions = list(K8S_VERSIONS)
    if values["mode"] == "standalone" or not values["sidecar"]["native"]:
        versions.append(OLDEST)  # what must work on clusters before 1.29
    assert rendered.objects
    for version in versions:
        for obj in rendered.objects:
            validate(obj, version)


def test_probe_paths(case: Any) -> None:
    _, values, rendered = case
    agent = _agent(rendered)
    assert probe_path(agent, "livenessProbe") == "/livez"
    assert probe_path(agent, "readinessProbe") == "/readyz"
    assert probe_path(agent, "startupProbe") == "/readyz"
    admin_port = values["admin"]["port"]
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert ports["admin"] == admin_port
    assert ports["spop"] == values["agent"]["port"]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert agent[probe]["httpGet"]["port"] == "admin"
    assert flag(agent["args"], "admin-addr").endswith(f":{admin_port}")
    # Readiness must fall quickly at drain start; liveness must never be tied to draining.
    assert agent["readinessProbe"]["failureThreshold"] * agent["readinessProbe"]["periodSeconds"] <= 5


def test_grace_covers_the_drain(case: Any) -> None:
    _, values, rendered = case
    g = values["gracefulTermination"]
    grace = rendered.grace()
    if not g["enabled"]:
        return
    delay, timeout, margin = g["shutdownDelaySeconds"], g["drainTimeoutSeconds"], g["marginSeconds"]
    assert grace >= delay + timeout + margin
    if g.get("terminationGracePeriodSeconds") is not None:
        assert grace == g["terminationGracePeriodSeconds"]
    agent = _agent(rendered)
    agent_deadline = seconds(flag(agent["args"], "drain-timeout"))
    agent_delay = seconds(flag(agent["args"], "shutdown-delay"))
    assert agent_delay < agent_deadline, "the daemon refuses a delay that is not shorter than the deadline"
    if values["mode"] == "standalone":
        assert (agent_delay, agent_deadline) == (delay, timeout)
        assert grace >= agent_deadline + margin
        return
    # Sidecar: HAProxy listens `grace` s after its stop signal, then soft-stops for at most
    # `hard-stop-after` s. The agent must outlive that (classic) or follow it (native), and
    # the pod's grace must cover both.
    haproxy_cfg, _ = _haproxy_configs(rendered)
    hp_grace = seconds(re.search(r"^\s*grace (\S+)$", haproxy_cfg, re.M).group(1))
    hp_hard = seconds(re.search(r"^\s*hard-stop-after (\S+)$", haproxy_cfg, re.M).group(1))
    assert (hp_grace, hp_hard) == (delay, timeout)
    haproxy_lifetime = hp_grace + hp_hard
    if values["sidecar"]["native"]:
        assert agent_delay == 0, "a native sidecar is stopped after HAProxy: nothing to announce"
        assert grace >= haproxy_lifetime + agent_deadline + margin
    else:
        assert agent_delay == delay
        assert agent_deadline > haproxy_lifetime, "the lingering agent must outlive HAProxy"
        assert grace >= agent_deadline + margin


def test_no_prestop_anywhere(case: Any) -> None:
    _, _, rendered = case
    assert_no_prestop(rendered)
    assert_no_nested_mounts(rendered)


def test_sidecar_ordering(case: Any) -> None:
    _, values, rendered = case
    spec = rendered.pod_spec()
    agent = _agent(rendered)
    policy = flag(agent["args"], "on-sigterm")
    if values["mode"] == "standalone":
        assert [c["name"] for c in spec["containers"]] == ["agent"]
        assert "initContainers" not in spec
        assert policy == ("drain" if values["gracefulTermination"]["enabled"] else "exit")
        return
    mains = [c["name"] for c in spec["containers"]]
    assert mains[0] == "haproxy"
    if values["sidecar"]["native"]:
        inits = spec["initContainers"]
        assert [c["name"] for c in inits] == ["agent"]
        assert inits[0]["restartPolicy"] == "Always"
        assert "agent" not in mains
        assert policy == ("drain" if values["gracefulTermination"]["enabled"] else "exit")
    else:
        assert "initContainers" not in spec
        assert "agent" in mains and "restartPolicy" not in agent
        assert policy == ("linger" if values["gracefulTermination"]["enabled"] else "exit")
    for extra in values["sidecar"]["extraContainers"]:
        assert extra["name"] in mains


def test_graceful_termination_switch(case: Any) -> None:
    _, values, rendered = case
    agent = _agent(rendered)
    if values["gracefulTermination"]["enabled"]:
        assert "OFF" not in rendered.notes
        return
    assert flag(agent["args"], "on-sigterm") == "exit"
    assert flag(agent["args"], "shutdown-delay") is None
    assert flag(agent["args"], "drain-timeout") is None
    assert rendered.grace() == values["gracefulTermination"]["disabledGracePeriodSeconds"]
    assert "OFF" in rendered.notes


def test_agent_config(case: Any) -> None:
    _, values, rendered = case
    volumes = {v["name"]: v for v in rendered.pod_spec()["volumes"]}
    agent = _agent(rendered)
    assert flag(agent["args"], "config") == "/etc/lastcall-spoa/config.yaml"
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts["agent-config"] == "/etc/lastcall-spoa"
    if values["agent"]["existingConfigMap"]:
        assert volumes["agent-config"]["configMap"]["name"] == values["agent"]["existingConfigMap"]
        assert not [o for o in rendered.of_kind("ConfigMap") if o["metadata"]["name"].endswith("-agent")]
        return
    cm = rendered.one("ConfigMap", "-agent")
    assert volumes["agent-config"]["configMap"]["name"] == cm["metadata"]["name"]
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    host = "127.0.0.1" if values["mode"] == "sidecar" else "0.0.0.0"
    assert cfg["bind"] == f"{host}:{values['agent']['port']}"
    assert cfg["log_format"] == values["agent"]["logFormat"]
    assert cfg["log_level"] == values["agent"]["logLevel"]
    assert cfg["default_application"] in [a["name"] for a in cfg["applications"]]
    assert set(cfg) <= {"bind", "log_level", "log_format", "default_application", "applications"}
    for app in cfg["applications"]:
        assert set(app) <= {"name", "directives", "response_check", "transaction_ttl_ms"}
    # A config change rolls the pods.
    assert "checksum/config" in rendered.workload()["spec"]["template"]["metadata"]["annotations"]


def test_standalone_objects(case: Any) -> None:
    _, values, rendered = case
    if values["mode"] != "standalone":
        return
    dep = rendered.workload()
    assert dep["spec"]["replicas"] == values["replicaCount"]
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = rendered.one("PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == values["podDisruptionBudget"]["maxUnavailable"]
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    svc = rendered.one("Service", "-lastcall-spoa")
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]} == {"spop": "spop", "admin": "admin"}
    headless = [s for s in rendered.of_kind("Service") if s["metadata"]["name"].endswith("-headless")]
    assert len(headless) == (1 if values["service"]["headless"] else 0)
    for h in headless:
        assert h["spec"]["clusterIP"] == "None" and h["spec"]["publishNotReadyAddresses"] is False
    assert "option spop-check" in rendered.notes and "check inter 1s fall 2" in rendered.notes
    if values["metrics"]["serviceMonitor"]["enabled"]:
        sm = rendered.one("ServiceMonitor")
        assert sm["spec"]["endpoints"][0]["port"] == "admin"
        assert sm["metadata"]["labels"]["release"] == "prom"
    else:
        assert not rendered.of_kind("ServiceMonitor")
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(values["admin"]["port"])
    if values["admin"]["tokenSecret"]["name"]:
        agent = _agent(rendered)
        token_file = flag(agent["args"], "admin-token-file")
        assert token_file == f"/etc/lastcall-spoa-admin/{values['admin']['tokenSecret']['key']}"
        # Not nested inside the read-only config volume's mount.
        mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
        assert not mounts["admin-token"].startswith(mounts["agent-config"] + "/")


def test_sidecar_haproxy_config(case: Any, tmp_path: Path) -> None:
    _, values, rendered = case
    if values["mode"] != "sidecar":
        assert not [o for o in rendered.of_kind("ConfigMap") if o["metadata"]["name"].endswith("-haproxy")]
        return
    haproxy_cfg, spoe_cfg = _haproxy_configs(rendered)
    # The agent backend: health-checked SPOP, one agent on loopback.
    assert "option spop-check" in haproxy_cfg
    assert re.search(rf"server agent 127\.0\.0\.1:{values['agent']['port']} check inter 1s fall 2\b", haproxy_cfg)
    # Readiness, in one probe: not stopping, the agent's check UP, the agent's own /readyz.
    assert 'string "stopping" if { stopping }' in haproxy_cfg
    assert "if { nbsrv(coraza-spoa) lt 1 }" in haproxy_cfg
    assert "set-path /readyz\n  default_backend agent-readiness\n" in haproxy_cfg
    assert f"server agent 127.0.0.1:{values['admin']['port']}\n" in haproxy_cfg
    assert ("grace " in haproxy_cfg) == values["gracefulTermination"]["enabled"]
    assert "use-backend coraza-spoa" in spoe_cfg
    assert ("coraza-res" in spoe_cfg) == values["sidecar"]["haproxy"]["responseCheck"]
    assert ("var(txn.coraza.error)" in haproxy_cfg) == values["sidecar"]["haproxy"]["failClosed"]
    for server in values["sidecar"]["haproxy"]["backendServers"]:
        assert f"server {server['name']} {server['address']} " in haproxy_cfg
    # The real HAProxy accepts it.
    result = haproxy_check(haproxy_cfg, spoe_cfg, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # Bodies reach the agent whole: HAProxy waits for them, with room for the configured size.
    assert "option http-buffer-request" in haproxy_cfg
    assert f"tune.bufsize {values['sidecar']['haproxy'].get('bufsize', 1114112)}\n" in haproxy_cfg
    # And the agent's own reader of HAProxy files finds nothing to add about bodies (when it
    # is built); it would without the line. (It does ask a sidecar for a second agent server
    # and the retry lines: one agent per pod is the sidecar's design.)
    binary = built_binary("lastcall-spoa")
    if binary is not None:
        (tmp_path / "spoe.cfg").write_text(spoe_cfg)
        for cfg, flagged in ((haproxy_cfg, False), (haproxy_cfg.replace("option http-buffer-request", ""), True)):
            (tmp_path / "haproxy.cfg").write_text(cfg.replace("/usr/local/etc/haproxy/spoe.cfg", str(tmp_path / "spoe.cfg")))
            checked = subprocess.run([binary, "check-haproxy", str(tmp_path / "haproxy.cfg")],
                                     capture_output=True, text=True, timeout=30)
            assert ("option http-buffer-request" in checked.stdout) == flagged, checked.stdout + checked.stderr
    haproxy = container(rendered.pod_spec(), "haproxy")
    assert probe_path(haproxy, "readinessProbe") == "/healthz"
    assert "command" not in haproxy, "the haproxy image's STOPSIGNAL (SIGUSR1) and entrypoint are kept"
    svc = rendered.one("Service")
    assert svc["spec"]["ports"][0]["targetPort"] == "http"


def test_images_default_to_app_version(case: Any) -> None:
    _, values, rendered = case
    assert _agent(rendered)["image"] == "lastcall/lastcall-spoa:0.1.0"
    for c in all_containers(rendered.pod_spec()):
        if c["name"] in ("agent", "haproxy"):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert rendered.pod_spec()["securityContext"]["runAsUser"] == 65532


# --- values the schema or the templates must refuse -------------------------------------

SCHEMA_REJECTS = {
    "onSigterm-bogus": {"gracefulTermination": {"onSigterm": "bogus"}},
    "negative-timeout": {"gracefulTermination": {"drainTimeoutSeconds": -1}},
    "negative-delay": {"gracefulTermination": {"shutdownDelaySeconds": -5}},
    "duration-string": {"gracefulTermination": {"drainTimeoutSeconds": "30s"}},
    "fractional-seconds": {"gracefulTermination": {"shutdownDelaySeconds": 1.5}},
    "typo-key": {"gracefulTermination": {"enable": False}},
    "mode-bogus": {"mode": "daemonset"},
    "zero-replicas": {"replicaCount": 0},
    "port-out-of-range": {"agent": {"port": 70000}},
    "log-format": {"agent": {"logFormat": "xml"}},
    "enabled-string": {"gracefulTermination": {"enabled": "no"}},
    "no-backend-server": {"mode": "sidecar", "sidecar": {"haproxy": {"backendServers": []}}},
}


@pytest.mark.parametrize("name", sorted(SCHEMA_REJECTS))
def test_schema_rejects(name: str) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render(CHART, SCHEMA_REJECTS[name])
    report = helm_python.lint(CHARTS / CHART, SCHEMA_REJECTS[name])
    assert report["errors"], f"lint accepted {name}"


TEMPLATE_REJECTS = {
    "delay-equal-to-timeout": (
        {"gracefulTermination": {"shutdownDelaySeconds": 30, "drainTimeoutSeconds": 30}},
        "must be shorter than",
    ),
    "grace-too-short": ({"gracefulTermination": {"terminationGracePeriodSeconds": 30}}, "shorter than the drain needs"),
    "grace-too-short-sidecar": (
        {"mode": "sidecar", "gracefulTermination": {"terminationGracePeriodSeconds": 40}},
        "shorter than the drain needs",
    ),
    "delay-longer-than-timeout": (
        {"gracefulTermination": {"shutdownDelaySeconds": 60, "drainTimeoutSeconds": 30}},
        "must be shorter than",
    ),
}


@pytest.mark.parametrize("name", sorted(TEMPLATE_REJECTS))
def test_template_rejects(name: str) -> None:
    values, message = TEMPLATE_REJECTS[name]
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render(CHART, values)


def test_turning_graceful_termination_off_is_one_value() -> None:
    on = render(CHART, {})
    off = render(CHART, {"gracefulTermination": {"enabled": False}})
    assert on.grace() == 5 + 30 + 5
    assert off.grace() == 10
    assert flag(_agent(on)["args"], "on-sigterm") == "drain"
    assert flag(_agent(off)["args"], "on-sigterm") == "exit"


def test_flags_known_to_the_built_agent() -> None:
    """Every option the chart passes is one the real daemon accepts (when it is built)."""
    binary = built_binary("lastcall-spoa")
    if binary is None:
        pytest.skip("lastcall-spoa is not built (cargo build -p lastcall-spoa)")
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
    used: set[str] = set()
    for name in VALUE_SETS:
        if name == "standalone-tuned":
            continue  # carries a made-up extraArgs flag
        for c in all_containers(render(CHART, VALUE_SETS[name]).pod_spec()):
            if c["name"] == "agent":
                used |= {a.split("=", 1)[0] for a in c["args"] if a.startswith("--")}
    missing = sorted(f for f in used if f not in help_text)
    assert not missing, f"lastcall-spoa --help does not mention {missing}"


def test_standalone_notes_backend_is_valid_haproxy(tmp_path: Path) -> None:
    """The backend NOTES.txt tells users to paste into their HAProxy is accepted by HAProxy
    together with the sidecar mode's frontend and SPOE file."""
    notes = render(CHART, {}).notes
    snippet = "\n".join(
        line for line in notes.splitlines() if line.startswith("  ") and not line.startswith("  kubectl")
    )
    assert "server-template agent" in snippet and "option spop-check" in snippet
    sidecar = render(CHART, {"mode": "sidecar"})
    haproxy_cfg, spoe_cfg = _haproxy_configs(sidecar)
    # Swap the sidecar's loopback agent backend for the one from NOTES.
    head, _, _ = haproxy_cfg.partition("backend coraza-spoa")
    resolvers = "resolvers kube\n  parse-resolv-conf\n  hold valid 10s\n"
    assert resolvers in head and "resolvers kube" in snippet
    cfg = head.replace(resolvers, "") + "\n" + snippet + "\n"
    result = haproxy_check(cfg, spoe_cfg, tmp_path)
    assert result.returncode == 0, cfg + result.stdout + result.stderr

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
    # The values both charts share (CHARTS.md), and spoa's HPA, DaemonSet and CRS sources.
    "shared-values": {
        "serviceAccount": {"create": True, "annotations": {"team": "waf"}},
        "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}},
        "agent": {"resources": {"requests": {"cpu": "1"}}, "env": [{"name": "OLD", "value": "1"}]},
        "extraEnv": [{"name": "MALLOC_ARENA_MAX", "value": "2"}],
        "extraVolumes": [{"name": "rules", "configMap": {"name": "my-rules"}}],
        "extraVolumeMounts": [{"name": "rules", "mountPath": "/etc/my-rules", "readOnly": True}],
        "initContainers": [{"name": "warm", "image": "busybox:1.36", "command": ["true"]}],
        "networkPolicy": {
            "enabled": True,
            "ingressFrom": [{"podSelector": {"matchLabels": {"app": "haproxy"}}}],
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        },
        "crs": {"image": {"repository": "registry.example/coreruleset", "tag": "4.28.0"}},
    },
    "autoscaling": {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 8}},
    "daemonset-crs-volume": {
        "daemonSet": {"enabled": True},
        "crs": {"volume": {"persistentVolumeClaim": {"claimName": "crs-4-28"}}, "path": "/coreruleset-4.28.0"},
    },
    "sidecar-shared-values": {
        "mode": "sidecar",
        "serviceAccount": {"name": "edge"},
        "networkPolicy": {"enabled": True},
        "crs": {"image": {"repository": "registry.example/coreruleset", "tag": "4.28.0"}},
        "initContainers": [{"name": "warm", "image": "busybox:1.36", "command": ["true"]}],
    },
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
    # The user's init containers, then the CRS copier, come before the chart's agent.
    extra_inits = [c["name"] for c in values["initContainers"]] + (["crs"] if values["crs"]["image"]["repository"] else [])
    if values["mode"] == "standalone":
        assert [c["name"] for c in spec["containers"]] == ["agent"]
        assert [c["name"] for c in spec.get("initContainers", [])] == extra_inits
        assert policy == ("drain" if values["gracefulTermination"]["enabled"] else "exit")
        return
    mains = [c["name"] for c in spec["containers"]]
    assert mains[0] == "haproxy"
    if values["sidecar"]["native"]:
        inits = spec["initContainers"]
        assert [c["name"] for c in inits] == extra_inits + ["agent"]
        assert inits[-1]["restartPolicy"] == "Always"
        assert "agent" not in mains
        assert policy == ("drain" if values["gracefulTermination"]["enabled"] else "exit")
    else:
        assert [c["name"] for c in spec.get("initContainers", [])] == extra_inits
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
    # The agent follows its file: an existingConfigMap's edits reach it (test_checksums.py).
    assert ("--autoreload" in agent["args"]) == values["agent"]["autoreload"]
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
    if values["daemonSet"]["enabled"]:
        assert dep["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 0
    elif values["autoscaling"]["enabled"]:
        assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    else:
        assert dep["spec"]["replicas"] == values["replicaCount"]
        assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    if values["daemonSet"]["enabled"]:
        # A node drain does not evict a DaemonSet's pods: no budget.
        assert rendered.of_kind("PodDisruptionBudget") == []
    else:
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
    assert "fall 2 rise 1 on-marked-down shutdown-sessions\n" in rendered.notes
    assert "`max-waiting-frames 1`" in rendered.notes
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
    assert re.search(rf"server agent 127\.0\.0\.1:{values['agent']['port']} check inter 1s fall 2\b.* on-marked-down shutdown-sessions\n",
                     haproxy_cfg)
    assert "\n  max-waiting-frames 1\n" in spoe_cfg
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
    # And the agent's own reader of HAProxy files finds nothing to add about bodies, a hung
    # agent or one message at a time (when it is built); it would without each line. (It
    # does ask a sidecar for a second agent server and the retry lines: one agent per pod is
    # the sidecar's design.)
    binary = built_binary("lastcall-spoa")
    if binary is not None:
        without_shutdown = haproxy_cfg.replace(" on-marked-down shutdown-sessions", "")
        without_frames = spoe_cfg.replace("  max-waiting-frames 1\n", "")
        for cfg, spoe, flagged in (
            (haproxy_cfg, spoe_cfg, ""),
            (haproxy_cfg.replace("option http-buffer-request", ""), spoe_cfg, "option http-buffer-request"),
            (without_shutdown, spoe_cfg, "on-marked-down shutdown-sessions"),
            (haproxy_cfg, without_frames, "max-waiting-frames 1"),
        ):
            (tmp_path / "spoe.cfg").write_text(spoe)
            (tmp_path / "haproxy.cfg").write_text(cfg.replace("/usr/local/etc/haproxy/spoe.cfg", str(tmp_path / "spoe.cfg")))
            checked = subprocess.run([binary, "check-haproxy", str(tmp_path / "haproxy.cfg")],
                                     capture_output=True, text=True, timeout=30)
            for line in ("option http-buffer-request", "on-marked-down shutdown-sessions", "max-waiting-frames 1"):
                assert (line in checked.stdout) == (line == flagged), (line, checked.stdout + checked.stderr)
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


# --- the values both charts share, the HPA, the DaemonSet, the CRS sources ----------------


def test_service_account(case: Any) -> None:
    _, values, rendered = case
    spec = rendered.pod_spec()
    sa = values["serviceAccount"]
    assert spec["automountServiceAccountToken"] is sa["automountServiceAccountToken"] is False
    accounts = rendered.of_kind("ServiceAccount")
    if sa["create"]:
        assert len(accounts) == 1, "serviceAccount.create renders the account the pods name"
        assert accounts[0]["metadata"]["name"] == spec["serviceAccountName"] == (sa["name"] or "rel-lastcall-spoa")
        assert accounts[0]["automountServiceAccountToken"] is False
        assert accounts[0]["metadata"].get("annotations", {}) == sa["annotations"]
    else:
        assert not accounts
        assert spec["serviceAccountName"] == (sa["name"] or "default")


def _laid_over(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _laid_over(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_the_memory_defaults_reach_the_agent_and_an_old_agent_resources_keeps_them() -> None:
    default = _agent(render(CHART, {}))["resources"]
    assert default == {"requests": {"memory": "128Mi"}, "limits": {"memory": "256Mi"}}
    old = _agent(render(CHART, {"agent": {"resources": {"requests": {"cpu": "1"}}}}))["resources"]
    assert old == {"requests": {"cpu": "1", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}


def test_resources_env_volumes_and_init_containers(case: Any) -> None:
    _, values, rendered = case
    agent = _agent(rendered)
    want = _laid_over(values["resources"] or {}, values["agent"]["resources"] or {})
    assert agent.get("resources", {}) == want, "agent.resources (deprecated) is laid over resources"
    env = values["agent"]["env"] + values["extraEnv"]
    assert agent.get("env", []) == env
    spec = rendered.pod_spec()
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    for v in values["extraVolumes"]:
        assert volumes[v["name"]] == v
    for m in values["extraVolumeMounts"]:
        assert mounts[m["name"]] == m
    inits = [c["name"] for c in spec.get("initContainers", [])]
    user = [c["name"] for c in values["initContainers"]]
    assert inits[: len(user)] == user, "the user's init containers come first"


def test_crs_from_an_image_or_a_volume(case: Any) -> None:
    _, values, rendered = case
    crs = values["crs"]
    agent = _agent(rendered)
    spec = rendered.pod_spec()
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    if not crs["image"]["repository"] and not crs["volume"]:
        assert flag(agent["args"], "crs-dir") is None and "crs" not in volumes
        return
    assert flag(agent["args"], "crs-dir") == mounts["crs"]["mountPath"] == "/opt/lastcall-spoa/crs"
    assert mounts["crs"]["readOnly"] is True
    if crs["image"]["repository"]:
        copier = container(spec, "crs")
        assert copier["image"] == f"{crs['image']['repository']}:{crs['image']['tag']}"
        assert copier["command"] == ["cp", "-R", f"{crs['path']}/.", "/crs-out/"]
        assert copier["volumeMounts"] == [{"name": "crs", "mountPath": "/crs-out"}]
        assert volumes["crs"] == {"name": "crs", "emptyDir": {}}
        names = [c["name"] for c in spec["initContainers"]]
        assert names.index("crs") < names.index("agent") if "agent" in names else True
    else:
        assert volumes["crs"] == {"name": "crs", **crs["volume"]}
        assert mounts["crs"]["subPath"] == crs["path"].lstrip("/")


def test_workload_kind_and_autoscaling(case: Any) -> None:
    _, values, rendered = case
    w = rendered.workload()
    standalone = values["mode"] == "standalone"
    if standalone and values["daemonSet"]["enabled"]:
        assert w["kind"] == "DaemonSet"
        assert "replicas" not in w["spec"]
        assert w["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
        assert not rendered.of_kind("HorizontalPodAutoscaler")
        return
    assert w["kind"] == "Deployment"
    hpas = rendered.of_kind("HorizontalPodAutoscaler")
    if standalone and values["autoscaling"]["enabled"]:
        a = values["autoscaling"]
        assert "replicas" not in w["spec"], "the HPA owns the replica count"
        (hpa,) = hpas
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": w["metadata"]["name"]}
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (a["minReplicas"], a["maxReplicas"])
        assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
        down = hpa["spec"]["behavior"]["scaleDown"]
        # One pod per grace period: each drain ends before the next one starts.
        assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": rendered.grace()}]
        assert down["selectPolicy"] == "Min" and down["stabilizationWindowSeconds"] >= 60
    else:
        assert not hpas
        assert "replicas" in w["spec"]


def test_network_policy(case: Any) -> None:
    _, values, rendered = case
    np = values["networkPolicy"]
    policies = rendered.of_kind("NetworkPolicy")
    if not np["enabled"]:
        assert not policies
        return
    (policy,) = policies
    assert policy["spec"]["podSelector"]["matchLabels"] == rendered.workload()["spec"]["selector"]["matchLabels"]
    service, admin = policy["spec"]["ingress"]
    ports = {p["port"] for p in service["ports"]}
    assert ports == ({"spop"} if values["mode"] == "standalone" else {"http", "health"})
    assert service.get("from", []) == np["ingressFrom"]
    assert [p["port"] for p in admin["ports"]] == ["admin"]
    assert admin.get("from", []) == np["metricsFrom"]
    # Every named port exists on a container of the pod.
    named = {p["name"] for c in all_containers(rendered.pod_spec()) for p in c.get("ports", [])}
    assert ports | {"admin"} <= named


def test_default_rules_are_the_binarys_built_in_application(tmp_path: Path) -> None:
    """The chart's default configuration is the binary's built-in application: the rules the
    agent compiles from the rendered file are the ones it prints without a file (show-rules;
    one source, in the code: a copy in the chart would drift)."""
    rendered = render(CHART, {})
    cfg = yaml.safe_load(rendered.one("ConfigMap", "-agent")["data"]["config.yaml"])
    assert all("directives" not in a for a in cfg["applications"]), "the chart writes no rules of its own"
    binary = built_binary("lastcall-spoa")
    if binary is None:
        pytest.skip("lastcall-spoa is not built (cargo build -p lastcall-spoa)")
    path = tmp_path / "config.yaml"
    path.write_text(rendered.one("ConfigMap", "-agent")["data"]["config.yaml"])
    run = lambda *a: subprocess.run([binary, *a], capture_output=True, text=True, timeout=60, check=True).stdout
    builtin = run("show-rules")
    assert run("--config", str(path), "show-rules") == builtin
    for line in ("SecRequestBodyNoFilesLimit 1114112", "requestBodyProcessor=JSON", "SecPcreMatchLimit 50000"):
        assert line in builtin


def test_log_formats_are_the_binarys(tmp_path: Path) -> None:
    """agent.logFormat's enum is exactly the log_format values the built agent accepts (its
    error message lists them: one source, in the code), and each renders a file it runs."""
    import json as _json
    schema = _json.loads((CHARTS / CHART / "values.schema.json").read_text())
    enum = schema["properties"]["agent"]["properties"]["logFormat"]["enum"]
    binary = built_binary("lastcall-spoa")
    if binary is None:
        pytest.skip("lastcall-spoa is not built (cargo build -p lastcall-spoa)")
    bad = tmp_path / "bad.yaml"
    bad.write_text("log_format: xml\n")
    out = subprocess.run([binary, "-validate", "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 64, out
    listed = out.stderr.split("expected ", 1)[1].split("\n", 1)[0]
    accepted = [w.strip(" ,") for w in listed.replace(" or ", ", ").split(",") if w.strip(" ,")]
    assert sorted(accepted) == sorted(enum), (listed, enum)
    for f in enum:
        path = tmp_path / f"{f}.yaml"
        path.write_text(render(CHART, {"agent": {"logFormat": f}}).one("ConfigMap", "-agent")["data"]["config.yaml"])
        ok = subprocess.run([binary, "-validate", "--config", str(path)], capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0, (f, ok.stderr)


SHARED_REJECTS = {
    "sa-typo": {"serviceAccount": {"automount": False}},
    "hpa-typo": {"autoscaling": {"enable": True}},
    "np-from-not-list": {"networkPolicy": {"enabled": True, "ingressFrom": {"podSelector": {}}}},
    "crs-typo": {"crs": {"images": {}}},
    "app-key-typo": {"agent": {"config": {"applications": [{"name": "a", "paranoia": 2}]}}},
}


@pytest.mark.parametrize("name", sorted(SHARED_REJECTS))
def test_schema_rejects_shared_values(name: str) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render(CHART, SHARED_REJECTS[name])


def test_hpa_bounds_are_checked() -> None:
    with pytest.raises(helm_python.HelmRenderError, match="maxReplicas"):
        render(CHART, {"autoscaling": {"enabled": True, "minReplicas": 4, "maxReplicas": 2}})

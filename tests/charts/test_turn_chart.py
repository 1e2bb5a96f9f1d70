"""charts/lastcall-turn: render with several value sets, lint, validate every object against
the Kubernetes API schemas, and check the termination, placement and secret invariants."""

from __future__ import annotations

import base64
import re
import subprocess
from typing import Any

import helm_python
import pytest

from chartlib import (
    CHARTS,
    K8S_VERSIONS,
    OLDEST,
    assert_no_nested_mounts,
    assert_no_prestop,
    built_binary,
    container,
    flag,
    merged_values,
    probe_path,
    render,
    seconds,
    validate,
)

CHART = "lastcall-turn"
SECRET = "s3cr3t-do-not-leak-4f2a"

# coturn options the daemon reads from turnserver.conf (turn.md); the chart writes no other.
CONF_KEYS = {
    "listening-port", "tls-listening-port", "listening-ip", "relay-ip", "external-ip",
    "min-port", "max-port", "realm", "use-auth-secret", "static-auth-secret", "lt-cred-mech",
    "user", "no-tcp-relay", "denied-peer-ip", "allowed-peer-ip", "no-multicast-peers",
    "user-quota", "total-quota", "max-allocate-lifetime", "stale-nonce", "cert", "pkey",
    "no-tls", "no-udp", "no-tcp", "no-cli", "drain-min-allocations", "alternate-server",
}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "statefulset-everything": {
        "kind": "StatefulSet",
        "replicaCount": 3,
        "updateStrategy": {"maxUnavailable": 2},
        "tls": {"enabled": True, "existingSecret": "turn-tls"},
        "turn": {
            "realm": "turn.example.org",
            "externalIP": "203.0.113.7/10.0.0.7",
            "deniedPeerIPs": ["198.51.100.0-198.51.100.255"],
            "allowedPeerIPs": ["10.20.0.0-10.20.255.255"],
            "userQuota": 10,
            "totalQuota": 1000,
            "maxAllocateLifetime": 1800,
            "alternateServers": ["192.0.2.10:3478", "[2001:db8::10]:3478"],
            "auth": {"existingSecret": "turn-auth", "key": "current", "extraKeys": ["previous"]},
            "extraConfig": "stale-nonce=600\nno-multicast-peers\n",
        },
        "metrics": {"podAnnotations": False, "serviceMonitor": {"enabled": True}},
        "admin": {"tokenSecret": {"name": "turn-admin"}},
    },
    "chart-made-secret": {"turn": {"auth": {"value": SECRET}}},
    "percent-rollout": {"updateStrategy": {"maxUnavailable": "25%"}, "turn": {"udp": False}},
    "wire-12h": {
        "gracefulTermination": {"drainTimeoutSeconds": 43200, "terminationGracePeriodSeconds": 43300},
        "turn": {"listeningIP": "0.0.0.0", "relayIP": "$(POD_IP)"},
    },
    "config-from-secret": {"config": {"existingSecret": "turnserver-conf"}, "turn": {"auth": {"value": SECRET}}},
    "off": {"gracefulTermination": {"enabled": False}},
    "no-auth-secret": {"turn": {"auth": {"useAuthSecret": False}}, "kind": "StatefulSet"},
    # TURNS on 443 behind corporate firewalls, a relay address per node (the map), the
    # shared values of both charts.
    "turns-443-per-node-ips": {
        "tls": {"enabled": True, "existingSecret": "turn-tls"},
        "turn": {"tlsListeningPort": 443,
                 "externalIPs": {"node-a": "203.0.113.10", "node-b": "203.0.113.11/10.0.0.11 2001:db8::11"}},
        "serviceAccount": {"create": True, "annotations": {"example.org/owner": "rtc"}},
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
        "extraVolumes": [{"name": "extra", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "extra", "mountPath": "/extra"}],
        "initContainers": [{"name": "first", "image": "busybox:1.36", "command": ["true"]}],
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                       "whenUnsatisfiable": "ScheduleAnyway",
                                       "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "lastcall-turn"}}}],
        "networkPolicy": {"enabled": True, "ingressFrom": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
                          "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]},
    },
    # Relay ports below 1024 with the user's own added capability kept beside the chart's.
    "low-relay-ports": {
        "turn": {"minPort": 900, "maxPort": 1100},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"], "add": ["NET_RAW"]}},
    },
    # The node's ExternalIP from the Kubernetes API, as wire's chart did; a StatefulSet with
    # its PDB.
    "node-lookup-statefulset": {
        "kind": "StatefulSet",
        "turn": {"externalIPFromNode": {"enabled": True}},
        "serviceAccount": {"create": True},
        "podDisruptionBudget": {"maxUnavailable": 2},
    },
}


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def case(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], Any]:
    values = VALUE_SETS[request.param]
    return request.param, merged_values(CHART, values), render(CHART, values)


def _turn(rendered: Any) -> dict[str, Any]:
    return container(rendered.pod_spec(), "turn")


def _conf(rendered: Any) -> dict[str, list[str]]:
    """turnserver.conf as {key: [values]} (bare flags map to [""])."""
    text = rendered.one("ConfigMap", "lastcall-turn")["data"]["turnserver.conf"]
    conf: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        conf.setdefault(key, []).append(value)
    return conf


def test_lint_strict() -> None:
    report = helm_python.lint(CHARTS / CHART, strict=True, kube_version="v1.29.0")
    assert not [m for m in report["messages"] if m["severity"] >= 2] and not report["errors"], report


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_each_value_set(name: str) -> None:
    report = helm_python.lint(CHARTS / CHART, VALUE_SETS[name], kube_version="v1.29.0")
    assert not [m for m in report["messages"] if m["severity"] >= 3] and not report["errors"], report


def test_every_object_valid_for_kubernetes(case: Any) -> None:
    _, _, rendered = case
    assert rendered.objects
    for version in (*K8S_VERSIONS, OLDEST):
        for obj in rendered.objects:
            validate(obj, version)


def test_host_network_one_pod_per_node(case: Any) -> None:
    _, values, rendered = case
    wl = rendered.workload()
    spec = rendered.pod_spec()
    assert wl["kind"] == values["kind"]
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    rolling = wl["spec"]["updateStrategy"]["rollingUpdate"]
    assert wl["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert rolling["maxUnavailable"] == values["updateStrategy"]["maxUnavailable"]
    assert "maxSurge" not in rolling, "a surge pod would need the same host ports"
    if values["kind"] == "StatefulSet":
        assert wl["spec"]["replicas"] == values["replicaCount"]
        assert wl["spec"]["serviceName"] == rendered.one("Service")["metadata"]["name"]
        terms = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms[0]["topologyKey"] == "kubernetes.io/hostname"
        assert terms[0]["labelSelector"]["matchLabels"] == wl["spec"]["selector"]["matchLabels"]


def test_probe_paths(case: Any) -> None:
    _, values, rendered = case
    turn = _turn(rendered)
    assert probe_path(turn, "readinessProbe") == "/readyz"
    assert probe_path(turn, "livenessProbe") == "/livez"
    ports = {p["name"]: p for p in turn["ports"]}
    assert ports["admin"]["containerPort"] == values["admin"]["port"]
    assert turn["readinessProbe"]["httpGet"]["port"] == "admin"
    assert flag(turn["args"], "admin-addr") == f"$(POD_IP):{values['admin']['port']}"
    env = {e["name"]: e for e in turn["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_grace_covers_the_drain(case: Any) -> None:
    _, values, rendered = case
    g = values["gracefulTermination"]
    grace = rendered.grace()
    turn = _turn(rendered)
    if not g["enabled"]:
        assert flag(turn["args"], "on-sigterm") == "exit"
        assert flag(turn["args"], "drain-timeout") is None
        assert grace == g["disabledGracePeriodSeconds"]
        return
    delay, timeout, margin = g["shutdownDelaySeconds"], g["drainTimeoutSeconds"], g["marginSeconds"]
    assert flag(turn["args"], "on-sigterm") == "drain"
    assert seconds(flag(turn["args"], "shutdown-delay")) == delay
    assert seconds(flag(turn["args"], "drain-timeout")) == timeout
    assert int(flag(turn["args"], "drain-min-sessions")) == g["drainMinAllocations"]
    assert grace >= delay + timeout + margin
    # Long by default: calls last.
    assert grace >= 3600


def test_no_prestop_anywhere(case: Any) -> None:
    _, _, rendered = case
    assert_no_prestop(rendered)
    assert_no_nested_mounts(rendered)


def test_secret_never_in_configmap(case: Any) -> None:
    name, values, rendered = case
    turn = _turn(rendered)
    for cm in rendered.of_kind("ConfigMap"):
        for text in cm["data"].values():
            assert SECRET not in text
            assert "static-auth-secret" not in [line.split("=")[0] for line in text.splitlines()]
    for c in rendered.pod_spec()["containers"]:
        assert SECRET not in str(c), "the secret must come from a Secret, not the pod spec"
    auth = values["turn"]["auth"]
    env = {e["name"]: e for e in turn.get("env", [])}
    if values["config"]["existingSecret"]:
        vol = [v for v in rendered.pod_spec()["volumes"] if v["name"] == "config"][0]
        assert vol["secret"]["secretName"] == values["config"]["existingSecret"]
        assert not rendered.of_kind("ConfigMap") and not rendered.of_kind("Secret")
        assert flag(turn["args"], "static-auth-secret") is None
        return
    if not auth["useAuthSecret"]:
        assert "TURN_STATIC_AUTH_SECRET" not in env
        assert "use-auth-secret" not in _conf(rendered)
        return
    assert "use-auth-secret" in _conf(rendered)
    ref = env["TURN_STATIC_AUTH_SECRET"]["valueFrom"]["secretKeyRef"]
    assert ref["key"] == auth["key"]
    assert ref["name"] == (auth["existingSecret"] or "rel-lastcall-turn-auth")
    secret_flags = [a for a in turn["args"] if a.startswith("--static-auth-secret=")]
    assert secret_flags[0] == "--static-auth-secret=$(TURN_STATIC_AUTH_SECRET)"
    assert len(secret_flags) == 1 + len(auth["extraKeys"])
    for i, key in enumerate(auth["extraKeys"]):
        assert env[f"TURN_STATIC_AUTH_SECRET_{i}"]["valueFrom"]["secretKeyRef"]["key"] == key
    secrets = rendered.of_kind("Secret")
    if auth["value"] and not auth["existingSecret"]:
        assert len(secrets) == 1
        assert base64.b64decode(secrets[0]["data"][auth["key"]]).decode() == auth["value"]
    else:
        assert not secrets
        # The Secret is the user's to create: NOTES say how when the chart chose its name.
        assert ("create secret generic" in rendered.notes) == (not auth["existingSecret"])


def test_turnserver_conf(case: Any) -> None:
    _, values, rendered = case
    if values["config"]["existingSecret"]:
        return
    conf = _conf(rendered)
    t = values["turn"]
    unknown = set(conf) - CONF_KEYS
    assert not unknown, f"turnserver.conf keys the daemon does not know: {unknown}"
    assert conf["listening-port"] == [str(t["listeningPort"])]
    assert conf["realm"] == [t["realm"]]
    assert conf["min-port"] == [str(t["minPort"])] and conf["max-port"] == [str(t["maxPort"])]
    assert conf.get("alternate-server", []) == t["alternateServers"]
    assert conf.get("denied-peer-ip", []) == t["deniedPeerIPs"]
    assert conf.get("allowed-peer-ip", []) == t["allowedPeerIPs"]
    assert ("no-udp" in conf) == (not t["udp"])
    turn = _turn(rendered)
    assert turn["args"][:2] == ["-c", "/etc/lastcall-turn/config/turnserver.conf"]
    assert flag(turn["args"], "listening-ip") == (t["listeningIP"] or "$(POD_IP)")
    assert flag(turn["args"], "relay-ip") == (t["relayIP"] or "$(POD_IP)")
    mounts = {m["name"]: m["mountPath"] for m in turn["volumeMounts"]}
    assert mounts["config"] == "/etc/lastcall-turn/config"
    if values["tls"]["enabled"]:
        assert conf["cert"] == ["/etc/lastcall-turn/tls/tls.crt"]
        assert conf["pkey"] == ["/etc/lastcall-turn/tls/tls.key"]
        assert conf["tls-listening-port"] == [str(t["tlsListeningPort"])]
        assert "no-tls" not in conf
        assert mounts["tls"] == "/etc/lastcall-turn/tls"
        vol = [v for v in rendered.pod_spec()["volumes"] if v["name"] == "tls"][0]
        assert vol["secret"]["secretName"] == values["tls"]["existingSecret"]
    else:
        assert "no-tls" in conf and "cert" not in conf
    annotations = rendered.workload()["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/config" in annotations


def test_metrics(case: Any) -> None:
    _, values, rendered = case
    annotations = rendered.workload()["spec"]["template"]["metadata"].get("annotations", {})
    m = values["metrics"]
    if m["podAnnotations"]:
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(values["admin"]["port"])
        assert annotations["prometheus.io/path"] == "/metrics"
    else:
        assert "prometheus.io/scrape" not in annotations
    monitors = rendered.of_kind("ServiceMonitor")
    assert len(monitors) == (1 if m["serviceMonitor"]["enabled"] else 0)
    for sm in monitors:
        svc = rendered.one("Service")
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        port = sm["spec"]["endpoints"][0]["port"]
        assert port in [p["name"] for p in svc["spec"]["ports"]]
        assert sm["spec"]["endpoints"][0]["path"] == "/metrics"


SCHEMA_REJECTS = {
    "onSigterm-bogus": {"gracefulTermination": {"onSigterm": "bogus"}},
    "negative-timeout": {"gracefulTermination": {"drainTimeoutSeconds": -1}},
    "duration-string": {"gracefulTermination": {"drainTimeoutSeconds": "1h"}},
    "kind-deployment": {"kind": "Deployment"},
    "max-unavailable-zero": {"updateStrategy": {"maxUnavailable": 0}},
    "max-unavailable-words": {"updateStrategy": {"maxUnavailable": "half"}},
    "typo-key": {"turn": {"listenPort": 3478}},
    "realm-empty": {"turn": {"realm": ""}},
    "alternate-without-port": {"turn": {"alternateServers": ["192.0.2.10"]}},
    "alternate-hostname": {"turn": {"alternateServers": ["turn-b.example.org:3478"]}},
    "external-ips-hostname": {"turn": {"externalIPs": {"node-a": "turn.example.org"}}},
    "external-ips-bad-node-name": {"turn": {"externalIPs": {"Node_A": "203.0.113.10"}}},
    "lookup-dns-type": {"turn": {"externalIPFromNode": {"enabled": True, "addressType": "ExternalDNS"}}},
    "service-account-typo": {"serviceAccount": {"automount": True}},
    "pdb-zero": {"podDisruptionBudget": {"maxUnavailable": 0}},
}


@pytest.mark.parametrize("name", sorted(SCHEMA_REJECTS))
def test_schema_rejects(name: str) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render(CHART, SCHEMA_REJECTS[name])
    assert helm_python.lint(CHARTS / CHART, SCHEMA_REJECTS[name])["errors"]


TEMPLATE_REJECTS = {
    "delay-equal-to-timeout": (
        {"gracefulTermination": {"shutdownDelaySeconds": 60, "drainTimeoutSeconds": 60}},
        "must be shorter than",
    ),
    "grace-too-short": ({"gracefulTermination": {"terminationGracePeriodSeconds": 3600}}, "shorter than the drain needs"),
    "delay-longer-than-timeout": (
        {"gracefulTermination": {"shutdownDelaySeconds": 120, "drainTimeoutSeconds": 60}},
        "must be shorter than",
    ),
    "tls-without-secret": ({"tls": {"enabled": True}}, "tls.existingSecret is required"),
    "lookup-without-service-account": (
        {"turn": {"externalIPFromNode": {"enabled": True}}},
        "needs a ServiceAccount allowed to get nodes",
    ),
    "map-and-lookup": (
        {"turn": {"externalIPs": {"node-a": "203.0.113.10"}, "externalIPFromNode": {"enabled": True}},
         "serviceAccount": {"create": True}},
        "give one",
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
    assert on.grace() == 15 + 3600 + 30
    assert off.grace() == 10
    assert flag(_turn(off)["args"], "on-sigterm") == "exit"


def test_flags_known_to_the_built_daemon() -> None:
    """Every option the chart passes is one the real daemon accepts (when it is built)."""
    binary = built_binary("lastcall-turn")
    if binary is None:
        pytest.skip("lastcall-turn is not built (cargo build -p lastcall-turn)")
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
    used: set[str] = set()
    for values in VALUE_SETS.values():
        used |= {a.split("=", 1)[0] for a in _turn(render(CHART, values))["args"] if a.startswith("--")}
    missing = sorted(f for f in used if f not in help_text)
    assert not missing, f"lastcall-turn --help does not mention {missing}"


def test_every_referenced_variable_is_defined(case: Any) -> None:
    """The kubelet leaves an undefined $(VAR) as is: the daemon would get a literal
    `$(POD_IP)` for an address."""
    _, _, rendered = case
    turn = _turn(rendered)
    defined = {e["name"] for e in turn.get("env", [])}
    referenced = set(re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", " ".join(turn["args"])))
    assert referenced <= defined, f"undefined: {referenced - defined}"


def _caps(c: dict[str, Any]) -> tuple[list[str], list[str]]:
    caps = c.get("securityContext", {}).get("capabilities", {})
    return caps.get("add", []), caps.get("drop", [])


def test_a_port_below_1024_adds_net_bind_service_and_nothing_else(case: Any) -> None:
    _, values, rendered = case
    t = values["turn"]
    ports = [t["listeningPort"], values["admin"]["port"], t["minPort"]] + (
        [t["tlsListeningPort"]] if values["tls"]["enabled"] else [])
    privileged = any(p < 1024 for p in ports)
    turn = _turn(rendered)
    add, drop = _caps(turn)
    assert drop == ["ALL"]
    own = values["securityContext"].get("capabilities", {}).get("add", [])
    assert add == own + (["NET_BIND_SERVICE"] if privileged else []), add
    sc = turn["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    # Root never: the pod's non-root user, also with the capability (the image's binary has
    # it as the file capability cap_net_bind_service=p; tests/images and tests/cri run it).
    assert "runAsUser" not in sc and "runAsNonRoot" not in sc, sc
    pod_sc = rendered.pod_spec()["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] == 65532, pod_sc
    for c in rendered.pod_spec().get("initContainers", []):
        if c["name"] == "node-external-ip":
            assert _caps(c) == ([], ["ALL"])


def test_external_ip_per_node_from_the_map_or_the_api(case: Any) -> None:
    _, values, rendered = case
    t = values["turn"]
    turn = _turn(rendered)
    env = {e["name"]: e for e in turn["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    ip_file = flag(turn["args"], "external-ip-file")
    volumes = {v["name"]: v for v in rendered.pod_spec()["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in turn["volumeMounts"]}
    inits = {c["name"]: c for c in rendered.pod_spec().get("initContainers", [])}
    if t["externalIPs"]:
        assert ip_file == "/etc/lastcall-turn/external-ips/$(NODE_NAME)"
        cm = rendered.one("ConfigMap", "-external-ips")
        assert cm["data"] == t["externalIPs"]
        assert volumes["external-ips"]["configMap"]["name"] == cm["metadata"]["name"]
        assert mounts["external-ips"] == "/etc/lastcall-turn/external-ips"
    elif t["externalIPFromNode"]["enabled"]:
        assert ip_file == "/run/lastcall-turn/node/external-ip"
        init = inits["node-external-ip"]
        assert init["args"][0] == "node-external-ip"
        assert flag(init["args"], "out") == ip_file and flag(init["args"], "node") == "$(NODE_NAME)"
        assert init["image"] == turn["image"]
        # The token: in the init container only, short-lived; the daemon has none.
        assert "node-token" in {m["name"] for m in init["volumeMounts"]}
        assert "node-token" not in mounts
        sources = volumes["node-token"]["projected"]["sources"]
        assert sources[0]["serviceAccountToken"]["expirationSeconds"] == 600
        assert rendered.pod_spec()["automountServiceAccountToken"] is False
        role = rendered.one("ClusterRole")
        assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
        binding = rendered.one("ClusterRoleBinding")
        assert binding["subjects"][0]["name"] == rendered.pod_spec()["serviceAccountName"]
        assert binding["subjects"][0]["namespace"] == "ns"
    else:
        assert ip_file is None and not rendered.of_kind("ClusterRole")
        assert not [o for o in rendered.of_kind("ConfigMap") if o["metadata"]["name"].endswith("-external-ips")]
    # The user's init containers first.
    names = list(inits)
    if values["initContainers"]:
        assert names[: len(values["initContainers"])] == [c["name"] for c in values["initContainers"]]


def test_shared_values_of_both_charts(case: Any) -> None:
    _, values, rendered = case
    spec = rendered.pod_spec()
    turn = _turn(rendered)
    sa = values["serviceAccount"]
    accounts = rendered.of_kind("ServiceAccount")
    assert len(accounts) == (1 if sa["create"] else 0)
    expected_name = (sa["name"] or "rel-lastcall-turn") if sa["create"] else (sa["name"] or "default")
    assert spec["serviceAccountName"] == expected_name
    assert spec["automountServiceAccountToken"] == sa["automountServiceAccountToken"]
    for acc in accounts:
        assert acc["metadata"]["name"] == expected_name
        assert acc.get("metadata", {}).get("annotations", {}) == sa["annotations"]
        assert acc["automountServiceAccountToken"] is False
    env_names = [e["name"] for e in turn["env"]]
    for e in values["extraEnv"]:
        assert e["name"] in env_names
    mounts = [m["name"] for m in turn["volumeMounts"]]
    assert all(m["name"] in mounts for m in values["extraVolumeMounts"])
    assert all(v in spec["volumes"] for v in values["extraVolumes"])
    assert spec.get("topologySpreadConstraints", []) == values["topologySpreadConstraints"]
    pdbs = rendered.of_kind("PodDisruptionBudget")
    if values["kind"] == "StatefulSet" and values["podDisruptionBudget"]["enabled"]:
        assert len(pdbs) == 1
        assert pdbs[0]["spec"]["maxUnavailable"] == values["podDisruptionBudget"]["maxUnavailable"]
        pod_labels = rendered.workload()["spec"]["template"]["metadata"]["labels"]
        assert pdbs[0]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    else:
        assert not pdbs
    policies = rendered.of_kind("NetworkPolicy")
    assert len(policies) == (1 if values["networkPolicy"]["enabled"] else 0)
    for np in policies:
        turn_rule, admin_rule = np["spec"]["ingress"]
        assert turn_rule.get("from", []) == values["networkPolicy"]["ingressFrom"]
        assert admin_rule.get("from", []) == values["networkPolicy"]["metricsFrom"]
        assert admin_rule["ports"] == [{"protocol": "TCP", "port": values["admin"]["port"]}]
        relay = [p for p in turn_rule["ports"] if "endPort" in p][0]
        assert (relay["port"], relay["endPort"]) == (values["turn"]["minPort"], values["turn"]["maxPort"])

"""wire's coturn StatefulSet (wireapp/coturn, `charts/coturn`), as its chart renders it, with
the lastcall-turn image: this project's own builder, written from reading the chart's
statefulset.yaml, configmap-coturn-conf-template.yaml, secret.yaml and values.yaml (nothing
of theirs is copied here). `render(values)` gives what a pod of the StatefulSet runs: the pod
template and the objects its volumes name (the ConfigMap with the configuration template,
the Secret with the zrest secrets, the ServiceAccount), for tests/cri's kubelet.

What is theirs, reproduced: `hostNetwork`, the pod's `fsGroup` 31338, the volumes (the
template's ConfigMap mounted by subPath, the secrets, emptyDirs for the external address
and the generated config, a memory emptyDir at /var/lib/coturn), the container's
environment (POD_IP, POD_NAME, HOST_IP), its command line (dumb-init, /bin/sh, the two `sed`
runs, `exec /usr/bin/turnserver -c /coturn-config/turnserver.conf`), its ports, the liveness
and readiness probes (`GET /` on the `status-http` port, 9641; timeout 5 s, 5 failures),
no container securityContext (the chart renders none for it: the image's user runs it).
With `tls.enabled`: the TLS Secret's volume, `shareProcessNamespace`, and the reloader
sidecar's environment (CONFIG_DIR, PROCESS_NAME=turnserver, RELOAD_SIGNAL=SIGUSR2). With
`coturnGracefulTermination`: the preStop hook `/usr/local/bin/pre-stop-hook "$POD_IP" 9641`
under /bin/sh and `terminationGracePeriodSeconds` 43200. With `ca.enabled` and a
`secretRef`: the CA Secret's volume at /secrets-ca.

What stands in for theirs (the test cluster has no API server and no other image):
- the init container `get-external-ip` runs kubectl (alpine/kubectl) to read the node's
  ExternalIP; here the turn image's /bin/sh writes the node's address (`status.hostIP`, the
  address a host-network pod's node has) to /external-ip/ip, the file the chart's command
  line reads. lastcall-turn's own `node-external-ip` reads the API (tested elsewhere).
- the reloader sidecar runs Pluies/config-reloader-sidecar (fsnotify on CONFIG_DIR, then the
  signal to the first process whose name is PROCESS_NAME); here a /bin/sh loop in the turn
  image does the same from the same environment: it follows each directory's `..data` link
  (what a Secret update swaps) once a second and sends RELOAD_SIGNAL to the process named
  `turnserver` it finds in /proc, as root (theirs runs as its distroless image's root).
- `federate.*` is not rendered (off by default; lastcall-turn refuses the fork's
  `federation-*` options, naming the feature)."""

from __future__ import annotations

import copy
from typing import Any

from enginelib import TURN_IMAGE
from podspec import PodSpec

# The chart's values.yaml defaults that shape the pod (the rest: resources, images).
DEFAULTS: dict[str, Any] = {
    "podSecurityContext": {"fsGroup": 31338},
    "coturnTurnListenPort": 3478,
    "coturnMetricsListenPort": 9641,
    "coturnTurnTlsListenPort": 5349,
    "coturnTurnListenIP": None,
    "coturnTurnRelayIP": None,
    "coturnTurnExternalIP": None,
    "coturnPrometheusIP": None,
    "tls": {"enabled": False,
            "ciphers": "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:TLS_AES_128_GCM_SHA256:"
                       "TLS_AES_256_GCM_SHA384",
            "secretRef": None},
    "ca": {"enabled": False, "secretRef": None, "secretKey": "ca-certificates.crt", "cert": None},
    "config": {"verboseLogging": False},
    "federate": {"enabled": False},
    "ratelimit": {"override": False, "requestLimit": 1000, "window": 120, "allowlist": None},
    "coturnGracefulTermination": False,
    "coturnGracePeriodSeconds": 43200,
    "livenessProbe": {"timeoutSeconds": 5, "failureThreshold": 5},
    "readinessProbe": {"timeoutSeconds": 5, "failureThreshold": 5},
    "resources": {"requests": {"memory": "512Mi"}, "limits": {"memory": "6.5Gi"}},
    "secrets": {"zrestSecrets": []},
}

# The special-purpose ranges the chart's configuration denies (IANA's registries; RFC 1918
# and ULA space left open on purpose, its comment says).
DENIED_PEERS = [
    "0.0.0.0-0.255.255.255", "100.64.0.0-100.127.255.255", "127.0.0.0-127.255.255.255",
    "169.254.0.0-169.254.255.255", "192.0.0.0-192.0.0.255", "192.0.2.0-192.0.2.255",
    "192.88.99.0-192.88.99.255", "198.18.0.0-198.19.255.255", "198.51.100.0-198.51.100.255",
    "203.0.113.0-203.0.113.255", "240.0.0.0-255.255.255.255", "::1", "64:ff9b::-64:ff9b::ffff:ffff",
    "::ffff:0.0.0.0-::ffff:255.255.255.255", "100::-100::ffff:ffff:ffff:ffff",
    "2001::-2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", "2002::-2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    "fc00::-fcff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fe80::-febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
]

# The StatefulSet's script: addresses into the template, one static-auth-secret= line per
# line of the secrets file, then the daemon under coturn's path.
COMMAND_SCRIPT = "\n".join([
    "set -e",
    "EXTERNAL_IP=$(cat /external-ip/ip)",
    'sed -Ee "s;__COTURN_EXT_IP__;$EXTERNAL_IP;g" -e "s;__COTURN_POD_IP__;$POD_IP;g" '
    '-e "s;__COTURN_HOST_IP__;$HOST_IP;g" /coturn-template/coturn.conf.template > /coturn-config/turnserver.conf',
    "sed -Ee 's/^/static-auth-secret=/' /secrets/zrest_secret.txt >> /coturn-config/turnserver.conf",
    "exec /usr/bin/turnserver -c /coturn-config/turnserver.conf",
    "",
])

# Stand-in for the init container's kubectl lookup (see the module docstring).
EXTERNAL_IP_SCRIPT = 'printf %s "$NODE_ADDRESS" | tee /dev/stderr > /external-ip/ip'

# Stand-in for config-reloader-sidecar (see the module docstring).
RELOADER_SCRIPT = r"""set -u
sig=${RELOAD_SIGNAL#SIG}
state() { for d in $(echo "$CONFIG_DIR" | tr , ' '); do readlink "$d/..data"; done; }
echo "starting with CONFIG_DIR=$CONFIG_DIR, PROCESS_NAME=$PROCESS_NAME, RELOAD_SIGNAL=$RELOAD_SIGNAL"
last=$(state)
while sleep 1; do
  now=$(state)
  [ "$now" = "$last" ] && continue
  last=$now
  echo "modified: $CONFIG_DIR"
  sent=
  for p in /proc/[0-9]*; do
    if [ "$(cat "$p/comm" 2>/dev/null)" = "$PROCESS_NAME" ]; then
      pid=${p#/proc/}
      if kill -s "$sig" "$pid"; then sent=$pid; echo "signal $RELOAD_SIGNAL sent to $PROCESS_NAME (pid $pid)"; fi
      break
    fi
  done
  [ -n "$sent" ] || echo "error: no process matching $PROCESS_NAME found"
done
"""


def merged(overrides: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(DEFAULTS)

    def into(dst: dict[str, Any], src: dict[str, Any]) -> None:
        for k, v in src.items():
            if isinstance(v, dict) and isinstance(dst.get(k), dict):
                into(dst[k], v)
            else:
                dst[k] = v

    into(out, overrides)
    return out


def config_template(v: dict[str, Any]) -> str:
    """The option lines of the chart's ConfigMap `coturn` (key coturn.conf.template) for
    values `v` (merged), in the template's order."""
    assert not v["federate"]["enabled"], "federate.enabled: not rendered here (lastcall-turn refuses federation-*)"
    lines = ["no-dtls", "no-tcp-relay"]
    if v["tls"]["enabled"]:
        lines += ["cert=/secrets-tls/tls.crt", "pkey=/secrets-tls/tls.key"]
        if v["tls"]["ciphers"]:
            lines.append(f"cipher-list={v['tls']['ciphers']}")
    else:
        lines.append("no-tls")
    ca = v["ca"]
    if ca["enabled"]:
        if ca["secretRef"] or ca["cert"]:
            lines.append(f"CA-file=/secrets-ca/{ca['secretKey'] or 'ca-certificates.crt'}")
    else:
        lines.append("CA-file=/etc/ssl/certs/ca-certificates.crt")
    lines += ["no-cli", 'pidfile="/var/tmp/turnserver.pid"',
              f"listening-ip={v['coturnTurnListenIP'] or '__COTURN_EXT_IP__'}",
              f"listening-port={v['coturnTurnListenPort']}",
              f"relay-ip={v['coturnTurnRelayIP'] or '__COTURN_EXT_IP__'}"]
    if v["coturnTurnExternalIP"]:
        lines.append(f"external-ip={v['coturnTurnExternalIP']}")
    lines += ["realm=dummy.io", "no-stun-backward-compatibility", "secure-stun", "no-rfc5780",
              "no-software-attribute", "response-origin-only-with-rfc5780",
              f"prometheus-ip={v['coturnPrometheusIP'] or '__COTURN_POD_IP__'}",
              f"prometheus-port={v['coturnMetricsListenPort']}", "log-file=stdout"]
    if v["config"]["verboseLogging"]:
        lines.append("verbose")
    lines.append("no-multicast-peers")
    lines += [f"denied-peer-ip={r}" for r in DENIED_PEERS]
    if v["ratelimit"]["override"]:
        lines += [f"401-req-limit={v['ratelimit']['requestLimit']}", f"401-window={v['ratelimit']['window']}"]
    if v["ratelimit"]["allowlist"]:
        lines.append("401-allowlist=/etc/coturn/allowlist.txt")
    lines.append("zrest")
    return "\n".join(lines) + "\n"


def secrets_file(v: dict[str, Any]) -> str:
    """secret.yaml's zrest_secret.txt: one secret a line, ending in a newline."""
    assert v["secrets"]["zrestSecrets"], "the chart fails without secrets.zrestSecrets"
    return "".join(f"{s}\n" for s in v["secrets"]["zrestSecrets"])


def pod_template(v: dict[str, Any], image: str = TURN_IMAGE) -> dict[str, Any]:
    tls, ca = v["tls"], v["ca"]
    ports = v["coturnTurnListenPort"], v["coturnMetricsListenPort"], v["coturnTurnTlsListenPort"]
    volumes: list[dict[str, Any]] = [
        {"name": "external-ip", "emptyDir": {}},
        {"name": "coturn-config", "emptyDir": {}},
        {"name": "coturn-config-template", "configMap": {"name": "coturn"}},
        {"name": "secrets", "secret": {"secretName": "coturn"}},
        {"name": "coturndb", "emptyDir": {"medium": "Memory", "sizeLimit": "128Mi"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "external-ip", "mountPath": "/external-ip"},
        {"name": "coturn-config", "mountPath": "/coturn-config"},
        {"name": "coturn-config-template", "mountPath": "/coturn-template/coturn.conf.template",
         "subPath": "coturn.conf.template"},
        {"name": "secrets", "mountPath": "/secrets/", "readOnly": True},
        {"name": "coturndb", "mountPath": "/var/lib/coturn"},
    ]
    if tls["enabled"]:
        volumes.append({"name": "secrets-tls", "secret": {"secretName": tls["secretRef"]}})
        mounts.append({"name": "secrets-tls", "mountPath": "/secrets-tls/", "readOnly": True})
    if ca["enabled"] and (ca["secretRef"] or ca["cert"]):
        assert ca["secretRef"], "ca.cert (the chart's own CA Secret): not rendered here; give ca.secretRef"
        volumes.append({"name": "secrets-ca", "secret": {"secretName": ca["secretRef"]}})
        mounts.append({"name": "secrets-ca", "mountPath": "/secrets-ca/", "readOnly": True})
    coturn: dict[str, Any] = {
        "name": "coturn",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}],
        "volumeMounts": mounts,
        "command": ["/usr/bin/dumb-init", "--", "/bin/sh", "-c", COMMAND_SCRIPT],
        "ports": [{"name": "coturn-tcp", "containerPort": ports[0], "protocol": "TCP"},
                  {"name": "coturn-udp", "containerPort": ports[0], "protocol": "UDP"},
                  *([{"name": "coturn-tls", "containerPort": ports[2], "protocol": "TCP"}] if tls["enabled"] else []),
                  {"name": "status-http", "containerPort": ports[1], "protocol": "TCP"}],
        "livenessProbe": {**v["livenessProbe"], "httpGet": {"path": "/", "port": "status-http"}},
        "readinessProbe": {**v["readinessProbe"], "httpGet": {"path": "/", "port": "status-http"}},
        "resources": v["resources"],
    }
    if v["coturnGracefulTermination"]:
        coturn["lifecycle"] = {"preStop": {"exec": {"command": [
            "/bin/sh", "-c", f'exec /usr/local/bin/pre-stop-hook "$POD_IP" {ports[1]}']}}}
    containers = [coturn]
    if tls["enabled"]:
        containers.append({
            "name": "coturn-cert-reloader",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/sh", "-c", RELOADER_SCRIPT],
            "env": [{"name": "CONFIG_DIR", "value": "/secrets-tls"},
                    {"name": "PROCESS_NAME", "value": "turnserver"},
                    {"name": "RELOAD_SIGNAL", "value": "SIGUSR2"}],
            "volumeMounts": [{"name": "secrets-tls", "mountPath": "/secrets-tls/", "readOnly": True}],
            # Their image (distroless/static) runs as root; the turn image's user is 65532.
            "securityContext": {"runAsUser": 0},
        })
    spec: dict[str, Any] = {
        "securityContext": copy.deepcopy(v["podSecurityContext"]),
        **({"shareProcessNamespace": True} if tls["enabled"] else {}),
        "hostNetwork": True,
        "serviceAccountName": "coturn",
        "volumes": volumes,
        "initContainers": [{
            "name": "get-external-ip",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "volumeMounts": [{"name": "external-ip", "mountPath": "/external-ip"}],
            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "NODE_ADDRESS", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}],
            "command": ["/bin/sh"],
            "args": ["-c", EXTERNAL_IP_SCRIPT],
            "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 65534},
        }],
        "containers": containers,
    }
    if v["coturnGracefulTermination"]:
        spec["terminationGracePeriodSeconds"] = v["coturnGracePeriodSeconds"]
    return {"metadata": {"labels": {"app": "coturn"}}, "spec": spec}


def render(overrides: dict[str, Any], extra_secrets: dict[str, dict[str, str]] | None = None) -> PodSpec:
    """The StatefulSet's pod for wire's values plus `overrides`, with the objects it names;
    `extra_secrets` are the Secrets the operator made (tls.secretRef, ca.secretRef)."""
    v = merged(overrides)
    objects = [
        {"kind": "ServiceAccount", "metadata": {"name": "coturn"}},
        {"kind": "ConfigMap", "metadata": {"name": "coturn"}, "data": {"coturn.conf.template": config_template(v)}},
        {"kind": "Secret", "metadata": {"name": "coturn"}, "stringData": {"zrest_secret.txt": secrets_file(v)}},
    ]
    return PodSpec(pod_template(v), objects, extra_secrets)

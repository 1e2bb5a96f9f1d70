"""A rendered pod spec read the way the kubelet reads it, for the tests that run the charts'
pods in real containers (docker here, containerd's CRI in tests/cri): the containers in
start order (native sidecars first), their environment with `value`, `fieldRef`,
`secretKeyRef` and `configMapKeyRef`, `$(VAR)` expansion in command and args, ConfigMap,
Secret and emptyDir volumes written to disk, the effective security context (container
over pod), probes with Kubernetes' defaults, ports by name, and the grace period.

What the API server adds before a pod reaches a kubelet is here too: the ServiceAccount
admission (`service_account`: a pod naming a ServiceAccount that does not exist is refused;
the token is mounted unless `automountServiceAccountToken` is false on the pod or on its
ServiceAccount).

ConfigMap and Secret volumes are laid out as the kubelet's atomic writer does: the files in
a timestamped directory, `..data` a symlink to it, each key a symlink through `..data`; an
update (`update_secret`) writes a new directory and swaps `..data` in one rename, which is
what a watcher of the directory (wire's reloader sidecar) sees. `subPath` mounts the
resolved file (not updated, as in Kubernetes); an emptyDir with `medium: Memory` is a tmpfs
of its `sizeLimit`; `shareProcessNamespace` is read (the CRI driver gives the pod one PID
namespace).

What the kubelet does and this module does not: resource limits, projected and other
volume kinds, subPathExpr, image pull policies (images are local), downward API volumes.
Asking for one of those fails loudly instead of being skipped."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Kubernetes' defaults (core/v1 Probe, PodSpec).
PROBE_DEFAULTS = {"initialDelaySeconds": 0, "periodSeconds": 10, "timeoutSeconds": 1,
                  "successThreshold": 1, "failureThreshold": 3}
DEFAULT_GRACE = 30
VOLUME_FILE_MODE = 0o644  # ConfigMap and Secret volumes' defaultMode
# Where the ServiceAccount admission mounts the token (the kube-api-access projected volume).
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined variables are replaced, `$$` is a literal `$`,
    references to undefined variables stay as written."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR.sub(sub, text)


@dataclass
class Probe:
    kind: str  # httpGet | tcpSocket | exec
    port: int | None
    path: str = "/"
    scheme: str = "HTTP"
    host: str | None = None
    command: list[str] = field(default_factory=list)
    initial_delay: float = 0
    period: float = 10
    timeout: float = 1
    success_threshold: int = 1
    failure_threshold: int = 3


@dataclass
class Security:
    uid: int | None
    gid: int | None
    groups: list[int]
    run_as_non_root: bool
    read_only_root: bool
    caps_add: list[str]
    caps_drop: list[str]
    no_new_privs: bool
    privileged: bool
    seccomp: str  # RuntimeDefault | Unconfined | Localhost


@dataclass
class Mount:
    host_path: str
    container_path: str
    read_only: bool


@dataclass
class Container:
    name: str
    spec: dict[str, Any]
    role: str  # sidecar (init container, restartPolicy Always) | init | main

    @property
    def image(self) -> str:
        return self.spec["image"]

    def port(self, ref: int | str) -> int:
        """A probe's port: a number, or the name of one of the container's ports."""
        if isinstance(ref, int):
            return ref
        if isinstance(ref, str) and ref.isdigit():
            return int(ref)
        for p in self.spec.get("ports", []):
            if p.get("name") == ref:
                return int(p["containerPort"])
        raise AssertionError(f"container {self.name}: no port named {ref!r}")

    def probe(self, which: str) -> Probe | None:
        """`startupProbe`, `readinessProbe` or `livenessProbe`, defaults filled in."""
        raw = self.spec.get(which)
        if not raw:
            return None
        values = {**PROBE_DEFAULTS, **{k: v for k, v in raw.items() if k in PROBE_DEFAULTS}}
        common = dict(initial_delay=values["initialDelaySeconds"], period=values["periodSeconds"],
                      timeout=values["timeoutSeconds"], success_threshold=values["successThreshold"],
                      failure_threshold=values["failureThreshold"])
        if "httpGet" in raw:
            h = raw["httpGet"]
            assert not h.get("httpHeaders"), "httpHeaders in a probe: not supported here"
            return Probe("httpGet", self.port(h["port"]), path=h.get("path", "/"),
                         scheme=h.get("scheme", "HTTP"), host=h.get("host"), **common)
        if "tcpSocket" in raw:
            t = raw["tcpSocket"]
            return Probe("tcpSocket", self.port(t["port"]), host=t.get("host"), **common)
        if "exec" in raw:
            return Probe("exec", None, command=list(raw["exec"]["command"]), **common)
        raise AssertionError(f"container {self.name}: unsupported {which}: {raw}")


class PodSpec:
    """One pod of a rendered workload: its template plus the objects its volumes and env
    refer to (ConfigMaps and Secrets, from the chart's render or given by the test)."""

    def __init__(self, template: dict[str, Any], objects: list[dict[str, Any]],
                 extra_secrets: dict[str, dict[str, str]] | None = None):
        self.metadata = template.get("metadata", {})
        self.spec = template["spec"]
        self.configmaps: dict[str, dict[str, str]] = {}
        self.secrets: dict[str, dict[str, str]] = {}
        self.service_accounts: dict[str, dict[str, Any]] = {}
        for o in objects:
            if o.get("kind") == "ServiceAccount":
                self.service_accounts[o["metadata"]["name"]] = o
            elif o.get("kind") == "ConfigMap":
                self.configmaps[o["metadata"]["name"]] = dict(o.get("data") or {})
            elif o.get("kind") == "Secret":
                data = {k: base64.b64decode(v).decode() for k, v in (o.get("data") or {}).items()}
                data.update(o.get("stringData") or {})
                self.secrets[o["metadata"]["name"]] = data
        for name, data in (extra_secrets or {}).items():
            self.secrets[name] = dict(data)
        unsupported = {"hostPID", "hostIPC", "ephemeralContainers"} & set(self.spec)
        assert not [k for k in unsupported if self.spec.get(k)], f"unsupported pod fields: {unsupported}"

    # --- structure -----------------------------------------------------------------------

    @property
    def host_network(self) -> bool:
        return bool(self.spec.get("hostNetwork"))

    @property
    def share_process_namespace(self) -> bool:
        return bool(self.spec.get("shareProcessNamespace"))

    @property
    def grace(self) -> int:
        return int(self.spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE))

    def containers(self) -> list[Container]:
        """In start order: init containers (native sidecars among them, in their order),
        then the main containers."""
        out = []
        for c in self.spec.get("initContainers", []):
            out.append(Container(c["name"], c, "sidecar" if c.get("restartPolicy") == "Always" else "init"))
        for c in self.spec.get("containers", []):
            out.append(Container(c["name"], c, "main"))
        return out

    # --- service account ------------------------------------------------------------------

    def service_account(self, namespace: str) -> tuple[str, bool]:
        """(the pod's ServiceAccount, whether its token is mounted), as the ServiceAccount
        admission plugin decides: `default` when none is named (it always exists); another
        name must be a ServiceAccount of the render, or the pod is refused; the token is
        mounted unless the pod's `automountServiceAccountToken`, or else the
        ServiceAccount's, is false."""
        name = self.spec.get("serviceAccountName") or self.spec.get("serviceAccount") or "default"
        sa = self.service_accounts.get(name)
        if sa is None and name != "default":
            raise AssertionError(f"pods is forbidden: error looking up service account {namespace}/{name}: "
                                 f"serviceaccount \"{name}\" not found")
        if "automountServiceAccountToken" in self.spec:
            return name, bool(self.spec["automountServiceAccountToken"])
        return name, bool((sa or {}).get("automountServiceAccountToken", True))

    # --- environment ---------------------------------------------------------------------

    def env(self, container: Container, fields: dict[str, str]) -> dict[str, str]:
        """The container's environment, in order, each value expanded against the ones
        before it; `fields` are the downward API's values (status.podIP, metadata.name...)."""
        assert not container.spec.get("envFrom"), "envFrom: not supported here"
        env: dict[str, str] = {}
        for item in container.spec.get("env", []):
            name = item["name"]
            if "value" in item:
                env[name] = expand(str(item["value"]), env)
                continue
            src = item.get("valueFrom", {})
            if "fieldRef" in src:
                path = src["fieldRef"]["fieldPath"]
                assert path in fields, f"env {name}: fieldRef {path} has no value here"
                env[name] = fields[path]
            elif "secretKeyRef" in src:
                env[name] = self._key(self.secrets, "Secret", src["secretKeyRef"], name)
            elif "configMapKeyRef" in src:
                env[name] = self._key(self.configmaps, "ConfigMap", src["configMapKeyRef"], name)
            else:
                raise AssertionError(f"env {name}: unsupported valueFrom {src}")
        return env

    @staticmethod
    def _key(store: dict[str, dict[str, str]], kind: str, ref: dict[str, Any], var: str) -> str:
        obj = store.get(ref["name"])
        if obj is None or ref["key"] not in obj:
            # The kubelet does not start the container (CreateContainerConfigError).
            raise AssertionError(f"env {var}: {kind} {ref['name']} key {ref['key']} does not exist")
        return obj[ref["key"]]

    def argv(self, container: Container, env: dict[str, str]) -> tuple[list[str] | None, list[str] | None]:
        """(command, args) with `$(VAR)` expanded; None means the image's own."""
        command = container.spec.get("command")
        args = container.spec.get("args")
        return ([expand(a, env) for a in command] if command is not None else None,
                [expand(a, env) for a in args] if args is not None else None)

    # --- volumes -------------------------------------------------------------------------

    def write_volumes(self, root: Path) -> dict[str, Path]:
        """Every volume of the pod under `root` (the kubelet's pods/UID/volumes), as the
        kubelet lays them out: ConfigMaps and Secrets through the atomic writer (a file per
        key, or per `items` entry, mode `defaultMode` (0644), group fsGroup); emptyDir a 0777
        directory (owned by fsGroup, setgid, when one is set), a tmpfs with `medium: Memory`.
        Returns {volume name: host directory}."""
        fs_group = self.spec.get("securityContext", {}).get("fsGroup")
        out: dict[str, Path] = {}
        for vol in self.spec.get("volumes", []):
            name = vol["name"]
            path = root / name
            path.mkdir(parents=True, exist_ok=True)
            if "configMap" in vol or "secret" in vol:
                self._write_payload(vol, path, fs_group)
            elif "emptyDir" in vol:
                medium = (vol["emptyDir"] or {}).get("medium", "")
                assert medium in ("", "Memory"), f"emptyDir medium {medium}: not supported here"
                if medium == "Memory":
                    limit = (vol["emptyDir"] or {}).get("sizeLimit")
                    size = f",size={quantity(limit)}" if limit else ""
                    subprocess.run(["mount", "-t", "tmpfs", "-o", f"mode=0777{size}", "tmpfs", str(path)],
                                   check=True, capture_output=True, timeout=30)
                os.chmod(path, 0o777)
                if fs_group is not None:
                    os.chown(path, 0, int(fs_group))
                    os.chmod(path, 0o2777)
            else:
                raise AssertionError(f"volume {name}: kind not supported here: {sorted(vol)}")
            out[name] = path
        return out

    def _write_payload(self, vol: dict[str, Any], path: Path, fs_group: Any) -> None:
        """The kubelet's atomic writer: the files in a new `..TIMESTAMP` directory, `..data`
        swapped to it in one rename, a symlink `KEY -> ..data/KEY` per top-level name, the
        previous directory removed."""
        name = vol["name"]
        kind = "configMap" if "configMap" in vol else "secret"
        src = vol[kind]
        obj_name = src["name"] if kind == "configMap" else src["secretName"]
        store = self.configmaps if kind == "configMap" else self.secrets
        data = store.get(obj_name)
        assert data is not None or src.get("optional"), f"volume {name}: {kind} {obj_name} does not exist"
        data = data or {}
        items = src.get("items") or [{"key": k, "path": k} for k in data]
        mode = int(src.get("defaultMode", VOLUME_FILE_MODE))
        now = time.time_ns()
        stamp = path / (time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime(now / 1e9)) + f"{now % 10**9:09d}")
        stamp.mkdir()
        os.chmod(stamp, 0o755)
        tops = set()
        for item in items:
            assert item["key"] in data, f"volume {name}: {kind} {obj_name} has no key {item['key']}"
            target = stamp / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[item["key"]])
            os.chmod(target, int(item.get("mode", mode)))
            if fs_group is not None:
                os.chown(target, 0, int(fs_group))
            tops.add(Path(item["path"]).parts[0])
        data_link = path / "..data"
        old = os.readlink(data_link) if data_link.is_symlink() else None
        tmp = path / "..data_tmp"
        if tmp.is_symlink():
            tmp.unlink()
        os.symlink(stamp.name, tmp)
        os.rename(tmp, data_link)
        for top in tops:
            link = path / top
            if not link.is_symlink():
                os.symlink(f"..data/{top}", link)
        if old is not None and old != stamp.name:
            subprocess.run(["rm", "-rf", str(path / old)], check=True, timeout=30)
        os.chmod(path, 0o755)
        if fs_group is not None:
            os.chown(path, 0, int(fs_group))

    def update_secret(self, secret: str, data: dict[str, str], volumes: dict[str, Path]) -> None:
        """A Secret changed in the API: every volume of this pod that shows it gets the new
        files, as the kubelet's sync writes them (one `..data` rename per volume)."""
        self.secrets[secret] = dict(data)
        fs_group = self.spec.get("securityContext", {}).get("fsGroup")
        for vol in self.spec.get("volumes", []):
            if (vol.get("secret") or {}).get("secretName") == secret:
                self._write_payload(vol, volumes[vol["name"]], fs_group)

    def update_configmap(self, configmap: str, data: dict[str, str], volumes: dict[str, Path]) -> None:
        """A ConfigMap edited in the API (`kubectl edit`): every volume of this pod that shows
        it gets the new files, as the kubelet's sync writes them (one `..data` rename per
        volume). A subPath mount of it keeps the old file, as on Kubernetes."""
        self.configmaps[configmap] = dict(data)
        fs_group = self.spec.get("securityContext", {}).get("fsGroup")
        for vol in self.spec.get("volumes", []):
            if (vol.get("configMap") or {}).get("name") == configmap:
                self._write_payload(vol, volumes[vol["name"]], fs_group)

    def mounts(self, container: Container, volumes: dict[str, Path]) -> list[Mount]:
        out = []
        for m in container.spec.get("volumeMounts", []):
            assert not m.get("subPathExpr"), "subPathExpr: not supported here"
            host = volumes[m["name"]]
            if m.get("subPath"):
                # The kubelet bind-mounts the resolved path: a later update does not reach it.
                host = (host / m["subPath"]).resolve()
                assert host.is_relative_to(volumes[m["name"]].resolve()), f"subPath {m['subPath']} leaves its volume"
            out.append(Mount(str(host), m["mountPath"], bool(m.get("readOnly", False))))
        return out

    # --- security ------------------------------------------------------------------------

    def security(self, container: Container) -> Security:
        """The effective security context: the container's fields over the pod's."""
        pod = self.spec.get("securityContext", {}) or {}
        own = container.spec.get("securityContext", {}) or {}

        def pick(key: str) -> Any:
            return own[key] if key in own else pod.get(key)

        groups = [int(g) for g in pod.get("supplementalGroups", [])]
        if pod.get("fsGroup") is not None:
            groups.append(int(pod["fsGroup"]))
        caps = own.get("capabilities", {}) or {}
        seccomp = (pick("seccompProfile") or {}).get("type", "Unconfined")
        privileged = bool(own.get("privileged", False))
        ape = own.get("allowPrivilegeEscalation")
        return Security(
            uid=pick("runAsUser"), gid=pick("runAsGroup"), groups=groups,
            run_as_non_root=bool(pick("runAsNonRoot")),
            read_only_root=bool(own.get("readOnlyRootFilesystem", False)),
            caps_add=list(caps.get("add", [])), caps_drop=list(caps.get("drop", [])),
            # The kubelet sets no_new_privs unless privilege escalation is allowed (the
            # default when unset is "allowed", unless privileged or CAP_SYS_ADMIN).
            no_new_privs=ape is False, privileged=privileged, seccomp=seccomp)


def quantity(q: Any) -> int:
    """A Kubernetes quantity (128Mi, 1G, 4096) in bytes."""
    text = str(q)
    for suffix, factor in (("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("k", 10**3), ("M", 10**6), ("G", 10**9)):
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    return int(text)


def fields(pod_name: str, namespace: str, pod_ip: str, host_ip: str, node: str, uid: str) -> dict[str, str]:
    """The downward API's field values for a pod."""
    return {"metadata.name": pod_name, "metadata.namespace": namespace, "metadata.uid": uid,
            "status.podIP": pod_ip, "status.hostIP": host_ip, "spec.nodeName": node,
            "status.podIPs": pod_ip, "spec.serviceAccountName": "default"}

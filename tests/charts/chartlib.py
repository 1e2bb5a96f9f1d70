"""Shared helpers for the chart tests: offline Helm (helm-python-sdk), Kubernetes schema
validation (kubernetes-validate) and accessors for the rendered objects."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import helm_python
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
CHARTS = REPO / "charts"

# Kubernetes versions whose API schemas every rendered object must satisfy (strict: unknown
# fields are errors). 1.29 is the first release with native sidecars on by default; 1.37 is
# the newest kubernetes-validate ships. OLDEST is the chart's kubeVersion floor, used for
# what must also work on clusters before 1.29 (standalone, classic sidecar, TURN).
K8S_VERSIONS = ("1.29.0", "1.37.0")
OLDEST = "1.25.0"

# Kinds from CRDs that kubernetes-validate has no schema for; checked by hand instead.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def load(chart: str) -> helm_python.Chart:
    return helm_python.Chart.load(CHARTS / chart)


class Rendered:
    """The objects one `helm template` of a chart produced, plus its NOTES."""

    def __init__(self, chart: str, values: dict[str, Any] | None, manifests: dict[str, str]):
        self.chart = chart
        self.values = values or {}
        self.notes = ""
        self.objects: list[dict[str, Any]] = []
        for path, text in sorted(manifests.items()):
            if path.endswith("NOTES.txt"):
                self.notes = text
                continue
            for doc in yaml.safe_load_all(text):
                if doc:
                    self.objects.append(doc)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name_suffix: str = "") -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"].endswith(name_suffix)]
        assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {len(found)}"
        return found[0]

    def workload(self) -> dict[str, Any]:
        found = [o for o in self.objects if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]
        assert len(found) == 1, f"expected one workload, got {[o['kind'] for o in found]}"
        return found[0]

    def pod_spec(self) -> dict[str, Any]:
        return self.workload()["spec"]["template"]["spec"]

    def grace(self) -> int:
        grace = self.pod_spec()["terminationGracePeriodSeconds"]
        assert isinstance(grace, int)
        return grace


def render(chart: str, values: dict[str, Any] | None = None) -> Rendered:
    """Render offline exactly as `helm install` would: values checked against the chart's
    schema first (render does that itself), then the templates."""
    with load(chart) as c:
        manifests = c.render(values=copy.deepcopy(values), name="rel", namespace="ns")
    return Rendered(chart, values, manifests)


def merged_values(chart: str, values: dict[str, Any] | None) -> dict[str, Any]:
    with load(chart) as c:
        return c.merge_values(copy.deepcopy(values))


def validate(obj: dict[str, Any], version: str) -> None:
    """Validate one object against the Kubernetes API schema (strict)."""
    if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
        assert obj["metadata"]["name"]
        if obj["kind"] == "PrometheusRule":
            # Its rules are checked by promtool (tests/charts/test_observability.py).
            assert obj["spec"]["groups"], "PrometheusRule without groups"
        elif obj["kind"] == "PodMonitor":
            assert obj["spec"]["podMetricsEndpoints"], "PodMonitor without podMetricsEndpoints"
        else:
            assert obj["spec"]["endpoints"], "ServiceMonitor without endpoints"
        return
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = "/".join(str(p) for p in e.path)
        raise AssertionError(
            f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {version} at {path}: {e.message}"
        ) from None


def all_containers(pod_spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from pod_spec.get("initContainers", [])
    yield from pod_spec.get("containers", [])


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in all_containers(pod_spec) if c["name"] == name]
    assert len(found) == 1, f"expected one container {name}, got {len(found)}"
    return found[0]


def flag(args: list[str], name: str) -> str | None:
    """The value of `--name=value` in a container's args (None when absent)."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    assert len(values) <= 1, f"--{name} given {len(values)} times"
    return values[0] if values else None


def seconds(duration: str) -> int:
    """`30s`, `5m`, `1h30m` or bare seconds, as the daemons accept them."""
    if duration.isdigit():
        return int(duration)
    m = _DURATION.match(duration)
    assert m and duration, f"not a duration: {duration!r}"
    h, mi, s = (int(g or 0) for g in m.groups())
    return h * 3600 + mi * 60 + s


def probe_path(c: dict[str, Any], probe: str) -> str:
    return c[probe]["httpGet"]["path"]


def assert_no_prestop(rendered: Rendered) -> None:
    """No preStop hook, no lifecycle hooks at all, and nothing that sleeps."""
    for c in all_containers(rendered.pod_spec()):
        assert "lifecycle" not in c, f"container {c['name']} has lifecycle hooks: {c['lifecycle']}"
        words = " ".join(c.get("command", []) + c.get("args", []))
        assert "sleep" not in words, f"container {c['name']} sleeps: {words}"


def haproxy_check(haproxy_cfg: str, spoe_cfg: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run the real `haproxy -c` on a rendered configuration."""
    binary = shutil.which("haproxy")
    assert binary, "haproxy is not installed (bash scripts/setup.sh installs it)"
    (tmp / "spoe.cfg").write_text(spoe_cfg)
    cfg = haproxy_cfg.replace("/usr/local/etc/haproxy/spoe.cfg", str(tmp / "spoe.cfg"))
    (tmp / "haproxy.cfg").write_text(cfg)
    return subprocess.run(
        [binary, "-c", "-f", str(tmp / "haproxy.cfg")],
        capture_output=True,
        text=True,
        timeout=60,
    )


def built_binary(name: str) -> Path | None:
    """A daemon binary built from this checkout (debug first), if any."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    if not target.is_absolute():
        target = REPO / target
    for profile in ("debug", "release"):
        path = target / profile / name
        if path.is_file():
            return path
    return None


def assert_no_nested_mounts(rendered: Rendered) -> None:
    """No volume mounted inside another (a ConfigMap or Secret volume is read-only)."""
    for c in all_containers(rendered.pod_spec()):
        paths = [m["mountPath"].rstrip("/") for m in c.get("volumeMounts", [])]
        for a in paths:
            for b in paths:
                assert not b.startswith(a + "/"), f"container {c['name']}: {b} is inside {a}"

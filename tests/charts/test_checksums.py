"""Every input the pods read reaches them: when a value changes a ConfigMap or Secret that the
chart renders and the pod mounts or reads (volumes, env, envFrom), the pod template changes
too (its checksum annotations), so the workload rolls. Checked generically: every leaf of the
chart's values (and of a few value sets that turn more inputs on) is changed in turn and the
two renders compared. What the chart cannot hash (a ConfigMap or Secret given by name) is
covered by the tests below it: the agent follows its file (--autoreload), or the docs say
how to roll."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any, Iterator

import helm_python
import pytest

from chartlib import CHARTS, all_containers, container, merged_values, render

# Value sets that turn on the inputs the defaults leave off; every leaf of each is changed.
BASES: dict[str, list[dict[str, Any]]] = {
    "lastcall-spoa": [
        {},
        {"mode": "sidecar"},
        {"mode": "sidecar", "sidecar": {"native": False}},
        {"agent": {"existingConfigMap": "mine"}, "mode": "sidecar"},
    ],
    "lastcall-turn": [
        {},
        {"turn": {"auth": {"value": "s3cret", "extraKeys": ["old"]}}},
        {"tls": {"enabled": True, "existingSecret": "turn-tls"}, "turn": {"externalIPs": {"n1": "203.0.113.1"}}},
        {"config": {"existingSecret": "conf"}, "turn": {"externalIPs": {"n1": "203.0.113.1"}}},
    ],
}

# Inputs that must be among those seen changing (so that the walk cannot pass by exercising
# nothing): the value path that changes them.
MUST_EXERCISE = {
    "lastcall-spoa": {"agent.logLevel", "agent.config.default_application", "sidecar.haproxy.bufsize"},
    "lastcall-turn": {"turn.auth.value", "turn.realm", "turn.externalIPs.n1", "turn.auth.key"},
}


def schema_at(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for p in path:
        schema = schema.get("properties", {}).get(p) or schema.get("additionalProperties") or {}
        if not isinstance(schema, dict):
            return {}
    return schema


def leaves(values: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(values, dict):
        for k, v in values.items():
            yield from leaves(v, path + (k,))
    elif not isinstance(values, list) and values is not None:
        yield path, values


def variants(value: Any, schema: dict[str, Any]) -> list[Any]:
    """Other values of a leaf that the schema may accept (for a plain string: candidates,
    the first one that renders is used)."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1]
    if isinstance(value, str):
        if "enum" in schema:
            return [e for e in schema["enum"] if e != value]
        out = [value + "x", value + "1", "x"]
        if value[-1:].isdigit():  # an address, a duration, a version
            out.insert(0, value[:-1] + str((int(value[-1]) + 1) % 10))
        return out
    return []


def with_leaf(values: dict[str, Any], path: tuple[str, ...], leaf: Any) -> dict[str, Any]:
    out = copy.deepcopy(values)
    d = out
    for p in path[:-1]:
        d = d.setdefault(p, {})
    d[path[-1]] = leaf
    return out


def pod_inputs(objects: list[dict[str, Any]], pod: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """The ConfigMaps and Secrets the pod reads, with their content as rendered (None: not
    rendered by the chart, given by name)."""
    spec = pod["spec"]
    names: set[tuple[str, str]] = set()

    def add_source(v: dict[str, Any]) -> None:
        if "configMap" in v:
            names.add(("ConfigMap", v["configMap"]["name"]))
        if "secret" in v:
            names.add(("Secret", v["secret"].get("secretName") or v["secret"].get("name")))

    for v in spec.get("volumes", []):
        add_source(v)
        for s in v.get("projected", {}).get("sources", []):
            add_source(s)
    for c in all_containers(spec):
        for e in c.get("env", []):
            ref = e.get("valueFrom", {})
            if "configMapKeyRef" in ref:
                names.add(("ConfigMap", ref["configMapKeyRef"]["name"]))
            if "secretKeyRef" in ref:
                names.add(("Secret", ref["secretKeyRef"]["name"]))
        for e in c.get("envFrom", []):
            if "configMapRef" in e:
                names.add(("ConfigMap", e["configMapRef"]["name"]))
            if "secretRef" in e:
                names.add(("Secret", e["secretRef"]["name"]))
    rendered = {
        (o["kind"], o["metadata"]["name"]): {k: o.get(k) for k in ("data", "stringData", "binaryData")}
        for o in objects
        if o["kind"] in ("ConfigMap", "Secret")
    }
    return {n: rendered.get(n) for n in sorted(names)}


def render_objects(chart_dir: Path, values: dict[str, Any]) -> list[dict[str, Any]] | None:
    import yaml

    try:
        with helm_python.Chart.load(chart_dir) as c:
            manifests = c.render(values=copy.deepcopy(values), name="rel", namespace="ns")
    except Exception:  # a value the schema or a template refuses: not a variant
        return None
    return [d for p, t in sorted(manifests.items()) if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d]


def pod_template(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (w,) = [o for o in objects if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]
    return w["spec"]["template"]


def unrolled_changes(chart: str, chart_dir: Path, under: str = "") -> tuple[list[str], set[str]]:
    """(inputs that changed without the pod template changing, value paths that changed an
    input) over every leaf of every base."""
    schema = json.loads((chart_dir / "values.schema.json").read_text())
    missed: list[str] = []
    exercised: set[str] = set()
    for base in BASES[chart]:
        before = render_objects(chart_dir, base)
        assert before is not None, f"base {base} does not render"
        pod0 = pod_template(before)
        in0 = pod_inputs(before, pod0)
        for path, value in leaves(merged_values(chart, base)):
            if not ".".join(path).startswith(under):
                continue
            s = schema_at(schema, path)
            plain_string = isinstance(value, str) and "enum" not in s
            for v in variants(value, s):
                after = render_objects(chart_dir, with_leaf(base, path, v))
                if after is None:
                    continue
                pod1 = pod_template(after)
                in1 = pod_inputs(after, pod1)
                if in1 != in0:
                    exercised.add(".".join(path))
                    if pod1 == pod0:
                        changed = sorted(n for n in set(in0) | set(in1) if in0.get(n) != in1.get(n))
                        missed.append(f"{'.'.join(path)}={v!r} (base {base}) changes {changed}")
                if plain_string:
                    break
    return missed, exercised


@pytest.mark.parametrize("chart", sorted(BASES))
def test_every_rendered_input_is_in_the_pod_template(chart: str) -> None:
    missed, exercised = unrolled_changes(chart, CHARTS / chart)
    assert not missed, "inputs change without a rollout:\n" + "\n".join(missed)
    assert MUST_EXERCISE[chart] <= exercised, MUST_EXERCISE[chart] - exercised


def test_the_walk_catches_a_missing_checksum(tmp_path: Path) -> None:
    """The same walk on a copy of the turn chart without its checksum annotations reports the
    Secret and the ConfigMap (the test above can fail)."""
    copy_dir = tmp_path / "lastcall-turn"
    shutil.copytree(CHARTS / "lastcall-turn", copy_dir)
    helpers = copy_dir / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    stripped = "\n".join(line for line in text.splitlines() if "checksum/" not in line)
    assert stripped != text
    helpers.write_text(stripped + "\n")
    missed, _ = unrolled_changes("lastcall-turn", copy_dir, under="turn.")
    assert any(m.startswith("turn.auth.value=") for m in missed), missed
    assert any(m.startswith("turn.realm=") for m in missed), missed
    assert any(m.startswith("turn.externalIPs.n1=") and "conf" in m for m in missed), missed

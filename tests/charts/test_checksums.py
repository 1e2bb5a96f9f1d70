"""Every input the pods read reaches them: when a value changes a ConfigMap or Secret that the
chart renders and the pod mounts or reads (volumes, env, envFrom), the pod template changes
too (its checksum annotations), so the workload rolls. Checked generically: every leaf of the
chart's values (and of a few value sets that turn more inputs on) is changed in turn and the
two renders compared. What the chart cannot hash (a ConfigMap or Secret given by name) is
covered by the tests below it: the agent follows its file (--autoreload), or the docs say
how to roll."""

from __future__ import annotations

import copy
import http.client
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import helm_python
import pytest
import yaml

from chartlib import CHARTS, all_containers, built_binary, container, merged_values, render
from test_daemons_with_chart_args import free_port, kubelet_args

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


def test_existing_configmap_edit_reaches_the_agent(tmp_path: Path) -> None:
    """agent.existingConfigMap: the agent started with the chart's arguments follows the
    kubelet's update of the mounted ConfigMap (a new `..data` symlink): the new rules are
    loaded (spoa_reloads_total{result="ok"}), a file that does not compile is refused and the
    agent stays ready. Skipped when the agent is not built."""
    binary = built_binary("lastcall-spoa")
    if binary is None:
        pytest.skip("lastcall-spoa is not built")
    admin_port, spop_port = free_port(), free_port()
    values = {
        "agent": {"existingConfigMap": "my-waf", "port": spop_port},
        "admin": {"port": admin_port, "address": "127.0.0.1"},
    }
    r = render("lastcall-spoa", values)
    assert not [o for o in r.of_kind("ConfigMap") if o["metadata"]["name"].endswith("-agent")]
    agent = container(r.pod_spec(), "agent")
    assert "--autoreload" in agent["args"]

    # The volume as the kubelet lays it out: config.yaml -> ..data/config.yaml, ..data -> ..v1.
    mount = tmp_path / "mount"
    mount.mkdir()

    def publish(version: str, cfg: dict[str, Any]) -> None:
        (mount / version).mkdir()
        (mount / version / "config.yaml").write_text(yaml.safe_dump(cfg))
        os.symlink(version, mount / "..data_tmp")
        os.rename(mount / "..data_tmp", mount / "..data")

    base = {"bind": f"127.0.0.1:{spop_port}", "applications": [{"name": "default"}]}
    publish("..v1", base)
    os.symlink("..data/config.yaml", mount / "config.yaml")
    argv = [str(binary)] + kubelet_args(agent["args"], {}, {"/etc/lastcall-spoa/config.yaml": str(mount / "config.yaml")})

    def get(path: str) -> tuple[int, str] | None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=2)
            conn.request("GET", path)
            resp = conn.getresponse()
            out = (resp.status, resp.read().decode())
            conn.close()
            return out
        except OSError:
            return None

    def reloads(result: str) -> float:
        got = get("/metrics")
        for line in (got[1] if got else "").splitlines():
            if line.startswith("spoa_reloads_total{") and f'result="{result}"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def wait(what: str, check: Any, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            assert proc.poll() is None, f"agent exited before {what}:\n{log.read_text()[-3000:]}"
            time.sleep(0.05)
        pytest.fail(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")

    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait("readiness", lambda: (get("/readyz") or (0, ""))[0] == 200, proc)
        assert reloads("ok") == 0
        # An edit: a rule of the user's own after the built-in ones.
        edited = {**base, "applications": [{"name": "default", "directives": 'SecRuleEngine On\nSecRule ARGS:block "@streq yes" "id:10001,phase:1,deny,status:403"\n'}]}
        publish("..v2", edited)
        wait("the edit reloaded", lambda: reloads("ok") == 1, proc)
        # A broken edit: refused, the running rules kept, still ready.
        publish("..v3", {**base, "applications": [{"name": "default", "directives": "SecRule ARGS\n"}]})
        wait("the broken edit refused", lambda: reloads("error") == 1, proc)
        assert (get("/readyz") or (0, ""))[0] == 200
        assert reloads("ok") == 1
    finally:
        proc.kill()
        proc.wait()

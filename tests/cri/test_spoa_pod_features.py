"""The pod features of charts/lastcall-spoa, run through containerd's CRI (tests/cri/kubelet.py)
as the chart renders them, all in one pod:

- `initContainers` (the user's, first) and the CRS copier (`crs.image`: a small local image
  carrying this machine's Debian CRS 3.3.4 tree, laid out like a release, built here without
  a registry; the image's own CRS is Debian 13's 3.3.7, so the two are told apart), run to
  completion in that order before the agent starts;
- `extraVolumes` + `extraVolumeMounts` (an emptyDir the user's init container writes and
  the agent has mounted read-only), `extraEnv` (in the agent's environment);
- `serviceAccount.create` with `automountServiceAccountToken: false`: the ServiceAccount is
  rendered (the admission refuses a pod naming one that does not exist), and no token is
  mounted in any container;
- the agent serves with the copied tree behind HAProxy on the edge host: a benign request
  passes, an SQL injection is refused, and its matched-rule line (coraza-spoa's JSON) names
  a rule file of the copied tree and its CRS version.

And the DaemonSet mode's pods run, one per node, with the token mounted this time
(`automountServiceAccountToken: true`): the control showing the kubelet here mounts it
when asked, so the absence above means something.

The HorizontalPodAutoscaler and the NetworkPolicy have no controller here (no API server,
metrics pipeline or CNI policy engine): tests/charts renders and schema-validates them,
nothing runs them (charts/lastcall-spoa/README.md).

Then `agent.existingConfigMap`: the user's own ConfigMap, edited while the pod runs, reaches
the running agent (the kubelet's atomic-writer update of the mounted volume, `-autoreload`),
without a restart; an edit that does not compile leaves the running rules in place."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

import netns
from chartlib import render
from cluster import CriCluster
from controllers import DaemonSet, labels, pod_spec
from enginelib import BASE_IMAGE, Engine, measured
from kubelet import Pod, wait_until
from loadlib import ATTACK, BENIGN, Origin
from podspec import TOKEN_PATH, PodSpec
from test_spoa_deployment import EdgeHAProxy

CRS_IMAGE_REPO = "lastcall-local/crs"
HOST_RULES = Path("/usr/share/modsecurity-crs/rules")
HOST_SETUP = Path("/etc/modsecurity/crs/crs-setup.conf")
GRACE = {"gracefulTermination": {"shutdownDelaySeconds": 1, "drainTimeoutSeconds": 10}}
RESTRICTED = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def crs_version(rules: Path) -> str:
    found = re.search(r'SecComponentSignature\s+"OWASP_CRS/([0-9.]+)"',
                      (rules / "REQUEST-901-INITIALIZATION.conf").read_text())
    assert found
    return found.group(1)


@pytest.fixture()
def crs_image(engine: Engine, cluster: CriCluster, tmp_path: Path) -> str:
    """`lastcall-local/crs:debian-VERSION`: the Debian base with this machine's CRS tree at
    /coreruleset (rules/ and crs-setup.conf.example, as a release has them), imported on
    both nodes."""
    if not HOST_RULES.is_dir() or not HOST_SETUP.is_file():
        pytest.skip("Debian's modsecurity-crs is not installed on this machine (scripts/setup.sh installs it)")
    version = crs_version(HOST_RULES)
    image = f"{CRS_IMAGE_REPO}:debian-{version}"
    ctx = tmp_path / "crs-image"
    (ctx / "coreruleset" / "rules").mkdir(parents=True)
    for f in HOST_RULES.iterdir():
        shutil.copyfile(f.resolve(), ctx / "coreruleset" / "rules" / f.name)
    shutil.copyfile(HOST_SETUP.resolve(), ctx / "coreruleset" / "crs-setup.conf.example")
    (ctx / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nCOPY coreruleset/ /coreruleset/\n")
    engine.docker("build", "-q", "-t", image, str(ctx), timeout=300)
    for node in cluster.cluster.nodes.values():
        node.load_images(engine, [image])
    return image


@pytest.fixture()
def origin(cluster: CriCluster) -> Iterator[Origin]:
    o = Origin(cluster.edge)
    yield o
    o.close()


def proc_root(pod: Pod, container: str) -> Path:
    return Path(f"/proc/{pod.pid(container)}/root")


def inside(root: Path, path: str, depth: int = 0) -> Path:
    """`path` as the container sees it, from the host through /proc/PID/root: its symlinks
    resolved within the container's root (an absolute one, such as Debian's /var/run ->
    /run, would otherwise lead to the host's)."""
    assert depth < 40, f"symlink loop at {path}"
    here = root
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        nxt = here / part
        if nxt.is_symlink():
            target = str(nxt.readlink())
            rest = "/".join(parts[i + 1:])
            base = "" if target.startswith("/") else "/" + str(here.relative_to(root))
            return inside(root, f"{base}/{target}/{rest}", depth + 1)
        here = nxt
    return here


def environ(pod: Pod, container: str) -> dict[str, str]:
    raw = Path(f"/proc/{pod.pid(container)}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


def features(crs_image: str) -> dict[str, Any]:
    repo, tag = crs_image.split(":")
    return {
        **GRACE,
        "serviceAccount": {"create": True, "automountServiceAccountToken": False},
        "initContainers": [{
            "name": "prepare",
            "image": crs_image,
            "command": ["sh", "-c", "echo prepared-by-init > /prepared/marker"],
            "securityContext": RESTRICTED,
            "volumeMounts": [{"name": "work", "mountPath": "/prepared"}],
        }],
        "extraVolumes": [{"name": "work", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "work", "mountPath": "/var/lib/lastcall-test", "readOnly": True}],
        "extraEnv": [{"name": "LASTCALL_TEST_EXTRA_ENV", "value": "from-extraEnv"}],
        "crs": {"image": {"repository": repo, "tag": tag}, "path": "/coreruleset"},
    }


def test_spoa_pod_features_run(cluster: CriCluster, crs_image: str, origin: Origin, tmp_path: Path) -> None:
    version = crs_image.rsplit("-", 1)[1]
    rendered = render("lastcall-spoa", features(crs_image))
    spec = pod_spec(rendered)
    (sa,) = rendered.of_kind("ServiceAccount")
    assert sa["automountServiceAccountToken"] is False
    assert spec.spec["serviceAccountName"] == sa["metadata"]["name"] and spec.spec["automountServiceAccountToken"] is False
    assert [c.name for c in spec.containers()] == ["prepare", "crs", "agent"]
    # The admission refuses the pod when the ServiceAccount is not there (the chart's old
    # bug: serviceAccountName without the object): the check can fail.
    without = [o for o in rendered.objects if o.get("kind") != "ServiceAccount"]
    with pytest.raises(AssertionError, match="serviceaccount .* not found"):
        PodSpec(rendered.workload()["spec"]["template"], without).service_account("ns")

    kubelet = cluster.kubelets["a"]
    pod = kubelet.run_pod(spec, "waf-features", labels=labels(rendered))
    pod.wait_ready(180)
    runs = pod.runs
    assert runs["prepare"].exit_code == 0 and runs["crs"].exit_code == 0, pod.describe()
    # In order: the user's init container, then the copier, then the agent (each asked to start
    # after the one before exited; the copier can exit before its StartContainer returns).
    assert runs["prepare"].exited_at <= runs["crs"].start_asked_at <= runs["crs"].exited_at <= runs["agent"].start_asked_at  # type: ignore[operator]

    root = proc_root(pod, "agent")
    assert (root / "var/lib/lastcall-test/marker").read_text() == "prepared-by-init\n"
    assert environ(pod, "agent").get("LASTCALL_TEST_EXTRA_ENV") == "from-extraEnv"
    copied = root / "opt/lastcall-spoa/crs"
    assert f'"OWASP_CRS/{version}"' in (copied / "rules/REQUEST-901-INITIALIZATION.conf").read_text()
    assert (copied / "crs-setup.conf.example").is_file()
    token_dir = inside(root, TOKEN_PATH)
    assert inside(root, "/var/run").is_dir()  # resolved in the container (Debian: /run)
    assert not token_dir.exists(), "a service-account token is mounted"
    assert pod.token_dir is None

    # The agent serves with the copied tree, behind HAProxy.
    haproxy = EdgeHAProxy(cluster.edge, tmp_path, origin.port)
    try:
        wait_until("HAProxy's admin socket", haproxy.sock.exists, timeout=30)
        haproxy.sync([pod])
        edge = cluster.edge
        wait_until("HAProxy passes a benign request through the agent",
                   lambda: (netns.http_get(edge, "127.0.0.1", haproxy.port, BENIGN) or (0,))[0] == 200,
                   timeout=30, timeline=cluster.timeline)
        attack = netns.http_get(edge, "127.0.0.1", haproxy.port, ATTACK)
        assert attack and attack[0] == 403, attack
    finally:
        haproxy.close()
    rule_lines = []
    wait_until("the 942100 line in the agent's log", lambda: '"rule_id":942100' in pod.logs("agent", 400), timeout=20)
    for line in pod.logs("agent", 400).splitlines():
        if line.startswith("{") and '"match"' in line:
            rule_lines.append(json.loads(line)["match"])
    sqli = next(m for m in rule_lines if m["rule_id"] == 942100)
    assert sqli["file"] == "/opt/lastcall-spoa/crs/rules/REQUEST-942-APPLICATION-ATTACK-SQLI.conf", sqli
    assert sqli["version"] == f"OWASP_CRS/{version}", sqli
    measured(f"cri spoa pod features on {pod.who}: init containers prepare (exit 0) then crs (copied CRS {version} "
             f"from {crs_image}, exit 0), the agent ready {pod.ready_at - runs['agent'].started_at:.2f} s after its start "  # type: ignore[operator]
             f"with the copied tree (942100 from {sqli['file']}, {sqli['version']}); extraVolumes/extraVolumeMounts/"
             f"extraEnv in the agent; ServiceAccount {sa['metadata']['name']}, no token mounted")


def test_spoa_daemonset_pods_run(cluster: CriCluster) -> None:
    rendered = render("lastcall-spoa", {**GRACE, "daemonSet": {"enabled": True},
                                        "serviceAccount": {"automountServiceAccountToken": True}})
    assert rendered.workload()["kind"] == "DaemonSet"
    assert not rendered.of_kind("HorizontalPodAutoscaler")
    ds = DaemonSet("waf-ds", cluster.kubelets, cluster.timeline)
    ds.create(rendered)
    report = []
    for node, pod in ds.pods.items():
        got = netns.http_get(cluster.edge, pod.ip, 9901, "/readyz")
        assert got and got[0] == 200, (node, got)
        # The control: with automount on, the token is there (and would be above).
        token = inside(proc_root(pod, "agent"), TOKEN_PATH + "/token")
        assert token.read_text().startswith("token-of-ns-default-"), token
        report.append(f"{pod.who} ready {pod.ready_at - pod.runs['agent'].started_at:.2f} s after start")  # type: ignore[operator]
    assert sorted(ds.pods) == sorted(cluster.kubelets)
    measured("cri spoa DaemonSet mode: one pod per node, " + "; ".join(report)
             + "; with automountServiceAccountToken: true the token is mounted (the control)")


EDITED_PATH = "/blocked-by-the-edit"
EDITED_RULE = f'SecRule REQUEST_URI "@contains {EDITED_PATH}" "id:1900001,phase:1,deny,status:403,log"'


def reloads(edge: str, pod: Pod, result: str) -> float:
    got = netns.http_get(edge, pod.ip, 9901, "/metrics")
    assert got and got[0] == 200, f"{pod.who} /metrics: {got}"
    for line in got[1].splitlines():
        if line.startswith("spoa_reloads_total{") and f'result="{result}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_an_existing_configmaps_edit_reaches_the_running_agent(cluster: CriCluster, origin: Origin,
                                                               tmp_path: Path) -> None:
    """The user's ConfigMap (`agent.existingConfigMap`, key config.yaml), edited while the
    pod serves: the kubelet swaps the volume's `..data`, the agent (`--autoreload`, the
    chart's default) loads the new rules with no restart and no drain; an edit that does
    not compile is refused and counted, the running rules kept. The chart cannot hash such
    a ConfigMap into the pod template, so this is the path its edits take (the render tests:
    tests/charts/test_checksums.py)."""
    rendered = render("lastcall-spoa", {**GRACE, "agent": {"existingConfigMap": "my-waf"}})
    assert not [o for o in rendered.of_kind("ConfigMap") if o["metadata"]["name"].endswith("-agent")]
    spec = pod_spec(rendered)
    agent = next(c for c in spec.containers() if c.name == "agent")
    assert "--autoreload" in (agent.spec.get("args") or [])
    mount = next(m for m in agent.spec["volumeMounts"] if m["mountPath"].startswith("/etc/lastcall-spoa"))
    assert not mount.get("subPath"), "a subPath mount never sees a ConfigMap's edits"
    # The user's ConfigMap: what the chart would have rendered from its own values.
    (own,) = [o for o in render("lastcall-spoa", GRACE).of_kind("ConfigMap") if o["metadata"]["name"].endswith("-agent")]
    spec.configmaps["my-waf"] = dict(own["data"])
    config = yaml.safe_load(own["data"]["config.yaml"])

    pod = cluster.kubelets["a"].run_pod(spec, "waf-existing-cm", labels=labels(rendered))
    pod.wait_ready(180)
    agent_pid, edge = pod.pid("agent"), cluster.edge
    haproxy = EdgeHAProxy(edge, tmp_path, origin.port)
    try:
        wait_until("HAProxy's admin socket", haproxy.sock.exists, timeout=30)
        haproxy.sync([pod])

        def status(path: str) -> int:
            got = netns.http_get(edge, "127.0.0.1", haproxy.port, path)
            return got[0] if got else 0

        wait_until("HAProxy passes a benign request through the agent", lambda: status(BENIGN) == 200,
                   timeout=30, timeline=cluster.timeline)
        assert status(EDITED_PATH) == 200 and status(ATTACK) == 403

        # The edit: the user's own rules, one of which refuses EDITED_PATH.
        edited = dict(config)
        edited["applications"] = [{**config["applications"][0], "directives": "\n".join([
            "Include @coraza.conf-recommended", "SecRuleEngine On", EDITED_RULE])}]
        edited_at = cluster.timeline.add("test", "the ConfigMap my-waf edited (a rule of the user's)")
        pod.spec.update_configmap("my-waf", {"config.yaml": yaml.safe_dump(edited)}, pod.volumes)
        applied = wait_until("the edited rules to refuse " + EDITED_PATH, lambda: status(EDITED_PATH) == 403,
                             timeout=30, timeline=cluster.timeline)
        assert reloads(edge, pod, "ok") >= 1
        assert "changed: reloading (-autoreload)" in pod.logs("agent", 400)

        # An edit that does not compile: refused, counted, the running rules kept.
        broken = dict(edited)
        broken["applications"] = [{**edited["applications"][0],
                                   "directives": edited["applications"][0]["directives"] + "\nSecRule ARGS"}]
        pod.spec.update_configmap("my-waf", {"config.yaml": yaml.safe_dump(broken)}, pod.volumes)
        wait_until("the broken edit to be refused", lambda: reloads(edge, pod, "error") >= 1, timeout=30, timeline=cluster.timeline)
        assert "reload failed, keeping the running rules" in pod.logs("agent", 400)
        assert status(EDITED_PATH) == 403 and status(BENIGN) == 200
        got = netns.http_get(edge, pod.ip, 9901, "/readyz")
        assert got and got[0] == 200, got
    finally:
        haproxy.close()
    assert pod.pid("agent") == agent_pid and pod.runs["agent"].restarts == 0, "the agent was restarted"
    measured(f"cri spoa agent.existingConfigMap on {pod.who}: the ConfigMap edited -> its rule enforced "
             f"{applied - edited_at:.2f} s later (kubelet-style ..data swap, --autoreload), same process; "
             f"a broken edit refused, the running rules kept, still ready")

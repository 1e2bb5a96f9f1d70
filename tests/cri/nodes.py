"""Test hosts for the CRI tests: each node is a network namespace on a private segment
(tests/images/netns.py, TestNetwork) running its own containerd with the CRI plugin, the
API a kubelet talks to; the kubelet-like driver (kubelet.py) is the client.

Each containerd has its own root (kept between runs, so imported images are cached), state
directory, socket and config, and runs inside its node's network namespace (`nsenter
--net`, nothing else shared differently), so host-network pods get the node's addresses
and pod-network pods get an address from the node's pod range through the CNI bridge
plugin (Debian's containernetworking-plugins), on a bridge inside the node. What this
needs from containerd on this machine (Debian 12's 1.6): `restrict_oom_score_adj` (no
CAP_SYS_RESOURCE here), a local pause image as the sandbox image, network namespaces
under its state directory.

`Cluster.stop()` removes every pod, stops the containerds and their shims, unmounts what
they left and deletes the namespaces; `Cluster.cleanup_stale()` does the same for a run
that was killed, before a new one starts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

try:
    import grpc
    from cri_api.v1 import api_pb2 as cri
    from cri_api.v1 import api_pb2_grpc as cri_grpc
except ImportError:  # `nodes.py cleanup` needs neither (it may run outside the test venv)
    if __name__ != "__main__":
        raise

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "images"))

import netns  # noqa: E402
from enginelib import CACHE, PAUSE_IMAGE, Engine, measured  # noqa: E402

RUN = Path(os.environ.get("LASTCALL_RUN", "/run/lastcall")) / "cri"
CNI_BIN = Path("/usr/lib/cni")
CONTAINERD = shutil.which("containerd") or "/usr/bin/containerd"
CTR = shutil.which("ctr") or "/usr/bin/ctr"


def full_ref(image: str) -> str:
    """docker.io/library/... normalisation, as containerd stores references."""
    name = image if "/" in image.split(":")[0] else f"library/{image}"
    first = name.split("/")[0]
    return name if ("." in first or ":" in first or first == "localhost") else f"docker.io/{name}"


class Node:
    """One test host: its namespace, its containerd, and a CRI client for both services."""

    def __init__(self, net: netns.TestNetwork, name: str, address: str, pod_cidr: str):
        self.name = name
        self.address = address
        self.pod_cidr = pod_cidr
        self.gateway = pod_cidr.rsplit(".", 1)[0] + ".1"
        self.net = net
        self.ns = net.add_host(name, address, forward=True)
        self.root = CACHE / "cri" / name  # images and snapshots: kept
        self.state = RUN / name  # sockets, task state, netns mounts: not kept
        self.sock = self.state / "containerd.sock"
        self.pods_dir = self.state / "pods"
        self.log = CACHE / "cri" / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: grpc.Channel | None = None

    # --- containerd ----------------------------------------------------------------------

    def config(self) -> Path:
        cni = self.state / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        (cni / "net.d" / "10-lastcall.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0",
            "name": "lastcall-pods",
            "plugins": [{
                "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": self.pod_cidr, "gateway": self.gateway}]],
                         "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(cni / "ipam")},
            }],
        }, indent=2))
        cfg = self.state / "containerd.toml"
        cfg.write_text(f"""version = 2
root = "{self.root / 'root'}"
state = "{self.state / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{self.state / 'containerd.sock.ttrpc'}"
[debug]
  address = ""
  level = "warn"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.root / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{full_ref(PAUSE_IMAGE)}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni / 'net.d'}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
""")
        return cfg

    def start(self) -> None:
        assert (CNI_BIN / "bridge").exists(), "the CNI plugins are not installed (containernetworking-plugins; scripts/setup.sh)"
        self.root.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        cfg = self.config()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(["nsenter", f"--net={self.ns}", "--", CONTAINERD, "--config", str(cfg)],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + 60
        while not self.sock.exists():
            assert self.proc.poll() is None, f"containerd on {self.name} exited:\n{self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"containerd on {self.name}: no socket after 60 s"
            time.sleep(0.05)
        self.channel = grpc.insecure_channel(f"unix://{self.sock}")
        self.runtime = cri_grpc.RuntimeServiceStub(self.channel)
        self.images = cri_grpc.ImageServiceStub(self.channel)
        while True:
            try:
                status = self.runtime.Status(cri.StatusRequest(), timeout=5)
                ready = {c.type: c.status for c in status.status.conditions}
                if ready.get("RuntimeReady") and ready.get("NetworkReady"):
                    break
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"containerd on {self.name}: CRI not ready:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.1)
        self.remove_all_pods()

    def version(self) -> str:
        v = self.runtime.Version(cri.VersionRequest(), timeout=10)
        return f"{v.runtime_name} {v.runtime_version} (CRI {v.runtime_api_version})"

    def image_id(self, image: str) -> str | None:
        got = self.images.ImageStatus(cri.ImageStatusRequest(image=cri.ImageSpec(image=image)), timeout=30)
        return got.image.id or None

    def load_images(self, engine: Engine, images: list[str]) -> None:
        """Imports what is missing or stale from the private dockerd (docker save | ctr
        import): the CRI plugin sees the k8s.io namespace's images at once."""
        stale = [i for i in images if self.image_id(i) != engine.image_id(i)]
        if not stale:
            return
        started = time.monotonic()
        tar = self.state / "images.tar"
        engine.save(stale, tar)
        out = subprocess.run([CTR, "--address", str(self.sock), "-n", "k8s.io", "images", "import", str(tar)],
                             capture_output=True, text=True, timeout=900)
        tar.unlink()
        assert out.returncode == 0, f"ctr images import on {self.name}: {out.stderr}"
        for i in stale:
            assert self.image_id(i) == engine.image_id(i), f"{i} not imported on {self.name}"
        measured(f"cri {self.name}: imported {', '.join(stale)} in {time.monotonic() - started:.1f} s")

    def manifest_digest(self, image: str) -> str:
        """The digest of the manifest containerd holds for `image` (its image record's target:
        what `repo@sha256:...` names; for an imported image, the manifest the import made)."""
        out = subprocess.run([CTR, "--address", str(self.sock), "-n", "k8s.io", "images", "ls",
                              f"name=={full_ref(image)}"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"ctr images ls on {self.name}: {out.stderr}"
        rows = [line.split() for line in out.stdout.splitlines()[1:] if line.strip()]
        assert len(rows) == 1 and rows[0][2].startswith("sha256:"), f"{image} on {self.name}: {out.stdout}"
        return rows[0][2]

    def record_repo_digest(self, image: str) -> str:
        """Records `repo@<manifest digest>` for an imported image, as a pull records it (the
        CRI's PullImage keeps both repo:tag and repo@digest; `ctr images import` keeps only
        the archive's repo:tag unless told `--digests`): an image record of that name, on
        the same target. Returns the digest."""
        digest = self.manifest_digest(image)
        repo = full_ref(image).rsplit(":", 1)[0]
        out = subprocess.run([CTR, "--address", str(self.sock), "-n", "k8s.io", "images", "tag", "--force",
                              full_ref(image), f"{repo}@{digest}"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"ctr images tag on {self.name}: {out.stderr}"
        return digest

    def forget_repo_digest(self, image: str) -> None:
        """Removes the `repo@<manifest digest>` record (the image stays, under its tag): the
        import's state, as the containerd root is kept between runs."""
        repo = full_ref(image).rsplit(":", 1)[0]
        subprocess.run([CTR, "--address", str(self.sock), "-n", "k8s.io", "images", "rm",
                        f"{repo}@{self.manifest_digest(image)}"], capture_output=True, text=True, timeout=60)

    def remove_all_pods(self) -> None:
        for sb in self.runtime.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=30).items:
            self.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sb.id), timeout=120)
            self.runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sb.id), timeout=120)

    def stop(self) -> None:
        if self.channel is not None:
            try:
                self.remove_all_pods()
            except grpc.RpcError as e:
                print(f"cri {self.name}: removing pods: {e}")
            self.channel.close()
            self.channel = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None
        kill_leftovers(self.state)


def kill_leftovers(state: Path) -> None:
    """containerd and shims whose command line names `state` (a run that was killed), then
    whatever they left mounted under it or under the roots."""
    out = subprocess.run(["pgrep", "-f", f"(containerd|containerd-shim).*{state}"], capture_output=True, text=True)
    for pid in out.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    roots = [str(state), str(CACHE / "cri")]
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if any(m.startswith(r + "/") for r in roots)), reverse=True):
        subprocess.run(["umount", m], capture_output=True)
        if Path(m).is_mount():
            subprocess.run(["umount", "-l", m], capture_output=True)
    shutil.rmtree(state, ignore_errors=True)


class Cluster:
    """Two nodes (a, b) and an edge host (clients, load, the standalone HAProxy, the TURN
    peer) on one segment: 198.18.0.1, .2 and .100; pod ranges 198.19.1.0/24 (a) and
    198.19.2.0/24 (b), routed through their nodes."""

    NODES = {"a": ("198.18.0.1", "198.19.1.0/24"), "b": ("198.18.0.2", "198.19.2.0/24")}
    EDGE = "198.18.0.100"

    def __init__(self) -> None:
        self.net: netns.TestNetwork | None = None
        self.nodes: dict[str, Node] = {}
        self.edge = ""

    @staticmethod
    def cleanup_stale() -> None:
        for name in Cluster.NODES:
            kill_leftovers(RUN / name)
        netns.TestNetwork("cri").cleanup()

    def start(self, engine: Engine, images: list[str]) -> None:
        self.cleanup_stale()
        self.net = netns.TestNetwork("cri")
        self.edge = self.net.add_host("edge", self.EDGE)
        for name, (address, cidr) in self.NODES.items():
            self.nodes[name] = Node(self.net, name, address, cidr)
        for name, (address, cidr) in self.NODES.items():
            self.net.route("edge", cidr, address)
            for other, node in self.nodes.items():
                if other != name:
                    self.net.route(other, cidr, address)
        for node in self.nodes.values():
            node.start()
            node.load_images(engine, [PAUSE_IMAGE, *images])
        measured(f"cri: nodes {', '.join(self.nodes)} up ({self.nodes['a'].version()})")

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        self.nodes.clear()
        if self.net is not None:
            self.net.cleanup()
            self.net = None


if __name__ == "__main__":
    # `python3 tests/cri/nodes.py cleanup`: what a killed run left (scripts/test_containers.sh
    # runs it at the end, whatever happened).
    assert sys.argv[1:] == ["cleanup"], "usage: nodes.py cleanup"
    Cluster.cleanup_stale()

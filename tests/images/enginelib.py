"""The private Docker engine the container tests run on, the images it builds, and pods run
on it the way dockershim ran them.

- `Engine`: Debian's dockerd started by `scripts/dockerd.sh` with its own data root, exec
  root, socket and pidfile (no bridge, no iptables), held under `flock
  $LASTCALL_CACHE/images.lock` so that two test runs on one machine take turns; the images
  built by `scripts/images.sh` (Debian 13 bases from debootstrap, no registry) plus a pause
  image; stopped, with what it mounted, when the session ends, also after a failure.
- `DockerPod`: a rendered pod spec (tests/images/podspec.py) run with `docker run`: a
  pause container owns the pod's network namespace (`--network none`: loopback only) or
  the pod uses the host's (`hostNetwork`), and each container joins it with the spec's
  user, groups, read-only root, capabilities, no-new-privileges, seccomp, environment,
  arguments and volumes. Probes run from this process, inside the pod's namespace.

The session fixture `engine` (tests/conftest.py) makes one Engine per pytest run."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import netns
from podspec import Container, PodSpec, Probe, fields

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LASTCALL_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lastcall")
DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"
PAUSE_IMAGE = "lastcall-local/pause:1"
HAPROXY_IMAGE = "lastcall-local/haproxy:trixie"
BASE_IMAGE = "lastcall-local/debian:trixie"
SPOA_IMAGE = "lastcall/lastcall-spoa:0.1.0"
TURN_IMAGE = "lastcall/lastcall-turn:0.1.0"
POLL = 0.05

# Lines for the end-of-run summary (printed by tests/conftest.py).
MEASURED: list[str] = []


def measured(line: str) -> None:
    MEASURED.append(line)
    print(line)


def _sh(argv: list[str], env: dict[str, str] | None = None, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


class Engine:
    """The private dockerd, its images, and a `docker` client bound to it."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        self.lock_fd: int | None = None
        self.host = ""
        self.started = False

    # --- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        CACHE.mkdir(parents=True, exist_ok=True)
        if not os.environ.get("LASTCALL_IMAGES_LOCKED"):  # else scripts/test_containers.sh holds it
            self.lock_fd = os.open(CACHE / "images.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"engine: waiting for {CACHE / 'images.lock'} (another test run uses the private dockerd)")
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        out = _sh(["bash", "scripts/dockerd.sh", "start"], timeout=120)
        assert out.returncode == 0, f"scripts/dockerd.sh start failed:\n{out.stderr}"
        self.started = True
        self.host = out.stdout.strip().split("=", 1)[1]
        self.env["DOCKER_HOST"] = self.host

    def stop(self) -> None:
        if self.started:
            out = _sh(["bash", "scripts/dockerd.sh", "stop"], timeout=120)
            if out.returncode != 0:
                print(f"scripts/dockerd.sh stop: {out.stderr}")
            self.started = False
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    def build_images(self) -> None:
        """scripts/images.sh (cached: fast when nothing changed), then the pause image."""
        binaries = os.environ.get("LASTCALL_IMAGE_BINARIES", "source")
        # Debian's CRS: the tests reach Debian's mirror only, not the CRS release URLs (the
        # release path is built with a stand-in release served on loopback:
        # tests/images/test_crs_release.py).
        argv = ["bash", "scripts/images.sh", "--haproxy", "--crs", "debian", "--binaries", binaries]
        if binaries == "prebuilt" and os.environ.get("LASTCALL_PREBUILT_DIR"):
            argv += ["--prebuilt-dir", os.environ["LASTCALL_PREBUILT_DIR"]]
        started = time.monotonic()
        out = _sh(argv, env=self.env)
        assert out.returncode == 0, f"{' '.join(argv)} failed:\n{out.stderr[-8000:]}"
        measured(f"images: `{' '.join(argv)}` took {time.monotonic() - started:.0f} s; sizes:")
        for line in out.stdout.strip().splitlines():
            measured(f"  {line}")
        self._build_pause()
        # The private daemon's data root is a per-machine cache: old builds' images and the
        # least recently used build cache go, the cargo cache of the last builds stays.
        self.docker("image", "prune", "-f", timeout=300)
        self.docker("builder", "prune", "-f", "--keep-storage", "8GB", timeout=300)

    def _build_pause(self) -> None:
        """The pod sandbox image: tests/images/pause.c linked statically, FROM scratch."""
        work = CACHE / "pause"
        work.mkdir(parents=True, exist_ok=True)
        src = Path(__file__).with_name("pause.c")
        binary = work / "pause"
        if not binary.exists() or binary.stat().st_mtime < src.stat().st_mtime:
            out = _sh(["gcc", "-Os", "-static", "-o", str(binary), str(src)])
            assert out.returncode == 0, f"gcc pause.c: {out.stderr}"
        (work / "Dockerfile").write_text('FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n')
        self.docker("build", "-q", "-t", PAUSE_IMAGE, str(work), timeout=300)

    # --- client --------------------------------------------------------------------------

    def docker(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([DOCKER, *args], capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} exited {out.returncode}: {out.stderr.strip()}")
        return out

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([DOCKER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)

    def inspect(self, name: str) -> dict:
        return json.loads(self.docker("inspect", name).stdout)[0]

    def image_id(self, image: str) -> str:
        return self.docker("image", "inspect", "-f", "{{.Id}}", image).stdout.strip()

    def save(self, images: list[str], path: Path) -> None:
        self.docker("save", "-o", str(path), *images, timeout=600)


# --- pods on docker ---------------------------------------------------------------------


@dataclass
class Stopped:
    """How `docker stop -t GRACE` ended for one container."""

    exit_code: int
    seconds: float  # from the stop request to the container's exit
    oom_killed: bool
    exited_at: float  # time.monotonic() of the exit


class DockerPod:
    """One pod of a rendered workload on the private dockerd (see the module docstring)."""

    def __init__(self, engine: Engine, spec: PodSpec, name: str, workdir: Path,
                 images: dict[str, str] | None = None, join: "DockerPod | None" = None):
        self.join = join  # share this pod's network namespace (two pods on one "node")
        self.engine = engine
        self.spec = spec
        self.name = name
        self.workdir = workdir
        self.images = images or {}  # image in the spec -> image to run (local names)
        self.ns: str | None = None  # the pod's network namespace (None: the host's)
        self.pod_ip = "127.0.0.1"
        self.started: list[str] = []
        self.volumes: dict[str, Path] = {}

    def cname(self, c: Container | str) -> str:
        return f"{self.name}-{c if isinstance(c, str) else c.name}"

    def start(self, ready_timeout: float = 90) -> None:
        self.volumes = self.spec.write_volumes(self.workdir / "volumes")
        net: list[str]
        if self.spec.host_network:
            net = ["--network", "host"]
        elif self.join is not None:
            self.ns, self.pod_ip = self.join.ns, self.join.pod_ip
            net = ["--network", f"container:{self.join.cname('pause')}"]
        else:
            pause = self.cname("pause")
            self.engine.docker("run", "-d", "--name", pause, "--network", "none", "--ipc", "shareable", PAUSE_IMAGE)
            self.started.append(pause)
            self.ns = f"/proc/{self.pid('pause')}/ns/net"
            net = ["--network", f"container:{pause}", "--ipc", f"container:{pause}"]
        field_values = fields(self.name, "ns", self.pod_ip, "127.0.0.1", "docker", self.name)
        for c in self.spec.containers():
            assert c.role != "init", "run-to-completion init containers: not used by the charts"
            self._run(c, net, field_values)
            if c.role == "sidecar":  # the kubelet waits for a sidecar's startup probe
                self.wait_probe(c, "startupProbe", ready_timeout)
        self.wait_ready(ready_timeout)

    def _run(self, c: Container, net: list[str], field_values: dict[str, str]) -> None:
        sec = self.spec.security(c)
        env = self.spec.env(c, field_values)
        command, args = self.spec.argv(c, env)
        argv = ["run", "-d", "--name", self.cname(c), *net, "--stop-timeout", str(self.spec.grace)]
        if sec.uid is not None:
            argv += ["--user", f"{sec.uid}:{sec.gid if sec.gid is not None else sec.uid}"]
        for g in sec.groups:
            argv += ["--group-add", str(g)]
        if sec.read_only_root:
            argv.append("--read-only")
        for cap in sec.caps_drop:
            argv += ["--cap-drop", cap]
        for cap in sec.caps_add:
            argv += ["--cap-add", cap]
        if sec.no_new_privs:
            argv += ["--security-opt", "no-new-privileges"]
        if sec.seccomp == "Unconfined":
            argv += ["--security-opt", "seccomp=unconfined"]
        if sec.privileged:
            argv.append("--privileged")
        for k, v in env.items():
            argv += ["--env", f"{k}={v}"]
        for m in self.spec.mounts(c, self.volumes):
            argv += ["--mount", f"type=bind,src={m.host_path},dst={m.container_path}" + (",readonly" if m.read_only else "")]
        if command:
            argv += ["--entrypoint", command[0]]
        argv.append(self.images.get(c.image, c.image))
        if command:
            argv += command[1:]
        if args is not None:
            argv += args
        self.engine.docker(*argv)
        self.started.append(self.cname(c))

    # --- state ---------------------------------------------------------------------------

    def pid(self, c: Container | str) -> int:
        return int(self.engine.docker("inspect", "-f", "{{.State.Pid}}", self.cname(c)).stdout)

    def running(self, c: Container | str) -> bool:
        return self.engine.docker("inspect", "-f", "{{.State.Running}}", self.cname(c)).stdout.strip() == "true"

    def logs(self, c: Container | str, tail: int = 40) -> str:
        out = self.engine.docker("logs", "--tail", str(tail), self.cname(c), check=False)
        return out.stdout + out.stderr

    def container(self, name: str) -> Container:
        return next(c for c in self.spec.containers() if c.name == name)

    def probe_once(self, probe: Probe) -> bool:
        if probe.kind == "httpGet":
            got = netns.http_get(self.ns, probe.host or self.pod_ip, probe.port, probe.path, timeout=probe.timeout)
            return got is not None and 200 <= got[0] < 400
        if probe.kind == "tcpSocket":
            try:
                netns.connect(self.ns, (probe.host or self.pod_ip, probe.port), probe.timeout).close()
                return True
            except OSError:
                return False
        raise AssertionError(f"probe kind {probe.kind}: not supported by DockerPod")

    def wait_probe(self, c: Container, which: str, timeout: float) -> float:
        probe = c.probe(which)
        if probe is None:
            return time.monotonic()
        return self.wait_for(f"{c.name} {which}", lambda: self.probe_once(probe), timeout, c)

    def wait_ready(self, timeout: float) -> None:
        for c in self.spec.containers():
            self.wait_probe(c, "readinessProbe", timeout)

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float, c: Container | None = None) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return time.monotonic()
            for name in ([c.name] if c else [x.name for x in self.spec.containers()]):
                if not self.running(name):
                    raise AssertionError(f"{self.cname(name)} exited before {what}:\n{self.logs(name)}")
            time.sleep(POLL)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}:\n" +
                             "\n".join(self.logs(x.name) for x in self.spec.containers()))

    # --- stop ----------------------------------------------------------------------------

    def stop(self, c: Container | str, grace: int | None = None,
             while_stopping: Callable[[], None] | None = None) -> Stopped:
        """`docker stop -t GRACE` (the image's STOPSIGNAL, SIGKILL at GRACE), timed from the
        request to the exit as `docker wait` reports it; `while_stopping` runs meanwhile."""
        name = self.cname(c)
        grace = self.spec.grace if grace is None else grace
        waiter = self.engine.popen("wait", name)
        time.sleep(0.2)  # `docker wait` has attached (it returns at once for a stopped one)
        assert waiter.poll() is None, f"{name} is not running: {waiter.communicate()}"
        exited: list[float] = []

        def wait() -> None:
            waiter.communicate()
            exited.append(time.monotonic())

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        start = time.monotonic()
        stopper = self.engine.popen("stop", "-t", str(grace), name)
        if while_stopping is not None:
            while_stopping()
        stopper.communicate(timeout=grace + 120)
        t.join(timeout=60)
        assert exited, f"docker wait {name} did not return"
        state = self.engine.inspect(name)["State"]
        return Stopped(int(state["ExitCode"]), exited[0] - start, bool(state.get("OOMKilled")), exited[0])

    def close(self) -> None:
        for name in reversed(self.started):
            self.engine.docker("rm", "-f", name, check=False)
        self.started.clear()
        shutil.rmtree(self.workdir / "volumes", ignore_errors=True)


# --- what a container process runs with --------------------------------------------------


def process_status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def root_mount_options(pid: int) -> list[str]:
    """The mount options of the process's root filesystem (from its mountinfo)."""
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        parts = line.split()
        if parts[4] == "/":
            return parts[5].split(",")
    raise AssertionError(f"no / in /proc/{pid}/mountinfo")


def assert_runs_as_rendered(pid: int, spec: PodSpec, c: Container) -> dict[str, str]:
    """The container's process has what the rendered securityContext asks for: the uid and
    gid (all four ids), the fsGroup as a supplementary group, no capabilities at all
    (effective, permitted, bounding), no_new_privs, a seccomp filter, a read-only root, and
    it is PID 1 of its own PID namespace. Returns its /proc status."""
    sec = spec.security(c)
    st = process_status(pid)
    assert st["Uid"].split() == [str(sec.uid)] * 4, f"Uid {st['Uid']}"
    assert st["Gid"].split() == [str(sec.gid)] * 4, f"Gid {st['Gid']}"
    assert set(st.get("Groups", "").split()) >= {str(g) for g in sec.groups}, f"Groups {st.get('Groups')}"
    if "ALL" in sec.caps_drop and not sec.caps_add:
        for key in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
            assert int(st[key], 16) == 0, f"{key} {st[key]}: capabilities left"
    if sec.no_new_privs:
        assert st["NoNewPrivs"] == "1", f"NoNewPrivs {st['NoNewPrivs']}"
    if sec.seccomp == "RuntimeDefault":
        assert st["Seccomp"] == "2", f"Seccomp {st['Seccomp']} (2 = a filter)"
    if sec.read_only_root:
        assert "ro" in root_mount_options(pid), f"root mounted {root_mount_options(pid)}"
    assert st["NSpid"].split()[-1] == "1", f"NSpid {st['NSpid']}: not PID 1 of its namespace"
    return st

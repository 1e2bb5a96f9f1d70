"""A small kubelet: runs the pods of rendered charts on a node's containerd through the CRI,
the way the kubelet does, so that what the charts render is what runs.

Per pod: a sandbox (`RunPodSandbox`: host network or the pod network through CNI, DNS
config, the pod's labels), its volumes written to disk (ConfigMap, Secret, emptyDir;
tests/images/podspec.py), then the containers in order (`CreateContainer` +
`StartContainer`) with the rendered image, command, args (`$(VAR)` expanded), env (value,
fieldRef, secretKeyRef), mounts and security context (uid/gid, fsGroup, capabilities,
no_new_privs, read-only root, RuntimeDefault seccomp, runAsNonRoot checked). Native
sidecars (init containers with `restartPolicy: Always`) start first, each one only after
its startup probe passed; main containers then start one after the other.

Probes, as pkg/kubelet/prober does: one worker per probe, the first run at once, then every
`periodSeconds`, `timeoutSeconds` per run, `initialDelaySeconds`, success and failure
thresholds; readiness and liveness wait for the startup probe, and its success triggers an
immediate readiness run; liveness or startup failures restart the container, as does an
exit while the pod runs (restartPolicy Always, 10 s back-off; `OnFailure`: only a non-zero
exit; `Never`: none, the pod's phase is then Succeeded once every container exited 0, Failed
once one exited otherwise: `wait_completed`, as `helm test` waits for its hook pods). A pod is
ready when all its containers are (run-to-completion init containers aside).

Init containers run in the order they are listed, native sidecars among them: a
run-to-completion one must exit 0 before the next starts (one that fails fails the pod
here, where the kubelet would retry it with back-off). The ServiceAccount admission the API
server does is applied first (tests/images/podspec.py: an unknown ServiceAccount refuses
the pod; otherwise, unless automount is off, a token, the CA and the namespace are mounted
read-only at /var/run/secrets/kubernetes.io/serviceaccount in every container).

Deletion, as the kubelet's: the grace period is `terminationGracePeriodSeconds`, counted
from the deletion; main containers are stopped in parallel, each one's `preStop` exec hook
run first (`ExecSync` in the container, bounded by the grace; a hook that fails is logged
and the stop goes on, as the kubelet's FailedPreStopHook), then `StopContainer` with what is
left of the grace (the image's STOPSIGNAL, then SIGKILL at the end), native sidecars after
every main container has exited, in reverse order, with what is left of the grace (at
least 2 s); liveness and startup probes stop at deletion, readiness keeps running. Every
step is timestamped in a shared `Timeline`.

`shareProcessNamespace` gives the pod one PID namespace (the sandbox's, its pause process
as PID 1), as the kubelet asks the runtime; otherwise each container has its own.

Not done: resource limits, image pulls (images are imported), httpGet and postStart hooks
(asserted), ephemeral containers, the pod status API, init container retries."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import grpc
from cri_api.v1 import api_pb2 as cri

import netns
from nodes import Node
from podspec import TOKEN_PATH, Container, PodSpec, Probe, fields

MIN_GRACE = 2  # the kubelet's minimum for what is left of a grace period
BACKOFF = 10.0
# The kubelet's default masked and read-only /proc and /sys paths (its DefaultProcMount).
MASKED = ["/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
          "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"]
READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


class Timeline:
    """What happened, when: pod and container events from every kubelet and controller."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.events: list[tuple[float, str, str]] = []
        self.lock = threading.Lock()

    def add(self, who: str, what: str) -> float:
        now = time.monotonic()
        with self.lock:
            self.events.append((now, who, what))
        return now

    def text(self, last: int = 200) -> str:
        with self.lock:
            rows = self.events[-last:]
        return "\n".join(f"{t - self.t0:8.3f}  {who:28} {what}" for t, who, what in rows)


@dataclass
class Run:
    """One container of a pod, across its restarts."""

    spec: Container
    id: str = ""
    attempt: int = 0
    prestop_started_at: float | None = None
    prestop_ended_at: float | None = None
    prestop_exit: int | None = None  # None: no hook, or it did not return (an error instead)
    prestop_output: str = ""
    start_asked_at: float = 0.0  # StartContainer called (a short container may exit before it returns)
    started_at: float = 0.0  # StartContainer returned
    started: bool = False  # the startup probe passed (or there is none)
    ready: bool = False
    restarts: int = 0
    restarting: bool = False
    stop_sent_at: float | None = None
    exited_at: float | None = None  # from the runtime's finished_at
    exit_code: int | None = None
    reason: str = ""
    started_event: threading.Event = field(default_factory=threading.Event)
    readiness_trigger: threading.Event = field(default_factory=threading.Event)


class Pod:
    """One pod on one node (see the module docstring)."""

    def __init__(self, kubelet: "Kubelet", spec: PodSpec, name: str, namespace: str, labels: dict[str, str]):
        self.kubelet = kubelet
        self.node: Node = kubelet.node
        self.spec = spec
        self.name = name
        self.namespace = namespace
        self.labels = labels
        self.uid = str(uuid.uuid4())
        self.dir = self.node.pods_dir / self.uid
        self.who = f"{self.node.name}/{name}"
        self.timeline = kubelet.timeline
        self.runs: dict[str, Run] = {c.name: Run(c) for c in spec.containers()}
        self.sandbox = ""
        self.sandbox_config: cri.PodSandboxConfig | None = None
        self.ip = ""
        self.lock = threading.RLock()
        self.deleted_at: float | None = None
        self.terminated_at: float | None = None
        self.ready_at: float | None = None
        self.stopping = threading.Event()  # deletion requested
        self.gone = threading.Event()  # sandbox removed
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []
        # The API server's admission, before the pod exists.
        self.service_account, self.automount = spec.service_account(namespace)
        self.token_dir: Path | None = None
        for c in spec.containers():
            hooks = c.spec.get("lifecycle") or {}
            assert set(hooks) <= {"preStop"} and "httpGet" not in hooks.get("preStop", {}), (
                f"{c.name}: only exec preStop hooks are run by this kubelet: {hooks}")

    def event(self, what: str) -> float:
        return self.timeline.add(self.who, what)

    # --- start ---------------------------------------------------------------------------

    def start(self) -> None:
        """The sandbox and every container, in order; returns once the last one started
        (not when the pod is ready: see `wait_ready`)."""
        rt = self.node.runtime
        host = self.spec.host_network
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        self.volumes = self.spec.write_volumes(self.dir / "volumes")
        if self.automount:
            # What the kube-api-access projected volume holds (a made-up token: nothing here
            # answers to it).
            self.token_dir = self.dir / "volumes" / "kube-api-access"
            self.token_dir.mkdir(parents=True, exist_ok=True)
            (self.token_dir / "token").write_text(f"token-of-{self.namespace}-{self.service_account}-{self.uid}")
            (self.token_dir / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
            (self.token_dir / "namespace").write_text(self.namespace)
            for f in self.token_dir.iterdir():
                f.chmod(0o644)
        pod_sec = self.spec.spec.get("securityContext", {}) or {}
        pid = cri.POD if self.spec.share_process_namespace else cri.CONTAINER
        ns_opts = cri.NamespaceOption(network=cri.NODE if host else cri.POD, pid=pid, ipc=cri.POD)
        sandbox_sec = cri.LinuxSandboxSecurityContext(
            namespace_options=ns_opts,
            seccomp=cri.SecurityProfile(profile_type=cri.SecurityProfile.ProfileType.RuntimeDefault),
            supplemental_groups=[int(g) for g in pod_sec.get("supplementalGroups", [])]
            + ([int(pod_sec["fsGroup"])] if pod_sec.get("fsGroup") is not None else []),
        )
        if pod_sec.get("runAsUser") is not None:
            sandbox_sec.run_as_user.value = int(pod_sec["runAsUser"])
        self.sandbox_config = cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=self.name, uid=self.uid, namespace=self.namespace, attempt=0),
            # A host-network pod keeps the node's hostname: none is set (what the kubelet does).
            hostname="" if host else self.name,
            log_directory=str(self.dir / "logs"),
            dns_config=cri.DNSConfig(servers=[self.kubelet.dns],
                                     searches=[f"{self.namespace}.svc.cluster.local", "svc.cluster.local", "cluster.local"],
                                     options=["ndots:5"]),
            labels={**self.labels, "io.kubernetes.pod.name": self.name, "io.kubernetes.pod.namespace": self.namespace,
                    "io.kubernetes.pod.uid": self.uid},
            annotations={str(k): str(v) for k, v in (self.spec.metadata.get("annotations") or {}).items()},
            linux=cri.LinuxPodSandboxConfig(security_context=sandbox_sec),
        )
        self.event("RunPodSandbox")
        self.sandbox = rt.RunPodSandbox(cri.RunPodSandboxRequest(config=self.sandbox_config), timeout=120).pod_sandbox_id
        if host:
            self.ip = self.node.address
        else:
            st = rt.PodSandboxStatus(cri.PodSandboxStatusRequest(pod_sandbox_id=self.sandbox), timeout=30)
            self.ip = st.status.network.ip
        assert self.ip, f"{self.who}: sandbox without an IP"
        self.event(f"sandbox up, pod IP {self.ip}")
        for c in self.spec.containers():
            if self.stopping.is_set():
                return
            self._start_container(self.runs[c.name])
            if c.role == "init":
                if not self._run_to_completion(self.runs[c.name]):
                    return
                continue
            self._spawn(self._probe_workers(self.runs[c.name]))
            if c.role == "sidecar":
                # The next container starts once this sidecar has started (startup probe).
                while not self.runs[c.name].started_event.wait(0.2):
                    assert not self.stopping.is_set() and not self.errors, f"{self.who}: {self.errors}"
        self._spawn([threading.Thread(target=self._monitor, name=f"{self.who} monitor", daemon=True)])

    def _run_to_completion(self, run: Run, timeout: float = 120) -> bool:
        """Waits for an init container to exit; True when it exited 0."""
        deadline = time.monotonic() + timeout
        while run.exit_code is None:
            if time.monotonic() > deadline or self.stopping.is_set():
                self.errors.append(f"{run.spec.name}: init container still running after {timeout} s")
                return False
            self._record_exit(run)
            time.sleep(0.05)
        if run.exit_code != 0:
            self.errors.append(f"{run.spec.name}: init container exited {run.exit_code} ({run.reason}): "
                               f"{self.logs(run.spec.name, 10)}")
            return False
        return True

    def _spawn(self, threads: list[threading.Thread]) -> None:
        for t in threads:
            self.threads.append(t)
            t.start()

    def _field_values(self) -> dict[str, str]:
        return fields(self.name, self.namespace, self.ip, self.node.address, self.node.name, self.uid)

    def _container_config(self, run: Run) -> cri.ContainerConfig:
        c = run.spec
        sec = self.spec.security(c)
        env = self.spec.env(c, self._field_values())
        command, args = self.spec.argv(c, env)
        if sec.run_as_non_root:
            uid = sec.uid
            if uid is None:
                image = self.node.images.ImageStatus(cri.ImageStatusRequest(image=cri.ImageSpec(image=c.image)))
                uid = image.image.uid.value if image.image.HasField("uid") else None
            # CreateContainerConfigError in the kubelet: the image would run as root.
            assert uid not in (None, 0), f"{c.name}: runAsNonRoot, but it would run as uid {uid}"
        linux_sec = cri.LinuxContainerSecurityContext(
            capabilities=cri.Capability(add_capabilities=sec.caps_add, drop_capabilities=sec.caps_drop),
            privileged=sec.privileged,
            namespace_options=self.sandbox_config.linux.security_context.namespace_options,
            readonly_rootfs=sec.read_only_root,
            supplemental_groups=sec.groups,
            no_new_privs=sec.no_new_privs,
            masked_paths=MASKED, readonly_paths=READONLY,
        )
        if sec.seccomp == "RuntimeDefault":
            linux_sec.seccomp.profile_type = cri.SecurityProfile.ProfileType.RuntimeDefault
        if sec.uid is not None:
            linux_sec.run_as_user.value = int(sec.uid)
        if sec.gid is not None:
            linux_sec.run_as_group.value = int(sec.gid)
        mounts = [cri.Mount(container_path=m.container_path, host_path=m.host_path, readonly=m.read_only)
                  for m in self.spec.mounts(c, self.volumes)]
        if self.token_dir is not None:
            mounts.append(cri.Mount(container_path=TOKEN_PATH, host_path=str(self.token_dir), readonly=True))
        return cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=c.name, attempt=run.attempt),
            image=cri.ImageSpec(image=c.image),
            command=command or [], args=args or [],
            envs=[cri.KeyValue(key=k, value=v) for k, v in env.items()],
            mounts=mounts,
            labels={"io.kubernetes.container.name": c.name, "io.kubernetes.pod.name": self.name,
                    "io.kubernetes.pod.uid": self.uid},
            log_path=f"{c.name}/{run.attempt}.log",
            linux=cri.LinuxContainerConfig(resources=cri.LinuxContainerResources(), security_context=linux_sec),
        )

    def _start_container(self, run: Run) -> None:
        rt = self.node.runtime
        config = self._container_config(run)
        run.id = rt.CreateContainer(cri.CreateContainerRequest(pod_sandbox_id=self.sandbox, config=config,
                                                               sandbox_config=self.sandbox_config), timeout=120).container_id
        run.start_asked_at = time.monotonic()
        rt.StartContainer(cri.StartContainerRequest(container_id=run.id), timeout=120)
        with self.lock:
            run.started_at = time.monotonic()
            run.exited_at = run.exit_code = None
            run.started = run.spec.probe("startupProbe") is None
            run.ready = False
            if run.started:
                run.started_event.set()
        self.event(f"{run.spec.name}: started (attempt {run.attempt})")

    # --- probes --------------------------------------------------------------------------

    def _probe_workers(self, run: Run) -> list[threading.Thread]:
        out = []
        for which in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = run.spec.probe(which)
            if probe is not None:
                out.append(threading.Thread(target=self._probe_loop, args=(run, which, probe),
                                            name=f"{self.who} {run.spec.name} {which}", daemon=True))
        if run.spec.probe("readinessProbe") is None:
            with self.lock:
                run.ready = True  # no readinessProbe: ready once started
                if self.is_ready() and self.ready_at is None:  # the last container to be ready
                    self.ready_at = self.event("pod ready")
        return out

    def probe_once(self, probe: Probe) -> bool:
        host = probe.host or self.ip
        if probe.kind == "httpGet":
            assert probe.scheme == "HTTP", "HTTPS probes: not used by the charts"
            got = netns.http_get(self.node.ns, host, probe.port, probe.path, timeout=probe.timeout)
            return got is not None and 200 <= got[0] < 400
        if probe.kind == "tcpSocket":
            try:
                netns.connect(self.node.ns, (host, probe.port), probe.timeout).close()
                return True
            except OSError:
                return False
        raise AssertionError(f"probe kind {probe.kind}: not used by the charts")

    def _probe_loop(self, run: Run, which: str, probe: Probe) -> None:
        last, streak, container = None, 0, ""
        trigger = run.readiness_trigger if which == "readinessProbe" else threading.Event()
        while not self.gone.is_set():
            with self.lock:
                if container != run.id:  # a new container: start over
                    container, last, streak = run.id, None, 0
                running = bool(run.id) and run.exit_code is None and not run.restarting
                started, since = run.started, run.started_at
            if self.stopping.is_set() and which != "readinessProbe":
                return  # the kubelet stops liveness and startup probes at deletion
            due = running and time.monotonic() - since >= probe.initial_delay
            if due and ((which == "startupProbe") != started):
                ok = self.probe_once(probe)
                streak = streak + 1 if ok == last else 1
                last = ok
                if ok and streak >= probe.success_threshold:
                    self._probe_passed(run, which)
                elif not ok and streak >= probe.failure_threshold:
                    self._probe_failed(run, which, streak)
                    streak = 0
            elif not running and which == "readinessProbe":
                with self.lock:
                    run.ready = False
            trigger.wait(probe.period)
            trigger.clear()

    def _probe_passed(self, run: Run, which: str) -> None:
        with self.lock:
            if which == "startupProbe" and not run.started:
                run.started = True
                run.started_event.set()
                run.readiness_trigger.set()  # the prober runs readiness at once
                self.event(f"{run.spec.name}: startup probe passed")
            elif which == "readinessProbe" and not run.ready:
                run.ready = True
                self.event(f"{run.spec.name}: ready")
                if self.is_ready() and self.ready_at is None:
                    self.ready_at = self.event("pod ready")

    def _probe_failed(self, run: Run, which: str, streak: int) -> None:
        with self.lock:
            if which == "readinessProbe":
                if run.ready:
                    run.ready = False
                    self.event(f"{run.spec.name}: not ready ({streak} failed)")
                return
        if self.stopping.is_set():
            return
        self.event(f"{run.spec.name}: {which} failed {streak} times: restart")
        self._restart(run, f"{which} failed")

    def is_ready(self) -> bool:
        with self.lock:
            return (not self.stopping.is_set() and bool(self.sandbox)
                    and all(r.ready and r.exit_code is None and r.id for r in self.runs.values()
                            if r.spec.role != "init"))

    # --- restarts --------------------------------------------------------------------------

    def _status(self, run: Run) -> cri.ContainerStatus:
        return self.node.runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=run.id), timeout=30).status

    def _record_exit(self, run: Run) -> None:
        st = self._status(run)
        if st.state != cri.CONTAINER_EXITED:
            return
        # finished_at is wall-clock nanoseconds: bring it onto the monotonic clock.
        exited = time.monotonic() - (time.time() - st.finished_at / 1e9)
        with self.lock:
            if run.exit_code is None:
                run.exit_code, run.reason, run.exited_at = st.exit_code, st.reason, exited
                run.ready = False
        self.event(f"{run.spec.name}: exited {st.exit_code} ({st.reason})")

    @property
    def restart_policy(self) -> str:
        return str(self.spec.spec.get("restartPolicy") or "Always")

    def _monitor(self) -> None:
        """Records the exits of containers while the pod runs and restarts them as the pod's
        restartPolicy says (Always: every exit; OnFailure: a non-zero one; Never: none)."""
        policy = self.restart_policy
        while not self.stopping.wait(0.1):
            for run in self.runs.values():
                if run.spec.role == "init" or not run.id or run.exit_code is not None or run.restarting:
                    continue
                try:
                    self._record_exit(run)
                except grpc.RpcError as e:
                    self.errors.append(f"{run.spec.name}: ContainerStatus: {e}")
                if run.exit_code is None or self.stopping.is_set():
                    continue
                if policy == "Always" or (policy == "OnFailure" and run.exit_code != 0):
                    self._restart(run, f"exited {run.exit_code}")

    def _restart(self, run: Run, why: str) -> None:
        rt = self.node.runtime
        with self.lock:
            if self.stopping.is_set() or run.restarting:
                return
            run.restarts += 1
            run.restarting = True
        self.errors.append(f"{run.spec.name} restarted: {why}")
        try:
            if run.exit_code is None:
                rt.StopContainer(cri.StopContainerRequest(container_id=run.id, timeout=self.spec.grace),
                                 timeout=self.spec.grace + 60)
                self._record_exit(run)
            if self.stopping.wait(BACKOFF * min(2 ** (run.restarts - 1), 30)):
                return
            rt.RemoveContainer(cri.RemoveContainerRequest(container_id=run.id), timeout=60)
            run.attempt += 1
            run.started_event.clear()
            self._start_container(run)
        finally:
            run.restarting = False

    # --- deletion --------------------------------------------------------------------------

    def delete(self, grace: int | None = None) -> threading.Thread:
        """Starts the kubelet's termination of the pod; returns the thread doing it."""
        grace = self.spec.grace if grace is None else grace
        with self.lock:
            self.deleted_at = self.event(f"deleted (grace {grace} s)")
            self.stopping.set()
        t = threading.Thread(target=self._terminate, args=(grace,), name=f"{self.who} terminate", daemon=True)
        t.start()
        return t

    def _pre_stop(self, run: Run, deadline: float) -> None:
        """The container's preStop exec hook, as the kubelet runs it: in the container, with
        the grace period as its bound; its failure is recorded, not fatal."""
        hook = ((run.spec.spec.get("lifecycle") or {}).get("preStop") or {}).get("exec")
        if not hook or not run.id or run.exit_code is not None:
            return
        bound = max(MIN_GRACE, int(deadline - time.monotonic()))
        run.prestop_started_at = self.event(f"{run.spec.name}: preStop {hook['command']}")
        try:
            got = self.node.runtime.ExecSync(cri.ExecSyncRequest(container_id=run.id, cmd=hook["command"],
                                                                 timeout=bound), timeout=bound + 10)
            run.prestop_exit = got.exit_code
            run.prestop_output = (got.stdout + got.stderr).decode(errors="replace")
            run.prestop_ended_at = self.event(f"{run.spec.name}: preStop returned {got.exit_code}")
        except grpc.RpcError as e:
            run.prestop_output = str(e.details())
            run.prestop_ended_at = self.event(f"{run.spec.name}: preStop failed: {e.code()} {e.details()}")

    def _stop(self, run: Run, deadline: float) -> None:
        self._pre_stop(run, deadline)
        if run.prestop_started_at is not None:
            self._record_exit(run)  # it may have exited during its hook
        remaining = max(MIN_GRACE, int(deadline - time.monotonic() + 0.999))
        if not run.id or run.exit_code is not None:
            return
        with self.lock:
            run.stop_sent_at = self.event(f"{run.spec.name}: StopContainer (timeout {remaining} s)")
        try:
            self.node.runtime.StopContainer(cri.StopContainerRequest(container_id=run.id, timeout=remaining),
                                            timeout=remaining + 60)
        except grpc.RpcError as e:
            # A container that exited as the call arrived (after its preStop hook) may have
            # its shim gone under the call: what counts is the exit the runtime records.
            self.event(f"{run.spec.name}: StopContainer: {e.code()} {e.details()}")
        deadline = time.monotonic() + 30  # the kubelet's PLEG relists until it sees the exit
        self._record_exit(run)
        while run.exit_code is None:
            if time.monotonic() > deadline:
                self.errors.append(f"{run.spec.name}: no exit recorded 30 s after StopContainer")
                return
            time.sleep(0.1)
            self._record_exit(run)

    def _terminate(self, grace: int) -> None:
        deadline = self.deleted_at + grace  # type: ignore[operator]
        mains = [r for r in self.runs.values() if r.spec.role == "main"]
        sidecars = [r for r in self.runs.values() if r.spec.role == "sidecar"]
        threads = [threading.Thread(target=self._stop, args=(r, deadline), daemon=True) for r in mains]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in reversed(sidecars):  # after every main container, in reverse order
            self._stop(r, deadline)
        rt = self.node.runtime
        try:
            rt.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=self.sandbox), timeout=120)
            rt.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=self.sandbox), timeout=120)
        except grpc.RpcError as e:
            self.errors.append(f"removing the sandbox: {e}")
        for path in getattr(self, "volumes", {}).values():  # emptyDir medium Memory: a tmpfs
            if path.is_mount():
                subprocess.run(["umount", str(path)], capture_output=True, timeout=30)
        self.terminated_at = self.event("terminated")
        self.gone.set()

    # --- results -------------------------------------------------------------------------

    def pid(self, container: str) -> int:
        """The container's process on this machine (containerd's verbose status)."""
        st = self.node.runtime.ContainerStatus(
            cri.ContainerStatusRequest(container_id=self.runs[container].id, verbose=True), timeout=30)
        return int(json.loads(st.info["info"])["pid"])

    def logs(self, container: str, tail: int = 30) -> str:
        run = self.runs[container]
        path = self.dir / "logs" / container / f"{run.attempt}.log"
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return f"(no log at {path})"
        # CRI log lines: TIMESTAMP STREAM TAG MESSAGE
        return "\n".join(line.split(" ", 3)[-1] for line in lines[-tail:])

    def wait_ready(self, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while not self.is_ready():
            if time.monotonic() > deadline or self.errors:
                raise AssertionError(f"{self.who} not ready after {timeout} s: {self.errors}\n" + self.describe())
            time.sleep(0.05)
        return self.ready_at or time.monotonic()

    def phase(self) -> str:
        """The pod's phase as the kubelet reports it, for the containers' side: Running while
        a main container runs, Succeeded once all exited 0, Failed once all exited and one
        did not exit 0 (restartPolicy Never; Always and OnFailure restart instead)."""
        with self.lock:
            mains = [r for r in self.runs.values() if r.spec.role == "main"]
            if self.errors or not all(r.id and r.exit_code is not None for r in mains):
                return "Failed" if self.errors and self.restart_policy == "Never" else "Running"
            if self.restart_policy == "Never":
                return "Succeeded" if all(r.exit_code == 0 for r in mains) else "Failed"
            return "Running"

    def wait_completed(self, timeout: float) -> dict[str, int]:
        """For a pod with restartPolicy Never (a Job's, a `helm test` hook's): waits until it
        is Succeeded or Failed and returns its main containers' exit codes."""
        assert self.restart_policy == "Never", f"{self.who}: restartPolicy {self.restart_policy} never completes"
        deadline = time.monotonic() + timeout
        while self.phase() == "Running":
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.who} still running after {timeout} s\n" + self.describe())
            time.sleep(0.05)
        assert not self.errors, f"{self.who}: {self.errors}\n" + self.describe()
        return {name: r.exit_code for name, r in self.runs.items() if r.spec.role == "main"}  # type: ignore[misc]

    def describe(self) -> str:
        out = []
        for name, r in self.runs.items():
            out.append(f"--- {self.who} {name}: ready={r.ready} started={r.started} exit={r.exit_code} "
                       f"restarts={r.restarts}\n{self.logs(name)}")
        return "\n".join(out)


class Kubelet:
    """A node's kubelet: starts pods there. `dns` is the nameserver pods get (no cluster
    DNS runs; nothing the charts render resolves names)."""

    def __init__(self, node: Node, timeline: Timeline, dns: str):
        self.node = node
        self.timeline = timeline
        self.dns = dns
        self.pods: list[Pod] = []

    def run_pod(self, spec: PodSpec, name: str, namespace: str = "ns", labels: dict[str, str] | None = None) -> Pod:
        pod = Pod(self, spec, name, namespace, labels or {})
        self.pods.append(pod)
        pod.start()
        return pod

    def cleanup(self) -> None:
        for pod in self.pods:
            if not pod.stopping.is_set():
                pod.delete(grace=MIN_GRACE)
        for pod in self.pods:
            pod.gone.wait(120)


def wait_until(what: str, check: Callable[[], bool], timeout: float, timeline: Timeline | None = None) -> float:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n" + (timeline.text() if timeline else ""))
        time.sleep(0.05)
    return time.monotonic()


def log_dir(pod: Pod) -> Path:
    return pod.dir / "logs"

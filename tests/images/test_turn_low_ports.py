"""The lastcall-turn image on a port below 1024 without root: its binary carries the file
capability `cap_net_bind_service=p` (docker/Dockerfile's turn-caps stage), and the daemon,
as the image's uid 65532, raises it only when a configured port needs it.

- the built image's layer holds `security.capability` on /usr/local/bin/lastcall-turn:
  permitted CAP_NET_BIND_SERVICE, no effective bit (what `getcap` prints as
  `cap_net_bind_service=p`; read from `docker save`, since the image has no getcap);
- `--cap-drop ALL --cap-add NET_BIND_SERVICE`: TLS on 443 answers a handshake, the process
  is uid 65532 with CapEff = CapPrm = 0x400;
- the same with `--security-opt no-new-privileges`: Docker (unlike containerd's CRI, see
  tests/cri/test_turn_node_values.py) does not put an added capability in a non-root
  process's permitted set, so under no_new_privs the kernel withholds the file capability:
  exit 71, the error saying so and what to change;
- `--cap-drop ALL`: on 3478 it runs with no capability at all;
- `--cap-drop ALL` and 443: it exits 71 at once with the error naming the option, the port
  and what gives the capability, having bound nothing.

Each container has its own network namespace (`--network none`, loopback only) with
net.ipv4.ip_unprivileged_port_start set to the kernel's 1024 as Kubernetes leaves it
(Docker sets it to 0 in a container's namespace, where every port is unprivileged)."""

from __future__ import annotations

import json
import ssl
import struct
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Iterator

import pytest

import netns
from enginelib import TURN_IMAGE, Engine, measured, process_status

START = 60.0
BINARY = "usr/local/bin/lastcall-turn"
CAP_NET_BIND_SERVICE = 10
VFS_CAP_FLAGS_EFFECTIVE = 0x000001


def file_capability(engine: Engine, image: str, tmp: Path) -> bytes:
    """The security.capability attribute of the image's lastcall-turn, from the last layer
    of `docker save` that holds the file (tar's PAX header SCHILY.xattr.*)."""
    out = tmp / "image.tar"
    engine.save([image], out)
    found: bytes | None = None
    with tarfile.open(out) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        for layer in manifest[0]["Layers"]:
            member = outer.extractfile(layer)
            assert member is not None, layer
            with tarfile.open(fileobj=member) as inner:
                for entry in inner:
                    if entry.name.lstrip("./") == BINARY:
                        raw = entry.pax_headers.get("SCHILY.xattr.security.capability")
                        found = raw.encode("utf-8", "surrogateescape") if raw is not None else b""
    assert found is not None, f"no {BINARY} in {image}"
    return found


def decode_vfs_cap(raw: bytes) -> tuple[int, int, int, bool]:
    """struct vfs_cap_data (v2: 20 bytes, v3: 24 with the root uid): (revision, permitted,
    inheritable, effective bit)."""
    assert len(raw) in (20, 24), f"security.capability of {len(raw)} bytes: {raw!r}"
    magic, p0, i0, p1, i1 = struct.unpack_from("<5I", raw)
    return magic >> 24, p0 | p1 << 32, i0 | i1 << 32, bool(magic & VFS_CAP_FLAGS_EFFECTIVE)


def self_signed(dir: Path) -> None:
    dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "1", "-subj", "/CN=turn.test", "-keyout", str(dir / "key.pem"), "-out",
                    str(dir / "cert.pem")], check=True, capture_output=True)
    for f in dir.iterdir():
        f.chmod(0o644)  # read by uid 65532
    dir.chmod(0o755)


@pytest.fixture()
def containers(engine: Engine) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for n in names:
        engine.docker("rm", "-f", n, check=False)


def run_turn(engine: Engine, names: list[str], name: str, certs: Path, caps: list[str], args: list[str]) -> str:
    engine.docker("rm", "-f", name, check=False)
    engine.docker(
        "run", "-d", "--name", name, "--network", "none", "--read-only",
        "--sysctl", "net.ipv4.ip_unprivileged_port_start=1024",
        "-v", f"{certs}:/certs:ro", "--cap-drop", "ALL", *caps, TURN_IMAGE,
        "-n", "--listening-ip=127.0.0.1", "--realm=turn.test", "--use-auth-secret",
        "--static-auth-secret=s3cret", "--admin-addr=127.0.0.1:9641", "--shutdown-delay=0s", *args)
    names.append(name)
    return name


def wait_ready(engine: Engine, name: str) -> int:
    """The container's host pid once /readyz answers 200 in its namespace."""
    pid = int(engine.docker("inspect", "-f", "{{.State.Pid}}", name).stdout)
    assert pid > 0, engine.docker("logs", name, check=False).stderr[-3000:]
    ns = f"/proc/{pid}/ns/net"
    deadline = time.monotonic() + START
    while (netns.http_get(ns, "127.0.0.1", 9641, "/readyz") or (0,))[0] != 200:
        assert time.monotonic() < deadline, engine.docker("logs", name, check=False).stderr[-3000:]
        time.sleep(0.1)
    return pid


def tls_handshake(pid: int, port: int) -> str:
    """A TLS handshake with the daemon on 127.0.0.1:port inside the container's namespace;
    returns the negotiated version."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    sock = netns.connect(f"/proc/{pid}/ns/net", ("127.0.0.1", port))
    with ctx.wrap_socket(sock, server_hostname="turn.test") as tls:
        return str(tls.version())


def test_turn_image_binary_has_cap_net_bind_service_permitted_not_effective(engine: Engine, tmp_path: Path) -> None:
    raw = file_capability(engine, TURN_IMAGE, tmp_path)
    assert raw, f"{BINARY} in {TURN_IMAGE} has no security.capability: COPY lost it"
    revision, permitted, inheritable, effective = decode_vfs_cap(raw)
    assert permitted == 1 << CAP_NET_BIND_SERVICE, f"permitted {permitted:#x}"
    assert inheritable == 0 and not effective, (inheritable, effective)
    measured(f"{TURN_IMAGE} {BINARY}: security.capability v{revision} permitted {permitted:#x}, "
             f"inheritable {inheritable:#x}, effective bit {int(effective)} (cap_net_bind_service=p)")


def test_turn_image_binds_443_as_65532_with_only_net_bind_service(
        engine: Engine, tmp_path: Path, containers: list[str]) -> None:
    self_signed(tmp_path / "certs")
    name = run_turn(engine, containers, "lc-turn-443", tmp_path / "certs", ["--cap-add", "NET_BIND_SERVICE"],
                    ["--tls-listening-port=443", "--cert=/certs/cert.pem", "--pkey=/certs/key.pem"])
    pid = wait_ready(engine, name)
    st = process_status(pid)
    assert st["Uid"].split() == ["65532"] * 4, st["Uid"]
    assert st["CapEff"] == "0000000000000400" and st["CapPrm"] == "0000000000000400", (st["CapEff"], st["CapPrm"])
    assert st["CapAmb"] == "0000000000000000", st["CapAmb"]
    version = tls_handshake(pid, 443)
    logs = engine.docker("logs", name).stderr
    assert "CAP_NET_BIND_SERVICE raised from the permitted set for tls-listening-port 443" in logs, logs
    engine.docker("stop", "-t", "30", name, timeout=90)
    code = int(engine.docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout)
    assert code == 0, engine.docker("logs", name, check=False).stderr[-3000:]
    measured(f"turn image, --cap-drop ALL --cap-add NET_BIND_SERVICE, ip_unprivileged_port_start 1024: "
             f"uid 65532, CapEff {st['CapEff']} CapPrm {st['CapPrm']}, NoNewPrivs {st['NoNewPrivs']}, "
             f"{version} handshake on 443; docker stop -> exit {code}")


def wait_exited(engine: Engine, name: str) -> tuple[int, str]:
    deadline = time.monotonic() + START
    while engine.docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() == "true":
        assert time.monotonic() < deadline, f"{name} still running:\n" + engine.docker("logs", name).stderr[-3000:]
        time.sleep(0.1)
    code = int(engine.docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout)
    return code, engine.docker("logs", name).stderr


def test_turn_image_on_443_under_docker_no_new_privileges_says_why(
        engine: Engine, tmp_path: Path, containers: list[str]) -> None:
    self_signed(tmp_path / "certs")
    name = run_turn(engine, containers, "lc-turn-443-nnp", tmp_path / "certs",
                    ["--cap-add", "NET_BIND_SERVICE", "--security-opt", "no-new-privileges"],
                    ["--tls-listening-port=443", "--cert=/certs/cert.pem", "--pkey=/certs/key.pem"])
    code, logs = wait_exited(engine, name)
    assert code == 71, f"exit {code}:\n{logs}"
    for needle in ("tls-listening-port 443 is below", "no_new_privs is set",
                   "allowPrivilegeEscalation: true", "without no-new-privileges"):
        assert needle in logs, f"no `{needle}` in:\n{logs}"
    version = engine.docker("version", "-f", "{{.Server.Version}}").stdout.strip()
    measured(f"turn image on 443, --cap-add NET_BIND_SERVICE --security-opt no-new-privileges on dockerd {version}: "
             f"file capability withheld (the added capability is not in the non-root process's permitted set "
             f"before exec), exit {code} saying so")


def test_turn_image_on_3478_holds_no_capability(engine: Engine, tmp_path: Path, containers: list[str]) -> None:
    (tmp_path / "certs").mkdir()
    name = run_turn(engine, containers, "lc-turn-3478", tmp_path / "certs", ["--security-opt", "no-new-privileges"],
                    ["--listening-port=3478"])
    pid = wait_ready(engine, name)
    st = process_status(pid)
    for key in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert int(st[key], 16) == 0, f"{key} {st[key]}"
    assert st["Uid"].split() == ["65532"] * 4
    # Given the capability (no no-new-privileges: it reaches the permitted set) but not
    # needing it: dropped from every set.
    name2 = run_turn(engine, containers, "lc-turn-3478-given", tmp_path / "certs",
                     ["--cap-add", "NET_BIND_SERVICE"], ["--listening-port=3478"])
    st2 = process_status(wait_ready(engine, name2))
    assert (st2["CapEff"], st2["CapPrm"]) == ("0000000000000000", "0000000000000000"), st2
    assert "CAP_NET_BIND_SERVICE dropped: no port below net.ipv4.ip_unprivileged_port_start, 1024" in \
        engine.docker("logs", name2).stderr
    measured(f"turn image on 3478: --cap-drop ALL -> CapEff {st['CapEff']} CapPrm {st['CapPrm']}; "
             f"--cap-add NET_BIND_SERVICE -> dropped at start, CapEff {st2['CapEff']} CapPrm {st2['CapPrm']}")


def test_turn_image_on_443_without_the_capability_says_what_gives_it(
        engine: Engine, tmp_path: Path, containers: list[str]) -> None:
    self_signed(tmp_path / "certs")
    name = run_turn(engine, containers, "lc-turn-443-nocap", tmp_path / "certs", ["--security-opt", "no-new-privileges"],
                    ["--tls-listening-port=443", "--cert=/certs/cert.pem", "--pkey=/certs/key.pem"])
    code, logs = wait_exited(engine, name)
    assert code == 71, f"exit {code}:\n{logs}"
    for needle in ("tls-listening-port 443 is below net.ipv4.ip_unprivileged_port_start (1024)",
                   "(uid 65532) has no CAP_NET_BIND_SERVICE",
                   "nothing was bound (it is not in this process's bounding set", "turn.tlsListeningPort",
                   "--cap-add NET_BIND_SERVICE", "AmbientCapabilities=CAP_NET_BIND_SERVICE"):
        assert needle in logs, f"no `{needle}` in:\n{logs}"
    assert "lastcall-turn listening" not in logs
    measured(f"turn image on 443 with --cap-drop ALL: exit {code}: {logs.strip().splitlines()[-1][:160]}...")

"""Helpers for the image tests (no container engine needed): docker/Dockerfile parsing, the
built daemons, a daemon started as PID 1 of a new PID namespace, and two minimal protocol
clients written for these tests (an SPOP peer speaking HAPROXY-HELLO, a TURN client that
allocates with TURN REST API credentials)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import itertools
import json
import os
import random
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"

POLL = 0.02

# Lines for the end-of-run summary (conftest.py prints them).
MEASURED: list[str] = []


def measured(line: str) -> None:
    MEASURED.append(line)
    print(line)


# --- Dockerfile -------------------------------------------------------------------------


def stages(path: Path = DOCKERFILE) -> dict[str, list[tuple[str, str]]]:
    """{stage name: [(INSTRUCTION, arguments)]}, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") and not pending:
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    result: dict[str, list[tuple[str, str]]] = {}
    current: str | None = None
    for line in lines:
        if not line:
            continue
        instr, _, args = line.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            words = args.split()
            current = words[2] if len(words) >= 3 and words[1].upper() == "AS" else words[0]
            result[current] = [("FROM", words[0])]
        elif current is not None:
            result[current].append((instr, args.strip()))
    return result


def apt_installed(stage: list[tuple[str, str]]) -> list[str]:
    """Package names from every `apt-get install` in a stage's RUN instructions."""
    packages: list[str] = []
    for instr, args in stage:
        if instr != "RUN":
            continue
        for command in args.replace("&&", ";").replace("||", ";").split(";"):
            words = command.split()
            for i in range(len(words) - 1):
                if words[i] in ("apt-get", "apt") and "install" in words[i + 1 :]:
                    after = words[words.index("install", i) + 1 :]
                    packages += [w for w in after if not w.startswith("-")]
                    break
    return packages


def user(stage: list[tuple[str, str]]) -> tuple[int, int]:
    """The numeric `USER uid:gid` of a stage."""
    found = [a for i, a in stage if i == "USER"]
    assert len(found) == 1, f"USER appears {len(found)} times"
    uid, _, gid = found[0].partition(":")
    assert uid.isdigit() and gid.isdigit(), f"USER {found[0]}: numeric uid:gid expected (runAsNonRoot)"
    return int(uid), int(gid)


def cmd(stage: list[tuple[str, str]]) -> list[str]:
    """The exec-form CMD of a stage (the image's default arguments)."""
    found = [json.loads(a) for i, a in stage if i == "CMD"]
    assert len(found) == 1, f"CMD appears {len(found)} times"
    return found[0]


def entrypoint(stage: list[tuple[str, str]]) -> list[str]:
    found = [json.loads(a) for i, a in stage if i == "ENTRYPOINT"]
    assert len(found) == 1, f"ENTRYPOINT appears {len(found)} times"
    return found[0]


# --- binaries ---------------------------------------------------------------------------


def target_dir() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    return target if target.is_absolute() else REPO / target


def built(name: str, profiles: tuple[str, ...] = ("debug", "release")) -> list[Path]:
    """The daemon binaries built from this checkout, in the order of `profiles`."""
    return [target_dir() / p / name for p in profiles if (target_dir() / p / name).is_file()]


def binary_or_skip(name: str) -> Path:
    """The binary to run: debug first (what CI has just built), or the profile named by
    LASTCALL_TEST_PROFILE (e.g. `release`, the build the image ships)."""
    profile = os.environ.get("LASTCALL_TEST_PROFILE")
    found = built(name, (profile,)) if profile else built(name)
    if not found:
        pytest.skip(f"{name} is not built (cargo build -p {name})")
    return found[0]


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_udp_range(count: int) -> int:
    """The first of `count` consecutive UDP ports that were free a moment ago: tried below
    the ephemeral range first (10000-32767, where clients' sockets don't land; a busy
    machine can hold thousands of ephemeral UDP ports), then anywhere."""
    for attempt in range(400):
        base = random.randrange(10000, 32768 - count) if attempt < 200 else free_port(socket.SOCK_DGRAM)
        if base + count >= 65535:
            continue
        socks = []
        try:
            for p in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free UDP port range")


def http_get(port: int, path: str) -> tuple[int, str] | None:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
        conn.request("GET", path)
        resp = conn.getresponse()
        out = (resp.status, resp.read().decode(errors="replace"))
        conn.close()
        return out
    except OSError:
        return None


def metric(port: int, name: str) -> float | None:
    got = http_get(port, "/metrics")
    if got is None or got[0] != 200:
        return None
    for line in got[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


# --- PID 1 ------------------------------------------------------------------------------


class Pid1:
    """`argv` run as PID 1 of a new PID namespace: `unshare --pid --fork --mount-proc`.

    unshare forks; its child (the daemon, after exec) is PID 1 inside the namespace and has
    an ordinary PID outside (`host_pid`), which is where the signals are sent from, as a
    container runtime does. unshare waits for it and exits with its status (or re-raises
    the signal that killed it). `--kill-child` SIGKILLs the daemon if unshare goes away, so
    the daemon cannot outlive the test.

    With `user=(uid, gid)` the daemon runs as that user, like the image's `USER`: setpriv
    changes the ids (no supplementary groups, so no capabilities left) and execs, so the
    daemon is still PID 1. The log file is opened here, by root."""

    def __init__(self, argv: list[str], log: Path, user: tuple[int, int] | None = None):
        unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
        assert unshare and setpriv, "unshare and setpriv (util-linux) are not installed"
        if os.geteuid() != 0:
            pytest.fail("the PID 1 tests need root: unshare --pid and setpriv --reuid (run them as root, as CI does)")
        self.log = log
        self.argv = argv
        self.user = user
        prefix = [] if user is None else [setpriv, f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups"]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [unshare, "--pid", "--fork", "--mount-proc", "--kill-child", *prefix, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=log.parent,
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        self.host_pid = self._find_child()
        self.signalled_at: float | None = None

    def _find_child(self) -> int:
        deadline = time.monotonic() + 20
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        while time.monotonic() < deadline:
            try:
                pids = children.read_text().split()
            except OSError:
                pids = []
            if pids:
                return int(pids[0])
            if self.proc.poll() is not None:
                pytest.fail(f"unshare exited ({self.proc.returncode}):\n{self.output()}")
            time.sleep(POLL)
        pytest.fail(f"unshare did not fork within 20 s:\n{self.output()}")

    def status_line(self, key: str) -> list[int]:
        """A numeric line of the daemon's /proc/PID/status, e.g. `NSpid:` (host pid, pid in
        the namespace) or `Uid:` (real, effective, saved, filesystem)."""
        for line in Path(f"/proc/{self.host_pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return [int(p) for p in line.split()[1:]]
        raise AssertionError(f"no {key} line in /proc/PID/status")

    def caught(self) -> set[int]:
        """Signals the daemon has handlers for (`SigCgt:` of /proc/PID/status); empty once gone."""
        try:
            text = Path(f"/proc/{self.host_pid}/status").read_text()
        except OSError:
            return set()
        for line in text.splitlines():
            if line.startswith("SigCgt:"):
                mask = int(line.split()[1], 16)
                return {n for n in range(1, 65) if mask >> (n - 1) & 1}
        return set()

    def nspid(self) -> list[int]:
        return self.status_line("NSpid")

    def exe(self) -> str:
        return os.readlink(f"/proc/{self.host_pid}/exe")

    def assert_pid1(self, binary: Path) -> None:
        """The daemon itself (not a shell, not unshare) is PID 1 of its own namespace.

        unshare's forked child becomes the daemon when it calls exec, a moment after the fork
        that `_find_child` saw: wait for that exec (bounded), then check."""
        want = str(binary.resolve())
        deadline = time.monotonic() + 10.0
        while self.exe() != want and time.monotonic() < deadline and self.running():
            time.sleep(0.01)
        assert self.exe() == want, f"host pid {self.host_pid} runs {self.exe()}"
        ns = self.nspid()
        assert ns == [self.host_pid, 1], f"NSpid {ns}: not PID 1 of a child namespace"
        if self.user is not None:
            assert self.status_line("Uid") == [self.user[0]] * 4, f"Uid {self.status_line('Uid')}"
            assert self.status_line("Gid") == [self.user[1]] * 4, f"Gid {self.status_line('Gid')}"
            caps = [ln for ln in Path(f"/proc/{self.host_pid}/status").read_text().splitlines() if ln.startswith("CapEff:")]
            assert caps and int(caps[0].split()[1], 16) == 0, f"capabilities left: {caps}"

    def signal(self, sig: signal.Signals) -> float:
        os.kill(self.host_pid, sig)
        self.signalled_at = time.monotonic()
        return self.signalled_at

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        """The daemon's exit status, as unshare passes it on (util-linux 2.38 exits 1 when
        its child was killed by a signal)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {timeout} s later:\n{self.output()}")

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float) -> float:
        """Poll `check` until true; returns when (monotonic). Fails if the daemon exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return time.monotonic()
            if self.proc.poll() is not None:
                pytest.fail(f"exited ({self.proc.returncode}) before {what}:\n{self.output()}")
            time.sleep(POLL)
        pytest.fail(f"timed out after {timeout} s waiting for {what}:\n{self.output()}")

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def close(self) -> None:
        for pid in (self.host_pid, self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> "Pid1":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- SPOP (HAProxy's SPOE protocol, SPOE.txt section 3) ---------------------------------

HAPROXY_HELLO, HAPROXY_DISCONNECT, NOTIFY = 1, 2, 3
AGENT_HELLO, AGENT_DISCONNECT, ACK = 101, 102, 103
FIN = 1


def varint(v: int) -> bytes:
    if v < 240:
        return bytes([v])
    out = bytearray([(v | 240) & 0xFF])
    v = (v - 240) >> 4
    while v >= 128:
        out.append((v | 128) & 0xFF)
        v = (v - 128) >> 7
    out.append(v)
    return bytes(out)


def spop_string(s: str) -> bytes:
    data = s.encode()
    return varint(len(data)) + data


def spop_frame(kind: int, payload: bytes, stream: int = 0, frame: int = 0) -> bytes:
    body = bytes([kind]) + struct.pack(">I", FIN) + varint(stream) + varint(frame) + payload
    return struct.pack(">I", len(body)) + body


def haproxy_hello(max_frame_size: int = 16380) -> bytes:
    kv = spop_string("supported-versions") + bytes([8]) + spop_string("2.0")
    kv += spop_string("max-frame-size") + bytes([3]) + varint(max_frame_size)
    kv += spop_string("capabilities") + bytes([8]) + spop_string("")
    return spop_frame(HAPROXY_HELLO, kv)


def read_frame(sock: socket.socket) -> int | None:
    """The type of the next frame (None at EOF)."""

    def exact(n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    head = exact(4)
    if head is None:
        return None
    body = exact(struct.unpack(">I", head)[0])
    if not body:
        return None
    return body[0]


def spop_session(port: int) -> socket.socket:
    """A connection that has done the HELLO handshake (a session for the agent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(haproxy_hello())
    kind = read_frame(sock)
    assert kind == AGENT_HELLO, f"answer to HAPROXY-HELLO: frame type {kind}"
    return sock


# --- TURN (RFC 5766/8656 over UDP, long-term credentials, TURN REST API secret) ---------

MAGIC = 0x2112A442
ALLOCATE, REFRESH = 0x0003, 0x0004
A_USERNAME, A_MI, A_ERROR, A_LIFETIME, A_REALM, A_NONCE, A_TRANSPORT = (
    0x0006, 0x0008, 0x0009, 0x000D, 0x0014, 0x0015, 0x0019)
A_ALTERNATE = 0x8023


def _attr(kind: int, value: bytes) -> bytes:
    pad = (4 - len(value) % 4) % 4
    return struct.pack(">HH", kind, len(value)) + value + b"\0" * pad


def _parse(msg: bytes) -> tuple[int, bytes, dict[int, bytes]]:
    kind, length, magic = struct.unpack(">HHI", msg[:8])
    assert magic == MAGIC, "not a STUN message"
    txid = msg[8:20]
    attrs: dict[int, bytes] = {}
    i = 20
    while i + 4 <= 20 + length:
        t, n = struct.unpack(">HH", msg[i : i + 4])
        attrs.setdefault(t, msg[i + 4 : i + 4 + n])
        i += 4 + n + (4 - n % 4) % 4
    return kind, txid, attrs


class ServerGone(Exception):
    """The server's port answered with ICMP port unreachable: nothing listens any more."""


class TurnClient:
    """One UDP 5-tuple, so one allocation at most. The socket is connected, so an ICMP port
    unreachable (the server is gone) surfaces as ServerGone instead of a silent timeout.
    `host` and `ns` put the client in a test host's network namespace (tests/images/netns.py)."""

    def __init__(self, port: int, secret: str, host: str = "127.0.0.1", ns: str | None = None,
                 local: str | None = None):
        import netns

        self.server = (host, port)
        self.sock = netns.socket_in(ns, socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((local or ("127.0.0.1" if host.startswith("127.") else "0.0.0.0"), 0))
        self.sock.connect(self.server)
        self.sock.settimeout(1.0)
        self.username = f"{int(time.time()) + 3600}:pid1-test"
        self.password = base64.b64encode(
            hmac.new(secret.encode(), self.username.encode(), hashlib.sha1).digest()).decode()
        self.realm = b""
        self.nonce = b""

    def close(self) -> None:
        self.sock.close()

    def _request(self, method: int, attrs: bytes, auth: bool) -> tuple[int, dict[int, bytes]]:
        txid = secrets.token_bytes(12)
        if auth:
            attrs += _attr(A_USERNAME, self.username.encode())
            attrs += _attr(A_REALM, self.realm) + _attr(A_NONCE, self.nonce)
            key = hashlib.md5(f"{self.username}:".encode() + self.realm + f":{self.password}".encode()).digest()
            head = struct.pack(">HHI", method, len(attrs) + 24, MAGIC) + txid
            mac = hmac.new(key, head + attrs, hashlib.sha1).digest()
            attrs += _attr(A_MI, mac)
        msg = struct.pack(">HHI", method, len(attrs), MAGIC) + txid + attrs
        wait = 0.25
        for _ in range(12):  # UDP: retransmit with backoff (0.25 s doubling to 2 s), bounded
            try:
                self.sock.send(msg)
            except ConnectionRefusedError:
                raise ServerGone() from None
            deadline = time.monotonic() + wait
            wait = min(2 * wait, 2.0)
            while time.monotonic() < deadline:
                try:
                    self.sock.settimeout(max(0.01, deadline - time.monotonic()))
                    data = self.sock.recv(2048)
                except socket.timeout:
                    break
                except ConnectionRefusedError:
                    raise ServerGone() from None
                kind, got_txid, got = _parse(data)
                if got_txid == txid:
                    return kind, got
        raise AssertionError(f"no answer to STUN method {method:#x} from {self.server}")

    @staticmethod
    def error_code(attrs: dict[int, bytes]) -> int:
        raw = attrs.get(A_ERROR, b"\0\0\0\0")
        return (raw[2] & 7) * 100 + raw[3]

    def _authenticated(self, method: int, attrs: bytes) -> tuple[int, dict[int, bytes]]:
        """A request with credentials; learns (or refreshes) realm and nonce on 401/438."""
        for _ in range(3):
            if not self.nonce:
                kind, got = self._request(method, attrs, auth=False)
            else:
                kind, got = self._request(method, attrs, auth=True)
            if kind & 0x0110 == 0x0110 and self.error_code(got) in (401, 438) and A_NONCE in got:
                self.realm, self.nonce = got.get(A_REALM, self.realm), got[A_NONCE]
                continue
            return kind, got
        raise AssertionError("authentication did not converge")

    def allocate(self) -> tuple[bool, int]:
        """(success, error code or 0)."""
        kind, got = self._authenticated(ALLOCATE, _attr(A_TRANSPORT, bytes([17, 0, 0, 0])))
        self.last = got
        return kind == ALLOCATE | 0x0100, self.error_code(got) if kind == ALLOCATE | 0x0110 else 0

    def alternate(self) -> tuple[str, int] | None:
        """The ALTERNATE-SERVER (RFC 8489 14.15, a plain address) of the last answer."""
        raw = getattr(self, "last", {}).get(A_ALTERNATE)
        if raw is None or raw[1] != 1:
            return None
        return socket.inet_ntoa(raw[4:8]), struct.unpack(">H", raw[2:4])[0]

    def refresh(self, lifetime: int) -> tuple[bool, int]:
        kind, got = self._authenticated(REFRESH, _attr(A_LIFETIME, struct.pack(">I", lifetime)))
        return kind == REFRESH | 0x0100, self.error_code(got) if kind == REFRESH | 0x0110 else 0


# --- coturn's own clients: turnutils_uclient (a call) and turnutils_peer (its echo peer) --

UCLIENT = "/usr/bin/turnutils_uclient"
PEER = "/usr/bin/turnutils_peer"


class Call:
    """A bounded `turnutils_uclient` run (one call, or `-m` calls, of `-n` messages `-z` ms
    apart) in the background; `wait()` gives its report. With `ns`, it runs inside that
    network namespace. `secret` makes TURN REST API credentials for `user` (`-W`); with
    `password`, `user` and `password` are long-term credentials as given (`-w`: e.g. Wire's
    zrest ones). `extra` goes before the server's address (`-S` for TLS, `-i`/`-k` a client
    certificate)."""

    def __init__(self, server: str, port: int, peer: tuple[str, int], secret: str, user: str,
                 messages: int, gap_ms: int = 20, clients: int = 1, tcp: bool = True,
                 ns: str | None = None, log: Path | None = None, password: str | None = None,
                 extra: tuple[str, ...] = ()):
        import netns

        assert shutil.which(UCLIENT), "turnutils_uclient is not installed (coturn; scripts/setup.sh installs it)"
        self.messages = messages * clients
        auth = ["-w", password] if password is not None else ["-W", secret]
        argv = [*netns.exec_prefix(ns), UCLIENT, *(["-t"] if tcp else []), "-c", "-X",
                "-n", str(messages), "-m", str(clients), "-z", str(gap_ms), "-l", "100",
                "-p", str(port), "-e", peer[0], "-r", str(peer[1]), "-u", user, *auth, *extra, server]
        self.log = log
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True)
        self.output = ""
        self.ended_at: float | None = None  # when uclient exited (its call, and allocation, ended)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        self.output = self.proc.stdout.read()
        self.proc.wait()
        self.ended_at = time.monotonic()

    def wait(self, timeout: float = 180) -> "Call":
        self.reader.join(timeout)
        if self.reader.is_alive():
            self.proc.kill()
            self.reader.join(30)
        if self.log is not None:
            self.log.write_text(self.output)
        return self

    def totals(self) -> dict[str, int | None]:
        """uclient's summary: messages sent and received, packets lost."""

        def after(line: str, key: str) -> int | None:
            at = line.find(key)
            if at < 0:
                return None
            rest = line[at + len(key):].lstrip(" ~=")
            digits = "".join(itertools.takewhile(str.isdigit, rest))
            return int(digits) if digits else None

        out: dict[str, int | None] = {"sent": None, "received": None, "lost": None}
        for line in self.output.splitlines():
            if "msz=" in line:
                continue
            if "tot_send_msgs" in line:
                out["sent"], out["received"] = after(line, "tot_send_msgs"), after(line, "tot_recv_msgs")
            if "Total lost packets" in line:
                out["lost"] = after(line, "Total lost packets")
        return out

    def assert_all_echoed(self) -> dict[str, int | None]:
        t = self.totals()
        tail = "\n".join(self.output.splitlines()[-15:])
        assert self.proc.returncode == 0, f"turnutils_uclient exited {self.proc.returncode}:\n{tail}"
        assert t["sent"] == self.messages and t["received"] == self.messages and t["lost"] == 0, f"{t}:\n{tail}"
        return t


class Peer:
    """coturn's UDP echo peer on `host`, in `ns`; started and checked to echo."""

    def __init__(self, host: str = "127.0.0.1", ns: str | None = None):
        import netns

        assert shutil.which(PEER), "turnutils_peer is not installed (coturn; scripts/setup.sh installs it)"
        self.host = host
        self.port = netns.free_port_in(ns, host, socket.SOCK_DGRAM)
        self.proc = subprocess.Popen([*netns.exec_prefix(ns), PEER, "-L", host, "-p", str(self.port)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        probe = netns.socket_in(ns, socket.AF_INET, socket.SOCK_DGRAM)
        probe.settimeout(0.1)
        deadline = time.monotonic() + 20
        try:
            while True:
                probe.sendto(b"ping", (host, self.port))
                try:
                    if probe.recv(64) == b"ping":
                        return
                except socket.timeout:
                    pass
                assert time.monotonic() < deadline and self.proc.poll() is None, "turnutils_peer never echoed"
        finally:
            probe.close()

    @property
    def addr(self) -> tuple[str, int]:
        return self.host, self.port

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

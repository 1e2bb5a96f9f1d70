"""Network namespaces for the container tests: sockets opened inside a namespace from this
process, commands started inside one, and the test hosts' own namespaces (`ip netns`,
veth pairs, a bridge in a switch namespace).

A socket belongs to the network namespace of the thread that created it, for its whole
life; `setns(2)` switches only the calling thread. So `socket_in(ns, ...)` enters the
namespace, creates the socket and comes back at once: the rest of the test uses the
socket like any other. The namespaces are given by path: `/run/netns/NAME` for those made
with `ip netns add`, `/proc/PID/ns/net` for a container's."""

from __future__ import annotations

import ctypes
import http.client
import os
import socket
import subprocess
import threading
from contextlib import contextmanager
from typing import Iterator

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_lock = threading.Lock()


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def entered(ns: str) -> Iterator[None]:
    """The calling thread inside network namespace `ns` for the block's duration."""
    own = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    target = os.open(ns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def socket_in(ns: str | None, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A new socket in namespace `ns` (None: this process's own)."""
    if ns is None:
        return socket.socket(family, kind)
    with entered(ns):
        return socket.socket(family, kind)


def connect(ns: str | None, addr: tuple[str, int], timeout: float = 5.0) -> socket.socket:
    sock = socket_in(ns)
    sock.settimeout(timeout)
    try:
        sock.connect(addr)
    except OSError:
        sock.close()
        raise
    return sock


class HTTPConnection(http.client.HTTPConnection):
    """http.client over a socket opened in a network namespace."""

    def __init__(self, ns: str | None, host: str, port: int, timeout: float = 5.0):
        super().__init__(host, port, timeout=timeout)
        self.ns = ns

    def connect(self) -> None:
        self.sock = connect(self.ns, (self.host, self.port), self.timeout)  # type: ignore[arg-type]


def http_get(ns: str | None, host: str, port: int, path: str, timeout: float = 3.0) -> tuple[int, str] | None:
    """(status, body), or None when nothing answered."""
    try:
        conn = HTTPConnection(ns, host, port, timeout=timeout)
        conn.request("GET", path)
        resp = conn.getresponse()
        out = (resp.status, resp.read().decode(errors="replace"))
        conn.close()
        return out
    except (OSError, http.client.HTTPException):
        return None


def listener_in(ns: str | None, addr: tuple[str, int], kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A bound (and, for TCP, listening) socket in `ns`."""
    sock = socket_in(ns, socket.AF_INET, kind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    if kind == socket.SOCK_STREAM:
        sock.listen(512)
    return sock


def free_port_in(ns: str | None, host: str = "127.0.0.1", kind: int = socket.SOCK_STREAM) -> int:
    with socket_in(ns, socket.AF_INET, kind) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip() or out.stdout.strip()}")
    return out


def exec_prefix(ns: str | None) -> list[str]:
    """Argv prefix that starts a command inside `ns` (network namespace only)."""
    return [] if ns is None else ["nsenter", f"--net={ns}", "--"]


# --- test hosts -------------------------------------------------------------------------


class TestNetwork:
    """Hosts on one private layer-2 segment, each a network namespace with one veth into a
    bridge that lives in its own switch namespace, plus extra routes. Nothing of it is in
    the machine's own namespace: the machine's interfaces, routes and firewall stay as they
    are. Addresses come from 198.18.0.0/15 (RFC 2544, benchmarking: never routed)."""

    PREFIX = "lastcall-"

    def __init__(self, name: str):
        self.name = name
        self.switch = f"{self.PREFIX}{name}-sw"
        self.hosts: dict[str, str] = {}  # host -> its address on the segment
        self.cleanup()
        run("ip", "netns", "add", self.switch)
        self._sw(["ip", "link", "add", "br0", "type", "bridge"])
        self._sw(["ip", "link", "set", "br0", "up"])
        self._sw(["ip", "link", "set", "lo", "up"])

    def _sw(self, argv: list[str]) -> None:
        run("ip", "netns", "exec", self.switch, *argv)

    @staticmethod
    def path(ns: str) -> str:
        return f"/run/netns/{ns}"

    def ns(self, host: str) -> str:
        return f"{self.PREFIX}{self.name}-{host}"

    def netns_path(self, host: str) -> str:
        return self.path(self.ns(host))

    def add_host(self, host: str, address: str, forward: bool = False) -> str:
        """A host `host` with `address`/24 on the segment; returns its namespace path."""
        ns = self.ns(host)
        run("ip", "netns", "add", ns)
        # The veth is made inside the host namespace, its peer moved into the switch.
        peer = f"v-{host}"[:15]
        run("ip", "netns", "exec", ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", peer)
        run("ip", "netns", "exec", ns, "ip", "link", "set", peer, "netns", self.switch)
        self._sw(["ip", "link", "set", peer, "master", "br0"])
        self._sw(["ip", "link", "set", peer, "up"])
        for argv in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", f"{address}/24", "dev", "eth0"],
                     ["ip", "link", "set", "eth0", "up"]):
            run("ip", "netns", "exec", ns, *argv)
        if forward:
            run("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self.hosts[host] = address
        return self.path(ns)

    def route(self, host: str, cidr: str, via: str) -> None:
        run("ip", "netns", "exec", self.ns(host), "ip", "route", "add", cidr, "via", via)

    def cleanup(self) -> None:
        """Deletes this network's namespaces (also those a killed run left)."""
        listed = run("ip", "netns", "list", check=False).stdout.split("\n")
        prefix = f"{self.PREFIX}{self.name}-"
        for line in listed:
            ns = line.split(" ")[0]
            if ns.startswith(prefix):
                run("ip", "netns", "del", ns, check=False)
        self.hosts.clear()

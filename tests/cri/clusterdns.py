"""The cluster DNS the pods of the CRI tests ask (the kubelet gives them the edge host as their
nameserver, with the cluster's search path and ndots:5): a small UDP responder on the edge
host answering the Services' names as CoreDNS's kubernetes plugin does for the names a test
publishes (`<service>.<namespace>.svc.cluster.local`: A records of the ready endpoints, as for
a headless Service; no kube-proxy runs here, so a ClusterIP Service's name is answered with
its ready endpoints' addresses too), NXDOMAIN for any other name under cluster.local and
REFUSED for the rest (nothing leaves the test network). No AAAA records: the pods are IPv4.

A name's records are what the test sets (`publish`), e.g. from controllers.Endpoints'
view: a test that wants a name to follow readiness updates it there."""

from __future__ import annotations

import socket
import struct
import threading

import netns

DOMAIN = "cluster.local"
TTL = 5
A, AAAA = 1, 28
NOERROR, NXDOMAIN, REFUSED, FORMERR = 0, 3, 5, 1


def parse_question(packet: bytes) -> tuple[int, int, str, int, int]:
    """(id, flags, name, qtype, end of the question) of a query; ValueError when malformed."""
    if len(packet) < 12:
        raise ValueError("short header")
    ident, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if qdcount != 1:
        raise ValueError(f"{qdcount} questions")
    labels, pos = [], 12
    while True:
        if pos >= len(packet):
            raise ValueError("name runs past the packet")
        n = packet[pos]
        pos += 1
        if n == 0:
            break
        if n & 0xC0 or pos + n > len(packet):
            raise ValueError("compressed or truncated name in a question")
        labels.append(packet[pos:pos + n].decode("ascii", errors="replace").lower())
        pos += n
    if pos + 4 > len(packet):
        raise ValueError("no type and class")
    qtype, _qclass = struct.unpack("!HH", packet[pos:pos + 4])
    return ident, flags, ".".join(labels), qtype, pos + 4


def answer(packet: bytes, records: dict[str, list[str]]) -> bytes | None:
    """The response to one query (None: not even a header to answer)."""
    try:
        ident, flags, name, qtype, end = parse_question(packet)
    except ValueError:
        if len(packet) < 2:
            return None
        return packet[:2] + struct.pack("!HHHHH", 0x8000 | FORMERR, 0, 0, 0, 0)
    rd = flags & 0x0100
    addresses = records.get(name)
    if addresses is not None:
        rcode = NOERROR
    elif name == DOMAIN or name.endswith("." + DOMAIN):
        rcode = NXDOMAIN
    else:
        rcode = REFUSED
    rrs = [socket.inet_aton(a) for a in (addresses or [])] if qtype == A else []
    header = struct.pack("!HHHHHH", ident, 0x8000 | 0x0400 | rd | rcode, 1, len(rrs), 0, 0)
    body = packet[12:end]
    for rdata in rrs:  # the name: a pointer to the question's (offset 12)
        body += struct.pack("!HHHIH", 0xC00C, A, 1, TTL, len(rdata)) + rdata
    return header + body


class ClusterDNS:
    """The responder, on `address`:53/udp in namespace `ns` (the edge host's)."""

    def __init__(self, ns: str, address: str):
        self.records: dict[str, list[str]] = {}
        self.queries: list[str] = []
        self.lock = threading.Lock()
        self.sock = netns.listener_in(ns, (address, 53), socket.SOCK_DGRAM)
        self.sock.settimeout(0.2)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="cluster dns", daemon=True)
        self.thread.start()

    def publish(self, service: str, namespace: str, addresses: list[str]) -> str:
        """Sets the records of `service` in `namespace`; returns the name."""
        name = f"{service}.{namespace}.svc.{DOMAIN}"
        with self.lock:
            self.records[name] = list(addresses)
        return name

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                packet, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                reply = answer(packet, self.records)
                try:
                    self.queries.append(parse_question(packet)[2])
                except ValueError:
                    pass
            if reply is not None:
                self.sock.sendto(reply, peer)

    def close(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)
        self.sock.close()

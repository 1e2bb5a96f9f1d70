"""HTTP traffic for the container tests: an origin server and a bounded load of benign
requests and attacks through HAProxy, both possibly inside a test host's network
namespace. Each request is a new connection (so a request that finds no listener or a
closed connection counts as failed, never retried), and every answer is checked: a benign
request must get the origin's 200, an attack the WAF's 403."""

from __future__ import annotations

import http.client
import http.server
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import netns

BENIGN = "/products?id=42"
ATTACK = "/products?id=1%27%20OR%20%271%27=%271"  # SQL injection: CRS blocks it (rule 942100)


class _Origin(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        body = b"origin ok\n"
        self.server.served += 1  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Origin", "1")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client (HAProxy) that closed its connection early: not the origin's business


class Origin:
    """The application behind HAProxy: 200 `origin ok` to every GET, on `host` in `ns`."""

    def __init__(self, ns: str | None, host: str = "127.0.0.1", port: int = 0):
        self.server = _Server((host, port), _Origin, bind_and_activate=False)
        self.server.socket.close()
        self.server.socket = netns.listener_in(ns, (host, port))
        self.server.served = 0  # type: ignore[attr-defined]
        self.server.daemon_threads = True
        self.port = self.server.socket.getsockname()[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def served(self) -> int:
        return self.server.served  # type: ignore[attr-defined]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Counts:
    sent: int = 0
    passed: int = 0
    blocked: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)
    per_target: dict[str, int] = field(default_factory=dict)


class Load:
    """`workers` threads sending requests, one every `gap` seconds each, to `target()`
    (`(ns, host, port)`, asked anew for every request: a Service picks an endpoint per
    connection), every `attack_every`-th one an attack. Stops at `stop()` or after
    `limit` seconds."""

    def __init__(self, target: Callable[[], tuple[str | None, str, int]], workers: int = 4,
                 gap: float = 0.02, attack_every: int = 10, limit: float = 300):
        self.target = target
        self.counts = Counts()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.deadline = time.monotonic() + limit
        self.gap = gap
        self.attack_every = attack_every
        self.threads = [threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(workers)]
        for t in self.threads:
            t.start()

    def _one(self, n: int) -> None:
        attack = n % self.attack_every == 0
        ns, host, port = self.target()
        key = f"{host}:{port}"
        try:
            conn = netns.HTTPConnection(ns, host, port, timeout=10)
            conn.request("GET", ATTACK if attack else BENIGN, headers={"Connection": "close"})
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            ok = resp.status == 403 if attack else (resp.status == 200 and body == b"origin ok\n")
            outcome = f"{resp.status}"
        except (OSError, http.client.HTTPException) as e:
            ok, outcome = False, f"{type(e).__name__}: {e}"
        with self.lock:
            c = self.counts
            c.sent += 1
            c.per_target[key] = c.per_target.get(key, 0) + 1
            if ok and attack:
                c.blocked += 1
            elif ok:
                c.passed += 1
            else:
                c.failed += 1
                if len(c.failures) < 20:
                    c.failures.append(f"{time.strftime('%H:%M:%S')} {'attack' if attack else 'benign'} -> {key}: {outcome}")

    def _worker(self, i: int) -> None:
        n = i
        rng = random.Random(i)
        while not self.done.is_set() and time.monotonic() < self.deadline:
            self._one(n)
            n += len(self.threads)
            self.done.wait(self.gap * (0.5 + rng.random()))

    def sent(self) -> int:
        with self.lock:
            return self.counts.sent

    def wait_sent(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.sent() < n:
            assert time.monotonic() < deadline, f"only {self.sent()} requests sent in {timeout} s"
            time.sleep(0.05)

    def stop(self) -> Counts:
        self.done.set()
        for t in self.threads:
            t.join(timeout=30)
        return self.counts

    def summary(self) -> str:
        c = self.counts
        return (f"{c.sent} requests: {c.passed} passed, {c.blocked} attacks blocked, {c.failed} failed"
                + (f"; first failures: {c.failures[:5]}" if c.failures else ""))


# SPOE's `timeout processing` in the tests: the chart's 500 ms default is for production
# machines; on this busy 2-core one a CRS evaluation was seen to take more than 500 ms while
# pods were being created beside it (a 500 by fail-closed, which says nothing about drains).
PROCESSING = "5s"


def spoe_config(processing: str = PROCESSING) -> str:
    """The SPOE file the spoa chart renders for its sidecar HAProxy (engine `coraza`,
    `option var-prefix coraza`, `option set-on-error error`, backend `coraza-spoa`)."""
    from chartlib import render

    values = {"mode": "sidecar", "sidecar": {"haproxy": {"timeouts": {"processing": processing}}}}
    return render("lastcall-spoa", values).one("ConfigMap", "-haproxy")["data"]["spoe.cfg"]


def haproxy_config(bind: str, origin: str, agents: list[str], spoe_path: str, stats_socket: str | None = None,
                   template: int = 0) -> str:
    """HAProxy in front of standalone agents, as the chart's NOTES tell users to set it up:
    one server per agent with `option spop-check`, `check inter 1s fall 2 rise 1
    on-marked-down shutdown-sessions` (HAProxy 3.0 here), fail
    closed (500 when the agent gives no verdict), 403 for what the WAF denies. With
    `template`, `template` disabled servers (agent1..) that a discovery fills in through
    the runtime API at `stats_socket` (what HAProxy's DNS resolution does by itself)."""
    servers = "\n".join(f"  server agent{i + 1} {a} check inter 1s fall 2 rise 1 on-marked-down shutdown-sessions"
                        for i, a in enumerate(agents))
    servers = servers.strip("\n")
    for i in range(len(agents), len(agents) + template):
        servers += f"\n  server agent{i + 1} 127.0.0.1:9 check inter 1s fall 2 rise 1 disabled"
    stats = f"  stats socket {stats_socket} mode 600 level admin\n" if stats_socket else ""
    return f"""global
  log stdout format raw local0 info
{stats}
defaults
  mode http
  log global
  option httplog
  timeout connect 5s
  timeout client 30s
  timeout server 30s

frontend http
  bind {bind}
  option http-buffer-request
  unique-id-format %[uuid()]
  unique-id-header X-Unique-ID
  filter spoe engine coraza config {spoe_path}
  http-request deny deny_status 403 hdr waf-block request if {{ var(txn.coraza.action) -m str deny }}
  http-request deny deny_status 500 if {{ var(txn.coraza.error) -m int gt 0 }}
  default_backend app

backend app
  server origin {origin}

backend coraza-spoa
  mode tcp
  balance roundrobin
  option spop-check
  timeout connect 5s
  timeout server 3m
{servers}
"""

#!/usr/bin/env python3
"""What HAProxy hands an SPOE agent of a request body: a probe that prints a table.

For each HAProxy configuration (no buffering, as coraza-spoa's example file;
`option http-buffer-request`; `http-request wait-for-body`) and each way a client sends a
body (Content-Length, chunked, HTTP/2 over h2c, `Expect: 100-continue`, and the body sent a
moment after the headers, as browsers send uploads), it records:

- what the agent received (`body` bytes, the `body_size` argument, from lastcall-spoa's
  debug line `coraza-req received`);
- what HAProxy's fetches said at the `send-spoe-group` rule (`req.body_len`,
  `req.body_size`, captured with `set-var` on the same rule line's position);
- the client's status and how many body bytes the origin received.

Usage (the agent binary from `cargo build -p lastcall-spoa`; HAProxy's command from
LASTCALL_HAPROXY, as the tests take it):

    python3 bench/spoa/body_probe.py
    LASTCALL_HAPROXY="scripts/peer-run trixie /usr/sbin/haproxy" python3 bench/spoa/body_probe.py
    LASTCALL_HAPROXY="scripts/peer-run sid /usr/sbin/haproxy" python3 bench/spoa/body_probe.py

`python3 bench/spoa/body_probe.py memory` measures instead HAProxy's memory per connection
holding a body in its buffer, for each `tune.bufsize` in BUFSIZES (CONNS connections).

Everything listens on 127.0.0.1, ephemeral ports; every process is stopped at the end.
"""

import http.server
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from procfs import rss_kib  # noqa: E402  (bench/procfs.py: the scripts' one RSS reader)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AGENT = os.environ.get("LASTCALL_SPOA_BIN", os.path.join(ROOT, "target/debug/lastcall-spoa"))
HAPROXY = shlex.split(os.environ.get("LASTCALL_HAPROXY", "/usr/sbin/haproxy"))

RECEIVED = {}  # path -> body bytes the origin read


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Origin(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def handle(self):
        try:
            super().handle()
        except OSError:
            pass  # HAProxy closed a connection (a refused request): not the probe's business

    def do_POST(self):
        n = 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                n += len(self.rfile.read(size))
                self.rfile.readline()
        else:
            n = len(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        RECEIVED[self.path] = n
        text = f"origin ok {n}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    do_GET = do_POST


SPOE = """\
[coraza]
spoe-agent coraza-agent
    groups          coraza-req
    option          var-prefix      coraza
    option          set-on-error    error
    timeout         hello           2s
    timeout         idle            2m
    timeout         processing      5s
    use-backend     coraza-spoa
spoe-message coraza-req
    args app=str(default) src-ip=src src-port=src_port dst-ip=dst dst-port=dst_port method=method path=path query=query version=req.ver headers=req.hdrs body=req.body body_size=req.body_size
spoe-group coraza-req
    messages coraza-req
"""

CONFIGS = {
    "none": "",
    "http-buffer-request": "    option http-buffer-request\n",
    "wait-for-body 2s": "    http-request wait-for-body time 2s\n",
}


def haproxy_cfg(spoe_path, front, front_h2, origin, agent, extra, bufsize):
    glob = f"    tune.bufsize {bufsize}\n" if bufsize else ""
    return f"""\
global
    log stdout format raw local0 info
{glob}
defaults
    mode http
    log global
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend web
    bind 127.0.0.1:{front}
    bind 127.0.0.1:{front_h2} proto h2
{extra if 'buffer' in extra else ''}    log-format "probe path=%[var(txn.p_path)] len=%[var(txn.p_len)] size=%[var(txn.p_size)] status=%ST"
    filter spoe engine coraza config {spoe_path}
{extra if 'wait-for' in extra else ''}    http-request set-var(txn.p_path) path
    http-request set-var(txn.p_len) req.body_len
    http-request set-var(txn.p_size) req.body_size
    http-request send-spoe-group coraza coraza-req
    http-request deny deny_status 403 if {{ var(txn.coraza.action) -m str deny }}
    http-request deny deny_status 500 if {{ var(txn.coraza.error) -m int gt 0 }}
    default_backend origin

backend origin
    server origin 127.0.0.1:{origin}

backend coraza-spoa
    mode tcp
    server spoa1 127.0.0.1:{agent}
"""


def form(size):
    return ("a=" + "b" * (size - 2)).encode()


def curl(port, path, body, extra):
    d = tempfile.NamedTemporaryFile(delete=False)
    d.write(body)
    d.close()
    out = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{exitcode}", "--max-time", "20",
         "-H", "Content-Type: application/x-www-form-urlencoded",
         "--data-binary", "@" + d.name, *extra, f"http://127.0.0.1:{port}{path}"],
        capture_output=True, text=True)
    os.unlink(d.name)
    code, exit_code = out.stdout.split()
    return code if exit_code == "0" else f"{code} (curl exit {exit_code})"


def raw(port, path, body, chunked, delay):
    """Headers first, then the body `delay` seconds later (a browser's upload)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(20)
    te = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n{te}\r\nConnection: close\r\n\r\n".encode())
    time.sleep(delay)
    if chunked:
        s.sendall(b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
    else:
        s.sendall(body)
    data = b""
    while True:
        try:
            c = s.recv(65536)
        except OSError:
            break
        if not c:
            break
        data += c
    s.close()
    m = re.match(rb"HTTP/1\.[01] (\d+)", data)
    return m.group(1).decode() if m else "no response"


CLIENTS = [
    ("Content-Length", lambda p, p2, path, b: curl(p, path, b, [])),
    ("chunked", lambda p, p2, path, b: curl(p, path, b, ["-H", "Transfer-Encoding: chunked"])),
    ("Content-Length + Expect: 100-continue",
     lambda p, p2, path, b: curl(p, path, b, ["-H", "Expect: 100-continue"])),
    ("HTTP/2 (h2c), Content-Length", lambda p, p2, path, b: curl(p2, path, b, ["--http2-prior-knowledge"])),
    ("HTTP/2 (h2c), no length",
     lambda p, p2, path, b: curl(p2, path, b, ["--http2-prior-knowledge", "-H", "Transfer-Encoding: chunked"])),
    ("Content-Length, body 0.3 s after headers", lambda p, p2, path, b: raw(p, path, b, False, 0.3)),
    ("chunked, body 0.3 s after headers", lambda p, p2, path, b: raw(p, path, b, True, 0.3)),
]


def wait_for(path, pattern, timeout=10):
    end = time.time() + timeout
    while time.time() < end:
        with open(path, errors="replace") as f:
            for line in f:
                m = re.search(pattern, line)
                if m:
                    return m
        time.sleep(0.05)
    return None


def memory():
    """HAProxy's memory per connection holding a request body in its buffer: CONNS clients
    each send the headers of a 1 MiB upload and BODY_KB of its body, then hold; HAProxy's
    RSS before and while they hold, for each tune.bufsize."""
    conns = int(os.environ.get("CONNS", "100"))
    body_kb = int(os.environ.get("BODY_KB", "900"))
    tmp = tempfile.mkdtemp(prefix="body-mem-")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    version = subprocess.run(HAPROXY + ["-v"], capture_output=True, text=True).stdout.splitlines()[0]
    print(f"{version}; {conns} connections each holding {body_kb} KB of a 1 MiB body\n")
    print("| tune.bufsize | RSS idle | RSS holding | per connection |")
    print("|---|---|---|---|")
    for bufsize in os.environ.get("BUFSIZES", "16384,1114112").split(","):
        front, front_h2 = free_port(), free_port()
        spoe = os.path.join(tmp, "coraza.cfg")
        with open(spoe, "w") as f:
            f.write(SPOE)
        hcfg = os.path.join(tmp, f"haproxy-{bufsize}.cfg")
        with open(hcfg, "w") as f:
            f.write(haproxy_cfg(spoe, front, front_h2, srv.server_address[1], free_port(),
                                CONFIGS["http-buffer-request"], bufsize))
        hlog = open(os.path.join(tmp, f"haproxy-{bufsize}.log"), "w")
        hap = subprocess.Popen(HAPROXY + ["-db", "-f", hcfg], stdout=hlog, stderr=subprocess.STDOUT)
        socks = []
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", front), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.1)
            time.sleep(0.5)
            idle = rss_kib(hap.pid)
            chunk = b"a" * (body_kb * 1024)
            for i in range(conns):
                s = socket.create_connection(("127.0.0.1", front))
                s.sendall(f"POST /m{i} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1048576\r\n\r\n".encode())
                s.sendall(chunk[: min(len(chunk), int(bufsize) - 2048)])
                socks.append(s)
            # HAProxy reads what the buffer takes: wait until its RSS stops growing.
            last, same = 0, 0
            while same < 10:
                time.sleep(0.2)
                now = rss_kib(hap.pid)
                same = same + 1 if now == last else 0
                last = now
            print(f"| {bufsize} | {idle / 1024:.1f} MiB | {last / 1024:.1f} MiB | "
                  f"{(last - idle) / conns:.0f} KiB |", flush=True)
        finally:
            for s in socks:
                s.close()
            hap.terminate()
            hap.wait()
    srv.shutdown()


def main():
    if sys.argv[1:] == ["memory"]:
        return memory()
    sizes = [int(s) for s in os.environ.get("PROBE_SIZES", "1200,102400").split(",")]
    bufsize = os.environ.get("PROBE_BUFSIZE", "")
    tmp = tempfile.mkdtemp(prefix="body-probe-")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    origin = srv.server_address[1]
    agent_port = free_port()
    cfg = os.path.join(tmp, "agent.yaml")
    with open(cfg, "w") as f:
        f.write("max_frame_size: 4194304\ndefault_application: default\napplications:\n  - name: default\n"
                "    body_limit_action: process_partial\n")
    alog = open(os.path.join(tmp, "agent.log"), "w")
    agent = subprocess.Popen([AGENT, "--bind", f"127.0.0.1:{agent_port}", "--admin-addr",
                              f"127.0.0.1:{free_port()}", "--config", cfg, "--log-level", "debug"],
                             stdout=alog, stderr=subprocess.STDOUT)
    wait_for(alog.name, "listening on")
    version = subprocess.run(HAPROXY + ["-v"], capture_output=True, text=True).stdout.splitlines()[0]
    print(f"{version}; tune.bufsize {bufsize or 'default (16384)'}\n")
    print("| configuration | client | body | agent got | `body_size` arg | `req.body_len` | `req.body_size` | status | origin got |")
    print("|---|---|---|---|---|---|---|---|---|")
    n = 0
    try:
        for name, extra in CONFIGS.items():
            front, front_h2 = free_port(), free_port()
            spoe = os.path.join(tmp, "coraza.cfg")
            with open(spoe, "w") as f:
                f.write(SPOE)
            hcfg = os.path.join(tmp, f"haproxy-{n}.cfg")
            with open(hcfg, "w") as f:
                f.write(haproxy_cfg(spoe, front, front_h2, origin, agent_port, extra, bufsize))
            hlog = open(os.path.join(tmp, f"haproxy-{n}.log"), "w")
            hap = subprocess.Popen(HAPROXY + ["-db", "-f", hcfg], stdout=hlog, stderr=subprocess.STDOUT)
            try:
                for _ in range(100):
                    try:
                        socket.create_connection(("127.0.0.1", front), timeout=1).close()
                        break
                    except OSError:
                        time.sleep(0.1)
                for size in sizes:
                    for cname, client in CLIENTS:
                        n += 1
                        path = f"/p{n}"
                        status = client(front, front_h2, path, form(size))
                        a = wait_for(alog.name, rf"uri={path}\b.*body=(\d+) body_size=(\S+)", 5)
                        h = wait_for(hlog.name, rf"probe path={path} len=(\S*) size=(\S*) status", 5)
                        got = a.group(1) if a else "(no message)"
                        bsz = a.group(2).replace("Some(", "").replace(")", "") if a else ""
                        print(f"| {name} | {cname} | {size} | {got} | {bsz} | "
                              f"{h.group(1) if h else '?'} | {h.group(2) if h else '?'} | {status} | "
                              f"{RECEIVED.get(path, 'nothing')} |", flush=True)
            finally:
                hap.terminate()
                hap.wait()
    finally:
        agent.terminate()
        agent.wait()
        srv.shutdown()


if __name__ == "__main__":
    sys.exit(main())

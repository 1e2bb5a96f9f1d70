#!/usr/bin/env python3
"""lastcall-spoa's memory under a long, stated mix: does RSS level off? (docs/benchmarks.md,
*Soak*; issue 33).

The stack: an origin (nginx, `return 200` with a small HTML page), HAProxy with the
documented files (crates/spoa/examples/haproxy/, the per-request log line removed) and one
agent (release build, `workers: 2`, the built-in CRS at paranoia level 1 with
`response_check: true`, started with `-autoreload`). The load (wrk, one thread on CPU 1,
bench/spoa/soak.lua): per 100 requests 79 benign, 20 attacks, 1 form of 100 KB (every other
one ending in an SQL injection), every response checked by the agent, paced by
SOAK_DELAY_MS per connection. Every SOAK_RELOAD_SECONDS the configuration file changes (a
comment), so `-autoreload` compiles every rule again and swaps them. Before the load, the
idle agent is reloaded SOAK_PREWARM_RELOADS times with SIGHUP: a reload's memory levels off
only after ~150 reloads (one rule set's worth, `--reloads 200`), so that the hour measures
what traffic and its own reloads add from there, not that climb.

Every 10 s: the agent's RSS, descriptors and threads, the load average. At the end the
script takes the median RSS of each SOAK_WINDOW_SECONDS after the first SOAK_SKIP_SECONDS,
fits a line (least squares) to those medians and checks its slope against
SOAK_BOUND_MB_PER_H; the exit status says whether it held (0), or not (1),
or whether the run itself went wrong (2: 5xx answers, socket errors, the agent gone). It
prints the slope's 95 % interval beside it: whether the run can tell a slope of that size
from the windows' spread at all (a band of a few MiB over an hour reads as ±1-3 MB/h).

Usage: python3 bench/spoa/soak.py            (3,900 s: 10 minutes of warm-up, then an hour)
       python3 bench/spoa/soak.py --report OUT (the summary of a finished run again)
       python3 bench/spoa/soak.py --reloads N  (an idle agent's RSS after each of N SIGHUPs)
       python3 bench/spoa/soak.py --cpu N      (the agent's CPU per request under the mix, N s)
Environment: SOAK_SECONDS (3900), SOAK_SKIP_SECONDS (600), SOAK_BOUND_MB_PER_H (1.0),
SOAK_CONNECTIONS (16), SOAK_DELAY_MS (40), SOAK_RELOAD_SECONDS (300; 0: no reloads),
SOAK_PREWARM_RELOADS (200; 0: none; N: N SIGHUP reloads of the idle agent before the load, so
that the hour starts from the plateau `--reloads 200` shows), SOAK_RELOAD_BOUND_KIB (20: the
plateau `--reloads N` checks, KiB per reload over the last quarter of them; exit 0 when it held,
1 when not, 2 below 40 reloads), SOAK_SAMPLE_SECONDS (10), SOAK_HEAP_SECONDS (0: off; N: every N s, glibc's bytes in use
in the agent, asked through gdb with malloc_stats(): for an agent built with
SPOA_ALLOCATOR=glibc, i.e. --no-default-features), OUT (default target/bench-spoa/soak-<UTC time>),
LASTCALL_SPOA_BIN (default target/release/lastcall-spoa), SOAK_WRAP (a command the agent
runs under, e.g. "heaptrack -o OUT/agent": the agent is then that command's child),
and the peers as the tests take them: LASTCALL_HAPROXY, LASTCALL_SPOA_RUNNER (e.g.
"scripts/peer-run trixie" for libmodsecurity 3.0.14).
"""

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from procfs import children, fds, rss_kib, threads  # noqa: E402
from results import write_json  # noqa: E402

ENV = os.environ
SECONDS = int(ENV.get("SOAK_SECONDS", "3900"))
SKIP = int(ENV.get("SOAK_SKIP_SECONDS", "600"))
BOUND = float(ENV.get("SOAK_BOUND_MB_PER_H", "1.0"))
CONNS = int(ENV.get("SOAK_CONNECTIONS", "16"))
DELAY_MS = int(ENV.get("SOAK_DELAY_MS", "40"))
RELOAD = int(ENV.get("SOAK_RELOAD_SECONDS", "300"))
PREWARM = int(ENV.get("SOAK_PREWARM_RELOADS", "200"))
RELOAD_BOUND_KIB = float(ENV.get("SOAK_RELOAD_BOUND_KIB", "20"))
SAMPLE = int(ENV.get("SOAK_SAMPLE_SECONDS", "10"))
HEAP_EVERY = int(ENV.get("SOAK_HEAP_SECONDS", "0"))
WINDOW = int(ENV.get("SOAK_WINDOW_SECONDS", "300"))
AGENT = ENV.get("LASTCALL_SPOA_BIN", os.path.join(ROOT, "target/release/lastcall-spoa"))
HAPROXY = shlex.split(ENV.get("LASTCALL_HAPROXY", "haproxy"))
RUNNER = shlex.split(ENV.get("LASTCALL_SPOA_RUNNER", ""))
WRAP = shlex.split(ENV.get("SOAK_WRAP", ""))
OUT = ENV.get("OUT") or os.path.join(
    ROOT, "target/bench-spoa", "soak-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))


def log(msg):
    print(f"[soak {time.strftime('%H:%M:%S', time.gmtime())}] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def get(url, host="shop.example.com"):
    req = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except OSError:
        return None, b""


def wait_status(url, want=200, within=60):
    end = time.time() + within
    while time.time() < end:
        if get(url)[0] == want:
            return
        time.sleep(0.2)
    raise SystemExit(f"soak: {url} did not answer {want} within {within} s")


def agent_config(bind, generation):
    # The built-in application (no `directives`: CRS at paranoia level 1 with the engine
    # settings), checking responses. The comment is what a reload changes.
    return f"""# soak configuration, generation {generation}
bind: {bind}
workers: 2
default_application: default
applications:
  - name: default
    response_check: true
    transaction_ttl_ms: 60000
"""


def medians(points, window):
    """(start of window, median) for each full `window` seconds of (t, value) points."""
    out = []
    start = points[0][0] if points else 0
    while True:
        win = sorted(v for t, v in points if start <= t < start + window)
        # Full windows only (the last sample may fall a sampling interval short of the end).
        if not win or start + window > points[-1][0] + SAMPLE:
            break
        out.append((start + window / 2, win[len(win) // 2]))
        start += window
    return out


def fit(points):
    """Least-squares slope (y per x) and intercept."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    sxy = sum((p[0] - mx) * (p[1] - my) for p in points)
    slope = sxy / sxx if sxx else 0.0
    return slope, my - slope * mx


def t975(df):
    """Student's t at 97.5 % for `df` degrees of freedom: the table's values up to 5, then
    Cornish-Fisher's expansion (within 0.1 % of the table from 6 up; 2.262 at 9)."""
    if df <= 5:
        return (12.706, 4.303, 3.182, 2.776, 2.571)[max(df, 1) - 1]
    z = 1.959964
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def slope_interval(points):
    """The least-squares slope and the half-width of its 95 % interval (residuals' spread
    around the line, n - 2 degrees of freedom). Window medians next to each other are not
    independent, so the interval is a lower bound on the uncertainty, not a proof."""
    n = len(points)
    slope, intercept = fit(points)
    if n < 3:
        return slope, float("inf")
    mx = sum(p[0] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    rss = sum((y - (intercept + slope * x)) ** 2 for x, y in points)
    return slope, t975(n - 2) * (rss / (n - 2) / sxx) ** 0.5 if sxx else float("inf")


class Stack:
    def __init__(self, work):
        self.work = work
        self.procs = []
        self.origin_port, self.front_port = free_port(), free_port()
        self.agent_port, self.admin_port = free_port(), free_port()
        # The configuration in a directory of its own: -autoreload watches the directory and
        # waits for 200 ms without events, which a log file written beside it never gives.
        os.makedirs(os.path.join(work, "config"))
        self.config = os.path.join(work, "config", "agent.yaml")

    def start(self):
        w = self.work
        with open(os.path.join(w, "origin.conf"), "w") as f:
            f.write(f"""daemon off;
master_process off;
worker_processes 1;
pid {w}/origin.pid;
error_log {w}/origin-error.log;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {w}/o_body;
    proxy_temp_path {w}/o_proxy;
    fastcgi_temp_path {w}/o_fcgi;
    uwsgi_temp_path {w}/o_uwsgi;
    scgi_temp_path {w}/o_scgi;
    keepalive_requests 1000000;
    client_max_body_size 2m;
    server {{
        listen 127.0.0.1:{self.origin_port};
        location / {{
            default_type text/html;
            return 200 "<html><head><title>shop</title></head><body><p>Thank you.</p></body></html>\\n";
        }}
    }}
}}
""")
        self.spawn("origin", ["nginx", "-p", w, "-c", f"{w}/origin.conf", "-e", f"{w}/origin-error.log"])
        wait_status(f"http://127.0.0.1:{self.origin_port}/")

        with open(self.config, "w") as f:
            f.write(agent_config(f"127.0.0.1:{self.agent_port}", 0))
        self.agent_wrapper = self.spawn(
            "agent",
            WRAP + RUNNER + [AGENT, "-c", self.config, "-autoreload",
                             "--admin-addr", f"127.0.0.1:{self.admin_port}"],
            filtered=True)
        self.agent_pid = self.find_agent()
        wait_status(f"http://127.0.0.1:{self.admin_port}/readyz", within=120)

        hap = os.path.join(w, "haproxy.cfg")
        with open(os.path.join(ROOT, "crates/spoa/examples/haproxy/haproxy.cfg")) as src, open(hap, "w") as dst:
            for line in src:
                if line.strip().startswith("log stdout"):
                    continue
                dst.write(line)
                if line.strip() == "global":
                    dst.write("    nbthread 2\n")
        env = dict(os.environ,
                   FRONTEND_ADDR=f"127.0.0.1:{self.front_port}",
                   ORIGIN_ADDR=f"127.0.0.1:{self.origin_port}",
                   SPOA1_ADDR=f"127.0.0.1:{self.agent_port}",
                   SPOA2_ADDR=f"127.0.0.1:{self.agent_port}",
                   CORAZA_SPOE_CFG=os.path.join(ROOT, "crates/spoa/examples/haproxy/coraza.cfg"),
                   STATS_SOCKET=os.path.join(w, "haproxy.sock"))
        self.haproxy = self.spawn("haproxy", HAPROXY + ["-db", "-f", hap], env=env)
        wait_status(f"http://127.0.0.1:{self.front_port}/")
        status, _ = get(f"http://127.0.0.1:{self.front_port}/?id=1'%20OR%20'1'='1")
        if status != 403:
            raise SystemExit(f"soak: an SQL injection through the stack got {status}, not 403")

    def spawn(self, name, argv, env=None, filtered=False):
        out = open(os.path.join(self.work, f"{name}.log"), "w")
        p = subprocess.Popen(argv, stdout=subprocess.PIPE if filtered else out,
                             stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=ROOT)
        if filtered:
            # The agent logs every matched rule (about 3 lines a request here): keep the
            # rest, count those.
            def copy():
                total = False
                for line in p.stdout:
                    if b"rule matched" in line or b"request denied" in line:
                        self.matched_lines += 1
                        continue
                    out.write(line.decode(errors="replace"))
                    out.flush()
                    # malloc_stats() (SOAK_HEAP_SECONDS): the last "in use bytes" after
                    # "Total (incl. mmap):" is every arena's, mmapped chunks included.
                    if line.startswith(b"Total (incl. mmap):"):
                        total = True
                    elif total and line.startswith(b"in use bytes"):
                        self.heap_in_use = int(line.split(b"=")[1])
                        total = False
            self.matched_lines = 0
            self.heap_in_use = None
            threading.Thread(target=copy, daemon=True).start()
        self.procs.append(p)
        return p

    def find_agent(self):
        """The agent's own PID (under SOAK_WRAP or the runner it is a descendant)."""
        target = os.path.realpath(AGENT)
        end = time.time() + 60
        while time.time() < end:
            todo = [self.agent_wrapper.pid]
            while todo:
                pid = todo.pop()
                try:
                    exe = os.readlink(f"/proc/{pid}/exe")
                except OSError:
                    exe = ""
                # Through a chroot the link names the path inside it, which is the same
                # path here (peer-run binds the checkout at its own path).
                if exe == target or exe.endswith(target):
                    return pid
                todo.extend(children(pid))
            time.sleep(0.1)
        raise SystemExit("soak: the agent process did not appear")

    def heap_stats(self):
        """glibc's bytes in use in the agent (all arenas and mmapped chunks), asked with
        gdb: malloc_stats() prints them on the agent's standard error. None if unknown (a
        mimalloc build answers with glibc's own, unused, arenas: do not ask it)."""
        self.heap_in_use = None
        # Only libc's symbols (not the agent's debug information): the process stays
        # stopped while gdb reads them.
        subprocess.run(["gdb", "-batch", "-nx", "-ex", "set auto-solib-add off",
                        "-ex", f"set sysroot /proc/{self.agent_pid}/root",
                        "-ex", f"attach {self.agent_pid}", "-ex", "sharedlibrary libc.so",
                        "-ex", "call (void)malloc_stats()", "-ex", "detach", "/bin/true"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        end = time.time() + 10
        while self.heap_in_use is None and time.time() < end:
            time.sleep(0.05)
        return self.heap_in_use

    def sighup_reloads(self, n):
        """Reloads the agent `n` times with SIGHUP, each after the one before was logged,
        and returns its RSS (KiB) half a second after each."""
        log_path = os.path.join(self.work, "agent.log")
        with open(log_path, errors="replace") as f:
            before = f.read().count("rules reloaded")
        readings = []
        for i in range(1, n + 1):
            os.kill(self.agent_pid, signal.SIGHUP)
            end = time.time() + 120
            while time.time() < end:
                with open(log_path, errors="replace") as f:
                    if f.read().count("rules reloaded") >= before + i:
                        break
                time.sleep(0.05)
            else:
                raise SystemExit(f"soak: reload {i} of {n} was not logged within 120 s")
            time.sleep(0.5)
            readings.append(rss_kib(self.agent_pid))
        return readings

    def reload(self, generation):
        tmp = self.config + ".new"
        with open(tmp, "w") as f:
            f.write(agent_config(f"127.0.0.1:{self.agent_port}", generation))
        os.rename(tmp, self.config)

    def metrics(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError:
            return ""

    def stop(self):
        # HAProxy first, so that the agent's drain has nobody to wait for; then the agent
        # itself (under SOAK_WRAP the wrapper waits for it: heaptrack writes its data when
        # the agent exits).
        if getattr(self, "haproxy", None) is not None and self.haproxy.poll() is None:
            self.haproxy.send_signal(signal.SIGTERM)
            self.haproxy.wait(timeout=60)
        if getattr(self, "agent_pid", None):
            try:
                os.kill(self.agent_pid, signal.SIGTERM)
            except OSError:
                pass
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()


def main():
    os.makedirs(OUT, exist_ok=True)
    work = tempfile.mkdtemp(prefix="soak-spoa.")
    stack = Stack(work)
    samples = []
    wrk = None
    try:
        stack.start()
        version = subprocess.run(RUNNER + [AGENT, "--version"], capture_output=True, text=True).stdout.strip()
        info = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "agent": version, "agent_bin": shown_path(AGENT), "runner": " ".join(RUNNER) or "host libraries",
            "wrap": " ".join(WRAP), "haproxy": subprocess.run(HAPROXY + ["-v"], capture_output=True, text=True).stdout.splitlines()[0],
            "git": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
            "seconds": SECONDS, "skip_seconds": SKIP, "bound_mb_per_h": BOUND, "connections": CONNS,
            "delay_ms": DELAY_MS, "reload_seconds": RELOAD, "loadavg_start": open("/proc/loadavg").read().strip(),
        }
        log(f"{version}; {CONNS} connections, {DELAY_MS} ms pace, {SECONDS} s, reload every {RELOAD or 'never'} s; out {OUT}")
        if PREWARM:
            # A reload's memory levels off only after ~150 of them (`--reloads 200`): before
            # the load, so that the slope measured after SKIP is what traffic and the run's own
            # reloads add once the allocator's layout has settled.
            info["prewarm_rss_kib"] = [rss_kib(stack.agent_pid)] + stack.sighup_reloads(PREWARM)
            log(f"{PREWARM} reloads before the load: RSS {info['prewarm_rss_kib'][0]} -> {info['prewarm_rss_kib'][-1]} KiB")
        env = dict(os.environ, SOAK_DELAY_MS=str(DELAY_MS))
        wrk_out = open(os.path.join(OUT, "wrk.out"), "w")
        wrk = subprocess.Popen(
            ["taskset", "-c", "1", "wrk", "-t1", f"-c{CONNS}", f"-d{SECONDS}s", "--timeout", "10s",
             "-s", os.path.join(HERE, "soak.lua"), f"http://127.0.0.1:{stack.front_port}/"],
            stdout=wrk_out, stderr=subprocess.STDOUT, env=env)
        t0 = time.time()
        generation = 0
        k = 0
        with open(os.path.join(OUT, "samples.csv"), "w") as csv:
            csv.write("t_s,rss_kib,fds,threads,load1,heap_in_use_kib\n")
            while True:
                t = time.time() - t0
                pid = stack.agent_pid
                heap = ""
                if HEAP_EVERY and k % max(1, HEAP_EVERY // SAMPLE) == 0:
                    h = stack.heap_stats()
                    heap = "" if h is None else h // 1024
                row = (round(t), rss_kib(pid), fds(pid), threads(pid), load1(), heap)
                samples.append(row)
                csv.write(",".join(map(str, row)) + "\n")
                csv.flush()
                if row[1] == 0:
                    raise SystemExit("soak: the agent is gone")
                if wrk.poll() is not None:
                    break
                k += 1
                if RELOAD and t >= (generation + 1) * RELOAD:
                    generation += 1
                    stack.reload(generation)
                while wrk.poll() is None and time.time() < t0 + k * SAMPLE:
                    time.sleep(0.2)
        with open(os.path.join(OUT, "agent-metrics.txt"), "w") as f:
            f.write(stack.metrics())
        info["loadavg_end"] = open("/proc/loadavg").read().strip()
        info["reloads_asked"] = generation
        info["agent_match_log_lines"] = stack.matched_lines
    finally:
        if wrk and wrk.poll() is None:
            wrk.terminate()
        stack.stop()
        for name in ("agent", "haproxy"):
            src = os.path.join(work, f"{name}.log")
            if os.path.exists(src):  # the run's own directory named as <work>, not as this machine's
                with open(src, errors="replace") as f_in, open(os.path.join(OUT, f"{name}.log"), "w") as f_out:
                    f_out.write(f_in.read().replace(work, "<work>"))
        shutil.rmtree(work, ignore_errors=True)
    return report(info, samples)


def shown_path(path):
    """A binary as a result file names it: relative to the repository, else its file name."""
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else os.path.basename(path)


def report(info, samples):
    result = {}
    with open(os.path.join(OUT, "wrk.out")) as f:
        for line in f:
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
    with open(os.path.join(OUT, "agent.log"), errors="replace") as f:
        agent_log = f.read()
    reloads = agent_log.count("reloading (-autoreload)")
    late = [(t, kib) for t, kib, *_ in samples if t >= SKIP]
    heap = [(t, h) for t, _, _, _, _, h in samples if h != ""]
    # The slope checked is that of the medians of WINDOW-second windows after SKIP: RSS
    # read at one instant swings by 10-20 MB with what is in flight (a 100 KB form holds
    # ~700 KB while it is evaluated) and when the allocator hands pages back, which a
    # least-squares line through single samples takes for a trend over minutes.
    windows = medians(late, WINDOW)
    problems = []
    if len(windows) < 3:
        problems.append(f"only {len(windows)} windows of {WINDOW} s after {SKIP} s")
        slope_kib_s, half_kib_s = 0.0, float("inf")
    else:
        slope_kib_s, half_kib_s = slope_interval(windows)
    raw_kib_s = fit(late)[0] if len(late) >= 3 else 0.0
    late = late or samples
    mb_per_h = slope_kib_s * 3600 * 1024 / 1e6
    half_mb_per_h = half_kib_s * 3600 * 1024 / 1e6
    raw_mb_per_h = raw_kib_s * 3600 * 1024 / 1e6
    duration = result.get("duration_us", 1) / 1e6
    rate = result.get("requests", 0) / duration if duration else 0
    per_request = slope_kib_s * 1024 / rate if rate else 0.0
    status = result.get("status", {})
    errors = sum(result.get(k, 0) for k in ("err_connect", "err_read", "err_write", "err_timeout"))
    fives = sum(v for k, v in status.items() if k.startswith("5"))
    if fives:
        problems.append(f"{fives} answers 5xx")
    if errors:
        problems.append(f"{errors} socket errors")
    # The last change may land as the load stops; every earlier one must have been taken.
    if reloads < info["reloads_asked"] - 1:
        problems.append(f"{info['reloads_asked']} reloads asked, the agent logged {reloads}")
    rss = [s[1] for s in samples]
    summary = dict(info, **{
        "requests": result.get("requests"), "rate": round(rate, 1), "status": status,
        "socket_errors": errors, "p50_ms": result.get("p50_us", 0) / 1e3, "p99_ms": result.get("p99_us", 0) / 1e3,
        "reloads_done": reloads, "samples": len(samples),
        "rss_kib_first": rss[0], "rss_kib_at_skip": late[0][1], "rss_kib_last": rss[-1],
        "rss_kib_min_after_skip": min(k for _, k in late), "rss_kib_max_after_skip": max(k for _, k in late),
        "fds_min_max": [min(s[2] for s in samples), max(s[2] for s in samples)],
        "threads_min_max": [min(s[3] for s in samples), max(s[3] for s in samples)],
        "load1_min_median_max": [min(s[4] for s in samples), sorted(s[4] for s in samples)[len(samples) // 2], max(s[4] for s in samples)],
        "window_seconds": WINDOW, "window_medians_kib": [[round(t), k] for t, k in windows],
        "slope_mb_per_h": round(mb_per_h, 3), "slope_bytes_per_request": round(per_request, 2),
        "slope_ci95_mb_per_h": [round(mb_per_h - half_mb_per_h, 2), round(mb_per_h + half_mb_per_h, 2)],
        "raw_least_squares_mb_per_h": round(raw_mb_per_h, 3),
        "heap_in_use_kib": heap,
        "held": (mb_per_h <= BOUND) and not problems, "problems": problems,
    })
    write_json(os.path.join(OUT, "summary.json"), summary)
    print(f"soak: {summary['requests']} requests in {duration:.0f} s ({rate:.0f}/s), statuses {status}, "
          f"socket errors {errors}, p50 {summary['p50_ms']:.1f} ms, p99 {summary['p99_ms']:.1f} ms; "
          f"{reloads} reloads")
    print(f"soak: RSS {rss[0]} KiB at start, {late[0][1]} KiB at {late[0][0]} s, {rss[-1]} KiB at the end; "
          f"after {SKIP} s {summary['rss_kib_min_after_skip']}-{summary['rss_kib_max_after_skip']} KiB; "
          f"descriptors {summary['fds_min_max']}, threads {summary['threads_min_max']}, "
          f"load1 min/median/max {summary['load1_min_median_max']}")
    verdict = "held" if mb_per_h <= BOUND else "EXCEEDED"
    print(f"soak: medians of {WINDOW} s windows after {SKIP} s: "
          + ", ".join(f"{k / 1024:.1f}" for _, k in windows) + " MiB")
    print(f"soak: slope of those medians: {mb_per_h:+.3f} MB/h ({per_request:+.2f} bytes per request), "
          f"95 % interval {mb_per_h - half_mb_per_h:+.2f} to {mb_per_h + half_mb_per_h:+.2f} MB/h, "
          f"bound {BOUND} MB/h: {verdict} (least squares through every sample after {SKIP} s: {raw_mb_per_h:+.3f} MB/h)")
    if heap:
        late_heap = [x for x in heap if x[0] >= SKIP]
        hs = fit(late_heap)[0] * 3600 * 1024 / 1e6 if len(late_heap) >= 3 else float("nan")
        print(f"soak: glibc heap in use (malloc_stats): {heap[0][1]} KiB at {heap[0][0]} s, "
              f"{heap[-1][1]} KiB at {heap[-1][0]} s, min {min(h for _, h in heap)}, max {max(h for _, h in heap)} KiB; "
              f"slope after {SKIP} s {hs:+.3f} MB/h")
        summary["heap_slope_mb_per_h"] = hs
        write_json(os.path.join(OUT, "summary.json"), summary)
    for p in problems:
        print(f"soak: PROBLEM {p}")
    print(f"soak: results in {OUT}")
    if problems:
        return 2
    return 0 if mb_per_h <= BOUND else 1


def reloads_idle(n):
    """`soak.py --reloads N`: an idle agent (no HAProxy, no traffic) reloaded N times with
    SIGHUP, its RSS after each reload (what a reload leaves behind, without the noise of
    traffic)."""
    work = tempfile.mkdtemp(prefix="soak-reloads.")
    stack = Stack(work)
    with open(stack.config, "w") as f:
        f.write(agent_config(f"127.0.0.1:{stack.agent_port}", 0))
    stack.agent_wrapper = stack.spawn(
        "agent", WRAP + RUNNER + [AGENT, "-c", stack.config, "--admin-addr", f"127.0.0.1:{stack.admin_port}"],
        filtered=True)
    stack.haproxy = None
    try:
        stack.agent_pid = stack.find_agent()
        wait_status(f"http://127.0.0.1:{stack.admin_port}/readyz", within=120)
        readings = [rss_kib(stack.agent_pid)] + stack.sighup_reloads(n)
        version = subprocess.run(RUNNER + [AGENT, "--version"], capture_output=True, text=True).stdout.strip()
        print(f"reloads: {version} ({' '.join(RUNNER) or 'host libraries'}; {AGENT}): RSS in MiB at start "
              f"and after each of {n} SIGHUP reloads: " + " ".join(f"{k / 1024:.1f}" for k in readings))
    finally:
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)
    return plateau_verdict(readings)


def plateau_verdict(readings):
    """Whether an idle agent's RSS after each reload levelled off: the slope of a line through
    the last quarter of the readings (KiB per reload) against RELOAD_BOUND_KIB; 0 when it
    held, 1 when not, 2 when there are too few reloads to tell (fewer than 40)."""
    n = len(readings) - 1
    if n < 40:
        print(f"reloads: {n} reloads are too few to tell a plateau (40 at least; 200 to reach it)")
        return 2
    tail = list(enumerate(readings))[-(n // 4):]
    slope = fit(tail)[0]
    held = slope <= RELOAD_BOUND_KIB
    print(f"reloads: RSS {readings[0] / 1024:.1f} MiB at start, {max(readings) / 1024:.1f} MiB at most, "
          f"{readings[-1] / 1024:.1f} MiB at the end; over the last {len(tail)} reloads {slope:+.1f} KiB per reload, "
          f"bound {RELOAD_BOUND_KIB:g} KiB: {'held' if held else 'EXCEEDED'}")
    return 0 if held else 1


def cpu_ticks(pid):
    """utime + stime of `pid` in clock ticks (0 once the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except OSError:
        return 0


def cpu_cost(seconds):
    """`soak.py --cpu N`: the agent's CPU time per request under the soak's mix (no reloads),
    for N seconds after 5 s of warm-up, with its RSS at the end: to weigh an allocator
    setting (e.g. MIMALLOC_ALLOW_THP=0 in the environment, which the agent inherits) against
    what it costs on the request path. Run it under `quiet`, alternating the settings."""
    work = tempfile.mkdtemp(prefix="soak-cpu.")
    stack = Stack(work)
    try:
        stack.start()
        env = dict(os.environ, SOAK_DELAY_MS=str(DELAY_MS))
        hz = os.sysconf("SC_CLK_TCK")
        url = f"http://127.0.0.1:{stack.front_port}/"

        def wrk(secs):
            out = subprocess.run(
                ["taskset", "-c", "1", "wrk", "-t1", f"-c{CONNS}", f"-d{secs}s", "--timeout", "10s",
                 "-s", os.path.join(HERE, "soak.lua"), url],
                capture_output=True, text=True, env=env).stdout
            for line in out.splitlines():
                if line.startswith("RESULT "):
                    return json.loads(line[len("RESULT "):])
            raise SystemExit(f"soak: no RESULT from wrk: {out}")

        wrk(5)
        l0, c0 = load1(), cpu_ticks(stack.agent_pid)
        r = wrk(seconds)
        c1, l1 = cpu_ticks(stack.agent_pid), load1()
        n = r["requests"]
        fives = sum(v for k, v in r["status"].items() if k.startswith("5"))
        settings = " ".join(f"{k}={v}" for k, v in sorted(ENV.items()) if k.startswith("MIMALLOC_")) or "defaults"
        print(f"cpu: {AGENT} ({' '.join(RUNNER) or 'host libraries'}; allocator settings {settings}): "
              f"{n} requests in {seconds} s ({n / seconds:.0f}/s, {CONNS} connections, {DELAY_MS} ms pace), "
              f"statuses {r['status']}; agent CPU {(c1 - c0) * 1000 / hz / max(n, 1):.3f} ms per request; "
              f"RSS {rss_kib(stack.agent_pid) / 1024:.1f} MiB; load1 {l0} -> {l1}")
        return 2 if fives or n == 0 else 0
    finally:
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)


def report_again(out):
    """`soak.py --report OUT`: the summary of a finished run again, from its files."""
    global OUT
    OUT = out
    with open(os.path.join(out, "summary.json")) as f:
        info = json.load(f)
    samples = []
    with open(os.path.join(out, "samples.csv")) as f:
        next(f)
        for line in f:
            v = line.strip().split(",")
            v += [""] * (6 - len(v))
            samples.append((int(v[0]), int(v[1]), int(v[2]), int(v[3]), float(v[4]),
                            int(v[5]) if v[5] else ""))
    return report(info, samples)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--report":
        sys.exit(report_again(sys.argv[2]))
    if len(sys.argv) == 3 and sys.argv[1] == "--cpu":
        sys.exit(cpu_cost(int(sys.argv[2])))
    if len(sys.argv) == 3 and sys.argv[1] == "--reloads":
        sys.exit(reloads_idle(int(sys.argv[2])))
    sys.exit(main())

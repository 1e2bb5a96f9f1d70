#!/usr/bin/env python3
"""lastcall-turn vs coturn: alternating rounds, figures per server and as a ratio, a plot.

Run through bench/turn/run.sh (it builds the binaries, raises the file descriptor limit and
finds matplotlib). Every server listens on 127.0.0.1 on free ports and is killed afterwards.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from results import write_json  # noqa: E402  (bench/results.py: the scripts' one result writer)

SECRET = "SECRET"
PEER_RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "peer-run")
REALM = "example.org"
MIN_PORT, MAX_PORT = 10000, 31999  # relay ports: below the ephemeral range (32768-60999)
SERVERS = ["coturn", "lastcall-turn"]
# --realtime: run server and generator SCHED_FIFO instead of nice -15.
REALTIME = False
# The echo reads every this many µs instead of blocking (0: blocks; --echo-poll-us).
ECHO_POLL_US = 0
# Extra lastcall-turn builds to compare (name -> binary), from --extra NAME=PATH.
BINARIES = {}
# Variants: a server run with extra flags (name -> (coturn or lastcall-turn, flags)), from
# --variant 'NAME=BASE FLAG...', e.g. --variant 'lastcall-turn+max-bps=lastcall-turn --max-bps=125000000'.
VARIANTS = {}

FULL = dict(rounds=5, fixed_rate=10000, duration=4.0, ladder=[10000, 20000, 40000, 80000, 120000, 160000],
            search_steps=3, ladder_duration=2.0, clients=4, size=160, allocs=[1000, 10000], concurrency=16)
SMOKE = dict(rounds=1, fixed_rate=500, duration=1.0, ladder=[500, 1000], search_steps=0,
             ladder_duration=1.0, clients=2, size=160, allocs=[100, 300], concurrency=8)


def free_port():
    """A port free for both UDP and TCP on 127.0.0.1, outside the relay range."""
    while True:
        t = socket.socket()
        t.bind(("127.0.0.1", 0))
        p = t.getsockname()[1]
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.bind(("127.0.0.1", p))
            if not MIN_PORT <= p <= MAX_PORT:
                return p
        except OSError:
            pass
        finally:
            t.close()
            u.close()


def wait_stun(port, timeout=30.0):
    """Waits until a STUN Binding request on UDP `port` is answered."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(0.2)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            s.sendto(struct.pack("!HHI", 1, 0, 0x2112A442) + os.urandom(12), ("127.0.0.1", port))
            try:
                s.recvfrom(2048)
                return
            except OSError:
                pass
    finally:
        s.close()
    raise RuntimeError(f"no STUN answer on 127.0.0.1:{port} within {timeout} s")


def pin(cpu):
    """taskset onto `cpu` (with 2+ CPUs) and, as root, nice -15: other engineers compile on
    this machine, and a server or generator that is descheduled for 100 ms overflows its
    socket buffers (that is loss, but not the server's)."""
    if os.geteuid() != 0:
        prio = []
    elif REALTIME:
        # SCHED_FIFO: a waking server or generator preempts the other load at once (the
        # kernel's RT throttling still leaves 5 % of each CPU to everything else).
        prio = ["chrt", "-f", "10"]
    else:
        prio = ["nice", "-n", "-15"]
    if os.cpu_count() and os.cpu_count() >= 2:
        return prio + ["taskset", "-c", str(cpu)]
    return prio


class Server:
    def __init__(self, name, bin_dir, logdir):
        self.name = name
        self.admin = None
        base, flags = VARIANTS.get(name, (name, []))
        self.port = free_port()
        common = ["--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1", "--no-tls", "--no-dtls",
                  f"--realm={REALM}", "--use-auth-secret", f"--static-auth-secret={SECRET}",
                  "--allow-loopback-peers", f"--listening-port={self.port}",
                  f"--min-port={MIN_PORT}", f"--max-port={MAX_PORT}",
                  "--total-quota=0", "--user-quota=0"]
        if base == "coturn":
            cmd = ["turnserver", "-n", "--no-cli"] + common + ["--log-file=stdout", "--simple-log"] + flags
        elif base == "coturn-4.18":
            # Debian unstable's coturn from the peer chroot (scripts/peers.sh ensure sid), same
            # PID; 4.18 has no --no-dtls (DTLS is off unless --dtls) and deprecates --no-cli.
            cmd = [PEER_RUN, "sid", "/usr/bin/turnserver", "-n"] + [c for c in common if c != "--no-dtls"] + [
                "--log-file=stdout", "--simple-log"] + flags
        else:
            binary = BINARIES.get(base, os.path.join(bin_dir, "lastcall-turn"))
            self.admin = f"127.0.0.1:{free_port()}"
            cmd = [binary, "-n", "--no-cli"] + common + [
                f"--admin-addr={self.admin}", "--log-level=warn"] + flags
        self.cmd = pin(0) + cmd
        self.log = open(os.path.join(logdir, f"{name}-{self.port}.log"), "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        try:
            wait_stun(self.port)
        except Exception:
            self.stop()
            raise
        # nice and taskset exec the server: the PID is the server's.
        self.pid = self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def turnload(bin_dir, server, args, timeout, cpu=None):
    """Runs lastcall-turnload pinned to CPU 1 (through `server` when given, measuring its CPU
    as `server`, and the processes of `cpu`, {name: pid}); its JSON lines."""
    cmd = pin(1) + [os.path.join(bin_dir, "lastcall-turnload"), "--secret", SECRET,
                    "--clk-tck", str(os.sysconf("SC_CLK_TCK"))]
    if server is not None:
        cmd += ["--server", f"127.0.0.1:{server.port}", "--cpu-pid", str(server.pid)]
    for name, pid in (cpu or {}).items():
        cmd += ["--cpu", f"{name}={pid}"]
    cmd += args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-2000:]}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


class Echo:
    """Our echo peer (`lastcall-turnload echo`), a process of its own on CPU 0 beside the
    server, so that its CPU is measured apart."""

    def __init__(self, bin_dir):
        self.proc = subprocess.Popen(pin(0) + [os.path.join(bin_dir, "lastcall-turnload"), "echo",
                                               "--bind", "127.0.0.1:0", "--poll-us", str(ECHO_POLL_US)],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "echo":
            self.stop()
            raise RuntimeError(f"the echo said {line!r}")
        self.addr = line[1]
        self.pid = self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Reflector:
    """The kernel echo: `lastcall-turnload reflect` keeps a tc program attached to lo that
    sends datagrams to its port straight back (root, the `kernel` feature)."""

    def __init__(self, bin_dir):
        self.port = free_port()
        self.proc = subprocess.Popen([os.path.join(bin_dir, "lastcall-turnload"), "reflect", "--port",
                                      str(self.port)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        if line != ["reflect", str(self.port)]:
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            self.stop()
            raise RuntimeError(f"the reflector said {line!r} {err[-500:]}")
        self.addr = f"127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def scrape(admin):
    """The Prometheus text of lastcall-turn's admin listener."""
    import urllib.request
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as r:
        return r.read().decode()


def metric(text, series):
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def one_round(name, cfg, bin_dir, logdir):
    """Every measurement for one server, each on a freshly started server."""
    r = {"server": name, "load_before": loadavg()}
    with Echo(bin_dir) as echo:
        r["baseline"] = [o for o in turnload(bin_dir, None, [
            "direct", "--peer", echo.addr, "--clients", str(cfg["clients"]), "--size", str(cfg["size"]),
            "--duration", str(cfg["duration"]), "--rates", str(cfg["fixed_rate"])],
            timeout=120, cpu={"echo": echo.pid}) if o["kind"] == "direct"][0]
    with Server(name, bin_dir, logdir) as s, Echo(bin_dir) as echo:
        out = turnload(bin_dir, s, ["relay", "--peer", echo.addr, "--clients", str(cfg["clients"]),
                                    "--size", str(cfg["size"]), "--duration", str(cfg["duration"]),
                                    "--rates", str(cfg["fixed_rate"])], timeout=120, cpu={"echo": echo.pid})
        r["fixed"] = [o for o in out if o["kind"] == "relay"][0]
    with Server(name, bin_dir, logdir) as s, Echo(bin_dir) as echo:
        out = turnload(bin_dir, s, ["relay", "--peer", echo.addr, "--clients", str(cfg["clients"]),
                                    "--size", str(cfg["size"]), "--duration", str(cfg["ladder_duration"]),
                                    "--rates", ",".join(map(str, cfg["ladder"])),
                                    "--search-steps", str(cfg["search_steps"])], timeout=600,
                       cpu={"echo": echo.pid})
        r["ladder"] = [o for o in out if o["kind"] in ("relay", "search")]
        r["max_rate"] = [o for o in out if o["kind"] == "summary"][0]
    r["allocs"] = {}
    for n in cfg["allocs"]:
        with Server(name, bin_dir, logdir) as s:
            time.sleep(0.5)  # let the server settle before the RSS baseline
            out = turnload(bin_dir, s, ["hold", "--count", str(n), "--concurrency", str(cfg["concurrency"]),
                                        "--hold", "0.5", "--rss-pid", str(s.pid)], timeout=600)
            r["allocs"][str(n)] = [o for o in out if o["kind"] == "allocs"][0]
    r["load_after"] = loadavg()
    return r


def server_us(phase):
    """The server's CPU µs per relayed datagram of one phase (= CPU s per million); runs saved
    before the field's rename (udp-workers-rt2.json) call it cpu_s_per_m_relayed."""
    return phase.get("server_us_per_datagram", phase.get("cpu_s_per_m_relayed"))


def figures(r, cfg):
    """The headline figures of one round."""
    f = r["fixed"]
    a = r["allocs"]
    big = str(cfg["allocs"][-1])
    # A server that was descheduled by other load handles several queued datagrams per
    # wake-up and looks cheaper: its CPU figure only counts when it kept up (median round
    # trip under STARVED_US at the fixed rate, nothing lost).
    kept_up = f["p50_us"] is not None and f["p50_us"] < cfg.get("starved_us", STARVED_US) and f["lost"] == 0
    base = r["baseline"]
    added = lambda q: None if f[q] is None or base[q] is None else f[q] - base[q]
    out = {
        # µs of the server's CPU per datagram it forwarded = CPU s per million.
        "cpu_s_per_M_relayed": server_us(f) if kept_up else None,
        "fixed_rate_loss_pct": f["loss_pct"],
        "max_rate_lt_0.1pct_loss": r["max_rate"]["max_rate_under_threshold"],
        "allocs_per_s": a[big]["allocs_per_s"],
        "added_p50_us": added("p50_us"),
        "added_p99_us": added("p99_us"),
        "rtt_p50_us": f["p50_us"],
        "rtt_p99_us": f["p99_us"],
        "direct_echo_p99_us": base["p99_us"],
    }
    for n in cfg["allocs"]:
        out[f"rss_bytes_per_alloc_at_{n}"] = a[str(n)]["rss_per_alloc_bytes"]
    return out


STARVED_US = 1000

LOWER_IS_BETTER = ("cpu_s_per_M_relayed", "rss_bytes_per_alloc", "added_p", "rtt_p", "direct_echo", "fixed_rate_loss_pct")


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def kept_rounds(rounds):
    """Every round but the first (a warm-up), unless there is only one."""
    later = [r for r in rounds if r["round"] > 1]
    return later or rounds


def summarize(rounds, cfg):
    kept = kept_rounds(rounds)
    keys = list(figures(kept[0], cfg).keys())
    table = {}
    for k in keys:
        row = {}
        for name in SERVERS:
            vals = [figures(r, cfg)[k] for r in kept if r["server"] == name]
            row[name] = median(vals)
            row[name + "_all"] = vals
        a, b = row["lastcall-turn"], row["coturn"]
        row["ratio"] = (a / b) if (a is not None and b not in (None, 0)) else None
        table[k] = row
    return table


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float) and abs(v) < 100:
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return f"{v:,.0f}"


def print_table(table, file=sys.stdout):
    extra = SERVERS[2:]
    print(f"{'figure':32} {'coturn':>12} {'lastcall-turn':>14} {'ratio':>7}" + "".join(f" {n:>16}" for n in extra),
          file=file)
    for k, row in table.items():
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        print(f"{k:32} {fmt(row['coturn']):>12} {fmt(row['lastcall-turn']):>14} {ratio:>7}"
              + "".join(f" {fmt(row[n]):>16}" for n in extra), file=file)


def cpu_by_rate(rounds, cfg):
    """Median server CPU s per million relayed datagrams at each ladder rate, over the kept
    rounds' phases with < 0.1 % loss in which the server kept up (p50 under starved_us):
    {rate: {server: (median, phases)}}."""
    out = {}
    for rate in cfg["ladder"]:
        row = {}
        for name in SERVERS:
            xs = [server_us(p) for r in kept_rounds(rounds) if r["server"] == name
                  for p in r["ladder"] if int(p["rate"]) == rate and p["loss_pct"] < 0.1
                  and server_us(p) is not None
                  and (p["p50_us"] or 0) < cfg.get("starved_us", STARVED_US)]
            row[name] = (statistics.median(xs), len(xs)) if xs else (None, 0)
        out[rate] = row
    return out


def cpu_rate_lines(rounds, cfg, md=False):
    rows = cpu_by_rate(rounds, cfg)
    lines = []
    if md:
        lines += ["| offered rate | " + " | ".join(SERVERS) + " | ratio |", "| ---: |" + " ---: |" * (len(SERVERS) + 1)]
    for rate, row in rows.items():
        a, b = row["lastcall-turn"][0], row["coturn"][0]
        ratio = f"{a / b:.2f}" if a is not None and b else "-"
        cells = [f"{fmt(row[n][0])} ({row[n][1]})" for n in SERVERS]
        lines.append(f"| {rate:,}/s | " + " | ".join(cells) + f" | {ratio} |" if md else
                     f"  {rate:>7,}/s " + " ".join(f"{c:>16}" for c in cells) + f" {ratio:>6}")
    return lines


def markdown(table, res):
    """The table as Markdown (docs/benchmarks.md)."""
    extra = SERVERS[2:]
    lines = ["| figure | coturn | lastcall-turn | ratio |" + "".join(f" {n} |" for n in extra),
             "| --- | ---: | ---: | ---: |" + " ---: |" * len(extra)]
    for k, row in table.items():
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        lines.append(f"| `{k}` | {fmt(row['coturn'])} | {fmt(row['lastcall-turn'])} | {ratio} |"
                     + "".join(f" {fmt(row[n])} |" for n in extra))
    lines += ["", "Server CPU s per million relayed datagrams by offered rate (median over the ladder phases "
              "with < 0.1 % loss and round-trip p50 < 1 ms; number of phases in parentheses):", ""]
    lines += cpu_rate_lines(res["rounds"], res["config"], md=True)
    loads = [x for r in res["rounds"] for x in (r["load_before"], r["load_after"])]
    lines.append("")
    lines.append(f"Medians of rounds 2-{res['config']['rounds']}; load average during the run "
                 f"{min(loads):.1f} to {max(loads):.1f}.")
    return "\n".join(lines)


def plot(rounds, table, cfg, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib missing (Debian's python3-matplotlib), no plot", file=sys.stderr)
        return False
    kept = kept_rounds(rounds)
    colors = {"coturn": "tab:orange", "lastcall-turn": "tab:blue"}
    for i, n in enumerate(SERVERS[2:]):
        colors[n] = ["tab:gray", "tab:green", "tab:purple"][i % 3]
    fig, ax = plt.subplots(2, 3, figsize=(15, 8))
    for name in SERVERS:
        pts = [(p["offered"], p["loss_pct"], p["p50_us"], p["p99_us"]) for r in kept if r["server"] == name
               for p in r["ladder"]]
        pts.sort()
        if pts:
            ax[0][0].plot([p[0] for p in pts], [max(p[1], 1e-4) for p in pts], "o", color=colors[name],
                          label=name, alpha=0.7)
        cpts = sorted((p["offered"], p["server_us_per_datagram"]) for r in kept if r["server"] == name
                      for p in r["ladder"] if p.get("server_us_per_datagram") is not None and p["loss_pct"] < 0.1)
        if cpts:
            ax[0][1].plot([p[0] for p in cpts], [p[1] for p in cpts], "o", color=colors[name], label=name, alpha=0.7)
    ax[0][0].axhline(0.1, color="gray", ls="--", lw=1)
    ax[0][0].set(xlabel="offered rate (datagrams/s client→peer)", ylabel="loss % (log; 0 shown as 1e-4)",
                 yscale="log", title="loss vs offered rate")
    ax[0][1].set(xlabel="offered rate (datagrams/s client→peer)", ylabel="server CPU s per million relayed",
                 title="server CPU per relayed datagram vs rate (phases < 0.1 % loss)", ylim=(0, None))
    for a in ax[0][:2]:
        a.legend()

    def bars(a, keys, title, ylabel):
        xs = range(len(keys))
        w = 0.8 / len(SERVERS)
        for i, name in enumerate(SERVERS):
            vals = [table[k][name] or 0 for k in keys]
            a.bar([x + (i - (len(SERVERS) - 1) / 2) * w for x in xs], vals, w, color=colors[name], label=name)
        a.set_xticks(list(xs))
        a.set_xticklabels([k.replace("rss_bytes_per_alloc_at_", "at ").replace("_", " ") for k in keys], fontsize=8)
        a.set(title=title, ylabel=ylabel)
        a.legend()

    bars(ax[0][2], ["cpu_s_per_M_relayed"], f"server CPU at {cfg['fixed_rate']}/s", "CPU s per million relayed")
    bars(ax[1][0], [f"rss_bytes_per_alloc_at_{n}" for n in cfg["allocs"]], "memory per allocation", "bytes (RSS)")
    bars(ax[1][1], ["allocs_per_s"], "allocation rate", "allocations/s")
    bars(ax[1][2], ["rtt_p50_us", "rtt_p99_us", "direct_echo_p99_us"], f"round trip at {cfg['fixed_rate']}/s",
         "µs (log)")
    ax[1][2].set_yscale("log")
    fig.suptitle("lastcall-turn vs coturn 4.6.1 (loopback; server on CPU 0, generator on CPU 1; medians)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=80)
    return True


# --rate: the highest rate each design relays with < 0.1 % loss, and the CPU of the whole path
# (server + generator + echo peer + the kernel's softirq threads: exact per-process CPU) per
# datagram at 10k/50k/100k/s and at that maximum, beside the machine's own references: the
# generator straight to a user-space echo, and to a kernel echo (a tc reflector).
RATE_SERVERS = ["direct-echo", "kernel-echo", "coturn-4.18", "lastcall-turn-1w", "lastcall-turn-2w",
                "lastcall-turn+kernel"]
# `--also generator-sink`: the generator into a tc drop (nothing comes back), what it offers
# from its one core; its "whole" is the generator's CPU per datagram sent.
REFERENCES = ("direct-echo", "kernel-echo", "generator-sink")
RATE = dict(rounds=3, fixed=[10000, 50000, 100000], ladder=[150000, 200000, 250000, 300000, 350000, 400000],
            search_steps=3, duration=1.5, clients=32, size=160)
RATE_SMOKE = dict(rounds=1, fixed=[2000], ladder=[], search_steps=0, duration=1.0, clients=8, size=160)
# Servers relayed by which variants (what --variant does for the default mode).
RATE_VARIANTS = {"lastcall-turn-1w": ("lastcall-turn", ["--relay-threads=1"]),
                 "lastcall-turn-2w": ("lastcall-turn", ["--relay-threads=2"]),
                 "lastcall-turn+kernel": ("lastcall-turn", ["--kernel-relay"])}
KERNEL_SERIES = 'lastcall_turn_kernel_relayed_packets_total{direction="to_peer"}'


def load_args(cfg, rates, duration=None):
    return ["--clients", str(cfg["clients"]), "--size", str(cfg["size"]),
            "--duration", str(duration or cfg["duration"]), "--rates", ",".join(str(int(x)) for x in rates)]


def rate_round(name, cfg, bin_dir, logdir, rates=None, search=True):
    """One design at every rate: the phases, the summary, and (the fast path) how much the
    kernel relayed."""
    rates = rates or cfg["fixed"] + cfg["ladder"]
    search_args = ["--search-steps", str(cfg["search_steps"])] if search else []
    r = {"server": name, "load_before": loadavg()}
    if name == "direct-echo":
        with Echo(bin_dir) as echo:
            out = turnload(bin_dir, None, ["direct", "--peer", echo.addr] + load_args(cfg, rates) + search_args,
                           timeout=900, cpu={"echo": echo.pid})
    elif name == "kernel-echo":
        with Reflector(bin_dir) as refl:
            out = turnload(bin_dir, None, ["direct", "--peer", refl.addr] + load_args(cfg, rates) + search_args,
                           timeout=900)
    elif name == "generator-sink":
        # Nothing comes back (a tc drop on lo): the generator's CPU per datagram sent, and
        # its maximum the highest rate it offered (≥ 97 %); nothing is lost that was expected.
        out = turnload(bin_dir, None, ["sink"] + load_args(cfg, rates) + search_args, timeout=900)
        for o in out:
            if o["kind"] == "summary":
                o["max_rate_under_threshold"] = o["max_rate_offered"]
            else:
                o.update(whole_us_per_datagram=o["generator_and_softirq_us_per_datagram"], loss_pct=0.0,
                         p50_us=None, p99_us=None)
    else:
        with Server(name, bin_dir, logdir) as s, Echo(bin_dir) as echo:
            out = turnload(bin_dir, s, ["relay", "--peer", echo.addr] + load_args(cfg, rates) + search_args,
                           timeout=900, cpu={"echo": echo.pid})
            if s.admin:
                text = scrape(s.admin)
                r["kernel_to_peer"] = metric(text, KERNEL_SERIES)
                r["peer_sentp"] = metric(text, 'turn_traffic_peer_sentp{realm="example.org"}')
            with open(s.log.name) as f:
                log = f.read()
        if name.endswith("+kernel") and "fast path is off" in log:
            raise RuntimeError(f"{name}: the kernel fast path did not run: {log[-2000:]}")
    r["phases"] = [o for o in out if o["kind"] in ("relay", "direct", "sink", "search")]
    r["summary"] = [o for o in out if o["kind"] == "summary"][0]
    r["load_after"] = loadavg()
    return r


def phase_at(r, rate):
    for p in r["phases"]:
        if int(p["rate"]) == int(rate):
            return p
    return None


def best_phase(r):
    """The phase at the highest rate relayed under the threshold."""
    m = r["summary"]["max_rate_under_threshold"]
    return phase_at(r, m) if m is not None else None


def rate_table(rounds, cfg, servers):
    """Medians over the rounds: {server: {figure: value}}."""
    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None
    base = {int(p["rate"]): p for r in rounds if r["server"] == "direct-echo" for p in r["phases"]}
    table = {}
    for n in servers:
        rs = [r for r in rounds if r["server"] == n]
        row = {"max_rate": med([r["summary"]["max_rate_under_threshold"] for r in rs]),
               "max_rates": [r["summary"]["max_rate_under_threshold"] for r in rs]}
        for rate in cfg["fixed"]:
            ps = [phase_at(r, rate) for r in rs]
            ps = [p for p in ps if p]
            row[f"whole_{rate}"] = med([p["whole_us_per_datagram"] for p in ps])
            row[f"server_{rate}"] = med([p.get("server_us_per_datagram") for p in ps])
            row[f"loss_{rate}"] = med([p["loss_pct"] for p in ps])
            b = base.get(rate)
            row[f"p50_{rate}"] = med([p["p50_us"] for p in ps])
            row[f"p99_{rate}"] = med([p["p99_us"] for p in ps])
            if b and n not in REFERENCES:
                row[f"added_p50_{rate}"] = med([p["p50_us"] - b["p50_us"] for p in ps if p["p50_us"] is not None])
                row[f"added_p99_{rate}"] = med([p["p99_us"] - b["p99_us"] for p in ps if p["p99_us"] is not None])
        bests = [best_phase(r) for r in rs]
        row["whole_max"] = med([p["whole_us_per_datagram"] for p in bests if p])
        row["server_max"] = med([p.get("server_us_per_datagram") for p in bests if p])
        row["kernel_share"] = med([r["kernel_to_peer"] / r["peer_sentp"] for r in rs
                                   if r.get("kernel_to_peer") is not None and r.get("peer_sentp")])
        table[n] = row
    return table


def rate_lines(table, cfg, md=False):
    cols = ["max_rate"] + [f"whole_{x}" for x in cfg["fixed"]] + ["whole_max"] + \
           [f"server_{x}" for x in cfg["fixed"]] + [f"loss_{x}" for x in cfg["fixed"]] + \
           [f"added_p50_{x}" for x in cfg["fixed"]] + [f"added_p99_{x}" for x in cfg["fixed"]] + \
           ["server_max", "kernel_share"]
    head = ["figure"] + list(table)
    lines = []
    if md:
        lines += ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * len(table)]
    else:
        lines.append(" ".join(f"{h:>20}" for h in head))
    for c in cols:
        cells = [c] + [fmt(table[n].get(c)) for n in table]
        lines.append("| " + " | ".join(cells) + " |" if md else " ".join(f"{x:>20}" for x in cells))
    return lines


def rate_doc(res):
    """docs/benchmarks.md's tables of a --rate run, recomputed from its rounds (the docs test
    compares them with the page): per design, the loss-free maximum, the whole path's CPU per
    datagram at each fixed rate and at that maximum, the added round trip; then how busy each
    process kept its core at the design's maximum (which one stops it), and the ratios."""
    cfg, rounds = res["config"], res["rounds"]
    servers = [n for n in RATE_SERVERS + sorted({r["server"] for r in rounds} - set(RATE_SERVERS))
               if any(r["server"] == n for r in rounds)]
    table = rate_table(rounds, cfg, servers)
    fixed = cfg["fixed"]

    def k(x):
        return f"{x // 1000}k"

    def whole(row, x):
        v, loss = row.get(f"whole_{x}"), row.get(f"loss_{x}")
        if v is None:
            return "-"
        return fmt(v) if not loss or loss < 0.1 else f"{fmt(v)} ({loss:.0f} % lost)"

    head = (["design", "max rate, < 0.1 % loss (each round)"] + [f"whole µs/dgram at {k(x)}/s" for x in fixed] +
            ["whole µs/dgram at its max"] + [f"added p50 / p99 µs at {k(x)}/s" for x in fixed] + ["kernel share"])
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for n in servers:
        row = table[n]
        rounds_max = ", ".join(fmt(m) for m in row["max_rates"])
        cells = [n, f"{fmt(row['max_rate'])} ({rounds_max})"] + [whole(row, x) for x in fixed] + \
                [fmt(row["whole_max"])] + \
                [f"{fmt(row.get(f'added_p50_{x}'))} / {fmt(row.get(f'added_p99_{x}'))}" if n not in REFERENCES else "-"
                 for x in fixed] + \
                ["-" if row["kernel_share"] is None else f"{100 * row['kernel_share']:.2f} %"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| design | at its max: cores busy (server / echo / generator) |", "| --- | --- |"]
    for n in servers:
        busy = {}
        for r in rounds:
            p = best_phase(r) if r["server"] == n else None
            if p:
                for proc in ("server", "echo", "generator"):
                    v = p["cpu_s"].get(proc)
                    if v is not None:
                        busy.setdefault(proc, []).append(v / p["duration_s"])
        cell = " / ".join(f"{statistics.median(busy[x]):.2f}" if x in busy else "-"
                          for x in ("server", "echo", "generator"))
        lines.append(f"| {n} | {cell} |")
    ratios = rate_ratios(table, cfg)
    out = []
    if "max_rate_ratio" in ratios:
        out.append(f"loss-free maximum, lastcall-turn+kernel / coturn-4.18: {ratios['max_rate_ratio']:.2f}×")
    cmp = {}
    for r in res.get("compare", []):
        cmp.setdefault(r["server"], []).append(r["phases"][0]["whole_us_per_datagram"])
    if "coturn-4.18" in cmp and "lastcall-turn+kernel" in cmp:
        both = int(res["compare"][0]["phases"][0]["rate"])
        c, kk = statistics.median(cmp["coturn-4.18"]), statistics.median(cmp["lastcall-turn+kernel"])
        out.append(f"whole path at {both:,}/s (the highest both sustain; {len(cmp['coturn-4.18'])} alternated "
                   f"rounds each): lastcall-turn+kernel {fmt(kk)} µs against coturn-4.18 {fmt(c)} µs, {kk / c:.2f}×")
    lines += [""] + [f"- {x}" for x in out]
    lines.append(f"- load average during the run: {res['load'][0]:.1f} to {res['load'][1]:.1f}")
    return lines


def rate_ratios(table, cfg):
    """The goals: the fast path's loss-free maximum against coturn 4.18's, and the whole
    path's CPU at the highest rate both sustain."""
    k, c = table.get("lastcall-turn+kernel"), table.get("coturn-4.18")
    if not k or not c:
        return {}
    out = {}
    if k["max_rate"] and c["max_rate"]:
        out["max_rate_ratio"] = k["max_rate"] / c["max_rate"]
    for x in cfg["fixed"]:
        if k.get(f"whole_{x}") and c.get(f"whole_{x}"):
            out[f"whole_ratio_{x}"] = k[f"whole_{x}"] / c[f"whole_{x}"]
    return out


def compare_at(rounds_out, rate, cfg, bin_dir, logdir, n=2):
    """The fast path and coturn 4.18 alternated at `rate` (the highest both sustain)."""
    pairs = []
    for i in range(n):
        order = ["coturn-4.18", "lastcall-turn+kernel"] if i % 2 == 0 else ["lastcall-turn+kernel", "coturn-4.18"]
        for name in order:
            r = rate_round(name, cfg, bin_dir, logdir, rates=[rate], search=False)
            r["round"] = i + 1
            rounds_out.append(r)
            p = r["phases"][0]
            print(f"compare {i + 1} {name:21} {rate:.0f}/s whole {fmt(p['whole_us_per_datagram'])} us "
                  f"loss {p['loss_pct']:.3f}%", flush=True)
            pairs.append((name, p))
    return pairs


def rate_plot(rounds, servers, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib missing, no plot", file=sys.stderr)
        return False
    colors = dict(zip(servers, ["tab:gray", "black", "tab:orange", "tab:cyan", "tab:blue", "tab:green"]))
    fig, ax = plt.subplots(1, 2, figsize=(14, 5.5))
    for n in servers:
        pts = sorted((p["offered"], p["whole_us_per_datagram"], p["loss_pct"]) for r in rounds if r["server"] == n
                     for p in r["phases"] if p.get("whole_us_per_datagram") is not None)
        ok = [(x, y) for x, y, l in pts if l < 0.1]
        bad = [(x, y) for x, y, l in pts if l >= 0.1]
        st = "--" if n in REFERENCES else "-"
        if ok:
            ax[0].plot([x for x, _ in ok], [y for _, y in ok], st, marker="o", color=colors.get(n), label=n, alpha=0.8)
        if bad:
            ax[0].plot([x for x, _ in bad], [y for _, y in bad], "x", color=colors.get(n), alpha=0.6)
        ax[1].plot([x for x, _, _ in pts], [max(l, 1e-4) for _, _, l in pts], st, marker="o", color=colors.get(n),
                   label=n, alpha=0.8)
    ax[0].set(xlabel="offered rate (datagrams/s, client → peer)",
              ylabel="whole-path CPU µs per datagram (server+generator+echo+softirq)",
              title="CPU per datagram (o: < 0.1 % loss, x: more)", ylim=(0, None))
    ax[1].axhline(0.1, color="gray", ls=":", lw=1)
    ax[1].set(xlabel="offered rate (datagrams/s, client → peer)", ylabel="loss % (log; 0 shown as 1e-4)",
              yscale="log", title="loss against offered rate")
    for a in ax:
        a.legend(fontsize=8)
    fig.suptitle("TURN relays at rate on loopback (2 vCPU: server and echo on CPU 0, generator on CPU 1)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=80)
    return True


def rate_main(args):
    cfg = dict(RATE if args.mode == "full" else RATE_SMOKE)
    if args.rounds:
        cfg["rounds"] = args.rounds
    servers = [n for n in RATE_SERVERS + args.also if n not in args.skip]
    VARIANTS.update(RATE_VARIANTS)
    m = machine()
    print(f"machine: nproc {m['nproc']}, {m['cpu_model']}, kernel {m['kernel']}, coturn {m['coturn']}")
    print(f"pinning: {' '.join(pin(0))} server and echo; {' '.join(pin(1))} load generator")
    cfg["echo_poll_us"] = ECHO_POLL_US
    print(f"config: {json.dumps(cfg)}; designs {servers}")
    rounds = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="turn-bench-") as logdir:
        for i in range(cfg["rounds"]):
            order = servers if i % 2 == 0 else servers[::-1]
            for name in order:
                r = rate_round(name, cfg, args.bin_dir, logdir)
                r["round"] = i + 1
                rounds.append(r)
                print(f"round {i + 1} {name:21} load {r['load_before']:.1f}->{r['load_after']:.1f} max "
                      f"{fmt(r['summary']['max_rate_under_threshold'])}/s " + " ".join(
                          f"{int(p['rate'])}: {fmt(p['whole_us_per_datagram'])}us {p['loss_pct']:.2f}%"
                          for p in r["phases"]), flush=True)
        table = rate_table(rounds, cfg, servers)
        compare = []
        c, k = table.get("coturn-4.18", {}), table.get("lastcall-turn+kernel", {})
        if args.mode == "full" and c.get("max_rate") and k.get("max_rate"):
            both = min(c["max_rate"], k["max_rate"])
            rounds_cmp = []
            compare = compare_at(rounds_cmp, both, cfg, args.bin_dir, logdir)
            cmp = {n: statistics.median([p["whole_us_per_datagram"] for m_, p in compare if m_ == n])
                   for n in ("coturn-4.18", "lastcall-turn+kernel")}
        else:
            rounds_cmp, cmp, both = [], {}, None
    print(f"\nmedians of {cfg['rounds']} round(s) ({time.time() - t0:.0f} s); µs of CPU per datagram "
          "(each echoed datagram crossed the path twice); max = highest rate with < 0.1 % loss:")
    print("\n".join(rate_lines(table, cfg)))
    ratios = rate_ratios(table, cfg)
    if cmp:
        ratios["both_sustain_rate"] = both
        ratios["whole_ratio_at_both"] = cmp["lastcall-turn+kernel"] / cmp["coturn-4.18"]
        ratios["whole_at_both"] = cmp
    for k_, v in ratios.items():
        print(f"  {k_}: {v if isinstance(v, dict) else fmt(v)}")
    loads = [x for r in rounds + rounds_cmp for x in (r["load_before"], r["load_after"])]
    print(f"load average during the run: {min(loads):.1f} to {max(loads):.1f}")
    result = {"machine": m, "config": cfg, "rounds": rounds, "compare": rounds_cmp, "table": table,
              "ratios": ratios, "load": [min(loads), max(loads)]}
    if args.json:
        write_json(args.json, result)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(rate_doc(result)) + "\n")
    plot_path = args.plot or ("docs/img/turn-rate.png" if args.mode == "full" else None)
    if plot_path and rate_plot(rounds, servers, plot_path):
        print(f"plot: {plot_path}")


# The whole-path runs of 2026-12-01 (whole-path-*.json, in the history of bench/turn/results, made by the
# --whole-path mode of fb4e335, which --rate replaced): their table and plot, redrawn by --replot.
WHOLE_SERVERS = ["coturn-4.18", "coturn", "lastcall-turn", "lastcall-turn+kernel"]
def whole_table(rounds, cfg):
    """{rate: {figure: {server: median}}} over the kept rounds, and the ratio to coturn 4.18."""
    kept = kept_rounds(rounds)
    servers = [n for n in WHOLE_SERVERS if any(r["server"] == n for r in rounds)]
    table = {}
    for rate in cfg["rates"]:
        rows = {}
        for fig, key in [("whole_us_per_relayed", "whole_cpu_us_per_relayed"),
                         ("server_us_per_relayed", "cpu_s_per_m_relayed"),
                         ("loss_pct", "loss_pct"), ("rtt_p50_us", "p50_us"), ("rtt_p99_us", "p99_us"),
                         ("added_p50_us", "added_p50_us"), ("added_p99_us", "added_p99_us")]:
            row = {}
            for n in servers:
                vals = [r["phases"][str(rate)].get(key) for r in kept if r["server"] == n]
                row[n] = median(vals)
                row[n + "_all"] = vals
            rows[fig] = row
        table[rate] = rows
    return servers, table


def whole_lines(servers, table, md=False):
    lines = []
    head = ["rate", "figure"] + servers + [f"{n} / coturn-4.18" for n in servers[1:]]
    if md:
        lines += ["| " + " | ".join(head) + " |", "| ---: | --- |" + " ---: |" * (len(head) - 2)]
    else:
        lines.append(" ".join(f"{h:>22}" for h in head))
    for rate, rows in table.items():
        for fig, row in rows.items():
            base = row.get("coturn-4.18")
            ratios = [(f"{row[n] / base:.2f}" if row[n] is not None and base else "-")
                      if fig.endswith("per_relayed") else "" for n in servers[1:]]
            cells = [f"{rate:,}/s", fig] + [fmt(row[n]) for n in servers] + ratios
            lines.append("| " + " | ".join(cells) + " |" if md else " ".join(f"{c:>22}" for c in cells))
    return lines


def whole_plot(rounds, cfg, path):
    """The whole path's CPU per relayed datagram, split into the server's and the load
    generator's (clients and echo peer), per design and rate (medians of the kept rounds;
    each kept round a dot), with the loss and the added round trip beside it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib missing (Debian's python3-matplotlib), no plot", file=sys.stderr)
        return False
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    kept = kept_rounds(rounds)
    servers = [n for n in WHOLE_SERVERS if any(r["server"] == n for r in kept)]
    rates = cfg["rates"]
    colors = {"coturn-4.18": "tab:red", "coturn": "tab:orange", "lastcall-turn": "tab:blue",
              "lastcall-turn+kernel": "tab:green"}

    def per(r, rate, what):
        ph = r["phases"].get(str(rate), {})
        relayed = ph.get("relayed") or 0
        if what == "server":
            return ph["server_cpu_s"] * 1e6 / relayed if relayed and ph.get("server_cpu_s") is not None else None
        if what == "generator":
            return ph["generator_cpu_s"] * 1e6 / relayed if relayed and ph.get("generator_cpu_s") is not None else None
        return ph.get(what)

    fig, ax = plt.subplots(1, len(rates) + 1, figsize=(6 * (len(rates) + 1), 5.2))
    for k, rate in enumerate(rates):
        a = ax[k]
        for i, n in enumerate(servers):
            rs = [r for r in kept if r["server"] == n]
            srv = median([per(r, rate, "server") for r in rs]) or 0
            gen = median([per(r, rate, "generator") for r in rs]) or 0
            a.bar(i, srv, color=colors.get(n, "tab:gray"))
            a.bar(i, gen, bottom=srv, color=colors.get(n, "tab:gray"), alpha=0.45)
            whole = [per(r, rate, "whole_cpu_us_per_relayed") for r in rs]
            a.plot([i] * len(whole), whole, "k.", alpha=0.6)
            loss = median([per(r, rate, "loss_pct") for r in rs])
            label = f"{median(whole):.1f}"  # the table's figure: the median of the whole path
            a.annotate(f"{label}\nloss {loss:.1f} %" if loss else label,
                       (i, srv + gen), ha="center", va="bottom", fontsize=8, xytext=(0, 3),
                       textcoords="offset points")
        a.set_xticks(range(len(servers)))
        a.set_xticklabels([n.replace("lastcall-turn+kernel", "lastcall-turn\n+kernel") for n in servers], fontsize=8)
        a.set(title=f"{rate:,} datagrams/s offered", ylabel="CPU µs per relayed datagram (whole path)")
        a.legend(handles=[Patch(color="dimgray", label="server (solid)"),
                          Patch(color="dimgray", alpha=0.45, label="load generator: clients, echo peer (faded)"),
                          Line2D([], [], color="k", marker=".", ls="", label="each kept round")],
                 fontsize=8, loc="upper right")
    a = ax[-1]
    rate = rates[0]
    w = 0.38
    for i, n in enumerate(servers):
        rs = [r for r in kept if r["server"] == n]
        for j, (key, label) in enumerate([("added_p50_us", "p50"), ("added_p99_us", "p99")]):
            v = median([per(r, rate, key) for r in rs])
            if v is not None:
                a.bar(i + (j - 0.5) * w, max(v, 0), w, color=colors.get(n, "tab:gray"), alpha=1 - 0.45 * j,
                      label=label if i == 0 else None)
    a.set_xticks(range(len(servers)))
    a.set_xticklabels([n.replace("lastcall-turn+kernel", "lastcall-turn\n+kernel") for n in servers], fontsize=8)
    a.set(title=f"round trip added by the relay at {rate:,}/s", ylabel="µs (relay minus direct echo)")
    a.legend(fontsize=8)
    loads = [x for r in rounds for x in (r["load_before"], r["load_after"])]
    fig.suptitle(f"TURN relay, whole path: server + load generator CPU per relayed datagram (loopback, "
                 f"medians of {len(kept) // max(1, len(servers))} rounds, load average {min(loads):.1f}-{max(loads):.1f})",
                 fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=80)
    return True


def machine():
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"nproc": os.cpu_count(), "cpu_model": model, "kernel": os.uname().release,
            "coturn": subprocess.run(["turnserver", "--version"], capture_output=True, text=True).stdout.strip()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["full", "smoke"], default="full")
    ap.add_argument("--bin-dir", default="target/release")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--plot", help="PNG path (default docs/img/turn-bench.png; smoke: none)")
    ap.add_argument("--realtime", action="store_true",
                    help="run server and generator SCHED_FIFO (chrt -f 10) instead of nice -15: on a machine "
                         "with other load, fewer rounds where a server is starved")
    ap.add_argument("--markdown", help="write the table as Markdown here")
    ap.add_argument("--replot", metavar="JSON", help="only redraw the plot and table from a saved --json")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=PATH",
                    help="also measure another lastcall-turn binary (e.g. an earlier build), in the same rounds")
    ap.add_argument("--variant", action="append", default=[], metavar="'NAME=BASE FLAG...'",
                    help="also measure coturn or lastcall-turn (BASE) run with these extra flags, in the same rounds")
    ap.add_argument("--rate", action="store_true",
                    help="the designs at rate: the highest rate each relays with < 0.1 %% loss and the whole "
                         "path's CPU per datagram (server + generator + echo + softirq) at 10k/50k/100k/s and at "
                         "that maximum, for coturn 4.18 (sid chroot), lastcall-turn with 1 and 2 UDP threads "
                         "and with its kernel fast path, beside the machine's references (a user-space echo "
                         "and a tc reflector)")
    ap.add_argument("--skip", action="append", default=[], help="with --rate: leave this design out")
    ap.add_argument("--echo-poll-us", type=int,
                    help="the echo reads every N µs instead of blocking while idle (default 0: it blocks)")
    ap.add_argument("--also", action="append", default=[],
                    help="with --rate: add this design (coturn: Debian 12's 4.6.1; generator-sink: the generator alone "
                         "into a tc drop on lo, what it offers from one core)")
    args = ap.parse_args()
    global REALTIME, ECHO_POLL_US
    REALTIME = args.realtime
    ECHO_POLL_US = args.echo_poll_us or 0
    if args.rate:
        return rate_main(args)
    for v in args.variant:
        name, _, spec = v.partition("=")
        base, *flags = spec.split()
        if base not in ("coturn", "lastcall-turn"):
            ap.error(f"--variant {v}: the base is coturn or lastcall-turn")
        VARIANTS[name] = (base, flags)
        if name not in SERVERS:
            SERVERS.append(name)
    for e in args.extra:
        name, _, path = e.partition("=")
        BINARIES[name] = os.path.abspath(path)
        if name not in SERVERS:
            SERVERS.append(name)
    if args.replot:
        with open(args.replot) as f:
            res = json.load(f)
        if "fixed" in res["config"]:  # a --rate run
            servers = [n for n in RATE_SERVERS + sorted({r["server"] for r in res["rounds"]} - set(RATE_SERVERS))
                       if any(r["server"] == n for r in res["rounds"])]
            print("\n".join(rate_doc(res)))
            if args.markdown:
                with open(args.markdown, "w") as f:
                    f.write("\n".join(rate_doc(res)) + "\n")
            if args.plot:
                rate_plot(res["rounds"], servers, args.plot)
            return
        if res["rounds"] and "phases" in res["rounds"][0]:  # an earlier --whole-path run
            servers, table = whole_table(res["rounds"], res["config"])
            print("\n".join(whole_lines(servers, table)))
            if args.markdown:
                with open(args.markdown, "w") as f:
                    f.write("\n".join(whole_lines(servers, table, md=True)) + "\n")
            if args.plot:
                whole_plot(res["rounds"], res["config"], args.plot)
            return
        for name in {r["server"] for r in res["rounds"]} - set(SERVERS):
            SERVERS.append(name)
        table = summarize(res["rounds"], res["config"])
        print_table(table)
        print("\n".join(cpu_rate_lines(res["rounds"], res["config"])))
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(markdown(table, res) + "\n")
        if args.plot:
            plot(res["rounds"], table, res["config"], args.plot)
        return
    cfg = dict(FULL if args.mode == "full" else SMOKE)
    cfg["starved_us"] = STARVED_US if args.mode == "full" else 10**9  # smoke: debug builds, any figure
    if args.rounds:
        cfg["rounds"] = args.rounds
    m = machine()
    print(f"machine: nproc {m['nproc']}, {m['cpu_model']}, kernel {m['kernel']}, coturn {m['coturn']}")
    print(f"pinning: {' '.join(pin(0)) + ' server; ' + ' '.join(pin(1)) + ' load generator'}")
    print(f"config: {json.dumps(cfg)}")
    rounds = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="turn-bench-") as logdir:
        for i in range(cfg["rounds"]):
            order = SERVERS if i % 2 == 0 else SERVERS[::-1]
            for name in order:
                r = one_round(name, cfg, args.bin_dir, logdir)
                r["round"] = i + 1
                rounds.append(r)
                f = figures(r, cfg)
                print(f"round {i + 1} {name:13} load {r['load_before']:.1f}->{r['load_after']:.1f} "
                      + " ".join(f"{k}={fmt(v)}" for k, v in f.items()), flush=True)
    table = summarize(rounds, cfg)
    discarded = "first round discarded, " if cfg["rounds"] > 1 else ""
    print(f"(cpu_s_per_M_relayed: only rounds whose fixed-rate round-trip p50 was < {cfg['starved_us']} us "
          "with no loss)")
    print(f"\nmedians ({discarded}{max(1, cfg['rounds'] - 1)} round(s) kept; ratio = lastcall-turn / coturn; "
          f"relayed = datagrams forwarded by the server, both directions; {time.time() - t0:.0f} s):")
    print_table(table)
    print("\nserver CPU s per million relayed by offered rate (ladder phases with < 0.1 % loss, p50 < 1 ms):")
    print(f"  {'rate':>9} " + " ".join(f"{n:>16}" for n in SERVERS) + f" {'ratio':>6}")
    print("\n".join(cpu_rate_lines(rounds, cfg)))
    for k, row in table.items():
        if row["ratio"] is not None:
            better = row["ratio"] < 1 if k.startswith(LOWER_IS_BETTER) else row["ratio"] > 1
            print(f"  {k}: lastcall-turn {'better' if better else 'worse'} ({row['ratio']:.2f}x)")
    result = {"machine": m, "config": cfg, "rounds": rounds, "table": table}
    if args.json:
        write_json(args.json, result)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(table, result) + "\n")
    plot_path = args.plot or ("docs/img/turn-bench.png" if args.mode == "full" else None)
    if plot_path and plot(rounds, table, cfg, plot_path):
        print(f"plot: {plot_path}")


if __name__ == "__main__":
    main()

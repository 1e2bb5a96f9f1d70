#!/usr/bin/env python3
"""Summaries for bench/spoa/run.sh.

  report.py RESULTS.jsonl...              markdown table: medians over rounds, ratios b/c, b/a
                                          (several files: their rounds together)
  report.py --plot PNG [--title T] RESULTS.jsonl   the same data as a plot (Debian's
                                          python3-matplotlib: run it with /usr/bin/python3)
  report.py --smoke RESULTS.jsonl         checks a smoke run; exit 1 with the reasons if wrong
  report.py --soak RSS.csv [--plot PNG] WRK.out   soak summary (RSS drift, throughput)
  report.py --cpu LABEL=CPU.txt...        markdown table of `profile` runs' CPU per request
                                          (their cpu-per-request.txt), pass by pass, with the
                                          ratio of HAProxy + lastcall-spoa to nginx + ModSecurity

Only the standard library is needed, except for --plot.
"""

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict

SETUPS = [("a", "HAProxy (no WAF)"), ("b", "HAProxy + lastcall-spoa"), ("c", "nginx + ModSecurity")]


def load(paths):
    """Rows of one or more results files; rounds of later files are numbered after earlier ones."""
    rows, offset = [], 0
    for path in paths:
        with open(path) as f:
            part = [json.loads(line) for line in f if line.strip()]
        for row in part:
            row["round"] += offset
        offset = max([offset] + [row["round"] for row in part])
        rows += part
    return rows


def derived(row):
    r = row["result"]
    status = {int(k): v for k, v in r["status"].items()}
    return {
        "rps": r["requests"] / (r["duration_us"] / 1e6),
        "p50": r["p50_us"] / 1e3,
        "p99": r["p99_us"] / 1e3,
        "s5xx": sum(v for k, v in status.items() if k >= 500),
        "s403": status.get(403, 0),
        "s200": status.get(200, 0),
        "other": sum(v for k, v in status.items() if k not in (200, 403) and k < 500),
        "sock": r["err_connect"] + r["err_read"] + r["err_write"] + r["err_timeout"],
        "requests": r["requests"],
        "load": row["load1_after"],
    }


def cells(rows):
    """(traffic, conc, setup) -> list of derived rows (one per round)."""
    out = defaultdict(list)
    for row in rows:
        out[(row["traffic"], row["conc"], row["setup"])].append(derived(row))
    return out


def med(values):
    return statistics.median(values) if values else float("nan")


def table(rows):
    c = cells(rows)
    rounds = max((row["round"] for row in rows), default=0)
    loads = [row["load1_after"] for row in rows]
    lines = [
        f"Medians over {rounds} round(s); load average (1 min) during the runs: "
        f"min {min(loads):.2f}, median {med(loads):.2f}, max {max(loads):.2f}.",
        "",
        "| traffic | conc | (a) HAProxy req/s | (b) +lastcall-spoa req/s | (c) nginx+ModSec req/s "
        "| b/c | b/a | p50 ms a / b / c | p99 ms a / b / c | p99 b/c | 5xx+socket errors b / c |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---|",
    ]
    keys = sorted({(t, n) for (t, n, _) in c}, key=lambda k: (k[0] != "benign", k[1]))
    for traffic, conc in keys:
        m = {s: {f: med([d[f] for d in c.get((traffic, conc, s), [])]) for f in ("rps", "p50", "p99")}
             for s, _ in SETUPS}
        err = {s: sum(d["s5xx"] + d["sock"] for d in c.get((traffic, conc, s), [])) for s, _ in SETUPS}
        lines.append(
            f"| {traffic} | {conc} | {m['a']['rps']:.0f} | {m['b']['rps']:.0f} | {m['c']['rps']:.0f} "
            f"| {m['b']['rps'] / m['c']['rps']:.2f} | {m['b']['rps'] / m['a']['rps']:.2f} "
            f"| {m['a']['p50']:.2f} / {m['b']['p50']:.2f} / {m['c']['p50']:.2f} "
            f"| {m['a']['p99']:.2f} / {m['b']['p99']:.2f} / {m['c']['p99']:.2f} "
            f"| {m['b']['p99'] / m['c']['p99']:.2f} | {err['b']} / {err['c']} |"
        )
    spread = []
    for (traffic, conc, s), ds in sorted(c.items()):
        if len(ds) > 1:
            r = [d["rps"] for d in ds]
            spread.append(max(r) / min(r) if min(r) > 0 else float("inf"))
    if spread:
        lines += ["", f"Round-to-round spread of req/s in a cell (max/min): median {med(spread):.2f}, "
                      f"worst {max(spread):.2f}."]
    return "\n".join(lines)


def plot(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = cells(rows)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    for col, traffic in enumerate(["benign", "mixed"]):
        concs = sorted({n for (t, n, _) in c if t == traffic})
        for s, label in SETUPS:
            rps = [med([d["rps"] for d in c.get((traffic, n, s), [])]) for n in concs]
            p99 = [med([d["p99"] for d in c.get((traffic, n, s), [])]) for n in concs]
            axes[0][col].plot(concs, rps, marker="o", label=label)
            axes[1][col].plot(concs, p99, marker="o", label=label)
        axes[0][col].set_title(f"{traffic} traffic" + (" (20% attacks)" if traffic == "mixed" else ""))
        axes[0][col].set_ylabel("requests/s (median)")
        axes[0][col].set_yscale("log")
        axes[1][col].set_ylabel("p99 latency, ms (median)")
        axes[1][col].set_yscale("log")
        axes[1][col].set_xlabel("concurrent connections")
        axes[1][col].set_xscale("log", base=2)
        axes[1][col].set_xticks(concs, [str(n) for n in concs])
        for ax in (axes[0][col], axes[1][col]):
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def smoke(rows):
    problems = []
    c = cells(rows)
    for s, label in SETUPS:
        for traffic in ("benign", "mixed"):
            ds = [d for (t, _, ss), v in c.items() if t == traffic and ss == s for d in v]
            if not ds:
                problems.append(f"{label} {traffic}: no run")
                continue
            tot = {k: sum(d[k] for d in ds) for k in ("requests", "s200", "s403", "s5xx", "other", "sock")}
            print(f"smoke: {label:<24} {traffic:<6} {tot}")
            if tot["requests"] < 5:
                problems.append(f"{label} {traffic}: only {tot['requests']} requests")
            if tot["s5xx"] or tot["sock"] or tot["other"]:
                problems.append(f"{label} {traffic}: errors {tot}")
            if traffic == "benign" and tot["s403"]:
                problems.append(f"{label} benign: {tot['s403']} requests denied")
            if traffic == "mixed" and s != "a":
                # 1 in 5 requests is an attack; allow for the request in flight at the end.
                share = tot["s403"] / max(1, tot["s200"] + tot["s403"])
                if not 0.15 <= share <= 0.25:
                    problems.append(f"{label} mixed: {share:.0%} denied, expected 20%")
            if traffic == "mixed" and s == "a" and tot["s403"]:
                problems.append(f"{label} mixed: the proxy without WAF denied {tot['s403']}")
    for p in problems:
        print(f"smoke: FAIL {p}", file=sys.stderr)
    print("smoke: " + ("FAIL" if problems else "OK"))
    return 1 if problems else 0


def soak(rss_csv, wrk_out, png, label):
    samples = []
    with open(rss_csv) as f:
        next(f)
        for line in f:
            t, rss, load = line.strip().split(",")
            if rss:
                samples.append((int(t), int(rss), float(load)))
    result = None
    with open(wrk_out) as f:
        for line in f:
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
    rss = [s[1] for s in samples]
    # Memory "flat": after the first minute (connections opened, allocator arenas grown),
    # the RSS stays within 10% of its value at 60 s.
    warm = [s for s in samples if s[0] >= 60] or samples
    base = warm[0][1]
    lo, hi = min(s[1] for s in warm), max(s[1] for s in warm)
    print(f"soak: {len(samples)} samples over {samples[-1][0]} s")
    print(f"soak: RSS first {rss[0]} KiB, at {warm[0][0]} s {base} KiB, last {rss[-1]} KiB, "
          f"min {min(rss)} KiB, max {max(rss)} KiB")
    print(f"soak: after {warm[0][0]} s: min {lo} KiB ({lo / base - 1:+.1%}), max {hi} KiB "
          f"({hi / base - 1:+.1%}), last {warm[-1][1]} KiB ({warm[-1][1] / base - 1:+.1%}) vs {base} KiB")
    print(f"soak: load average (1 min) min {min(s[2] for s in samples):.2f}, "
          f"median {med([s[2] for s in samples]):.2f}, max {max(s[2] for s in samples):.2f}")
    if result:
        status = result["status"]
        print(f"soak: {result['requests']} requests, {result['requests'] / (result['duration_us'] / 1e6):.0f} req/s, "
              f"p50 {result['p50_us'] / 1e3:.2f} ms, p99 {result['p99_us'] / 1e3:.2f} ms, statuses {status}, "
              f"socket errors {result['err_connect'] + result['err_read'] + result['err_write'] + result['err_timeout']}")
    if png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 4))
        ax.plot([s[0] for s in samples], [s[1] / 1024 for s in samples], marker=".")
        ax.set_xlabel("seconds under load (mixed traffic, 32 connections)")
        ax.set_ylabel(f"{label} RSS, MiB")
        ax.set_ylim(0, max(rss) / 1024 * 1.2)
        ax.grid(True, alpha=0.3)
        ax.set_title(f"{label}: resident memory during the soak (sampled every 10 s)")
        fig.tight_layout()
        fig.savefig(png, dpi=100)
        print(f"soak: plot {png}")


CPU_LINE = re.compile(
    r"^(?P<stack>[^:]+): (?P<requests>\d+) requests in \d+s; CPU per request: (?P<parts>.*?); "
    r"total (?P<total>[\d.]+) ms \(load1 (?P<load>[\d.]+)\)$")


def cpu_passes(path):
    """The passes of a cpu-per-request.txt: one dict per pass, stack -> (total ms, parts, load1)."""
    passes = []
    for line in open(path):
        m = CPU_LINE.match(line.strip())
        if not m:
            continue
        parts = {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+) ms", m["parts"])}
        if m["stack"] == "nginx+modsecurity":
            passes.append({})
        passes[-1][m["stack"]] = (float(m["total"]), parts, float(m["load"]))
    return passes


def cpu_table(runs):
    """`runs`: (label, cpu-per-request.txt). Totals include the origin on both sides."""
    lines = ["| run | pass | (c) nginx + ModSecurity, ms | (b) HAProxy + lastcall-spoa, ms "
             "(HAProxy / agent) | (b)/(c) | (b) without the response group, ms | /(c) | load average |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for label, path in runs:
        for i, p in enumerate(cpu_passes(path), 1):
            c, b, n = p["nginx+modsecurity"], p["haproxy+lastcall-spoa"], p["haproxy+lastcall-spoa, no response group"]
            loads = [c[2], b[2], n[2]]
            lines.append(f"| {label} | {i} | {c[0]:.2f} | {b[0]:.2f} ({b[1]['haproxy']:.2f} / {b[1]['agent']:.2f}) | "
                         f"{b[0] / c[0]:.2f}× | {n[0]:.2f} | {n[0] / c[0]:.2f}× | {min(loads):.2f}–{max(loads):.2f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("input", nargs="+")
    ap.add_argument("--plot")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--soak")
    ap.add_argument("--cpu", action="store_true", help="inputs are LABEL=cpu-per-request.txt")
    ap.add_argument("--label", default="lastcall-spoa")
    ap.add_argument("--title", default="CRS 3.3.4 PL1, libmodsecurity 3.0.9, 2 cores shared with the load generator",
                    help="the plot's title: the versions and conditions of the run")
    a = ap.parse_args()
    if a.soak:
        soak(a.soak, a.input[0], a.plot, a.label)
        return 0
    if a.cpu:
        print(cpu_table([arg.split("=", 1) for arg in a.input]))
        return 0
    rows = load(a.input)
    if a.smoke:
        return smoke(rows)
    if a.plot:
        plot(rows, a.plot, a.title)
        return 0
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The demo's rollout as a PNG: requests per second and failures, each daemon's sessions, and
each process's lifecycle phase from start to exit. Run by lastcall-demo --timeline as
`/usr/bin/python3 - timeline.json out.png` (Debian's python3-matplotlib)."""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

PHASES = {0: ("serving", "#2ca02c"), 1: ("announcing", "#ffbf00"), 2: ("refusing", "#ff7f0e"),
          3: ("lingering", "#9467bd"), 4: ("starting", "#1f77b4")}


def rates(load, window=1.0):
    """Rates of (passed, blocked, failed) over the last `window` seconds, from cumulative
    samples (a few requests a sample: shorter windows only show the sampling)."""
    t, passed, blocked, failed = [], [], [], []
    j = 0
    for i, b in enumerate(load):
        while j < i and load[j + 1][0] <= b[0] - window:
            j += 1
        a = load[j]
        dt = b[0] - a[0]
        if dt < window * 0.75:
            continue
        t.append(b[0])
        passed.append((b[2] - a[2]) / dt)
        blocked.append((b[3] - a[3]) / dt)
        failed.append((b[4] - a[4]) / dt)
    return t, passed, blocked, failed


def main(data_path, png):
    data = json.load(open(data_path))
    procs = data["processes"]
    end = max([p["exit"][0] for p in procs if p["exit"]] + [l[0] for l in data["load"]] + [1])
    fig, (ax_req, ax_sess, ax_phase) = plt.subplots(
        3, 1, figsize=(12, 8.5), sharex=True, gridspec_kw={"height_ratios": [2, 1.4, 2.2]})
    fig.suptitle("lastcall demo: two WAF agents rolled under load, then lastcall-turn drained under a call")

    t, passed, blocked, failed = rates(data["load"])
    ax_req.plot(t, passed, color="#2ca02c", label="passed (200)")
    ax_req.plot(t, blocked, color="#1f77b4", label="attacks blocked (403)")
    ax_req.plot(t, failed, color="#d62728", linewidth=2, label="failed")
    total_failed = data["load"][-1][4] if data["load"] else 0
    ax_req.set_ylabel("HTTP requests/s (1 s)")
    ax_req.set_title(f"HTTP load through HAProxy: {total_failed:.0f} failed", loc="left", fontsize=10)
    ax_req.legend(loc="upper right", fontsize=8)
    ax_req.set_ylim(bottom=0)

    for p in procs:
        if p["sessions"]:
            xs = [s[0] for s in p["sessions"]]
            ys = [s[1] for s in p["sessions"]]
            ax_sess.step(xs, ys, where="post", label=p["name"])
    ax_sess.set_ylabel("live sessions")
    ax_sess.set_title("lastcall_sessions: SPOP connections (agents), allocations (lastcall-turn)",
                      loc="left", fontsize=10)
    ax_sess.legend(loc="best", fontsize=8, ncol=3)
    ax_sess.set_ylim(bottom=0)

    names = [p["name"] for p in procs]
    for i, p in enumerate(procs):
        y = len(procs) - 1 - i
        phases = p["phases"]
        stop = p["exit"][0] if p["exit"] else end
        for j, (at, phase) in enumerate(phases):
            nxt = phases[j + 1][0] if j + 1 < len(phases) else stop
            start = max(at, p["start"])
            if nxt > start:
                ax_phase.broken_barh([(start, nxt - start)], (y - 0.35, 0.7),
                                     facecolors=PHASES.get(int(phase), ("?", "grey"))[1])
        if p["signal"]:
            ax_phase.plot([p["signal"][0]] * 2, [y - 0.45, y + 0.45], color="black", linewidth=2)
            ax_phase.annotate(p["signal"][1], (p["signal"][0], y + 0.42), fontsize=7, ha="right",
                              va="bottom")
        if p["exit"]:
            took = f", {p['exit'][0] - p['signal'][0]:.1f} s after {p['signal'][1]}" if p["signal"] else ""
            ax_phase.plot(p["exit"][0], y, marker="X", color="black", markersize=8)
            ax_phase.annotate(f"{p['exit'][1]}{took}", (p["exit"][0], y), xytext=(6, -3),
                              textcoords="offset points", fontsize=8)
    ax_phase.set_yticks(range(len(procs)), list(reversed(names)))
    ax_phase.set_ylim(-0.7, len(procs) - 0.3)
    ax_phase.set_title("each process's phase (lastcall_drain_phase), its signal and its exit",
                       loc="left", fontsize=10)
    ax_phase.legend(handles=[Patch(color=c, label=n) for n, c in PHASES.values()], loc="lower left",
                    fontsize=8, ncol=5)
    ax_phase.set_xlabel("seconds since the demo started recording")
    ax_phase.set_xlim(0, end * 1.12)
    for ax in (ax_req, ax_sess, ax_phase):
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

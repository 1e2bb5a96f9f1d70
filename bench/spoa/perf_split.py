#!/usr/bin/env python3
"""Splits the agent's CPU samples into inside libmodsecurity and outside it.

Input: `perf script -F tid,period,ip,sym,dso` of a `perf record --call-graph dwarf -p AGENT`
(bench/spoa/run.sh profile). A sample is *inside* when any frame of its call chain is in
libmodsecurity.so (so libpcre, libstdc++, libc's malloc or the kernel called from
libmodsecurity count as inside: they are the engine's work); everything else is *outside*:
SPOP framing, copies, allocation, tokio scheduling, syscalls of the agent itself.
Samples whose leaf is pcre2 JIT code (`perf-PID.map`) or libpcre2 also count as inside:
the agent itself does not use PCRE, and JIT frames carry no unwind information, so their
call chains stop at the leaf. Samples are weighted by their period.

Prints the split, then where the outside time goes: by category (from the innermost
user-space frames of each call chain), by leaf library, by leaf symbol, and by the innermost
frame in the agent binary (who asked for it).

Usage: perf_split.py PERF_SCRIPT_OUTPUT [--top N]
"""

import re
import sys
from collections import Counter

FRAME = re.compile(r"^\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$")


def samples(path):
    head, frames = None, []
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                if head is not None:
                    yield head, frames
                head, frames = None, []
                continue
            if line[0] != "\t":
                if head is not None:
                    yield head, frames
                head, frames = line.split(), []
                continue
            m = FRAME.match(line)
            if m:
                frames.append((m.group(2), m.group(3)))
    if head is not None:
        yield head, frames


def short_dso(d):
    return d.rsplit("/", 1)[-1]


def clean(sym):
    sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
    sym = re.sub(r"::h[0-9a-f]{16}$", "", sym)
    return sym[:110]


# (category, substrings of a frame's symbol), tried on each user-space frame from the leaf up.
CATEGORIES = [
    ("logging (tracing to stderr)", ("Stderr", "tracing_subscriber", "tracing_core")),
    ("thread hand-off: blocking pool / async workers park, unpark, wake",
     ("parking_lot", "Condvar", "blocking::pool", "Waker::wake", "unpark", "park_internal", "futex",
      "std::sys::sync", "notify_one", "Notify")),
    ("socket I/O (read/write syscalls)", ("TcpStream", "UnixStream")),
    ("epoll / I/O driver", ("mio::poll", "epoll", "io::driver")),
    ("memory allocation", ("malloc", "free", "_int_", "tcache", "realloc", "finish_grow", "__rdl_", "__rust_alloc",
                           "__rust_dealloc", "cfree")),
    # Module paths of both layouts (before and after crates/spoa/src/{protocol,engine}/), so
    # that older builds' profiles split the same way.
    ("SPOP framing and decoding", ("lastcall_spoa::protocol", "lastcall_spoa::frame",
                                   "lastcall_spoa::message", "spop::")),
    ("agent code around the engine (WAF glue, report parsing)", ("lastcall_spoa::waf", "lastcall_modsec")),
    ("connection loop", ("lastcall_spoa::engine", "lastcall_spoa::server", "lastcall_spoa::conn")),
    ("tokio scheduler", ("tokio::",)),
]


def category(frames):
    user = [(s, d) for s, d in frames if "kernel.kallsyms" not in d]
    if not user:
        return "kernel only (no user-space frame)"
    for sym, _ in user:
        for name, keys in CATEGORIES:
            if any(k in sym for k in keys):
                return name
    return "other: " + short_dso(user[0][1])


def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 15
    total = inside = 0
    unknown = 0
    leaf_dso, leaf_sym, agent_frame = Counter(), Counter(), Counter()
    inside_leaf_dso = Counter()
    cats = Counter()
    for head, frames in samples(path):
        try:
            period = int(head[1])
        except (IndexError, ValueError):
            period = 1
        total += period
        if not frames:
            unknown += period
            continue
        user = [d for _, d in frames if "kernel.kallsyms" not in d]
        leaf = short_dso(user[0] if user else frames[0][1])
        if any("libmodsecurity" in d for _, d in frames) or leaf.startswith(("perf-", "libpcre2")):
            inside += period
            inside_leaf_dso[short_dso(frames[0][1])] += period
            continue
        cats[category(frames)] += period
        leaf_dso[short_dso(frames[0][1])] += period
        leaf_sym[f"{clean(frames[0][0])} [{short_dso(frames[0][1])}]"] += period
        ours = next((s for s, d in frames if "lastcall-spoa" in d and "[unknown]" not in s), None)
        agent_frame[clean(ours) if ours else "(no frame in lastcall-spoa)"] += period
    if total == 0:
        print("perf_split: no samples")
        return 1
    outside = total - inside
    print(f"samples (period-weighted): {total}")
    print(f"inside libmodsecurity (a frame in libmodsecurity.so, or pcre2): {inside / total:6.1%}")
    print(f"outside libmodsecurity:                                         {outside / total:6.1%}")
    print(f"  (of which samples without a call chain: {unknown / total:.1%})")
    print("\ninside, by leaf library:")
    for k, v in inside_leaf_dso.most_common(top):
        print(f"  {v / total:6.1%}  {k}")
    print("\noutside, by category (share of all agent CPU):")
    for k, v in cats.most_common():
        print(f"  {v / total:6.1%}  {k}")
    print("\noutside, by leaf library:")
    for k, v in leaf_dso.most_common(top):
        print(f"  {v / total:6.1%}  {k}")
    print("\noutside, by leaf symbol:")
    for k, v in leaf_sym.most_common(top):
        print(f"  {v / total:6.1%}  {k}")
    print("\noutside, by innermost lastcall-spoa frame:")
    for k, v in agent_frame.most_common(top):
        print(f"  {v / total:6.1%}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

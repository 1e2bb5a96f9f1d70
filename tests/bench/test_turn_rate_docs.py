"""docs/benchmarks.md's "at rate" figures against the committed run they came from
(bench/turn/results/RATE_RUN): the tables are recomputed from the run's rounds by bench.py's
own code (`rate_doc`, what `--markdown` and `--replot` print) and every line must be on the
page, so a figure edited by hand, or a new run committed without its page, fails here. The
plot must be the committed one named on the page. No server is started here."""

import json
import os

from benchlib import ROOT, script

RATE_RUN = "rate-3.json"
PLOT = "docs/img/turn-rate.png"


def load_bench():
    return script("bench/turn/bench.py", "turn_bench")


def run():
    with open(os.path.join(ROOT, "bench/turn/results", RATE_RUN)) as f:
        return json.load(f)


def test_the_rate_tables_in_the_docs_are_the_committed_run():
    bench = load_bench()
    docs = open(os.path.join(ROOT, "docs/benchmarks.md")).read()
    lines = [line for line in bench.rate_doc(run()) if line.strip()]
    assert len(lines) > 10
    missing = [line for line in lines if line not in docs]
    assert not missing, "docs/benchmarks.md does not say (bench.py --replot bench/turn/results/" \
        f"{RATE_RUN} --markdown OUT.md prints it):\n" + "\n".join(missing)
    assert f"bench/turn/results/{RATE_RUN}" in docs
    assert PLOT.removeprefix("docs/") in docs and os.path.getsize(os.path.join(ROOT, PLOT)) > 10_000


def test_the_run_is_every_design_alternated_on_one_machine():
    res = run()
    designs = [r["server"] for r in res["rounds"] if r["round"] == 1]
    assert designs == bench_designs(), designs
    for i in range(2, res["config"]["rounds"] + 1):
        assert [r["server"] for r in res["rounds"] if r["round"] == i] == (designs[::-1] if i % 2 == 0 else designs)
    kernel = [r for r in res["rounds"] if r["server"] == "lastcall-turn+kernel"]
    # The fast path's rounds were the kernel's: every datagram to the peer counted there.
    assert all(r["kernel_to_peer"] >= 0.99 * r["peer_sentp"] > 0 for r in kernel)
    assert {r["server"] for r in res["compare"]} == {"coturn-4.18", "lastcall-turn+kernel"}


def bench_designs():
    return list(load_bench().RATE_SERVERS)


def test_the_fixed_rate_tables_replot_from_their_committed_run(tmp_path):
    """The page's "tables again" command (`bench.py --replot
    bench/turn/results/udp-workers-rt2.json --markdown ...`) runs and prints the page's
    tables: that run was saved before a field's rename, and the command failed on it."""
    import subprocess
    import sys

    out = tmp_path / "replot.md"
    subprocess.run([sys.executable, os.path.join(ROOT, "bench/turn/bench.py"), "--replot",
                    os.path.join(ROOT, "bench/turn/results/udp-workers-rt2.json"), "--markdown", str(out)],
                   check=True, capture_output=True, timeout=120)
    docs = open(os.path.join(ROOT, "docs/benchmarks.md")).read()
    assert "bench.py --replot bench/turn/results/udp-workers-rt2.json" in docs
    lines = [line for line in out.read_text().splitlines() if line.strip()]
    assert len(lines) > 20
    missing = [line for line in lines if line not in docs]
    assert not missing, "docs/benchmarks.md does not say what --replot prints:\n" + "\n".join(missing)

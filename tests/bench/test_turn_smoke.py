"""Smoke mode of the TURN benchmark (bench/turn/run.sh smoke): coturn 4.6.1 and lastcall-turn
side by side on loopback, one short round. Asserts that every figure is produced for both
servers and that neither loses a datagram at the low fixed rate. The full benchmark stays
out of the test suite (bash bench/turn/run.sh full)."""
import json
import os
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SERVERS = ("coturn", "lastcall-turn")


@pytest.mark.skipif(shutil.which("turnserver") is None, reason="coturn's turnserver is not installed")
def test_turn_bench_smoke(tmp_path):
    out = tmp_path / "smoke.json"
    # The build (debug, if not built yet) is included in the bound; the run itself takes < 1 min.
    p = subprocess.run(["bash", "bench/turn/run.sh", "smoke", "--json", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "medians" in p.stdout, p.stdout
    res = json.loads(out.read_text())
    table = res["table"]
    for figure in ("cpu_s_per_M_relayed", "max_rate_lt_0.1pct_loss", "allocs_per_s", "added_p50_us",
                   "added_p99_us", "rss_bytes_per_alloc_at_100", "rss_bytes_per_alloc_at_300"):
        assert figure in table, figure
        for s in SERVERS:
            assert table[figure][s] is not None, (figure, s, p.stdout)
        assert table[figure]["ratio"] is not None or table[figure]["coturn"] == 0, figure
        assert figure in p.stdout
    for r in res["rounds"]:
        fixed = r["fixed"]
        # Low offered rate: every datagram relayed and echoed back, both ways through the server.
        assert fixed["sent"] >= 0.9 * res["config"]["fixed_rate"] * res["config"]["duration"], fixed
        assert fixed["lost"] == 0, (r["server"], fixed)
        assert fixed["peer_rx"] == fixed["sent"], (r["server"], fixed)
        assert fixed["server_cpu_s"] is not None
        for n, a in r["allocs"].items():
            assert a["ok"] == int(n) and a["failed"] == 0, (r["server"], a)
            assert a["rss_after_kib"] > a["rss_before_kib"], (r["server"], a)
    assert {r["server"] for r in res["rounds"]} == set(SERVERS)


@pytest.mark.skipif(shutil.which("turnserver") is None, reason="coturn's turnserver is not installed")
@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel fast path loads a BPF program: root only")
def test_turn_whole_path_smoke(tmp_path):
    """--whole-path, one short round: every design but coturn 4.18 (its chroot belongs to the
    peer tests), the whole path's and the server's CPU for each, nothing lost; the fast path's
    server does (almost) nothing."""
    out = tmp_path / "whole.json"
    p = subprocess.run(["bash", "bench/turn/run.sh", "smoke", "--whole-path", "--skip", "coturn-4.18",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())
    servers = {r["server"] for r in res["rounds"]}
    assert servers == {"coturn", "lastcall-turn", "lastcall-turn+kernel"}, servers
    for r in res["rounds"]:
        for rate, ph in r["phases"].items():
            assert ph["lost"] == 0, (r["server"], ph)
            assert ph["whole_cpu_us_per_relayed"] is not None, (r["server"], ph)
            assert ph["generator_cpu_s"] is not None, (r["server"], ph)
            if r["server"] == "lastcall-turn+kernel":
                assert ph["server_cpu_s"] <= 0.05, ph

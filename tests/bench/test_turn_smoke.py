"""Smoke mode of the TURN benchmark (bench/turn/run.sh smoke): coturn 4.6.1 and lastcall-turn
side by side on loopback, one short round. Asserts that every figure is produced for both
servers and that neither loses a datagram at the low fixed rate. The full benchmark stays
out of the test suite (bash bench/turn/run.sh full)."""
import json
import os
import shutil
import subprocess

import pytest

# Paced in real time (a generator at a fixed rate, losses counted at 0.1 %): at load 19, beside
# the container tests' in-image release builds, the generator offered 1,404 of 2,000
# datagrams in a second and the smoke round found no rate without a late datagram. They run
# after the container tests (scripts/test.sh), not beside them.
pytestmark = pytest.mark.measures

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
        assert fixed["received"] == fixed["sent"], (r["server"], fixed)
        assert fixed["cpu_s"]["server"] is not None
        for n, a in r["allocs"].items():
            assert a["ok"] == int(n) and a["failed"] == 0, (r["server"], a)
            assert a["rss_after_kib"] > a["rss_before_kib"], (r["server"], a)
    assert {r["server"] for r in res["rounds"]} == set(SERVERS)


@pytest.mark.skipif(shutil.which("turnserver") is None, reason="coturn's turnserver is not installed")
@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel fast path and reflector load BPF programs: root only")
def test_turn_rate_smoke(tmp_path):
    """--rate, its quick form: one second at 2,000 datagrams/s for every design (coturn
    4.6.1 stands in for 4.18, whose chroot belongs to the peer tests; one user-space worker
    count), beside the machine's references. Each relays everything, every process's CPU is
    counted, and the fast path's share is counted from the kernel's own counters: it cannot
    fall back to user space unnoticed."""
    out = tmp_path / "rate.json"
    p = subprocess.run(["bash", "bench/turn/run.sh", "smoke", "--rate", "--skip", "coturn-4.18",
                        "--skip", "lastcall-turn-2w", "--also", "coturn", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())
    designs = {r["server"] for r in res["rounds"]}
    assert designs == {"direct-echo", "kernel-echo", "coturn", "lastcall-turn-1w", "lastcall-turn+kernel"}, designs
    for r in res["rounds"]:
        for ph in r["phases"]:
            assert ph["sent"] >= 1500 and ph["lost"] == 0, (r["server"], ph)
            assert ph["whole_us_per_datagram"] is not None, (r["server"], ph)
            assert ph["cpu_s"]["generator"] > 0, (r["server"], ph)
            if r["server"] not in ("direct-echo", "kernel-echo"):
                assert ph["cpu_s"]["server"] is not None and ph["cpu_s"]["echo"] > 0, (r["server"], ph)
        assert r["summary"]["max_rate_under_threshold"] == 2000, (r["server"], r["summary"])
    kernel = [r for r in res["rounds"] if r["server"] == "lastcall-turn+kernel"][0]
    # Every datagram to the peer went through the kernel (its counters, against the daemon's
    # live traffic counters that include them).
    assert kernel["kernel_to_peer"] >= 0.99 * kernel["peer_sentp"] > 0, kernel
    user = [r for r in res["rounds"] if r["server"] == "lastcall-turn-1w"][0]
    assert user.get("kernel_to_peer") is None, user

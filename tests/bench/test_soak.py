"""bench/spoa/soak.py's arithmetic, and the soaks in docs/benchmarks.md against the
committed samples they came from (no agent is started here)."""

import os
import shutil

from benchlib import ROOT, script

# The hour without reloads, and two hours with reloads from their plateau on an idle machine:
# the runs docs/benchmarks.md quotes (both held their bound).
NORELOAD = os.path.join(ROOT, "bench/spoa/results/2026-12-02-soak-3.0.9-mimalloc-noreload")
IDLE2H = os.path.join(ROOT, "bench/spoa/results/2026-12-02-soak-3.0.9-mimalloc-idle-2h")


def load_soak():
    return script("bench/spoa/soak.py", "soak")


def test_fit_recovers_a_linear_growth():
    soak = load_soak()
    slope, intercept = soak.fit([(t, 1000 + 0.5 * t) for t in range(0, 3600, 10)])
    assert abs(slope - 0.5) < 1e-9 and abs(intercept - 1000) < 1e-6


def test_window_medians_ignore_single_spikes():
    soak = load_soak()
    # Flat at 100 with a spike of +50 every 7th sample: every median stays 100.
    points = [(t, 150 if (t // 10) % 7 == 0 else 100) for t in range(0, 3000, 10)]
    windows = soak.medians(points, 300)
    assert len(windows) == 10
    assert {v for _, v in windows} == {100}
    assert soak.fit(windows)[0] == 0


def test_the_reload_plateau_is_judged_on_the_last_quarter():
    soak = load_soak()
    # Levels off: +17 MiB over the first 150 reloads, then flat but for noise.
    levels = [35000 + min(i, 150) * 116 + (300 if i % 2 else 0) for i in range(201)]
    assert soak.plateau_verdict(levels) == 0
    # Keeps growing: 200 KiB per reload to the end.
    grows = [35000 + 200 * i for i in range(201)]
    assert soak.plateau_verdict(grows) == 1
    assert soak.plateau_verdict(grows[:30]) == 2, "30 reloads cannot tell"


def test_the_soaks_in_the_docs_are_the_committed_runs(tmp_path):
    import json

    soak = load_soak()
    docs = open(os.path.join(ROOT, "docs/benchmarks.md")).read()
    for src, status, requests, slope, band in [
        (NORELOAD, 0, 899300, "-2.58", (46.0, 48.4)),
        (IDLE2H, 0, 2633066, "0.41", (60.0, 63.3)),
    ]:
        out = tmp_path / os.path.basename(src)
        shutil.copytree(src, out)
        assert soak.report_again(str(out)) == status, src
        summary = json.loads((out / "summary.json").read_text())
        assert summary["requests"] == requests
        assert f"{summary['slope_mb_per_h']:+.2f}" == ("+" + slope if not slope.startswith("-") else slope)
        medians = [k / 1024 for _, k in summary["window_medians_kib"]]
        assert (round(min(medians), 1), round(max(medians), 1)) == band
        assert f"{requests:,} requests" in docs
        assert f"{band[0]}-{band[1]} MiB" in docs
    assert "slope −2.58 MB/h" in docs
    assert "slope +0.41 MB/h**" in docs and "2,633,066 requests" in docs
    summary = json.loads((tmp_path / os.path.basename(IDLE2H) / "summary.json").read_text())
    lo, hi = summary["slope_ci95_mb_per_h"]
    assert f"95 % interval −{-lo:.2f} to +{hi:.2f} MB/h" in docs
    kube = open(os.path.join(ROOT, "docs/kubernetes.md")).read()
    assert f"+0.41 MB/h (95 % interval −{-lo:.2f} to +{hi:.2f} MB/h)" in kube


def test_the_slopes_interval_says_what_a_run_can_tell():
    soak = load_soak()
    assert abs(soak.t975(9) - 2.262) < 0.002 and abs(soak.t975(20) - 2.086) < 0.002
    assert soak.t975(1) == 12.706 and soak.t975(3) == 3.182
    assert abs(soak.t975(6) - 2.447) < 0.003
    # A straight line: the slope exactly, no uncertainty.
    slope, half = soak.slope_interval([(t, 1000 + 0.5 * t) for t in range(0, 3600, 300)])
    assert abs(slope - 0.5) < 1e-9 and half < 1e-9
    # Flat with an alternating band of ±1000: slope ~0, an interval that holds 0 and is wide.
    band = [(t, 50000 + (1000 if i % 2 else -1000)) for i, t in enumerate(range(0, 3300, 300))]
    slope, half = soak.slope_interval(band)
    assert abs(slope) < half and half > 0.1
    assert soak.slope_interval(band[:2])[1] == float("inf"), "two points tell nothing"

"""Smoke test of the lastcall-spoa benchmark (bench/spoa/run.sh smoke, via smoke_test.sh).

Starts the three stacks of the benchmark (HAProxy alone, HAProxy + lastcall-spoa, nginx +
ModSecurity, in front of an nginx origin, all on 127.0.0.1 with free ports), sends benign and
mixed traffic with wrk for 2 s each, and requires the expected verdicts with no errors.
Skips when HAProxy, nginx or the ModSecurity module for nginx is not installed.
"""

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULE = pathlib.Path("/usr/lib/nginx/modules/ngx_http_modsecurity_module.so")


@pytest.mark.skipif(
    not (shutil.which("haproxy") and shutil.which("nginx") and MODULE.exists()),
    reason="needs haproxy, nginx and libnginx-mod-http-modsecurity",
)
def test_spoa_benchmark_smoke():
    proc = subprocess.run(
        ["bash", str(ROOT / "bench/spoa/smoke_test.sh")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ.copy(),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "smoke: OK" in out, out[-4000:]

"""docs/benchmarks.md's CPU-per-request tables of lastcall-spoa against the committed runs
they came from (bench/spoa/results/*/...cpu-per-request.txt): each table is recomputed by
report.py's own code (`report.py --cpu`, the command the page gives) and every line must be
on the page, so a figure edited by hand, or a run replaced without its page, fails here."""

import os

from benchlib import ROOT, script

CRS4 = "bench/spoa/results/2026-12-06-crs-4.28.0-modsec-3.0.14"
CRS4_16 = "bench/spoa/results/2026-12-06-crs-4.28.0-modsec-3.0.16"
CRS3 = "bench/spoa/results/2026-12-01-haproxy-3.2-modsec-3.0.14-glibc"
TABLES = [
    [("PL1, glibc", f"{CRS4_16}/pl1-glibc-cpu-per-request.txt"),
     ("PL2, glibc", f"{CRS4_16}/pl2-glibc-cpu-per-request.txt")],
    [("PL1, glibc", f"{CRS4}/pl1-glibc-cpu-per-request.txt"),
     ("PL1, mimalloc", f"{CRS4}/pl1-mimalloc-cpu-per-request.txt"),
     ("PL2, glibc", f"{CRS4}/pl2-glibc-cpu-per-request.txt"),
     ("PL1, glibc, c681aa0", f"{CRS4}/pl1-glibc-c681aa0-cpu-per-request.txt")],
    [("CRS 3.3.7 PL1, glibc", f"{CRS3}/profile-cpu-per-request.txt")],
]


def load_report():
    return script("bench/spoa/report.py", "spoa_report")


def test_the_cpu_tables_in_the_docs_are_the_committed_runs():
    report = load_report()
    docs = open(os.path.join(ROOT, "docs/benchmarks.md")).read()
    for runs in TABLES:
        table = report.cpu_table([(label, os.path.join(ROOT, path)) for label, path in runs])
        rows = table.splitlines()
        assert len(rows) == 2 + 2 * len(runs), table  # two alternated passes per run
        missing = [row for row in rows if row not in docs]
        assert not missing, "docs/benchmarks.md does not say (report.py --cpu " + " ".join(
            f'"{label}={path}"' for label, path in runs) + " prints it):\n" + "\n".join(missing)
        for _, path in runs:
            where = os.path.dirname(path)
            assert where in docs, f"docs/benchmarks.md does not name {where}"
            assert os.path.basename(path) in docs, f"docs/benchmarks.md does not name {path}"


def test_a_pass_reads_every_stack_and_the_ratio_is_of_the_totals(tmp_path):
    f = tmp_path / "cpu-per-request.txt"
    f.write_text(
        "nginx+modsecurity: 100 requests in 10s; CPU per request: nginx 1.900 ms; origin 0.100 ms; total 2.000 ms (load1 1.00)\n"
        "haproxy+lastcall-spoa: 90 requests in 10s; CPU per request: haproxy 0.300 ms; agent 1.600 ms; origin 0.100 ms; total 2.000 ms (load1 1.50)\n"
        "haproxy+lastcall-spoa, no response group: 95 requests in 10s; CPU per request: haproxy 0.200 ms; agent 1.500 ms; origin 0.100 ms; total 1.800 ms (load1 2.00)\n")
    rows = load_report().cpu_table([("x", str(f))]).splitlines()
    assert rows[2] == "| x | 1 | 2.00 | 2.00 (0.30 / 1.60) | 1.00× | 1.80 | 0.90× | 1.00–2.00 |", rows

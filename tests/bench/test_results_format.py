"""Committed benchmark results are in the compact form bench/results.py writes (one line per
top-level key and per record), not pretty-printed: a committed JSON file must come out of
write_json byte for byte as it is."""

import glob
import json
import os

from benchlib import ROOT, script



def load_results():
    return script("bench/results.py", "results")


def test_write_json_is_one_line_per_record_and_reads_back(tmp_path):
    results = load_results()
    data = {"machine": {"nproc": 2}, "rounds": [{"round": 1, "x": [1, 2]}, {"round": 2, "x": []}], "load": [0.5, 1.5]}
    out = tmp_path / "r.json"
    results.write_json(str(out), data)
    assert json.loads(out.read_text()) == data
    assert out.read_text().splitlines() == [
        "{", '"machine":{"nproc":2},', '"rounds":[', '{"round":1,"x":[1,2]},', '{"round":2,"x":[]}', "],",
        '"load":[0.5,1.5]', "}"]


def test_committed_json_results_are_compact(tmp_path):
    results = load_results()
    files = glob.glob(os.path.join(ROOT, "bench/*/results/**/*.json"), recursive=True)
    assert files
    for path in files:
        with open(path) as f:
            text = f.read()
        out = tmp_path / "again.json"
        results.write_json(str(out), json.loads(text))
        assert out.read_text() == text, f"{os.path.relpath(path, ROOT)} is not in write_json's form"

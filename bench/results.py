"""How the benchmark scripts write a run's results: compact JSON, one line per top-level key
and one per record of a list of records, so a committed run is small and diffs by record,
and `json.load` reads it as before."""

import json


def _line(value):
    return json.dumps(value, separators=(",", ":"))


def write_json(path, result):
    """`result` (a dict) to `path`, compact."""
    lines = []
    for key, value in result.items():
        if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            lines.append(f"{_line(key)}:[\n" + ",\n".join(_line(x) for x in value) + "\n]")
        else:
            lines.append(f"{_line(key)}:{_line(value)}")
    with open(path, "w") as f:
        f.write("{\n" + ",\n".join(lines) + "\n}\n")

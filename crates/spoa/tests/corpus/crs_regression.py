#!/usr/bin/env python3
"""Prints a CRS release's regression corpus (tests/regression/tests/**/*.yaml, go-ftw's
format) as JSON lines, one per stage, for crates/spoa/tests/spoa/crs_regression.rs:

    {"name": "942100-1-0", "kind": "attack", "request_line": "POST /post HTTP/1.1",
     "raw": "<the request's bytes, in hex>"}

`kind` is `attack` when the stage expects a rule id in the log, else `benign`. The request
is built as go-ftw builds it: the request line, the headers in their order, and (unless
the stage turns `autocomplete_headers` off) `Content-Length` for a body and
`Connection: close` where missing; an `encoded_request` stage sends its bytes as given.

Usage: crs_regression.py CRS_DIR  (needs PyYAML)."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

try:
    import yaml
except ImportError:
    sys.exit("crs_regression.py needs PyYAML (pip install pyyaml)")


def request(inp: dict) -> bytes:
    if inp.get("encoded_request"):
        return base64.b64decode(inp["encoded_request"])
    method = inp.get("method", "GET")
    uri = inp.get("uri", "/")
    version = inp.get("version", "HTTP/1.1")
    headers = dict(inp.get("headers") or {})
    data = inp.get("data") or ""
    body = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else bytes(data)
    if inp.get("autocomplete_headers", True):
        names = {k.lower() for k in headers}
        if body and "content-length" not in names and "transfer-encoding" not in names:
            headers["Content-Length"] = str(len(body))
        if "connection" not in names:
            headers["Connection"] = "close"
    head = f"{method} {uri} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("utf-8", "surrogateescape") + b"\r\n" + body


def main() -> None:
    root = Path(sys.argv[1]) / "tests" / "regression" / "tests"
    if not root.is_dir():
        sys.exit(f"{root}: no regression tests (a CRS release's source tree has them)")
    for path in sorted(root.rglob("*.yaml")):
        doc = yaml.safe_load(path.read_text()) or {}
        rule = doc.get("rule_id") or path.stem
        for test in doc.get("tests") or []:
            for i, stage in enumerate(test.get("stages") or []):
                stage = stage.get("stage", stage)
                inp, out = stage.get("input") or {}, stage.get("output") or {}
                log = out.get("log") or {}
                raw = request(inp)
                line = raw.split(b"\r\n", 1)[0].decode("utf-8", "replace")
                print(json.dumps({
                    "name": f"{rule}-{test.get('test_id')}-{i}",
                    "kind": "attack" if log.get("expect_ids") else "benign",
                    "request_line": line,
                    "raw": raw.hex(),
                }))


if __name__ == "__main__":
    main()

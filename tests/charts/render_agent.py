"""Renders charts/lastcall-spoa offline (as `helm install` would) with the values given as
JSON on the command line, and prints, as JSON, what the agent container runs: the rendered
`config.yaml` of its ConfigMap and its arguments. The spoa integration tests run the agent
on exactly this (crates/spoa/tests/spoa/request_bodies.rs).

Usage: python3 tests/charts/render_agent.py '{"agent": {...}}'"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chartlib import container, render  # noqa: E402


def main() -> None:
    values = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    rendered = render("lastcall-spoa", values)
    agent = container(rendered.pod_spec(), "agent")
    config = rendered.one("ConfigMap", "-agent")["data"]["config.yaml"]
    json.dump({"config": config, "args": agent["args"]}, sys.stdout)


if __name__ == "__main__":
    main()

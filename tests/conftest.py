"""Shared by the suites under tests/: the helper modules of tests/charts, tests/images and
tests/cri on sys.path (each suite imports its neighbours' helpers by module name), the
session's private Docker engine for the container tests, and the summary of what they
measured."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

HERE = Path(__file__).resolve().parent
for sub in ("cri", "images", "charts"):
    if str(HERE / sub) not in sys.path:
        sys.path.insert(0, str(HERE / sub))

import enginelib  # noqa: E402


@pytest.fixture(scope="session")
def engine() -> Iterator[enginelib.Engine]:
    """The private dockerd with the images built (scripts/dockerd.sh, scripts/images.sh),
    stopped at the end of the session whatever happened. Needs root, as CI has."""
    if os.geteuid() != 0:
        pytest.skip("the container tests need root (dockerd, debootstrap, network namespaces); CI runs them as root")
    e = enginelib.Engine()
    try:
        e.start()
        e.build_images()
        yield e
    finally:
        e.stop()


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "containers: needs the private Docker engine (scripts/test_containers.sh runs these)")
    config.addinivalue_line("markers", "measures: needs the machine's spare CPU (a load generator paced in real time); "
                            "scripts/test.sh runs these once the container tests, which build images beside "
                            "everything, are done")


def pytest_collection_modifyitems(items: list[Any]) -> None:
    """Every test that uses the engine (directly or through a fixture) is a container test:
    scripts/test_python.sh leaves them out, scripts/test_containers.sh runs only them."""
    for item in items:
        if "engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.containers)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if enginelib.MEASURED:
        terminalreporter.section("container tests: measured")
        for line in enginelib.MEASURED:
            terminalreporter.write_line(line)

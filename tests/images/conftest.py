"""Prints what the image tests measured (exit times, libraries checked) after the run, also
under `pytest -q`."""

from __future__ import annotations

from typing import Any

import imagelib


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if imagelib.MEASURED:
        terminalreporter.section("image tests: measured")
        for line in imagelib.MEASURED:
            terminalreporter.write_line(line)

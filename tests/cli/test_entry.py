"""The program's entry (`cli/entry.py`): the collector off while toolbus starts, on again
once the command runs; a process that only imports toolbus keeps its collector as is."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

import toolbus.cli.entry  # noqa: F401 -- imported: nothing may change for the importer
from toolbus.cli.main import main

ENTERED = """
import gc, sys
import toolbus.cli.main as cli
seen = []
cli.main = lambda: seen.append(gc.isenabled()) or 0  # what the command line starts with
from toolbus.cli.entry import main
main()
print(seen)
"""


def test_importing_toolbus_leaves_the_collector_on() -> None:
    assert gc.isenabled()


def test_the_program_starts_with_the_collector_off() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", ENTERED], capture_output=True, text=True, timeout=60, check=True
    )
    assert ran.stdout.strip() == "[False]", ran.stderr[-2000:]


def test_a_command_turns_the_collector_on_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gc.disable()  # as the entry leaves it
    try:
        assert main(["schemas", "--check", "--dir", str(tmp_path)]) == 1  # none there: differ
        assert gc.isenabled()
    finally:
        gc.enable()
    capsys.readouterr()

"""The Makefile's installs, run by the real `make` in a copy of the tree (issue 30.5).

`make run` installs only what the worker needs (`pip install -e .`), `make test` the
development tools too (`.[dev]`); each has its own stamp in .venv, the dev one counting
for both, so either order installs each set once. A `PYTHON` that is not a command stops
`make run` (and `make test`) at once with one line saying so. The installs themselves are
not run here: the copy's .venv has a `pip` that only writes down what it was asked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
BOUND_S = 30
MISSING_PYTHON = "python3.99"
FAKE_PIP = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../pip.log"
"""


def make_env() -> dict[str, str]:
    """This environment without an outer make's variables (the suite may run under one)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "PYTHON"}


def make(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=tree,
        env=make_env(),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        check=False,
    )


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    """The Makefile, its scripts and pyproject.toml: a fresh clone, as far as make sees."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    return tmp_path


@pytest.fixture
def tree(bare: Path) -> Path:
    """The same with a .venv whose pip only logs what it was asked."""
    tmp_path = bare
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(shutil.which("python3") or "/usr/bin/python3")
    (bin_dir / "pip").write_text(FAKE_PIP)
    (bin_dir / "pip").chmod(0o755)
    # Older than anything the test makes: a stamp made now is newer, whatever the clock's grain.
    past = time.time() - 3600
    os.utime(tmp_path / "pyproject.toml", (past, past))
    return tmp_path


def installs(tree: Path) -> list[str]:
    log = tree / ".venv" / "pip.log"
    return log.read_text().splitlines() if log.exists() else []


def stamp(tree: Path, which: str) -> subprocess.CompletedProcess[str]:
    made = make(tree, f".venv/{which}")
    assert made.returncode == 0, made.stdout + made.stderr
    return made


def test_make_run_installs_the_worker_without_the_dev_tools(bare: Path) -> None:
    """What a fresh clone's `make run` would do (make -n): the worker, not the dev tools."""
    planned = make(bare, "-n", "run")
    assert planned.returncode == 0, planned.stderr
    assert ".venv/bin/pip install -e . " in planned.stdout, planned.stdout
    assert "[dev]" not in planned.stdout, planned.stdout
    tested = make(bare, "-n", "test")  # ...and `make test` still installs them
    assert ".venv/bin/pip install -e '.[dev]'" in tested.stdout, tested.stdout


def test_run_then_test_installs_each_set_once(tree: Path) -> None:
    shown = stamp(tree, ".installed-run")
    assert installs(tree) == ["install -e ."]
    # It says what it installs and roughly how long it takes, and pip is not quiet.
    assert "installing the worker" in shown.stdout and "110 MB" in shown.stdout
    stamp(tree, ".installed")
    assert installs(tree) == ["install -e .", "install -e .[dev]"]
    stamp(tree, ".installed-run")
    stamp(tree, ".installed")
    assert len(installs(tree)) == 2  # both up to date
    assert not any("--quiet" in line for line in installs(tree))


def test_test_then_run_installs_once(tree: Path) -> None:
    stamp(tree, ".installed")
    stamp(tree, ".installed-run")  # the dev install has the worker already
    assert installs(tree) == ["install -e .[dev]"]


def test_a_changed_pyproject_installs_again(tree: Path) -> None:
    stamp(tree, ".installed")
    future = time.time() + 3600
    os.utime(tree / "pyproject.toml", (future, future))
    stamp(tree, ".installed-run")
    assert installs(tree) == ["install -e .[dev]", "install -e ."]


@pytest.mark.parametrize("target", ["run", "test"])
def test_a_missing_python_is_one_clear_line(bare: Path, target: str) -> None:
    """No .venv yet (a fresh clone): `make run PYTHON=python3.99` stops before anything
    else, with one line naming it, not a shell's "not found" from inside a recipe."""
    started = time.monotonic()
    failed = make(bare, target, f"PYTHON={MISSING_PYTHON}")
    assert time.monotonic() - started < 5
    assert failed.returncode != 0
    ours = [line for line in failed.stderr.splitlines() if not line.startswith("make:")]
    assert len(ours) == 1, failed.stderr
    assert f"PYTHON={MISSING_PYTHON} is not a command" in ours[0]
    assert "installing" not in failed.stdout
    assert not (bare / ".venv").exists()

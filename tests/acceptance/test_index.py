"""The index (README.md here) against the tests, and, where the seeds are beside the clone,
against the seeds: every scenario has one test, and every test one scenario."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

from tests.acceptance.seeds import INDEX, SEEDS_DIR, quoted, read_index, seed_titles

ROWS = read_index()


def acceptance_tests() -> dict[str, str]:
    """`module.py::function` of every test in the seed modules, with its docstring
    (whitespace collapsed, so a quoted title may wrap)."""
    found = {}
    for path in sorted(INDEX.parent.glob("test_seed_*.py")):
        module = importlib.import_module(f"tests.acceptance.{path.stem}")
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("test_") and function.__module__ == module.__name__:
                found[f"{path.name}::{name}"] = " ".join((function.__doc__ or "").split())
    return found


def test_the_index_lists_each_scenario_once() -> None:
    assert len(ROWS) >= 60, f"the index table in {INDEX} was not read"
    keys = [(row.title, row.files) for row in ROWS]
    assert len(keys) == len(set(keys))
    assert len({row.test for row in ROWS}) == len(ROWS), "one test per scenario"


def test_each_scenario_has_exactly_one_test_quoting_it() -> None:
    tests = acceptance_tests()
    for row in ROWS:
        quoting = [
            name
            for name, doc in tests.items()
            if quoted(row.title) in doc and all(file in doc for file in row.files)
        ]
        assert quoting == [row.test], f"{row.title!r} ({', '.join(row.files)})"


def test_each_test_is_a_scenarios() -> None:
    assert set(acceptance_tests()) == {row.test for row in ROWS}


def test_a_deliberate_difference_is_said_in_both_places() -> None:
    """The index names one exactly where the test's docstring explains one."""
    tests = acceptance_tests()
    for row in ROWS:
        assert bool(row.difference) == ("Deliberate difference" in tests[row.test]), row.title


@pytest.mark.skipif(not SEEDS_DIR.is_dir(), reason="no ../shared/seeds beside this clone")
@pytest.mark.parametrize("seed", sorted(p.name for p in SEEDS_DIR.glob("*.txt")) or ["-"])
def test_every_scenario_of_a_seed_is_in_the_index(seed: str) -> None:
    titles = seed_titles(Path(SEEDS_DIR, seed))
    assert titles, f"{seed}: no scenarios found; a new kind of seed needs a rule in seeds.py"
    indexed = {row.title for row in ROWS if seed in row.files}
    assert sorted(set(titles) - indexed) == [], "scenarios missing from the index"
    assert sorted(indexed - set(titles)) == [], "indexed titles the seed does not have"

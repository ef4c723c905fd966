"""Paired runs: a bench script measured in child processes for another checkout's
`toolbus` package and for this one, alternating, so both share the machine's moment.

The other tree is put first on the child's path through a shadow folder holding only a
`toolbus` link to its package (`package_of`); this module imports nothing of toolbus, so either tree
can be the one a child loads. Each child prints one JSON object on its standard output.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent


def paired_parser(doc: str | None, *, repeat: int) -> argparse.ArgumentParser:
    """A bench script's parser with the options every paired script has: `--worker-tree`
    (the other checkout), `--repeat` (runs of each) and the hidden `--child`."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--worker-tree", type=Path, help="also measure DIR/worker, as before")
    parser.add_argument("--repeat", type=int, default=repeat, help="with --worker-tree")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser


def package_of(tree: Path) -> Path:
    """The `toolbus` package of a checkout: worker/toolbus/ (src layout), or worker/ itself
    in checkouts from before it."""
    nested = tree / "worker" / "toolbus"
    return nested if (nested / "__init__.py").is_file() else tree / "worker"


def alternate(
    script: str, tree: Path, args: Sequence[str], *, repeat: int, timeout_s: float
) -> tuple[list[Any], list[Any]]:
    """`script --child *args` `repeat` times for `tree`, then this checkout, in turn:
    what each child printed (parsed), before (the other tree) and after (this one)."""
    before: list[Any] = []
    after: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="toolbus-paired-tree-") as shadow:
        (Path(shadow) / "toolbus").symlink_to(package_of(tree.resolve()))  # imported first
        runs = [
            (before, {**os.environ, "PYTHONPATH": os.pathsep.join([shadow, str(ROOT)])}),
            # This checkout's package first too: run from a second worktree, the venv's
            # editable install would import the first one's instead.
            (
                after,
                {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "worker"), str(ROOT)])},
            ),
        ]
        for _ in range(repeat):
            for outputs, env in runs:
                child = subprocess.run(
                    [sys.executable, script, "--child", *args],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=timeout_s,
                )
                outputs.append(json.loads(child.stdout))
    return before, after


def print_paired(
    title: str,
    first: str,
    names: Sequence[str],
    outputs: tuple[list[Any], list[Any]],
    *,
    tree: Path,
    repeat: int,
) -> None:
    """Each figure's median over `alternate`'s children (each printed an object of
    figures in µs, `names` among its keys), the other tree's beside this checkout's."""
    theirs, ours = ({n: [run[n] for run in runs] for n in names} for runs in outputs)
    table = Table(title=f"{title}, median of {repeat} processes each")
    for column in (first, f"{tree} µs", "this checkout µs", "difference µs"):
        table.add_column(column, justify="left" if column == first else "right")
    for name in names:
        before, after = statistics.median(theirs[name]), statistics.median(ours[name])
        table.add_row(name, f"{before:.1f}", f"{after:.1f}", f"{after - before:+.1f}")
    Console().print(table)

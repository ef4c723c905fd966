"""Imports run down the layers only: no circle, no import from a lower layer back up.

Every module's imports are read with ast: module level, inside functions, and under
`if TYPE_CHECKING:` too (a type-only import upward is still a lower layer knowing a higher
one; where one is needed, the lower layer declares a Protocol instead). The one exception is
the package root `toolbus/__init__.py`: the public facade, which imports lazily; modules may
take `__version__` from it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SOURCE = ROOT / "worker" / "toolbus"

# The layer order, bottom to top, written once. Packages in one tier may not import each other.
TIERS: list[set[str]] = [
    {"wire"},
    {"transport", "config", "observability", "dedup"},
    {"tools"},
    {"normalization", "backends"},
    {"calls"},
    {"doors"},
    {"worker", "client"},
    {"cli"},
]


def module_name(source: Path, path: Path) -> str:
    parts = ["toolbus", *path.relative_to(source).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: Path) -> Iterator[tuple[Path, str, Path, int]]:
    """(importer file, imported module, imported file, line) for every toolbus import."""
    files = {module_name(source, p): p for p in source.rglob("*.py")}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            for wanted in targets:
                found = wanted  # `toolbus.x.Name` is the module `toolbus.x`
                while found not in files and "." in found:
                    found = found.rpartition(".")[0]
                if found in files and found != name:
                    yield path, found, files[found], node.lineno


def group(source: Path, path: Path) -> str | None:
    parts = path.relative_to(source).parts
    return parts[0] if len(parts) > 1 else None  # None: the root's own files


def tier(group_name: str) -> int:
    return next(i for i, names in enumerate(TIERS) if group_name in names)


def upward(source: Path) -> list[str]:
    found = []
    for path, target, target_path, line in imports(source):
        if path == source / "__init__.py" or target == "toolbus":
            continue  # the facade, and `from toolbus import __version__`
        mine, theirs = group(source, path), group(source, target_path)
        if mine is None or theirs is None or mine == theirs:
            continue
        if tier(theirs) >= tier(mine):
            found.append(
                f"{path.relative_to(source)}:{line} ({mine}) imports "
                f"{target_path.relative_to(source)} ({theirs}): not below it"
            )
    return found


def circles(source: Path) -> list[str]:
    graph: dict[Path, set[Path]] = {}
    for path, _, target_path, _ in imports(source):
        if path != source / "__init__.py":
            graph.setdefault(path, set()).add(target_path)
    found, done = [], set()

    def walk(node: Path, trail: list[Path]) -> None:
        if node in trail:
            cycle = [*trail[trail.index(node) :], node]
            found.append(" -> ".join(str(p.relative_to(source)) for p in cycle))
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            walk(nxt, [*trail, node])
        done.add(node)

    for start in sorted(graph):
        walk(start, [])
    return found


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in SOURCE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set().union(*TIERS)


def test_no_import_circle() -> None:
    assert circles(SOURCE) == []


def test_imports_run_down() -> None:
    assert upward(SOURCE) == []


def test_a_planted_upward_import_fails(tmp_path: Path) -> None:
    """The check can fail: a wire module importing the worker, and a circle, are both named."""
    for folder in ("wire", "worker"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "wire" / "topics.py").write_text("from toolbus.worker.service import Worker\n")
    (tmp_path / "worker" / "service.py").write_text("from toolbus.wire import topics\n")
    assert upward(tmp_path) == [
        "wire/topics.py:1 (wire) imports worker/service.py (worker): not below it"
    ]
    assert circles(tmp_path) != []


@pytest.mark.parametrize("package", sorted(set().union(*TIERS)))
def test_each_package_says_what_it_may_import(package: str) -> None:
    doc = ast.get_docstring(ast.parse((SOURCE / package / "__init__.py").read_text())) or ""
    assert "May import" in doc

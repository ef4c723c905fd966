"""The code's shape, checked: libraries at the edge, module and class sizes, lint pragmas.

These are the house rules a review would otherwise have to catch by reading: aiomqtt only
in the transport, the mcp SDK only in the MCP backend (and both in the bench's baselines),
no module over 400 lines, the `Worker` class under 220, and a reason on every `noqa`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SOURCE = ROOT / "worker" / "toolbus"
MAX_MODULE_LINES = 400
MAX_WORKER_LINES = 220


def modules() -> list[Path]:
    return sorted(SOURCE.rglob("*.py"))


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize(
    ("library", "allowed"),
    [
        # The bench's load generator and baselines are peers of the product (a client, a
        # bare aiomqtt responder, a raw mcp SDK user), not its transport or its backend:
        # they use the libraries directly, as what toolbus is compared against must.
        ("aiomqtt", {"transport/", "cli/bench/"}),
        ("paho", {"transport/", "cli/bench/"}),
        # The demo server is an MCP server, not part of the worker.
        ("mcp", {"backends/mcp", "cli/demo/", "cli/bench/"}),
        ("mcp_types", {"backends/mcp"}),
        # The HTTP listener is the one web server (the demo server's is the SDK's).
        ("starlette", {"worker/http.py"}),
        ("uvicorn", {"worker/http.py"}),
    ],
)
def test_third_party_libraries_stay_at_the_edge(library: str, allowed: set[str]) -> None:
    offenders = [
        str(path.relative_to(SOURCE))
        for path in modules()
        if library in imported_roots(path)
        and not any(str(path.relative_to(SOURCE)).startswith(prefix) for prefix in allowed)
    ]
    assert offenders == []


def test_no_module_is_over_400_lines() -> None:
    sizes = {str(p.relative_to(SOURCE)): len(p.read_text().splitlines()) for p in modules()}
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_the_worker_class_is_under_220_lines() -> None:
    tree = ast.parse((SOURCE / "worker" / "service.py").read_text())
    [worker] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Worker"]
    assert worker.end_lineno is not None
    assert worker.end_lineno - worker.lineno + 1 < MAX_WORKER_LINES


NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)$")


def test_every_noqa_says_why() -> None:
    """`# noqa: CODE -- reason`: a suppression nobody can explain is a bug kept quiet."""
    bare = []
    for path in [*modules(), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = NOQA.search(line)
            if match and not re.match(r":\s*[A-Z0-9, ]+ -- \S", match["rest"]):
                bare.append(f"{path.relative_to(ROOT)}:{number}")
    assert bare == []


def test_every_module_is_in_the_architecture_map() -> None:
    table = (ROOT / "docs" / "architecture.md").read_text()
    missing = [
        name
        for path in modules()
        if path.name not in {"__init__.py", "__main__.py"}
        and f"`{(name := str(path.relative_to(SOURCE)))}`" not in table
    ]
    assert missing == []

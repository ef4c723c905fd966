"""The names other packages import from `toolbus`, and the package as installed."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import toolbus

ROOT = Path(__file__).parents[2]
SOURCE = ROOT / "worker" / "toolbus"


def test_exported_names() -> None:
    assert sorted(toolbus.__all__) == [
        "BrokerUrl",
        "CallsReply",
        "Client",
        "ErrorCode",
        "LocalTool",
        "NoReply",
        "Progress",
        "Reply",
        "ReplyFormat",
        "Request",
        "Retry",
        "ToolbusError",
        "ToolsFormat",
        "__version__",
        "elicit",
        "progress",
        "tool",
    ]
    assert toolbus.__version__ != "0.0.0"  # installed, so the version comes from the metadata


def test_every_source_folder_is_a_package_the_wheel_takes() -> None:
    """setuptools finds packages (`[tool.setuptools.packages.find]` under worker/): a folder
    of modules without `__init__.py` would be missing from the wheel and the image."""
    folders = {path.parent for path in SOURCE.rglob("*.py")}
    assert sorted(str(f) for f in folders if not (f / "__init__.py").is_file()) == []
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert found["packages"]["find"] == {"where": ["worker"], "include": ["toolbus*"]}


def test_nothing_imports_the_folder_name(tmp_path: Path) -> None:
    """Every module imports as `toolbus.*`; none as `worker.*` (a caller's own `worker.py`
    would shadow it)."""
    modules = [
        "toolbus."
        + ".".join(path.relative_to(SOURCE).with_suffix("").parts).removesuffix(".__init__")
        for path in sorted(SOURCE.rglob("*.py"))
        if path.name != "__main__.py"
    ]
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name.removesuffix('.'))\n"
        "print(sorted(m for m in sys.modules if m == 'worker' or m.startswith('worker.')))\n"
    )
    # From an empty directory: the checkout's root (where `worker/` is a folder) is not on the path.
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_version_on_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "toolbus", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == f"toolbus {toolbus.__version__}"

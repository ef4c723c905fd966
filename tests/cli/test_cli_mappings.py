"""`toolbus mappings NAME` writes a tool's defaults and enum values as JSON, as the rest
of its table is written (`false`, `null`, `"on"`), not as Python (`False`, `None`, `on`).
The tool is a package's, loaded by its entry point as `toolbus serve` loads it; the
command line runs as a subprocess.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.cli.test_cli import cli_env, run_cli
from toolbus.backends.local.functions import ENTRY_POINT_GROUP

TOOL = '''
from typing import Literal

from toolbus import tool


@tool
async def dim(
    room: str,
    fade: bool = False,
    scene: str | None = None,
    mode: Literal["on", "off"] = "on",
    level: float = 0.5,
) -> str:
    """Dim a room."""
    return room
'''


async def test_defaults_and_enums_are_json(tmp_path: Path) -> None:
    (tmp_path / "dimmer.py").write_text(TOOL)
    dist = tmp_path / "dimmer-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: dimmer\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ndim = dimmer:dim\n")
    env = cli_env("unused")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    code, out, err = await run_cli("mappings", "dim", env=env)
    assert code == 0, err
    rows = {
        line.split(" | ")[0].split("`")[1]: line
        for line in out.splitlines()
        if line.startswith("| `")
    }
    assert rows["fade"].endswith("| `false` |"), rows["fade"]
    assert rows["level"].endswith("| `0.5` |"), rows["level"]
    assert rows["mode"].endswith('| `"on"` |'), rows["mode"]
    assert '(`"on"`, `"off"`)' in rows["mode"]  # the enum, as JSON too
    assert "False" not in out and "None" not in out

"""Wire contracts: schemas on disk match the code; error codes map one to one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from toolbus.wire.contracts import ErrorCode, check_schemas, write_schemas
from toolbus.wire.errors import ERROR_CLASSES, ToolbusError

ROOT = Path(__file__).parents[2]


def test_schemas_check_passes_on_the_repo() -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "toolbus", "schemas", "--check"),
            *("--dir", str(ROOT / "schemas"), "--asyncapi", str(ROOT / "docs" / "asyncapi.yaml")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_schemas_check_detects_drift(tmp_path: Path) -> None:
    write_schemas(tmp_path)
    assert check_schemas(tmp_path) == []
    (tmp_path / "reply.json").write_text("{}")
    (tmp_path / "request.json").unlink()
    assert sorted(check_schemas(tmp_path)) == ["reply.json", "request.json"]
    result = subprocess.run(
        [sys.executable, "-m", "toolbus", "schemas", "--check", "--dir", str(tmp_path)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1


def test_every_error_code_has_exactly_one_class() -> None:
    assert set(ERROR_CLASSES) == set(ErrorCode)
    assert len({cls.code for cls in ToolbusError.__subclasses__()}) == len(
        ToolbusError.__subclasses__()
    )
    for code, cls in ERROR_CLASSES.items():
        assert cls("m").body().code is code


def test_every_error_code_is_documented() -> None:
    doc = (ROOT / "docs" / "error-codes.md").read_text()
    for code in ErrorCode:
        assert f"`{code.value}`" in doc, code

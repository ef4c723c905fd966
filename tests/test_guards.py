"""Input guards (normalization/guards.py), through the executor that reads their settings."""

from __future__ import annotations

from typing import Any

import pytest

from tests.normalize_cases import (
    ANALYSIS_SCHEMA,
    ANALYSIS_SETTINGS,
    analysis_context,
    mcp_tool,
    run,
)
from toolbus.config import Settings
from toolbus.contracts import ErrorCode


@pytest.mark.parametrize(
    ("override", "rule"),
    [
        ({"code_scope": {"files": ["../../etc/passwd"]}}, "path_traversal"),
        ({"code_scope": {"files": ["/etc/passwd"]}}, "path_outside_roots"),
        ({"stuck_description": "x" * 2001}, "max_string_length"),
        ({"attempted_approaches": ["a"] * 101}, "max_array_length"),
        ({"stuck_description": "bell\x07"}, "forbidden_characters"),
    ],
)
async def test_analysis_context_guards(override: dict[str, Any], rule: str) -> None:
    outcome = await run(
        ANALYSIS_SETTINGS, mcp_tool("analyze_code", ANALYSIS_SCHEMA), analysis_context(**override)
    )
    assert outcome.error is not None and outcome.error.code is ErrorCode.INVALID_ARGUMENTS
    assert [v["rule"] for v in outcome.error.details["violations"]] == [rule]


async def test_string_of_exactly_the_limit_passes() -> None:
    outcome = await run(
        ANALYSIS_SETTINGS,
        mcp_tool("analyze_code", ANALYSIS_SCHEMA),
        analysis_context(stuck_description="x" * 2000),
    )
    assert outcome.ok


async def test_depth_and_size_guards() -> None:
    settings = Settings.model_validate({"guards": {"max_depth": 3, "max_argument_bytes": 100}})
    deep = await run(settings, mcp_tool("other"), {"a": {"b": {"c": {}}}})
    assert deep.error is not None and [v["rule"] for v in deep.error.details["violations"]] == [
        "max_depth"
    ]
    big = await run(settings, mcp_tool("other"), {"deviceName": "x" * 200})
    assert big.error is not None and [v["rule"] for v in big.error.details["violations"]] == [
        "max_argument_bytes"
    ]

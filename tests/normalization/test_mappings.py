"""The mappings document (normalization/mappings.py): what `toolbus mappings` prints."""

from __future__ import annotations

from tests.support.normalize_cases import (
    ANALYSIS_SCHEMA,
    ANALYSIS_SETTINGS,
    mcp_tool,
    registry_with,
)
from toolbus.config import Settings
from toolbus.normalization.mappings import render
from toolbus.worker.wiring import build_executor


def test_mappings_document_the_analysis_example() -> None:
    registry = registry_with(
        mcp_tool("analyze_code", ANALYSIS_SCHEMA), aliases={"analyze": "analyze_code"}
    )
    text = render(registry, build_executor(ANALYSIS_SETTINGS, registry).normalizer, "Analyze")
    assert text.startswith("## analyze_code")
    assert "`analyze` (alias)" in text
    assert (
        "| `analysisContext.stuckPoints` | array | `stuckPoints`, `stuck_description` (static map)"
        in text
    )
    assert "| `analysisContext.partialFindings[].confidence` | number |" in text
    assert "(wrap_array)" in text


def test_mappings_name_number_to_string_only_where_no_number_is_accepted() -> None:
    registry = registry_with(mcp_tool())
    text = render(registry, build_executor(Settings(), registry).normalizer, None)
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| `")}
    assert "(number_to_string)" in rows["| `deviceName` (required)"]
    assert "(number_to_string)" not in rows["| `level`"]

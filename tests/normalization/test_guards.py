"""Input guards (normalization/guards.py), through the executor that reads their settings."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.normalize_cases import (
    ANALYSIS_SCHEMA,
    ANALYSIS_SETTINGS,
    analysis_context,
    mcp_tool,
    run,
)
from toolbus.config import DEFAULT_FORBIDDEN_PATTERN, Settings
from toolbus.wire.contracts import ErrorCode


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


# -- forbidden patterns add up -------------------------------------------------------


TWO_STRINGS = {
    "type": "object",
    "properties": {"deviceName": {"type": "string"}, "action": {"type": "string"}},
}


def _forbidden_config(guards: dict[str, Any], tool_guards: dict[str, Any]) -> Settings:
    return Settings.model_validate(
        {
            "guards": guards,
            "tools": {
                "other": {
                    "guards": tool_guards,
                    "parameters": {"deviceName": {"forbidden_pattern": "[;|]"}},
                }
            },
        }
    )


async def _refused_by(settings: Settings, arguments: dict[str, Any]) -> list[tuple[str, str]]:
    outcome = await run(settings, mcp_tool("other", TWO_STRINGS), arguments)
    if outcome.error is None:
        return []
    assert outcome.error.code is ErrorCode.INVALID_ARGUMENTS
    return [(v["path"], v["pattern"]) for v in outcome.error.details["violations"]]


@pytest.mark.parametrize("global_pattern", [{}, {"forbidden_pattern": "<script"}])
async def test_patterns_of_every_level_add_to_the_control_character_default(
    global_pattern: dict[str, Any],
) -> None:
    settings = _forbidden_config(global_pattern, {"forbidden_pattern": "`"})
    default = DEFAULT_FORBIDDEN_PATTERN
    # The parameter's own pattern, the tool's and the default all hold for the parameter.
    assert await _refused_by(settings, {"deviceName": "a;b"}) == [("arguments.deviceName", "[;|]")]
    assert await _refused_by(settings, {"deviceName": "a`b"}) == [("arguments.deviceName", "`")]
    assert await _refused_by(settings, {"deviceName": "a\x07b"}) == [
        ("arguments.deviceName", default)
    ]
    # Another parameter of the tool: the tool's pattern and the default, not the parameter's.
    assert await _refused_by(settings, {"action": "a;b"}) == []
    assert await _refused_by(settings, {"action": "a\x1bb"}) == [("arguments.action", default)]
    if global_pattern:
        assert await _refused_by(settings, {"action": "<script>"}) == [
            ("arguments.action", "<script")
        ]


async def test_an_empty_global_pattern_is_the_one_way_to_lift_the_default() -> None:
    settings = _forbidden_config({"forbidden_pattern": ""}, {})
    assert await _refused_by(settings, {"action": "bell\x07"}) == []
    assert await _refused_by(settings, {"deviceName": "a|b"}) == [("arguments.deviceName", "[;|]")]
    # An empty pattern lower down lifts nothing.
    kept = _forbidden_config({}, {"forbidden_pattern": ""})
    assert await _refused_by(kept, {"action": "bell\x07"}) == [
        ("arguments.action", DEFAULT_FORBIDDEN_PATTERN)
    ]


async def test_patterns_that_cannot_share_one_search_still_hold_alone() -> None:
    # A backreference counts groups and an inline flag must lead its pattern: neither
    # can join the others in one alternation, so each is searched on its own.
    settings = Settings.model_validate(
        {
            "tools": {
                "other": {
                    "guards": {"forbidden_pattern": "(?i)drop"},
                    "parameters": {"deviceName": {"forbidden_pattern": r"(.)\1\1"}},
                }
            }
        }
    )
    assert await _refused_by(settings, {"deviceName": "aaa"}) == [
        ("arguments.deviceName", r"(.)\1\1")
    ]
    assert await _refused_by(settings, {"action": "aaa"}) == []
    assert await _refused_by(settings, {"action": "DROP it"}) == [("arguments.action", "(?i)drop")]
    assert await _refused_by(settings, {"action": "a\x07"}) == [
        ("arguments.action", DEFAULT_FORBIDDEN_PATTERN)
    ]


async def test_of_several_patterns_found_the_first_in_level_order_is_reported() -> None:
    settings = _forbidden_config({}, {"forbidden_pattern": "`"})
    assert await _refused_by(settings, {"deviceName": ";`\x07"}) == [
        ("arguments.deviceName", DEFAULT_FORBIDDEN_PATTERN)
    ]
    assert await _refused_by(settings, {"deviceName": ";`"}) == [("arguments.deviceName", "`")]


# -- lenient arrays: which items are dropped -----------------------------------------

LENIENT = Settings.model_validate(
    {"tools": {"other": {"parameters": {"items": {"lenient": True}}}}}
)


async def _dropped(schema: dict[str, Any], items: list[Any]) -> list[str]:
    outcome = await run(LENIENT, mcp_tool("other", schema), {"items": items})
    assert outcome.ok, outcome.error and outcome.error.details
    return [e.from_ for e in outcome.normalized if e.rule == "lenient_drop"]


@pytest.mark.parametrize(
    ("draft", "dropped"),
    [
        ("http://json-schema.org/draft-07/schema#", []),  # `dependentRequired` is unknown
        ("https://json-schema.org/draft/2020-12/schema", ["invalid (dependentRequired)"]),
    ],
)
async def test_lenient_items_are_judged_in_the_schemas_own_draft(
    draft: str, dropped: list[str]
) -> None:
    schema = {
        "$schema": draft,
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"type": "object", "dependentRequired": {"a": ["b"]}},
            }
        },
    }
    assert await _dropped(schema, [{"a": 1, "b": 2}, {"a": 1}]) == dropped


async def test_lenient_items_may_refer_to_the_rest_of_the_schema() -> None:
    schema = {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Finding"}}},
        "$defs": {"Finding": {"type": "object", "required": ["finding"]}},
    }
    assert await _dropped(schema, [{"finding": "x"}, {"confidence": 1}]) == ["invalid (required)"]

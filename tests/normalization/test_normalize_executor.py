"""Normalization through the whole executor: the analysis example, validation, caller profiles."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.normalize_cases import (
    ANALYSIS_SCHEMA,
    ANALYSIS_SETTINGS,
    analysis_context,
    mcp_tool,
    registry_with,
    run,
)
from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.calls.call import Call
from toolbus.config import Settings
from toolbus.wire.contracts import ErrorCode, ToolList
from toolbus.worker.wiring import build_executor, build_registry


async def test_analysis_context_example() -> None:
    outcome = await run(
        ANALYSIS_SETTINGS, mcp_tool("analyze_code", ANALYSIS_SCHEMA), analysis_context()
    )
    assert outcome.ok, outcome.error and outcome.error.details
    assert outcome.result is not None
    assert outcome.result.structured == {
        "analysisContext": {
            "attemptedApproaches": ["restarted the service", "read the logs"],
            "partialFindings": [{"finding": "cache misses", "confidence": 0.7}],
            "stuckPoints": ["cannot reproduce locally"],
            "focusArea": {
                # The relative path anchored to the allowed root: the tool cannot read it
                # against a working directory of its own.
                "files": ["/srv/repo/src/cache.py", "/srv/repo/app.py"],
                "entryPoints": ["main"],
                "serviceNames": ["api"],
            },
        }
    }
    rules = [(e.path, e.rule) for e in outcome.normalized]
    assert ("arguments.analysisContext.attempted_approaches", "snake_to_camel") in rules
    assert ("arguments.analysisContext.stuck_description", "static_map") in rules
    assert ("arguments.analysisContext.code_scope", "static_map") in rules
    assert ("arguments.analysisContext.stuckPoints", "wrap_array") in rules
    assert ("arguments.analysisContext.partialFindings[0].confidence", "string_to_number") in rules
    assert ("arguments.analysisContext.focusArea.files[0]", "path_canonical") in rules
    assert ("arguments.analysisContext.focusArea.files[1]", "path_canonical") not in rules
    dropped = [p for p, r in rules if r == "lenient_drop"]
    assert dropped == [
        "arguments.analysisContext.partialFindings[1]",
        "arguments.analysisContext.partialFindings[2]",
    ]


async def test_validation_lists_every_problem_and_the_parameters() -> None:
    # A boolean is no number: it stays, and the schema refuses it.
    outcome = await run(Settings(), mcp_tool(), {"deviceName": True, "action": "explode"})
    assert outcome.error is not None and outcome.error.code is ErrorCode.INVALID_ARGUMENTS
    assert {e["path"] for e in outcome.error.details["errors"]} == {"deviceName", "action"}
    assert outcome.error.details["parameters"] == SEED_PARAMETERS
    assert "parameters_omitted" not in outcome.error.details
    signature = {p["name"]: p for p in outcome.error.details["signature"]}
    assert (
        signature["action"]["enum"] == ["on", "off", "dim"]
        and signature["deviceName"]["required"] is True
    )


SEED_PARAMETERS = [
    {"name": "deviceName", "type": "string", "required": True},
    {"name": "action", "type": "string", "required": True, "enum": ["on", "off", "dim"]},
    {"name": "level", "type": "integer|null", "required": False},
    {"name": "newParameterName", "type": "string", "required": False},
]


@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        ({"deviceName": "a", "DeviceName": "b", "action": "on"}, "conflict"),  # normalization
        ({"deviceName": "x" * 3000, "action": "on"}, "violations"),  # a value guard
        ({"deviceName": [[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]}, "violations"),  # size/depth
    ],
    ids=["conflict", "max_string_length", "max_depth"],
)
async def test_every_refusal_of_arguments_lists_the_parameters(
    arguments: dict[str, Any], detail: str
) -> None:
    outcome = await run(Settings(), mcp_tool(), arguments)
    assert outcome.error is not None and outcome.error.code is ErrorCode.INVALID_ARGUMENTS
    assert detail in outcome.error.details
    assert outcome.error.details["parameters"] == SEED_PARAMETERS


async def test_a_tool_refusing_its_own_arguments_lists_the_parameters() -> None:
    registry = build_registry(BUILTIN_TOOLS, Settings())
    outcome = await build_executor(Settings(), registry).execute(
        Call(id="1", tool="datetime", arguments={"timezone": "Mars/Olympus"}, topic="t")
    )
    assert outcome.error is not None and outcome.error.code is ErrorCode.INVALID_ARGUMENTS
    assert outcome.error.details["parameter"] == "timezone"  # the tool's own detail stays
    assert outcome.error.details["parameters"] == [
        {"name": "timezone", "type": "string|null", "required": False}
    ]


async def test_parameters_are_built_once_per_tool_and_follow_the_registry() -> None:
    registry = registry_with(mcp_tool())
    executor = build_executor(Settings(), registry)
    built = registry.resolve("control_zwave_device").tool.parameters
    refused = Call(id="1", tool="control_zwave_device", arguments={"action": "on"}, topic="t")
    first, second = await executor.execute(refused), await executor.execute(refused)
    assert first.error is not None and second.error is not None
    first.error.details["parameters"].clear()  # one reply's details are its own
    assert second.error.details["parameters"] == SEED_PARAMETERS
    assert registry.resolve("control_zwave_device").tool.parameters is built
    # An MCP server announcing a changed schema: the next refusal lists the new parameters.
    changed = {"type": "object", "properties": {"room": {"type": "string"}}, "required": ["room"]}
    registry.register(mcp_tool(schema=changed))
    third = await executor.execute(refused)
    assert third.error is not None
    assert third.error.details["parameters"] == [
        {"name": "room", "type": "string", "required": True}
    ]


async def test_a_number_for_a_string_reaches_the_tool_as_text() -> None:
    outcome = await run(Settings(), mcp_tool(), {"device_name": 1234, "action": "on"})
    assert outcome.ok, outcome.error and outcome.error.details
    assert outcome.result is not None
    assert outcome.result.structured == {"deviceName": "1234", "action": "on"}
    assert [(c.path, c.rule) for c in outcome.normalized] == [
        ("arguments.device_name", "snake_to_camel"),
        ("arguments.deviceName", "number_to_string"),
    ]


# -- callers ---------------------------------------------------------------------


async def test_caller_profiles() -> None:
    settings = Settings.model_validate(
        {"callers": {"kitchen": {"tools": ["ControlZwaveDevice", "nope"]}}}
    )
    registry = registry_with(mcp_tool(), mcp_tool("other"))
    executor = build_executor(settings, registry)
    assert executor.access.unknown == {"kitchen": ["nope"]}
    allowed = await executor.execute(
        Call(
            id="1",
            tool="control_zwave_device",
            arguments={"deviceName": "a", "action": "on"},
            topic="t",
            caller="kitchen",
        )
    )
    assert allowed.ok
    refused = await executor.execute(
        Call(id="2", tool="other", arguments={}, topic="t", caller="kitchen")
    )
    assert refused.error is not None and refused.error.code is ErrorCode.FORBIDDEN
    stranger = await executor.execute(
        Call(
            id="3",
            tool="other",
            arguments={"deviceName": "a", "action": "on"},
            topic="t",
            caller="garage",
        )
    )
    assert stranger.ok  # no profile of its own and no `*` profile: unrestricted
    listed = executor.list_tools("kitchen").result
    assert listed is not None
    # Read as a caller reads it, through the wire contract: that also types the listing.
    listing = ToolList.model_validate(listed.structured)
    assert [t.name for t in listing.tools] == ["control_zwave_device"]


async def test_caller_from_topic_path() -> None:
    settings = Settings.model_validate(
        {"callers": {"*": {"tools": ["other"]}, "kitchen": {"tools": ["control_zwave_device"]}}}
    )
    executor = build_executor(settings, registry_with(mcp_tool(), mcp_tool("other")))
    via_topic = await executor.execute(
        Call(
            id="1",
            tool="kitchen/control_zwave_device",
            arguments={"deviceName": "a", "action": "on"},
            topic="t",
            topic_path=True,
        )
    )
    assert via_topic.ok and via_topic.tool == "control_zwave_device"
    default_profile = await executor.execute(
        Call(
            id="2",
            tool="control_zwave_device",
            arguments={"deviceName": "a", "action": "on"},
            topic="t",
        )
    )
    assert default_profile.error is not None and default_profile.error.code is ErrorCode.FORBIDDEN

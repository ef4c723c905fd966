"""The normalization engine, stage by stage and through the whole pipeline."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.logwait import watching
from toolbus.config import NO_TOOL_SETTINGS, Settings, ToolSettings, tool_settings
from toolbus.contracts import ErrorCode, ToolResult
from toolbus.decode import Call
from toolbus.errors import InvalidArguments, UnknownTool
from toolbus.execute import Outcome
from toolbus.normalization.normalize import Normalizer, camel_to_snake, snake_to_camel
from toolbus.registry import Registry, Tool
from toolbus.wiring import build_executor

SCHEMA = {
    "type": "object",
    "properties": {
        "deviceName": {"type": "string"},
        "action": {"type": "string", "enum": ["on", "off", "dim"]},
        "level": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
        "newParameterName": {"type": "string"},
    },
    "required": ["deviceName", "action"],
}
SEED_MAP = {
    "control_zwave_device": {
        "device_name": "deviceName",
        "command": "action",
        "brightness": "level",
    }
}


async def _echo_arguments(arguments: dict[str, Any]) -> ToolResult:
    return ToolResult(structured=arguments)


def mcp_tool(
    name: str = "control_zwave_device",
    schema: dict[str, Any] | None = None,
    settings: ToolSettings = NO_TOOL_SETTINGS,
) -> Tool:
    return Tool(
        name=name,
        description="",
        input_schema=schema or SCHEMA,
        invoke=_echo_arguments,
        origin="mcp:zwave",
        server="zwave",
        rename_arguments=True,
        settings=settings,
    )


def normalize(
    tool: Tool, arguments: dict[str, Any], maps: dict[str, dict[str, str]] | None = None
) -> tuple[dict[str, Any], list[tuple[str, str, str, str]]]:
    out, report = Normalizer(SEED_MAP if maps is None else maps).arguments(tool, arguments)
    return out, [(e.path, e.from_, e.to, e.rule) for e in report]


# -- the seed scenarios, verbatim -------------------------------------------------


def test_seed_static_map() -> None:
    out, report = normalize(mcp_tool(), {"device_name": "Switch One", "command": "on"})
    assert out == {"deviceName": "Switch One", "action": "on"}
    assert report == [
        ("arguments.device_name", "device_name", "deviceName", "static_map"),
        ("arguments.command", "command", "action", "static_map"),
    ]


def test_seed_snake_to_camel_and_level_unchanged() -> None:
    out, report = normalize(mcp_tool("other"), {"new_parameter_name": "x", "level": 5})
    assert out == {"newParameterName": "x", "level": 5}
    assert report == [
        ("arguments.new_parameter_name", "new_parameter_name", "newParameterName", "snake_to_camel")
    ]


def test_seed_local_tools_unchanged() -> None:
    local = Tool(name="echo", description="", input_schema=SCHEMA, invoke=_echo_arguments)
    out, report = normalize(local, {"device_name": "a", "Level": "5"})
    assert out == {"device_name": "a", "Level": "5"} and report == []


@pytest.mark.parametrize(
    ("snake", "camel"), [("device_name", "deviceName"), ("a_b_c", "aBC"), ("plain", "plain")]
)
def test_case_helpers(snake: str, camel: str) -> None:
    assert snake_to_camel(snake) == camel
    assert camel_to_snake("deviceName") == "device_name"


# -- spellings, both directions ----------------------------------------------------

SNAKE_SCHEMA = {
    "type": "object",
    "properties": {
        "ticket_title": {"type": "string"},
        "assignee_name": {"type": "string"},
        "due_in_days": {"type": "integer"},
    },
}


def test_camel_pascal_kebab_to_snake() -> None:
    tool = mcp_tool("create_ticket", SNAKE_SCHEMA)
    out, report = normalize(tool, {"ticketTitle": "t", "AssigneeName": "a", "due-in-days": 3})
    assert out == {"ticket_title": "t", "assignee_name": "a", "due_in_days": 3}
    assert [r[3] for r in report] == ["camel_to_snake", "camel_to_snake", "spelling"]


def test_heuristic_only_for_undeclared_keys_of_open_camel_objects() -> None:
    out, _ = normalize(mcp_tool("other"), {"max_results": 3})
    assert out == {"maxResults": 3}  # open camelCase schema: extra keys follow its style
    closed = {**SCHEMA, "additionalProperties": False}
    assert normalize(mcp_tool("other", closed), {"max_results": 3})[0] == {"max_results": 3}
    assert normalize(mcp_tool("other", SNAKE_SCHEMA), {"max_results": 3})[0] == {"max_results": 3}


def test_two_keys_for_one_property_are_refused() -> None:
    with pytest.raises(InvalidArguments) as caught:
        normalize(mcp_tool(), {"device_name": "a", "DeviceName": "b"})
    assert caught.value.details["property"] == "deviceName"


def test_values_are_never_renamed() -> None:
    out, _ = normalize(
        mcp_tool("other"), {"device_name": "device_name", "newParameterName": "new_parameter_name"}
    )
    assert out == {"deviceName": "device_name", "newParameterName": "new_parameter_name"}


# -- value shapes ------------------------------------------------------------------

SHAPES = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string"}},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "enabled": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["Eco", "Comfort"]},
        "filter": {"type": "object", "properties": {"room": {"type": "string"}}},
        "limit": {"type": "integer", "default": 10},
    },
}


def test_value_coercions() -> None:
    out, report = normalize(
        mcp_tool("shapes", SHAPES),
        {
            "tags": "one",
            "count": "5",
            "ratio": "2.5",
            "enabled": "TRUE",
            "mode": "eco",
            "filter": '{"room": "hall"}',
        },
    )
    assert out == {
        "tags": ["one"],
        "count": 5,
        "ratio": 2.5,
        "enabled": True,
        "mode": "Eco",
        "filter": {"room": "hall"},
        "limit": 10,
    }
    assert {r[3] for r in report} == {
        "wrap_array",
        "string_to_integer",
        "string_to_number",
        "string_to_boolean",
        "enum_case",
        "parse_json",
        "default",
    }


@pytest.mark.parametrize("value", ["5.5", "5e3", "five", "", " 5", "NaN", "Infinity"])
def test_nothing_lossy_for_integers(value: str) -> None:
    out, report = normalize(mcp_tool("shapes", SHAPES), {"count": value})
    assert out["count"] == value and [r for r in report if r[3] != "default"] == []


def test_each_coercion_can_be_switched_off() -> None:
    none = mcp_tool("shapes", SHAPES, ToolSettings(skip_coercions=["all"]))
    out, report = Normalizer().arguments(none, {"tags": "one", "count": "5"})
    assert out == {"tags": "one", "count": "5"} and report == []
    some = mcp_tool("shapes", SHAPES, ToolSettings(skip_coercions=["wrap_array", "default"]))
    out, _ = Normalizer().arguments(some, {"tags": "one", "count": "5"})
    assert out == {"tags": "one", "count": 5}


def test_idempotent() -> None:
    tool = mcp_tool("shapes", SHAPES)
    once, _ = normalize(tool, {"Tags": "one", "count": "5", "mode": "COMFORT"})
    twice, report = normalize(tool, once)
    assert twice == once and report == []


def test_refs_anyof_and_arrays_of_objects() -> None:
    schema = {
        "type": "object",
        "properties": {
            "rooms": {"type": "array", "items": {"$ref": "#/$defs/Room"}},
            "owner": {"anyOf": [{"$ref": "#/$defs/Person"}, {"type": "null"}]},
        },
        "$defs": {
            "Room": {
                "type": "object",
                "properties": {
                    "roomName": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Room"}},
                },
            },
            "Person": {"type": "object", "properties": {"firstName": {"type": "string"}}},
        },
    }
    out, report = normalize(
        mcp_tool("house", schema),
        {
            "rooms": [{"room_name": "a", "children": [{"RoomName": "b"}]}],
            "owner": {"first_name": "x"},
        },
    )
    assert out == {
        "rooms": [{"roomName": "a", "children": [{"roomName": "b"}]}],
        "owner": {"firstName": "x"},
    }
    assert ("arguments.rooms[0].children[0].RoomName", "RoomName", "roomName", "spelling") in report


# -- the analysis-context example, through the whole pipeline --------------------

ANALYSIS_SCHEMA = {
    "type": "object",
    "properties": {"analysisContext": {"$ref": "#/$defs/AnalysisContext"}},
    "required": ["analysisContext"],
    "$defs": {
        "AnalysisContext": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "attemptedApproaches": {"type": "array", "items": {"type": "string"}},
                "partialFindings": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "finding": {"type": "string"},
                            "confidence": {"type": "number"},
                        },
                        "required": ["finding"],
                    },
                },
                "stuckPoints": {"type": "array", "items": {"type": "string"}},
                "focusArea": {
                    "type": "object",
                    "properties": {
                        "files": {"type": "array", "items": {"type": "string"}},
                        "entryPoints": {"type": "array", "items": {"type": "string"}},
                        "serviceNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
            },
        }
    },
}
ANALYSIS_SETTINGS = Settings.model_validate(
    {
        "argument_maps": {
            "analyze_code": {
                "analysisContext.stuck_description": "stuckPoints",
                "analysisContext.code_scope": "focusArea",
            }
        },
        "tools": {
            "analyze_code": {
                "parameters": {
                    "analysisContext.partialFindings": {"lenient": True},
                    "analysisContext.focusArea.files": {
                        "path": True,
                        "allowed_roots": ["/srv/repo"],
                    },
                }
            }
        },
    }
)


def analysis_context(**overrides: Any) -> dict[str, Any]:
    context = {
        "attempted_approaches": ["restarted the service", "read the logs"],
        "partial_findings": [
            {"finding": "cache misses", "confidence": "0.7"},
            {"confidence": 1},
            "not an object",
        ],
        "stuck_description": "cannot reproduce locally",
        "code_scope": {
            "files": ["src/cache.py", "/srv/repo/app.py"],
            "entryPoints": ["main"],
            "serviceNames": ["api"],
        },
    }
    context.update(overrides)
    return {"analysisContext": context}


async def run(
    settings: Settings, tool: Tool, arguments: dict[str, Any], *, caller: str | None = None
) -> Outcome:
    registry = Registry(settings.aliases)
    # As a backend builds it: with its [tools.NAME] entry resolved.
    registry.register(replace(tool, settings=tool_settings(settings.tools, tool.name, tool.server)))
    executor = build_executor(settings, registry)
    return await executor.execute(
        Call(id="t", tool=tool.name, arguments=arguments, topic="t", caller=caller)
    )


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
                "files": ["src/cache.py", "/srv/repo/app.py"],
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
    dropped = [p for p, r in rules if r == "lenient_drop"]
    assert dropped == [
        "arguments.analysisContext.partialFindings[1]",
        "arguments.analysisContext.partialFindings[2]",
    ]


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


async def test_validation_lists_every_problem_and_the_signature() -> None:
    outcome = await run(Settings(), mcp_tool(), {"deviceName": 3, "action": "explode"})
    assert outcome.error is not None and outcome.error.code is ErrorCode.INVALID_ARGUMENTS
    assert {e["path"] for e in outcome.error.details["errors"]} == {"deviceName", "action"}
    signature = {p["name"]: p for p in outcome.error.details["signature"]}
    assert (
        signature["action"]["enum"] == ["on", "off", "dim"]
        and signature["deviceName"]["required"] is True
    )


# -- tool names and callers ----------------------------------------------------------


def registry_with(*tools: Tool, aliases: dict[str, str] | None = None) -> Registry:
    registry = Registry(aliases)
    registry.register_all(tools)
    return registry


@pytest.mark.parametrize(
    "name",
    [
        "control_zwave_device",
        "ControlZwaveDevice",
        "control-zwave-device",
        "controlzwavedevice",
        "CONTROL ZWAVE DEVICE",
        "zwave.control_zwave_device",
        "zwave__control_zwave_device",
        "Zwave",
    ],
)
def test_tool_name_spellings(name: str) -> None:
    registry = registry_with(mcp_tool(), aliases={"zwave": "control_zwave_device"})
    resolved = registry.resolve(name)
    assert resolved.name == "control_zwave_device"
    rules = [e.rule for e in resolved.report]
    assert rules in ([], ["tool_spelling"], ["alias"])


def test_ambiguous_names_are_refused_with_candidates() -> None:
    registry = registry_with(mcp_tool("get_data"), mcp_tool("getData"))
    assert registry.resolve("getData").name == "getData"  # exact still wins
    with pytest.raises(UnknownTool) as caught:
        registry.resolve("GET-DATA")
    assert caught.value.details["candidates"] == ["getData", "get_data"]


def test_same_tool_on_two_servers() -> None:
    first = Tool(
        name="search",
        description="",
        input_schema={},
        invoke=_echo_arguments,
        origin="mcp:a",
        server="a",
        rank=0,
    )
    second = Tool(
        name="search",
        description="",
        input_schema={},
        invoke=_echo_arguments,
        origin="mcp:b",
        server="b",
        rank=1,
    )
    registry = registry_with(second, first)  # registration order must not matter
    assert registry.resolve("search").tool is first
    assert (
        registry.resolve("b.search").tool is second and registry.resolve("b__search").tool is second
    )
    assert registry.names() == ["b.search", "search"]
    registry.unregister_origin("mcp:a")
    assert registry.resolve("search").tool is second


def test_unknown_alias_targets_are_reported() -> None:
    registry = registry_with(
        mcp_tool(), aliases={"MindMap": "create_mindmap", "lights": "control_zwave_device"}
    )
    assert registry.unknown_aliases() == {"mindmap": "create_mindmap"}


def test_sanitized_names() -> None:
    from toolbus.registry import sanitize_name

    assert sanitize_name("ok_name-1.2/x") == "ok_name-1.2/x"
    odd = sanitize_name("weird name!")
    assert (
        odd != "weird name!"
        and odd.startswith("weird_name")
        and sanitize_name("weird name!") == odd
    )
    assert len(sanitize_name("x" * 100)) <= 64


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
    assert listed is not None and [t["name"] for t in listed.structured["tools"]] == [
        "control_zwave_device"
    ]  # type: ignore[index]


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


def test_hidden_tools_appear_in_no_list() -> None:
    hidden = Tool(
        name="reboot",
        description="",
        input_schema={},
        invoke=_echo_arguments,
        settings=ToolSettings(model_invocable=False),
    )
    registry = registry_with(hidden, mcp_tool())
    assert [d.name for d in registry.definitions()] == ["control_zwave_device"]
    assert registry.resolve("reboot").tool is hidden  # still callable by automation


def test_mappings_document_the_analysis_example() -> None:
    from toolbus.normalization.mappings import render

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


async def test_the_transformation_is_logged_without_values() -> None:
    with watching("toolbus.normalize", "normalized control_zwave_device") as logged:
        await run(
            Settings(argument_maps=SEED_MAP),
            mcp_tool(),
            {"device_name": "Switch One", "command": "on"},
        )
    assert [r.getMessage() for r in logged.records] == [
        "normalized control_zwave_device: {device_name: ..., command: ...} -> {deviceName: ..., action: ...}"
    ]


async def test_the_report_is_recorded_on_the_span() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = registry_with(mcp_tool())
    executor = build_executor(
        Settings(argument_maps=SEED_MAP), registry, tracer=provider.get_tracer("test")
    )
    await executor.execute(
        Call(
            id="s",
            tool="ControlZwaveDevice",
            arguments={"device_name": "a", "command": "on"},
            topic="t",
        )
    )
    await executor.execute(
        Call(id="f", tool="control_zwave_device", arguments={"deviceName": 1}, topic="t")
    )
    ok, failed = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]
    assert ok.name == "execute_tool control_zwave_device"
    events = [
        (e.attributes["toolbus.path"], e.attributes["toolbus.rule"])
        for e in ok.events
        if e.attributes
    ]
    assert events == [
        ("tool", "tool_spelling"),
        ("arguments.device_name", "static_map"),
        ("arguments.command", "static_map"),
    ]
    assert ok.attributes is not None and ok.attributes["toolbus.normalized.count"] == 3
    assert failed.attributes is not None and failed.attributes["error.type"] == "invalid_arguments"
    assert not any(v == "a" for e in ok.events for v in (e.attributes or {}).values())  # no values

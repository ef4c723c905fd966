"""Schemas, settings and helpers shared by the normalization tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from toolbus.calls.call import Call
from toolbus.calls.execute import Outcome
from toolbus.config import NO_TOOL_SETTINGS, Settings, ToolSettings, tool_settings
from toolbus.normalization.normalize import Normalizer
from toolbus.tools.context import DETACHED, CallContext
from toolbus.tools.registry import Registry, Tool
from toolbus.wire.contracts import ToolResult
from toolbus.worker.wiring import build_executor

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


async def echo_arguments(arguments: dict[str, Any], context: CallContext = DETACHED) -> ToolResult:
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
        invoke=echo_arguments,
        origin="mcp:zwave",
        server="zwave",
        rename_arguments=True,
        settings=settings,
    )


def normalize(
    tool: Tool, arguments: dict[str, Any], maps: dict[str, dict[str, str]] | None = None
) -> tuple[dict[str, Any], list[tuple[str, str, str, str]]]:
    """Normalize with the seed map (or `maps`); the report as plain tuples, easy to compare."""
    out, report = Normalizer(SEED_MAP if maps is None else maps).arguments(tool, arguments)
    return out, [(e.path, e.from_, e.to, e.rule) for e in report]


def registry_with(*tools: Tool, aliases: dict[str, str] | None = None) -> Registry:
    registry = Registry(aliases)
    registry.register_all(tools)
    return registry


# -- the analysis-context example (also used by bench/normalize.py) ----------------

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
    """One call through the executor `settings` build, with `tool` the only one registered."""
    registry = Registry(settings.aliases)
    # As a backend builds it: with its [tools.NAME] entry resolved.
    registry.register(replace(tool, settings=tool_settings(settings.tools, tool.name, tool.server)))
    executor = build_executor(settings, registry)
    return await executor.execute(
        Call(id="t", tool=tool.name, arguments=arguments, topic="t", caller=caller)
    )

"""Execute: resolve, normalize, validate and run one call under its deadline.

This is the one place that classifies outcomes: whatever happens, `execute()`
returns an `Outcome` and logs exactly one line for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.config import ToolSettings
from worker.contracts import NormalizationEntry, ToolList, ToolResult
from worker.decode import Call
from worker.errors import CallTimeout, InternalError, ToolbusError
from worker.normalize import Normalizer
from worker.registry import Registry, Tool
from worker.validate import check_arguments

log = logging.getLogger("toolbus.execute")

LOGGED_ARGUMENTS_CHARS = 500


@dataclass(slots=True)
class Outcome:
    tool: str | None = None
    result: ToolResult | None = None
    error: ToolbusError | None = None
    normalized: list[NormalizationEntry] = field(default_factory=list)
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class Executor:
    def __init__(
        self,
        registry: Registry,
        normalizer: Normalizer,
        *,
        default_timeout_s: float,
        max_timeout_s: float,
        slow_call_ms: float,
        tool_settings: Mapping[str, ToolSettings],
    ) -> None:
        self.registry = registry
        self._normalizer = normalizer
        self._default_timeout_s = default_timeout_s
        self._max_timeout_s = max_timeout_s
        self._slow_call_ms = slow_call_ms
        self._tool_settings = tool_settings

    def deadline_s(self, call: Call, tool: Tool) -> float:
        """Request beats tool config beats the tool's own default beats the global default."""
        configured = self._tool_settings.get(tool.name)
        chosen = (
            call.timeout_s
            or (configured.timeout_s if configured else None)
            or tool.timeout_s
            or self._default_timeout_s
        )
        return min(chosen, self._max_timeout_s)

    async def execute(self, call: Call) -> Outcome:
        if call.list_tools:
            tools = ToolList(tools=self.registry.definitions())
            text = ", ".join(t.name for t in tools.tools)
            return Outcome(result=ToolResult(text=text, structured=tools.model_dump(by_alias=True)))
        outcome = Outcome()
        arguments: dict[str, Any] = call.arguments
        started = time.perf_counter()
        try:
            tool = self.registry.get(call.tool)
            outcome.tool = tool.name
            arguments, outcome.normalized = self._normalizer.arguments(tool, call.arguments)
            check_arguments(tool.name, tool.validator, tool.input_schema, arguments)
            outcome.result = await self._run(tool, arguments, self.deadline_s(call, tool))
        except ToolbusError as error:
            outcome.error = error
        except Exception as exc:
            log.exception("internal error in call %s to %s", call.id, call.tool)
            outcome.error = InternalError(f"internal error: {type(exc).__name__}")
        outcome.duration_ms = (time.perf_counter() - started) * 1000
        self._log(call, arguments, outcome)
        return outcome

    @staticmethod
    async def _run(tool: Tool, arguments: dict[str, Any], deadline_s: float) -> ToolResult:
        try:
            async with asyncio.timeout(deadline_s) as scope:
                return await tool.invoke(arguments)
        except TimeoutError:
            if scope.expired():
                raise CallTimeout(
                    f"{tool.name} did not finish within {deadline_s:g} s; the call was cancelled",
                    timeout_s=deadline_s,
                ) from None
            raise

    def _log(self, call: Call, arguments: dict[str, Any], outcome: Outcome) -> None:
        shown = repr(arguments)
        if len(shown) > LOGGED_ARGUMENTS_CHARS:
            shown = shown[:LOGGED_ARGUMENTS_CHARS] + "...}"
        outcome_text = "ok" if outcome.error is None else outcome.error.code.value
        level = logging.INFO
        if outcome.duration_ms > self._slow_call_ms:
            level = logging.WARNING
            outcome_text += f" (slow: over {self._slow_call_ms:g} ms)"
        log.log(
            level,
            "call %s tool=%s arguments=%s duration_ms=%.1f outcome=%s",
            call.id,
            outcome.tool or call.tool,
            shown,
            outcome.duration_ms,
            outcome_text,
            extra={"call_id": call.id, "tool": outcome.tool or call.tool, "outcome": outcome_text},
        )

"""Preparation: everything a call needs before its tool runs, done once per call.

`Steps` turns a call's arguments into what its tool is given: size and depth guards,
normalization, value guards, the schema's check (or the settled fast path, when it
serves), adding what it changed to the report. `Prepared` is one call made ready: the
tool it resolved, the arguments as they will run, the report so far, or why it is
refused, and its `execute_tool` span, still open; its `Outcome` is filled as the call
goes, until the executor concludes it (execute.py).

Deduplication compares calls by what a prepared call holds (`Prepared.asked`),
and the executor then runs that same prepared call: the claim awaits the store in
between, where `tools/list_changed` or a replaced server may change the registry, and
preparing again would normalize twice and could run something else than was compared.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from toolbus.calls.call import Call
from toolbus.calls.running import RunningCall
from toolbus.normalization.guards import Guards
from toolbus.normalization.normalize import Normalizer
from toolbus.normalization.settled import Plans
from toolbus.observability.spans import step_span
from toolbus.tools.registry import Tool
from toolbus.tools.validate import check_arguments
from toolbus.wire.contracts import ToolResult
from toolbus.wire.errors import InvalidArguments, ToolbusError
from toolbus.wire.report import Change


@dataclass(slots=True)
class Outcome:
    """What became of one call: its canonical tool, result or error, and report."""

    tool: str | None = None
    result: ToolResult | None = None
    error: ToolbusError | None = None
    normalized: list[Change] = field(default_factory=list)
    duration_ms: float = 0.0
    invoked: bool = False  # the tool was asked: it may have taken effect

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(slots=True)
class Prepared:
    """One call made ready to run, or refused (`outcome.error`) before it could be.

    `span` is the call's `execute_tool` span, opened before preparing so the steps'
    spans are its children; `owned`: the executor ends it when the call is concluded, or
    the answerer when the call is replayed (its step spans need their parent exported).
    """

    call: Call  # as located: the caller a `call/{a}/{b}` topic names is read
    outcome: Outcome  # the canonical tool and the report so far; `error` when refused
    span: trace.Span
    owned: bool
    arguments: dict[str, Any]  # what the tool is given: as they arrived until prepared
    tool: Tool | None = None  # set once every step has passed
    started: float = 0.0  # `time.perf_counter()` when preparing began
    # Past the sender's deadline on arrival, or by the time it would run (a claim that
    # waited on a stalled store): prepared (a repeat of a finished call is replayed,
    # which needs what it asks for), never run.
    expired: bool = False
    # Its home while it runs (calls/running.py): the tool's context, what a cancel finds.
    running: RunningCall | None = None
    concluded: bool = False  # once only: a held call's run and a stop may both try

    def elapsed_s(self) -> float:
        """The time the caller has waited for this answer so far: preparing, a repeat's
        wait for its running twin (the claim), and the run. A `timeout` after waiting
        30 s for a twin took 30 s, and is logged, metered and warned about as such."""
        return time.perf_counter() - self.started

    def asked(self) -> tuple[str, dict[str, Any]] | None:
        """What the call asks for, as deduplication compares calls: its tool's canonical
        name and its arguments exactly as they will run (`Echo` is `echo`, `device_name`
        `deviceName`). None when it is refused: it will not run."""
        if self.tool is None or self.outcome.error is not None:
            return None
        return self.outcome.tool or self.tool.name, self.arguments


class Steps:
    """The argument steps, with the per-tool tables they keep (cleared when the registry
    changes). `trace_steps`: a `normalize` and a `validate` span under the call's."""

    def __init__(
        self, normalizer: Normalizer, guards: Guards, tracer: trace.Tracer, *, trace_steps: bool
    ) -> None:
        self._normalizer = normalizer
        self._guards = guards
        self._plans = Plans(normalizer, guards)  # calls that need no normalizing at all
        self._tracer = tracer
        self._trace_steps = trace_steps  # a span per step costs more than the step: off

    def clear(self) -> None:
        self._guards.clear()
        self._normalizer.clear()
        self._plans.clear()

    def arguments(self, tool: Tool, call: Call, report: list[Change]) -> dict[str, Any]:
        """`call`'s arguments as `tool` is to get them, their changes added to `report`.

        Most calls need no more than top-level keys respelled and trip no guard: for
        them one walk (`settled`), then the schema's check; otherwise the full path.
        `InvalidArguments` lists the tool's parameters, so a model can correct itself.
        """
        try:
            if self._trace_steps and trace.get_current_span().is_recording():
                with step_span(self._tracer, "normalize"):
                    settled = self._plans.settled(tool, call.arguments, call.payload_bytes, report)
                    arguments = self._normalized(tool, call, report) if settled is None else settled
                with step_span(self._tracer, "validate"):
                    if settled is None:
                        arguments = self._guarded(tool, arguments, report)
                    check_arguments(tool.name, tool.validator, arguments)
                return arguments
            # The same steps without spans: even a no-op span costs more than a step.
            settled = self._plans.settled(tool, call.arguments, call.payload_bytes, report)
            if settled is None:
                settled = self._guarded(tool, self._normalized(tool, call, report), report)
            check_arguments(tool.name, tool.validator, settled)
        except InvalidArguments as error:
            explain(error, tool)
            raise
        return settled

    def _normalized(self, tool: Tool, call: Call, report: list[Change]) -> dict[str, Any]:
        """Size and depth checked on what arrived, then keys and values normalized."""
        self._guards.check_envelope(tool, call.arguments, call.payload_bytes)
        arguments, renamed = self._normalizer.arguments(tool, call.arguments)
        report.extend(renamed)
        return arguments

    def _guarded(
        self, tool: Tool, arguments: dict[str, Any], report: list[Change]
    ) -> dict[str, Any]:
        """The value guards, on what normalization made of the arguments."""
        arguments, dropped = self._guards.check_values(tool, arguments)
        report.extend(dropped)
        return arguments


def explain(error: InvalidArguments, tool: Tool) -> None:
    """Every `invalid_arguments` for a known tool lists the tool's parameters, so a model
    can correct its next call (`details.parameters`, built once per tool). A detail the
    raiser set itself is kept."""
    for key, value in tool.parameters.details().items():
        error.details.setdefault(key, value)

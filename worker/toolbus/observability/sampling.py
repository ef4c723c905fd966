"""Sampling: the operator's sampler decides what is exported, never a caller's flag.

A caller's `traceparent` joins its call to the caller's trace; under the SDK's usual
`parentbased_*` samplers its sampled flag would also decide whether the worker's spans
are exported: any caller could make the operator's collector record what the operator
configured it to drop (`parentbased_traceidratio` at 0, `parentbased_always_off`).
`OperatorSampling` wraps the operator's sampler (`OTEL_TRACES_SAMPLER`) so that:

- a call whose caller says sampled is decided as a trace of the operator's own would be
  (its root sampler, on the caller's trace id): the flag cannot turn sampling on. A
  caller that says not sampled is not sampled, as W3C Trace Context has it (it may
  opt out of the operator's traces, never in);
- such a call that the operator drops, and whose caller asks for its spans
  (`publish_trace`), is recorded for the caller's copy alone (RECORD_ONLY: spans that
  record without the sampled flag, which no exporting processor passes on), with every
  span under it: the copy is whole, the exporter gets nothing, and the flag passed on to
  an MCP server and in the reply says not sampled.

A call is marked as such by `call_context`, the context its `process` span starts in;
every other span (the MCP SDK's session, a span with no caller) is the operator's
sampler's alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context, create_key, get_current, get_value, set_value
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_OFF,
    DEFAULT_ON,
    Decision,
    ParentBasedTraceIdRatio,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

log = logging.getLogger("toolbus.telemetry")

_CALL = create_key("toolbus.call")


@dataclass(frozen=True, slots=True)
class _Call:
    copy_wanted: bool  # the caller (or `publish_traces`) wants the call's spans back


def call_context(context: Context | None, *, copy_wanted: bool) -> Context:
    """The context a call's `process` span starts in: the caller's (None: the current
    one), marked as a call's, so that its caller's sampled flag only ever records for the
    copy the caller asks for."""
    return set_value(_CALL, _Call(copy_wanted), context if context is not None else get_current())


class OperatorSampling(Sampler):
    """The operator's sampler, with a caller's sampled flag unable to turn it on (see the
    module docstring)."""

    def __init__(self, operator: Sampler) -> None:
        self.operator = operator

    def should_sample(  # noqa: PLR0917 -- the SDK's signature
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context)
        above = parent.get_span_context()
        if (
            above.is_valid
            and not above.is_remote
            and not above.trace_flags.sampled
            and parent.is_recording()
        ):
            # Under a span recorded for a caller's copy: the same, whatever the operator's
            # sampler (`parentbased_*` would drop it, and the copy would have holes).
            return SamplingResult(Decision.RECORD_ONLY, attributes, above.trace_state)
        call = get_value(_CALL, parent_context)
        caller_sampled = above.is_valid and above.is_remote and above.trace_flags.sampled
        if not isinstance(call, _Call) or not caller_sampled:
            return self.operator.should_sample(
                parent_context, trace_id, name, kind, attributes, links
            )
        as_own = trace.set_span_in_context(trace.INVALID_SPAN, parent_context)
        decided = self.operator.should_sample(as_own, trace_id, name, kind, attributes, links)
        if decided.decision is Decision.RECORD_AND_SAMPLE:
            # The caller's tracestate goes on with its trace (a root decision has none).
            return SamplingResult(decided.decision, decided.attributes, above.trace_state)
        if call.copy_wanted:
            return SamplingResult(Decision.RECORD_ONLY, attributes, above.trace_state)
        return SamplingResult(Decision.DROP, None, above.trace_state)

    def get_description(self) -> str:
        return f"OperatorSampling{{{self.operator.get_description()}}}"


# OTEL_TRACES_SAMPLER's values (the SDK's own table), each with its argument read.
_FIXED: dict[str, Sampler] = {
    "always_on": ALWAYS_ON,
    "always_off": ALWAYS_OFF,
    "parentbased_always_on": DEFAULT_ON,
    "parentbased_always_off": DEFAULT_OFF,
}
_RATIO = {"traceidratio": TraceIdRatioBased, "parentbased_traceidratio": ParentBasedTraceIdRatio}
SAMPLER_NAMES = frozenset({*_FIXED, *_RATIO})


def operator_sampler(env: Mapping[str, str]) -> Sampler:
    """The sampler `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` name, read from `env`
    as the SDK reads them: unset or unknown, `parentbased_always_on` (unknown: with a
    warning); a ratio that is not a number, 1.0 (with a warning)."""
    name = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if name not in SAMPLER_NAMES:
        log.warning("OTEL_TRACES_SAMPLER=%r is not known: parentbased_always_on it is", name)
        name = "parentbased_always_on"
    if name in _FIXED:
        return _FIXED[name]
    argument = env.get("OTEL_TRACES_SAMPLER_ARG", "")
    try:
        rate = float(argument)
    except ValueError:
        log.warning("OTEL_TRACES_SAMPLER_ARG=%r is not a number: 1.0 it is", argument)
        rate = 1.0
    return _RATIO[name](rate)

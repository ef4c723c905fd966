"""Metrics: what a worker counts, as OpenTelemetry instruments.

    toolbus.calls                 counter    {tool, outcome}   outcome: ok or the error code
    toolbus.call.duration         histogram  {tool}            seconds, 1 ms ... 60 s (sdk.py)
    toolbus.calls.in_flight       up-down    {}                messages being handled
    toolbus.normalize.rewrites    counter    {rule}            normalization report entries
    toolbus.dead_letters          counter    {code}
    toolbus.rate_limited          counter    {limit}           limit: rate or in_flight
    toolbus.internal_errors       counter    {stage}           bugs caught: see docs/operations.md
    toolbus.mcp.server.up         gauge      {server}          1 ready, 0 otherwise
    toolbus.mcp.stdout.partial_dropped  counter  {server}      unfinished stdout lines dropped
    toolbus.dedup.store_emptied   counter    {}                the Redis store lost its records
    toolbus.dedup.unrecorded_runs counter    {}                run with the store away (`run`)
    toolbus.dedup.bytes           gauge      {}                what the dedup records hold
    toolbus.dedup.gave_way        counter    {how}             past the bounds: shrunk, forgotten
    toolbus.session_taken_over    counter    {connection}      another client came with our id

Exported as `observability.sdk.configure_metrics` sets up (OTLP, console, Prometheus on
the HTTP listener's /metrics); no-ops until configured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from toolbus.observability.recent import RecentCalls
from toolbus.wire.report import Change

METER_NAME = "toolbus"


class Metrics:
    """The worker's instruments.

    Args:
        meter: where to create them; the global provider's `toolbus` meter by default.
        server_states: read at each collection for `toolbus.mcp.server.up`.
        partial_lines: read at each collection for `toolbus.mcp.stdout.partial_dropped`.
        dedup_bytes: read at each collection for `toolbus.dedup.bytes`.
        dedup_gave_way: read at each collection for `toolbus.dedup.gave_way`.
        recent: also told of each call and dead letter (the status page's window).
    """

    def __init__(
        self,
        meter: Meter | None = None,
        *,
        server_states: Callable[[], Mapping[str, str]] = dict,
        partial_lines: Callable[[], Mapping[str, int]] = dict,
        dedup_bytes: Callable[[], int] = lambda: 0,
        dedup_gave_way: Callable[[], Mapping[str, int]] = dict,
        recent: RecentCalls | None = None,
    ) -> None:
        self.recent = recent
        meter = meter or metrics.get_meter(METER_NAME)
        self._calls = meter.create_counter(
            "toolbus.calls", unit="{call}", description="Calls by tool and outcome"
        )
        self._duration = meter.create_histogram(
            "toolbus.call.duration", unit="s", description="Call duration"
        )
        self._in_flight = meter.create_up_down_counter(
            "toolbus.calls.in_flight", unit="{message}", description="Messages being handled"
        )
        self._rewrites = meter.create_counter(
            "toolbus.normalize.rewrites",
            unit="{rewrite}",
            description="Normalization changes by rule",
        )
        self._dead = meter.create_counter(
            "toolbus.dead_letters", unit="{message}", description="Messages dead-lettered"
        )
        self._limited = meter.create_counter(
            "toolbus.rate_limited",
            unit="{message}",
            description="Requests refused because their caller was over its quota",
        )
        self._internal = meter.create_counter(
            "toolbus.internal_errors",
            unit="{message}",
            description="Messages answered `internal` because building the answer failed",
        )
        self._emptied = meter.create_counter(
            "toolbus.dedup.store_emptied",
            unit="{event}",
            description="Times the Redis dedup store was found emptied (restart, flush)",
        )
        self._unrecorded = meter.create_counter(
            "toolbus.dedup.unrecorded_runs",
            unit="{call}",
            description="Calls run without a dedup record: the store was unreachable and "
            'dedup_unavailable = "run" (a repeat of one may run again)',
        )
        self._taken_over = meter.create_counter(
            "toolbus.session_taken_over",
            unit="{event}",
            description="Times the broker dropped a worker connection because another "
            "client connected with its client id (MQTT v5 reason 0x8E)",
        )
        self._servers = server_states
        meter.create_observable_gauge(
            "toolbus.mcp.server.up", callbacks=[self._observe_servers], description="1 when ready"
        )
        self._partial_lines = partial_lines
        meter.create_observable_counter(
            "toolbus.mcp.stdout.partial_dropped",
            callbacks=[self._observe_partial_lines],
            unit="{line}",
            description="Stdout lines an MCP server left unfinished too long, dropped",
        )

        self._dedup_bytes, self._dedup_gave_way = dedup_bytes, dedup_gave_way
        meter.create_observable_gauge(
            "toolbus.dedup.bytes",
            callbacks=[self._observe_dedup_bytes],
            unit="By",
            description="Bytes the dedup records hold, counted against dedup_max_bytes "
            "(memory: this worker's; Redis: the fleet's)",
        )
        meter.create_observable_counter(
            "toolbus.dedup.gave_way",
            callbacks=[self._observe_gave_way],
            unit="{record}",
            description="Finished records that gave way at the dedup bounds, by how: "
            "shrunk to a summary, or forgotten",
        )

    def _observe_dedup_bytes(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self._dedup_bytes())]

    def _observe_gave_way(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"how": how}) for how, n in self._dedup_gave_way().items()]

    def _observe_servers(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(int(state == "ready"), {"server": name})
            for name, state in self._servers().items()
        ]

    def _observe_partial_lines(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"server": name}) for name, n in self._partial_lines().items()]

    def call_done(
        self, tool: str, outcome: str, duration_s: float, changes: Iterable[Change]
    ) -> None:
        self._calls.add(1, {"tool": tool, "outcome": outcome})
        self._duration.record(duration_s, {"tool": tool})
        if self.recent is not None:
            self.recent.call_done(outcome, duration_s)
        for change in changes:
            self._rewrites.add(1, {"rule": change.rule})

    def message_started(self) -> None:
        self._in_flight.add(1)

    def message_done(self) -> None:
        self._in_flight.add(-1)

    def dead_lettered(self, code: str) -> None:
        self._dead.add(1, {"code": code})
        if self.recent is not None:
            self.recent.dead_lettered(code)

    def rate_limited(self, limit: str) -> None:
        self._limited.add(1, {"limit": limit})

    def internal_error(self, stage: str) -> None:
        self._internal.add(1, {"stage": stage})

    def dedup_store_emptied(self) -> None:
        self._emptied.add(1)

    def ran_without_dedup(self) -> None:
        self._unrecorded.add(1)

    def session_taken_over(self, connection: str) -> None:
        self._taken_over.add(1, {"connection": connection})

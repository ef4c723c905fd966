"""The status page: what `/` shows and `/status.json` answers, for an operator to look at.

`snapshot(worker)` gathers, as plain JSON values, what this worker knows in-process: its
broker connection, the fleet (every worker as the retained statuses say: `fleet`), each
MCP server's state, the tools each caller profile may use, the messages in flight, and
the last minutes' calls (outcomes, errors and dead letters by code, p50/p99: `recent`).
`PAGE` is one static HTML file with its CSS and script inline (no build step, nothing
fetched from elsewhere: the machines may be offline) that polls `/status.json`.

What is shown is names, states, counts and durations: never an argument value, a reply,
a credential or a client id. The listener answers anyone who reaches it (see
docs/security.md); the page renders every string as text, never as markup.
"""

from __future__ import annotations

import functools
import time
from importlib import resources
from typing import TYPE_CHECKING, Any

from toolbus import __version__
from toolbus.config.callers import ANONYMOUS_CALLER, DEFAULT_CALLER_PROFILE

if TYPE_CHECKING:
    from toolbus.worker.service import Worker

PAGE: bytes = resources.files("toolbus.worker").joinpath("static/status.html").read_bytes()
MAX_TOOLS_SHOWN = 500  # per profile: a page, not a catalogue (`{prefix}/tools` lists them all)


def snapshot(worker: Worker, started: float) -> dict[str, Any]:
    """The status page's data. `started`: the listener's start (monotonic), for uptime."""
    broker = worker.broker
    recent = worker.metrics.recent
    return {
        "worker_id": worker.worker_id,
        "time": time.time(),
        "uptime_s": round(time.monotonic() - started, 1),
        # Never the user name or password: the listener answers anyone who reaches it.
        "broker": {"address": f"{broker.host}:{broker.port}", "state": worker.broker_state},
        "in_flight": {
            "messages": worker.in_flight.count,
            "concurrency": worker.in_flight.concurrency,
            "queued": worker.queued(),
            "handled": worker.in_flight.handled,
            "max_seen": worker.in_flight.max_count,
        },
        "fleet": fleet(worker),
        "servers": [
            {
                "name": name,
                "state": server.state,
                "last_error": server.last_error,
                "tools": server.tools,
            }
            for name, server in sorted(worker.mcp.summaries().items())
        ],
        "profiles": profiles(worker),
        "recent": recent.snapshot() if recent is not None else None,
    }


def fleet(worker: Worker) -> list[dict[str, Any]]:
    """The workers as their statuses say, this one as it is now (its own status may
    not have come back yet, and says less than it knows)."""
    seen = worker.fleet.snapshot() if worker.fleet is not None else []
    state = "stopping" if worker.draining.is_set() else "online"
    me = {
        "worker_id": worker.worker_id,
        "state": state if worker.broker_state != "disconnected" else "disconnected",
        "since": None,
        "version": __version__,
        "in_flight": worker.in_flight.count,
        "handled": worker.in_flight.handled,
        "servers": worker.mcp.states(),
        "heard_s_ago": 0.0,
        "self": True,
    }
    for other in seen:
        if other["worker_id"] == worker.worker_id:
            me["since"] = other["since"]
    return sorted(
        [*(w for w in seen if w["worker_id"] != worker.worker_id), me], key=lambda w: w["worker_id"]
    )


def profiles(worker: Worker) -> list[dict[str, Any]]:
    """Each caller profile's tools, by the names a caller sees. Without profiles, every
    caller sees every tool: one row, `*`. A profile's `tools` unset is every tool."""
    executor = worker.pipeline.executor
    registry, access = executor.registry, executor.access
    callers = access.callers or [DEFAULT_CALLER_PROFILE]
    if DEFAULT_CALLER_PROFILE not in callers:  # callers without a profile of their own
        callers = [*callers, DEFAULT_CALLER_PROFILE]
    rows = []
    for caller in callers:
        # `*` names no caller: ask as one that has no profile of its own would.
        asking = _profileless(callers) if caller == DEFAULT_CALLER_PROFILE else caller
        allowed = functools.partial(access.allows, asking)
        names = sorted(registry.shown_name(tool) for tool in registry.listed(allowed))
        rows.append(
            {
                "caller": caller,
                "tools": names[:MAX_TOOLS_SHOWN],
                "count": len(names),
                "anonymous": caller == ANONYMOUS_CALLER,
            }
        )
    return rows


def _profileless(callers: list[str]) -> str:
    """A caller name no profile has (for `*`'s row)."""
    name = "\x00no-profile"
    while name in callers:
        name += "\x00"
    return name

"""Status view: the pool's statuses as two rich tables, once or live.

`once` prints a snapshot (tables or JSON). `live` redraws the tables as statuses change,
and each second so that ages advance and expired statuses drop out, until Ctrl-C; the
first connection must come within the timeout, a later loss is shown and reconnected
with backoff (the workers republish their statuses, so the view fills again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from datetime import UTC, datetime

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from toolbus.client.pool import Pool, follow, snapshot, status_connection, subscribe
from toolbus.transport import MqttConnection, TransportError
from toolbus.transport.nodes import Nodes
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.tasks import cancel_and_wait
from toolbus.wire.topics import Topics
from toolbus.wire.untrusted import printable

REFRESH_S = 1.0  # the live view's redraw without news: ages advance, expired rows go
RECONNECT_MAX_DELAY_S = 10.0


async def once(
    broker: BrokerUrl,
    topics: Topics,
    timeout_s: float,
    *,
    as_json: bool,
    client_id: str | None = None,
) -> Pool:
    """Print what is retained now, as tables or (`as_json`) JSON; the pool shown."""
    pool = await snapshot(broker, topics, timeout_s=timeout_s, client_id=client_id)
    if as_json:
        print(json.dumps(pool.to_json(), indent=2))
    else:
        # Piped: rich would fit the table to 80 columns and cut names that a grep needs.
        Console(width=None if sys.stdout.isatty() else 200).print(render(pool, topics))
    return pool


async def live(
    brokers: tuple[BrokerUrl, ...], topics: Topics, timeout_s: float, client_id: str | None = None
) -> None:
    """Until cancelled (Ctrl-C). The first connection comes from the first node that
    answers, each given `timeout_s` (else `TransportError` or `TimeoutError`); a later
    loss is shown and the next node tried, with backoff. The view names the node it reads."""
    pool, nodes = Pool(topics), Nodes(brokers)
    delay_s, connected_once = REFRESH_S, False
    with Live(render(pool, topics), auto_refresh=False) as view:
        while True:
            try:
                # Each node's connect is bounded by `timeout_s` (`status_connection`).
                conn = await nodes.first(lambda: _opened(nodes, timeout_s, client_id))
                connected_once, delay_s = True, REFRESH_S
                try:
                    await _watch(conn, pool, view, topics, _read_from(nodes))
                finally:
                    with contextlib.suppress(TransportError):
                        await conn.__aexit__(None, None, None)
            except TransportError as exc:
                if not connected_once:
                    raise
                nodes.advance()  # lost: the next node, as the workers move on
                lost = f"broker connection lost ({exc}); reconnecting to {nodes.current}"
                view.update(render(pool, topics, printable(lost)), refresh=True)
            await asyncio.sleep(delay_s)  # the reconnect backoff
            delay_s = min(delay_s * 2, RECONNECT_MAX_DELAY_S)


async def _opened(nodes: Nodes, timeout_s: float, client_id: str | None) -> MqttConnection:
    conn = status_connection(nodes.current, timeout_s, client_id)
    await conn.__aenter__()
    return conn


def _read_from(nodes: Nodes) -> str:
    """With several nodes, which one the view reads (retained statuses may be its own)."""
    return "" if len(nodes.all) == 1 else printable(f"statuses read from {nodes.current}")


async def _watch(
    conn: MqttConnection, pool: Pool, view: Live, topics: Topics, note: str = ""
) -> None:
    """Redraw as statuses change, and every `REFRESH_S` (ages advance, expired statuses
    go), until the connection fails (`TransportError`)."""
    await subscribe(conn, topics)
    changed = asyncio.Event()
    reader = asyncio.create_task(follow(conn, pool, changed.set), name="status-follow")
    try:
        while not reader.done():
            view.update(render(pool, topics, note), refresh=True)
            waiting = asyncio.create_task(changed.wait(), name="status-changed")
            try:
                await asyncio.wait(
                    {waiting, reader}, timeout=REFRESH_S, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                waiting.cancel()
            changed.clear()
        reader.result()  # raises what ended it
    finally:
        with contextlib.suppress(TransportError):  # already raised above, if it failed
            await cancel_and_wait(reader, REFRESH_S)


STATE_STYLES = {"online": "green", "stopping": "yellow"}  # else red: offline


def render(pool: Pool, topics: Topics, note: str = "") -> RenderableType:
    """Two tables: the workers, then the MCP servers at each worker."""
    now = datetime.now(UTC)
    workers = pool.workers()
    offline = {w.worker_id for w in workers if w.state == "offline"}
    table = Table(
        "worker",
        "state",
        "since",
        "version",
        "broker",
        "in flight",
        "tasks",
        "waiting",
        "handled",
        title="workers",
    )
    for worker in workers:
        state = Text(worker.state, style=STATE_STYLES.get(worker.state, "red"))
        since = _since(worker.since, now) if worker.since else "lost (last will)"
        table.add_row(
            _plain(worker.worker_id),
            state,
            since,
            _plain(worker.version or "-"),  # a status from before versions were reported
            _plain(worker.broker or "-"),  # the node it is on (none on a last will)
            str(worker.in_flight),
            str(worker.tasks),
            str(worker.waiting),
            str(worker.handled),
        )
    servers = Table(
        "server", "worker", "state", "since", "tools", "protocol", "last error", title="MCP servers"
    )
    for server in pool.servers():
        shown = server.state + (" (worker offline)" if server.worker_id in offline else "")
        style = "green" if server.state == "ready" and server.worker_id not in offline else "yellow"
        servers.add_row(
            _plain(server.server),
            _plain(server.worker_id),
            Text(printable(shown), style=style),
            _since(server.since, now),
            str(server.tool_count),
            _plain(server.protocol_version or "-"),  # the MCP version its session speaks
            _plain(server.last_error or ""),
        )
    parts: list[RenderableType] = [table, servers]
    if not workers and not pool.servers():
        parts = [Text(f"no statuses under {topics.prefix}/status/ (none retained, or all expired)")]
    if note:
        parts.append(Text(note, style="yellow"))
    return Group(*parts)


def _plain(text: str) -> Text:
    """Text from the broker shown as written: anyone who may publish a status chooses it,
    so never rich markup (`[/data]` would raise) and never a terminal control."""
    return Text(printable(text))


def _since(when: datetime, now: datetime) -> str:
    """`2025-05-01 12:03:04Z (3m 2s ago)`."""
    seconds = max(0, int((now - when).total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    age = f"{hours}h {minutes}m" if hours else f"{minutes}m {secs}s" if minutes else f"{secs}s"
    return f"{when.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z ({age} ago)"

"""Status: the worker's and each MCP server's state, as retained messages.

`{prefix}/status/{worker_id}` says online/offline (offline is also the connection's
will) with every server's state; `{prefix}/status/servers/{server}` carries one
server's state, last error and tools. Both are retained, so a dashboard that
subscribes later sees the current state at once. An `offline` status expires (the
will of a worker that never returns does not pile up); a clean stop clears its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from toolbus.contracts import ServerStatus, WorkerStatus
from toolbus.messages import Outbound
from toolbus.pipeline import Publisher
from toolbus.topics import Topics

if TYPE_CHECKING:  # annotations only: importing the mcp SDK costs a second
    from toolbus.backends.mcp import McpServer

log = logging.getLogger("toolbus.service")


class StatusReporter:
    """Builds status messages and publishes server changes while the worker is up.

    Args:
        topics: where status topics live.
        worker_id: this worker's id (also its MQTT client id).
        publisher: where server changes are published.
        servers: the MCP servers to report, `connecting` until they say otherwise.
        offline_expiry_s: how long the broker keeps an `offline` status (the last will of
            a worker that crashed): statuses of workers that never return expire.
    """

    def __init__(
        self,
        topics: Topics,
        worker_id: str,
        publisher: Publisher,
        servers: Iterable[str],
        *,
        offline_expiry_s: int = 3600,
    ) -> None:
        self._offline_expiry_s = offline_expiry_s
        self._topics = topics
        self._worker_id = worker_id
        self._publisher = publisher
        self._states: dict[str, str] = dict.fromkeys(servers, "connecting")
        self._live = False  # publish server changes only while connected and not stopping
        self._tasks: set[asyncio.Task[None]] = set()

    def resume(self) -> None:
        """Connected and serving: publish server changes from now on."""
        self._live = True

    def pause(self) -> None:
        """Disconnected or stopping: keep server changes for the next `worker` status."""
        self._live = False

    def worker(self, state: str) -> Outbound:
        """The worker's own retained status (`online`, `offline`)."""
        status = WorkerStatus(state=state, worker_id=self._worker_id, servers=dict(self._states))
        return Outbound(
            topic=self._topics.status(self._worker_id),
            payload=status.model_dump_json().encode(),
            retain=True,
            expiry_s=self._offline_expiry_s if state == "offline" else None,
        )

    def stopped(self) -> list[Outbound]:
        """A clean stop: `offline` for whoever listens now, then the retained status
        cleared, so a worker that left on purpose leaves nothing behind."""
        offline = self.worker("offline")
        cleared = Outbound(topic=offline.topic, payload=b"", retain=True, content_type=None)
        return [replace(offline, retain=False), cleared]

    def server_changed(self, server: McpServer) -> None:
        """A backend listener: log the change, publish it in the background when live."""
        log.info(
            "mcp server state",
            extra={"server": server.name, "state": server.state, "error": server.last_error},
        )
        self._states[server.name] = server.state
        if not self._live:
            return
        task = asyncio.create_task(self._publish(server), name=f"status:{server.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish(self, server: McpServer) -> None:
        status = ServerStatus(
            server=server.name,
            state=server.state,
            worker_id=self._worker_id,
            last_error=server.last_error,
            tools=server.tool_names,
            bad_stdout_lines=server.bad_stdout_lines,
        )
        await self._publisher.publish(
            Outbound(
                topic=self._topics.server_status(server.name),
                payload=status.model_dump_json().encode(),
                retain=True,
            )
        )
        await self._publisher.publish(self.worker("online"))

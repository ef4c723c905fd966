"""CallContext: what a running tool may know of its call, and its voice back to the caller.

A tool's contract is `invoke(arguments, context)`. The context is built per call by the
engine (`calls/running.py`) for whichever door received the call (the envelope over
MQTT today, MCP over MQTT next): the door decides where progress goes, the engine when a
call is cancelled. Backends read it and never know the door: the MCP backend asks its
server for progress only when `wants_progress`, a local tool reports through
`toolbus.progress(...)` (backends/local). Shaped after the mcp SDK's `DispatchContext`
(`cancel_requested`, `progress(...)`), which is what an MCP server's handler receives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from toolbus.wire.asking import InputRequest

Answers = dict[str, dict[str, Any]]
"""The caller's answer to each question by its key (an MCP `ElicitResult` or
`CreateMessageResult`, as JSON)."""


@dataclass(frozen=True, slots=True)
class Resume:
    """A continuation of a call whose server keeps no state (MCP 2026-07-28): the caller's
    answers and the server's own `requestState`, for the tool to call again with."""

    answers: Answers
    state: str | None
    asked: dict[str, str] | None = None  # each question's method, by key: one unanswered


class CallContext(Protocol):
    """One running call, as its tool sees it."""

    @property
    def key(self) -> str | None:
        """The call's dedup key (`Once.key`): who asked and which id. None: nobody owns it."""

    @property
    def deadline_at(self) -> float | None:
        """`time.monotonic()` past which the caller has stopped waiting (None: no bound)."""

    @property
    def wants_progress(self) -> bool:
        """Did the caller ask for progress? Backends ask their servers only then."""

    @property
    def cancel_cause(self) -> str | None:
        """Why the call is being cancelled (`caller`, `expired`), once it is."""

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """One progress update for the caller. Never blocks and never raises: the door
        queues, orders and rate-limits; a call whose caller did not ask drops it."""

    def task_status(self, status: str, message: str | None) -> None:
        """An upstream task's new status (`working`, `input_required`, ...) and message.
        Never blocks: relayed to a caller running the call as a task, else dropped."""

    @property
    def wants_input(self) -> bool:
        """Can the caller answer what the tool asks (`input: true`)?"""

    @property
    def resume(self) -> Resume | None:
        """Set on a continuation of a stateless server's call: what to call again with."""

    async def ask(self, questions: dict[str, InputRequest]) -> Answers | None:
        """Ask the caller while the tool waits (a server of before 2026-07-28 asks on its
        session): the answers, or None when there are none (the caller cannot answer, did
        not within `input_timeout_s`, or the call ended). Raises `ToolFailed` (reason
        `input_unrelayed`) when toolbus itself could not put the question (the caller's
        `input_max_open` reached, the token store down): no answer was given for it."""


class Detached:
    """The context of a call no door waits on (a tool invoked directly, in a test or a
    benchmark): no key, no deadline, no progress wanted, never cancelled."""

    key: str | None = None
    deadline_at: float | None = None
    wants_progress: bool = False
    cancel_cause: str | None = None

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Nobody listens."""

    def task_status(self, status: str, message: str | None) -> None:
        """Nobody listens."""

    wants_input: bool = False
    resume: Resume | None = None

    async def ask(self, questions: dict[str, InputRequest]) -> Answers | None:
        """Nobody answers."""
        return None


DETACHED: CallContext = Detached()

"""Call: one tool call as the engine runs it, whichever door it came through.

A door (the envelope over MQTT: doors/envelope) turns its messages into `Call`s; the
engine (answer, execute) runs them and never reads a message. `ReplyAddress` is where
the call's answer goes and until when its sender listens (set by the door).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolbus.tools.context import Resume
from toolbus.wire.contracts import ToolsFormat
from toolbus.wire.errors import ToolbusError


@dataclass(frozen=True, slots=True)
class ReplyAddress:
    topic: str
    correlation_data: bytes | None = None
    expires_at: float | None = None  # time.monotonic() after which the sender stops listening


@dataclass(frozen=True, slots=True)
class Call:
    id: str
    tool: str
    arguments: dict[str, Any]
    topic: str
    reply: ReplyAddress | None = None
    id_generated: bool = False
    caller: str | None = None
    timeout_s: float | None = None
    list_tools: bool = False
    topic_path: bool = False  # the tool came from the topic (and may be `caller/tool`)
    payload_bytes: int = 0  # size of the message that carried the call
    trace_fields: dict[str, str] = field(default_factory=dict)  # body trace context, baggage
    publish_trace: bool = False
    user_properties: tuple[tuple[str, str], ...] = field(default=())
    deadline_at: float | None = None  # time.monotonic() after which the sender stops caring
    tools_format: ToolsFormat = ToolsFormat.TOOLBUS  # on `{prefix}/tools`: the definitions' shape
    problem: ToolbusError | None = None  # what this call of a message got wrong: its answer
    # Where its message's reply goes (a call of many has no address of its own): an
    # anonymous caller's request ids are its reply topic's, as far as dedup goes.
    reply_topic: str | None = None
    provider_id: bool = False  # the id is a provider's tool-call id (`toolu_…`, `call_0`)
    correlation: bytes | None = None  # ids of ours (v5 correlation data, `toolbus.id`):
    message_id: str | None = None  # a retry sends them again, a new turn anew
    redelivered: bool = False  # the broker's DUP flag: a copy of a message it sent before
    task: bool = False  # run as a task: answered `working` at once, its end pushed
    delivery: str | None = None  # which delivery (`Inbound.delivery_id`): a copy keeps it
    progress: bool = False  # the caller asked for progress updates
    extend_on_progress: bool = False  # each update restarts the deadline, up to the cap
    wants_input: bool = False  # the caller can answer a tool's questions (`input: true`)
    # A continuation's: the token of the call it continues, and the caller's answers.
    continuation: str | None = None
    input_responses: dict[str, dict[str, Any]] | None = None
    approval: str | None = None  # the token of a person's approval of this very call
    resume: Resume | None = None  # a stateless server's call, continued: what to call with

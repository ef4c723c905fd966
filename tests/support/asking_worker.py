"""A stand-in worker whose tools ask their caller, and whose gate waits for approvals,
held strictly to the wire contract of issue 32 (wire/asking.py, docs/error-codes.md).

It reads requests off a real mosquitto (`{prefix}/call/#`) and answers on each request's
v5 Response Topic with its Correlation Data, as a worker does, so a caller (the client,
the command line) is tested against the contract before the worker's own relay exists:

- a tool in `questions` asks its rounds in turn. A request with `input: true` gets
  `input_required` (`input_requests`, `continuation`, `expires_in_s`); without it every
  elicitation is answered `decline` and every sampling request fails, for the caller,
  and the tool's own answer comes at once. Its final answer (`structured.answers`) holds
  what each question got, by key, in order: an `ElicitResult`, a `CreateMessageResult`,
  or `{"error": ...}` where the caller left a sampling request unanswered.
- a continuation must come under a new id, from the caller the token was made for, once,
  with an answer to each elicitation by its key that MCP's own types accept (`ElicitResult`,
  `CreateMessageResult`); otherwise `continuation_invalid` / `bad_request`, and what was
  wrong is kept in `violations`, which a test asserts empty.
- a tool in `gated` gets `approval_required` (`approval`, `call`: tool and arguments,
  `reason`, `expires_in_s`); the same call again with `approval` runs once; another
  caller's, a used, or an altered one gets `approval_invalid`.
- a provider's message (`toolbus` options beside it) is answered as a `CallsReply`, each
  call as above, `append` rendered by toolbus's own renderer.
- a cancel (`{prefix}/cancel/#`) is kept in `cancels` (and sets `cancelled`).
- `{prefix}/tools` lists the tools of `questions` and `gated` in the format asked, each
  taking a `text`.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiomqtt
from mcp.types import CreateMessageResult, ElicitResult
from pydantic import ValidationError

from tests.support.mqtt import Caller
from toolbus.wire.asking import ELICITATION, SAMPLING
from toolbus.wire.contracts import CallsReply, ErrorBody, ErrorCode, Options, Reply, ToolResult
from toolbus.wire.formats.envelope import options as read_options
from toolbus.wire.formats.envelope import request as read_request
from toolbus.wire.formats.incoming import read
from toolbus.wire.formats.outgoing import Answered, conversation

EXPIRES_IN_S = 120
SAMPLING_REFUSED = {"error": "sampling refused"}  # what a server gets for an unanswered one


@dataclass
class Pending:
    """A call waiting for its caller's answers: what a continuation token stands for."""

    caller: str | None
    tool: str
    arguments: dict[str, Any]
    round: int = 0  # the round asked (its questions: `questions[tool][round]`)
    answers: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Approval:
    caller: str | None
    tool: str
    arguments: dict[str, Any]


class AskingWorker:
    """`async with AskingWorker(broker_url, prefix) as worker:`; set `questions` and
    `gated` before calling."""

    def __init__(self, url: str, prefix: str, *, caller_in_topic: bool = False) -> None:
        self.prefix = prefix
        self._caller_in_topic = caller_in_topic  # `caller_identity = "topic"`
        self._caller = Caller(url)
        self.questions: dict[str, list[dict[str, dict[str, Any]]]] = {}
        self.gated: set[str] = set()
        self.requests: list[dict[str, Any]] = []  # every body, as it came
        self.topics: list[str] = []  # and its topic
        self.runs: list[tuple[str, dict[str, Any]]] = []  # (tool, arguments) run to the end
        self.answers: list[list[dict[str, Any]]] = []  # and what its questions got, each run
        self.cancels: list[dict[str, Any]] = []
        self.cancelled = asyncio.Event()
        self.violations: list[str] = []
        self._continuations: dict[str, Pending] = {}
        self._approvals: dict[str, Approval] = {}
        self._used: set[str] = set()
        self._ids: set[tuple[str | None, str]] = set()
        self._reader: asyncio.Task[None] | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[AskingWorker]:
        async with self._caller:
            await self._caller.subscribe(f"{self.prefix}/call/#")
            await self._caller.subscribe(f"{self.prefix}/tools/#")
            await self._caller.subscribe(f"{self.prefix}/cancel/#")
            self._reader = asyncio.create_task(self._serve())
            try:
                yield self
            finally:
                self._reader.cancel()

    async def _serve(self) -> None:
        while True:
            message = await self._caller.messages.get()
            await self._answer(message)

    async def _answer(self, message: aiomqtt.Message) -> None:
        assert isinstance(message.payload, bytes)
        body = json.loads(message.payload)
        if message.topic.value.startswith(f"{self.prefix}/cancel"):
            self.cancels.append(body)  # never answered: the call's own reply says so
            self.cancelled.set()
            return
        self.requests.append(body)
        self.topics.append(message.topic.value)
        shape = read(body)
        if message.topic.value.startswith(f"{self.prefix}/tools"):
            answer: Reply | CallsReply = self._tools(str(body.get("format", "toolbus")))
        elif shape.calls is None:
            answer = self._envelope(body, message.topic.value)
        else:
            opts = read_options(shape.options)
            replies = [
                self._call(opts, str(call.id), call.name, call.arguments) for call in shape.calls
            ]
            answered = [
                Answered(str(c.id), c.name, r) for c, r in zip(shape.calls, replies, strict=True)
            ]
            answer = CallsReply(
                id=str(shape.id or opts.id),
                format=shape.format,
                ok=all(r.ok for r in replies),
                append=conversation(shape.format, answered),
                results=replies,
                duration_ms=1.0,
            )
        topic = getattr(message.properties, "ResponseTopic", None)
        correlation = getattr(message.properties, "CorrelationData", None)
        assert topic is not None, "the client always gives a response topic"
        await self._caller.publish(
            topic, answer.model_dump_json(by_alias=True, exclude_none=True), correlation=correlation
        )

    def _tools(self, format: str) -> Reply:
        schema = {"type": "object", "properties": {"text": {"type": "string"}}}
        listed: list[Any] = []
        for name in sorted(set(self.questions) | self.gated):
            about = {"name": name, "description": f"{name}, which asks"}
            if format == "anthropic":
                listed.append({**about, "input_schema": schema})
            elif format == "openai":
                listed.append({"type": "function", "function": {**about, "parameters": schema}})
            elif format == "openai-responses":
                listed.append({"type": "function", **about, "parameters": schema})
            else:
                listed.append({**about, "inputSchema": schema, "origin": "local"})
        result = ToolResult(structured={"tools": listed, "pending": []})
        return Reply(id="tools", ok=True, result=result, duration_ms=1.0)

    def _envelope(self, body: dict[str, Any], topic: str) -> Reply:
        request = read_request(body, list_tools=False)
        levels = topic.removeprefix(f"{self.prefix}/call").strip("/").split("/")
        if self._caller_in_topic:  # call/{caller} or call/{caller}/{tool}
            request = request.model_copy(update={"caller": levels[0]})
            levels = levels[1:]
        tool = request.tool or (levels[0] if levels and levels[0] else "")
        return self._call(request, request.id or "", tool, request.arguments)

    def _call(self, opts: Options, ident: str, tool: str, arguments: dict[str, Any]) -> Reply:
        if (opts.caller, ident) in self._ids:
            self._violation(f"the id {ident} came twice: each round takes a new one")
        self._ids.add((opts.caller, ident))
        if opts.continuation is not None:
            return self._continued(opts, ident, tool)
        if tool in self.gated:
            refused = self._gate(opts, ident, tool, arguments)
            if refused is not None:
                return refused
        return self._round(opts, ident, Pending(opts.caller, tool, arguments))

    def _gate(
        self, opts: Options, ident: str, tool: str, arguments: dict[str, Any]
    ) -> Reply | None:
        if opts.approval is None:
            token = secrets.token_urlsafe(16)
            self._approvals[token] = Approval(opts.caller, tool, arguments)
            call = {"tool": tool, "arguments": arguments}
            return _error(
                ident,
                ErrorCode.APPROVAL_REQUIRED,
                approval=token,
                call=call,
                reason="tool",
                expires_in_s=EXPIRES_IN_S,
            )
        approval = self._approvals.get(opts.approval)
        reason = None
        if approval is None or approval.caller != opts.caller:
            reason = "unknown"
        elif opts.approval in self._used:
            reason = "used"
        elif (approval.tool, approval.arguments) != (tool, arguments):
            reason = "mismatch"
        if reason is not None:
            return _error(ident, ErrorCode.APPROVAL_INVALID, reason=reason)
        self._used.add(opts.approval)
        return None

    def _round(self, opts: Options, ident: str, pending: Pending) -> Reply:
        """The call at round `pending.round`: its questions to the caller, or its end."""
        rounds = self.questions.get(pending.tool, [])
        while pending.round < len(rounds):
            asked = rounds[pending.round]
            if opts.input:
                token = secrets.token_urlsafe(16)
                self._continuations[token] = pending
                return _error(
                    ident,
                    ErrorCode.INPUT_REQUIRED,
                    input_requests=asked,
                    continuation=token,
                    expires_in_s=EXPIRES_IN_S,
                )
            # The caller cannot answer: declined for it, and the tool goes on.
            pending.answers.append(
                {
                    key: {"action": "decline"} if q["method"] == ELICITATION else SAMPLING_REFUSED
                    for key, q in asked.items()
                }
            )
            pending.round += 1
        self.runs.append((pending.tool, pending.arguments))
        self.answers.append(pending.answers)
        return Reply(
            id=ident,
            ok=True,
            tool=pending.tool,
            result=ToolResult(text="done", structured={"answers": pending.answers}),
            duration_ms=1.0,
        )

    def _continued(self, opts: Options, ident: str, tool: str) -> Reply:
        token = opts.continuation or ""
        pending = self._continuations.get(token)
        if tool:
            self._violation(f"a continuation named a tool ({tool}): it needs none")
        reason = None
        if pending is None or pending.caller != opts.caller:
            reason = "unknown"
        elif token in self._used:
            reason = "used"
        if reason is not None or pending is None:
            self._violation(f"continuation refused: {reason}")
            return _error(ident, ErrorCode.CONTINUATION_INVALID, reason=reason)
        self._used.add(token)
        asked = self.questions[pending.tool][pending.round]
        responses = opts.input_responses or {}
        if not set(responses) <= set(asked):
            self._violation(f"answers to questions not asked: {set(responses) - set(asked)}")
            return _error(ident, ErrorCode.BAD_REQUEST, reason="unknown_keys")
        got: dict[str, Any] = {}
        for key, question in asked.items():
            answer = responses.get(key)
            if question["method"] == SAMPLING:
                got[key] = _valid(CreateMessageResult, answer) if answer else SAMPLING_REFUSED
            elif answer is None:
                self._violation(f"the elicitation {key} was left unanswered")
                got[key] = {"action": "cancel"}
            else:
                got[key] = _valid(ElicitResult, answer)
            if "invalid" in got[key]:
                self._violation(f"the answer to {key} is no MCP result: {got[key]['invalid']}")
        pending.answers.append(got)
        pending.round += 1
        return self._round(opts, ident, pending)

    def _violation(self, what: str) -> None:
        self.violations.append(what)


def _valid(model: type[ElicitResult] | type[CreateMessageResult], answer: Any) -> dict[str, Any]:
    """The answer as MCP's own type reads it back (by alias, as on the wire)."""
    try:
        parsed = model.model_validate(answer)
    except ValidationError as exc:
        return {"invalid": str(exc)}
    dumped: dict[str, Any] = parsed.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


def _error(ident: str, code: ErrorCode, **details: Any) -> Reply:
    return Reply(
        id=ident,
        ok=False,
        error=ErrorBody(code=code, message=code.value.replace("_", " "), details=details),
        duration_ms=1.0,
    )


def elicitation(message: str, **properties: dict[str, Any]) -> dict[str, Any]:
    """A form-mode elicitation/create as MCP defines its params."""
    return {
        "method": ELICITATION,
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": properties,
                "required": sorted(properties),
            },
        },
    }


def sampling(text: str, *, system: str | None = None, max_tokens: int = 100) -> dict[str, Any]:
    """A sampling/createMessage as MCP defines its params."""
    params: dict[str, Any] = {
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}],
        "maxTokens": max_tokens,
    }
    if system is not None:
        params["systemPrompt"] = system
    return {"method": SAMPLING, "params": params}

"""Asking: an MCP server's questions (elicitation, sampling), put to its call's caller.

toolbus declares the elicitation (form and URL) and sampling capabilities to every
server. A question reaches a caller only when its call said `input: true`
(`CallContext.wants_input`); any other call's is answered at once as a client that
cannot ask anyone would: elicitation `decline`, sampling an error.

Servers of two generations ask in two ways:

- before 2026-07-28, the server sends `elicitation/create` or `sampling/createMessage`
  on the session while the call runs (`Asking.elicit`, `Asking.sample`: the SDK's
  callbacks). Nothing in such a request names the call it is for, so it is taken to be
  the call's only while that call is the one in flight on the session; with several in
  flight it is declined, never put to a caller it may not be meant for. What keeps
  toolbus itself from asking (the caller's `input_max_open`, the token store down) is
  answered with a JSON-RPC error, never a `decline` the person did not give.
- from 2026-07-28, the server answers `tools/call` with `input_required`: the questions
  and its own state (`settle`). For a caller that can answer, they end the round
  (`InputRequired` with the state; calls/rounds.py keeps both on a token any worker
  resumes with `Resume`); for one that cannot, each elicitation is declined and the
  tool called again at once, and a sampling question (MCP has no "decline" for it) ends
  the call: `tool_error`, reason `input_unavailable`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mcp import ClientSession
from mcp.client.session import ClientRequestContext, MessageHandlerFnT
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    CallToolResult,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    InputRequiredResult,
    InputResponse,
    InputResponses,
)
from mcp_types import (
    InputRequest as McpInputRequest,
)
from pydantic import BaseModel, ValidationError

from toolbus.tools.context import CallContext, Resume
from toolbus.wire.asking import ELICITATION, SAMPLING, InputRequest
from toolbus.wire.errors import InputRequired, ToolbusError, ToolFailed

log = logging.getLogger("toolbus.mcp")

MAX_ROUNDS = 10  # a server asking on and on (the SDK's own bound)
STATE_ONLY_DELAY_S = 0.05  # a round with state and no question: the server is busy


class Asking:
    """One server's questions, to the caller of the one call each is for."""

    def __init__(self, server: str) -> None:
        self._server = server
        self._calls: dict[int, list[CallContext]] = {}  # by session: the calls in flight

    @contextmanager
    def calling(self, session: ClientSession, context: CallContext) -> Iterator[None]:
        """`context`'s call is in flight on `session` while the block runs."""
        calls = self._calls.setdefault(id(session), [])
        calls.append(context)
        try:
            yield
        finally:
            calls.remove(context)
            if not calls:
                del self._calls[id(session)]

    async def elicit(
        self, context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        answer = await self._ask(context, ELICITATION, params)
        if isinstance(answer, ErrorData):
            return answer
        if answer is None:
            return ElicitResult(action="decline")
        try:
            return ElicitResult.model_validate(answer)
        except ValidationError:
            log.warning("a caller's answer to %s's question is no ElicitResult", self._server)
            return ElicitResult(action="decline")

    async def sample(
        self, context: ClientRequestContext, params: CreateMessageRequestParams
    ) -> CreateMessageResult | ErrorData:
        answer = await self._ask(context, SAMPLING, params)
        if isinstance(answer, ErrorData):
            return answer
        if answer is None:
            return ErrorData(code=INVALID_REQUEST, message="the caller cannot answer sampling")
        try:
            return CreateMessageResult.model_validate(answer)
        except ValidationError:
            log.warning(
                "a caller's answer to %s's question is no CreateMessageResult", self._server
            )
            return ErrorData(code=INVALID_REQUEST, message="the caller's answer was malformed")

    async def _ask(
        self, ctx: ClientRequestContext, method: str, params: BaseModel
    ) -> dict[str, Any] | ErrorData | None:
        """The caller's answer; None: declined (no caller to ask, or no answer in time);
        an error when toolbus could not ask (the tool's call is its own to end)."""
        calls = self._calls.get(id(ctx.session), [])
        if len(calls) != 1:
            if calls:
                log.info("%s asked with %d calls in flight: declined", self._server, len(calls))
            return None
        context = calls[0]
        if not context.wants_input:
            return None
        key = f"{method.split('/', maxsplit=1)[0]}-{ctx.request_id}"
        question = InputRequest.model_validate({"method": method, "params": _json(params)})
        try:
            answers = await context.ask({key: question})
        except ToolbusError as unrelayed:
            refused = unrelayed.details.get("refused", unrelayed.code.value)
            return ErrorData(code=INTERNAL_ERROR, message=f"{unrelayed.message} ({refused})")
        return None if answers is None else answers.get(key)


def session_of(
    read: Any, write: Any, message_handler: MessageHandlerFnT, asking: Asking | None
) -> ClientSession:
    """The SDK's session, with `asking`'s callbacks: it declares elicitation (form and
    URL) and sampling to the server because they are set."""
    if asking is None:
        return ClientSession(read, write, message_handler=message_handler)
    return ClientSession(
        read,
        write,
        message_handler=message_handler,
        elicitation_callback=asking.elicit,
        sampling_callback=asking.sample,
    )


Call = Callable[
    [InputResponses | None, str | None], Awaitable[CallToolResult | InputRequiredResult]
]


async def settle(
    first: CallToolResult | InputRequiredResult, again: Call, context: CallContext
) -> CallToolResult:
    """A 2026-07-28 server's `tools/call` result to its end, for this call's caller:
    its questions raised as `InputRequired` (with the server's state) for a caller that
    can answer, else declined and the tool called again (`again`), up to MAX_ROUNDS."""
    result = first
    for _ in range(MAX_ROUNDS):
        if not isinstance(result, InputRequiredResult):
            return result
        asked = result.input_requests or {}
        if asked and context.wants_input:
            questions = {key: _question(request) for key, request in asked.items()}
            raise InputRequired(
                "the tool asks its caller", questions=questions, state=result.request_state
            )
        if not asked:
            await asyncio.sleep(STATE_ONLY_DELAY_S)
        result = await again(_declined(asked), result.request_state)
    raise ToolFailed("the server went on asking past every round", reason="input_rounds")


def responses(resume: Resume | None) -> InputResponses | None:
    """The caller's answers as the SDK sends them (`inputResponses`). A question left
    unanswered is what a caller that cannot answer gets: an elicitation declined, a
    sampling the end of the call (`input_unavailable`), as an older server's would."""
    if resume is None:
        return None
    answered: InputResponses = {k: _response(a) for k, a in resume.answers.items()}
    for key, method in (resume.asked or {}).items():
        if key in answered:
            continue
        if method != ELICITATION:
            raise ToolFailed(
                "the tool asks for what only its caller could give (sampling), and the "
                "caller did not answer",
                reason="input_unavailable",
            )
        answered[key] = ElicitResult(action="decline")
    return answered


def _response(answer: dict[str, Any]) -> InputResponse:
    try:
        if "action" in answer:
            return ElicitResult.model_validate(answer)
        return CreateMessageResult.model_validate(answer)
    except ValidationError:
        raise ToolFailed(
            "a caller's answer is no ElicitResult or CreateMessageResult",
            reason="bad_input_response",
        ) from None


def _declined(asked: dict[str, McpInputRequest]) -> InputResponses | None:
    if not asked:
        return None
    declined: InputResponses = {}
    for key, request in asked.items():
        if not isinstance(request, ElicitRequest):
            raise ToolFailed(
                "the tool asks for what only its caller could give (sampling); the "
                "caller did not say `input: true`",
                reason="input_unavailable",
            )
        declined[key] = ElicitResult(action="decline")
    return declined


def _question(request: McpInputRequest) -> InputRequest:
    return InputRequest.model_validate({"method": request.method, "params": _json(request.params)})


def _json(params: BaseModel | None) -> dict[str, Any]:
    if params is None:
        return {}
    dumped: dict[str, Any] = params.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped

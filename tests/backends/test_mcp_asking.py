"""The MCP side of a question toolbus cannot put to its caller (backends/mcp/asking.py):
the server gets a JSON-RPC error, never a `decline` the caller did not give; a question
nobody can answer (the caller did not say `input: true`) is declined as before."""

from __future__ import annotations

from typing import Any

from mcp.client.session import ClientRequestContext
from mcp_types import (
    INTERNAL_ERROR,
    CreateMessageRequestParams,
    ElicitRequestFormParams,
    ElicitResult,
    ErrorData,
    SamplingMessage,
    TextContent,
)

from toolbus.backends.mcp.asking import Asking
from toolbus.calls.asked import unrelayed
from toolbus.tools.context import Answers, Detached
from toolbus.wire.asking import InputRequest
from toolbus.wire.errors import RateLimited


class Refusing(Detached):
    """A call whose caller can answer, but toolbus cannot ask (input_max_open reached)."""

    wants_input = True

    async def ask(self, questions: dict[str, InputRequest]) -> Answers | None:
        raise unrelayed(RateLimited("input_max_open reached", limit="input_max_open"))


def request_context(session: Any) -> ClientRequestContext:
    return ClientRequestContext(session=session, request_id=7)


ELICIT = ElicitRequestFormParams(
    mode="form", message="Which?", requested_schema={"type": "object", "properties": {}}
)
SAMPLE = CreateMessageRequestParams(
    messages=[SamplingMessage(role="user", content=TextContent(type="text", text="hi"))],
    max_tokens=5,
)


async def test_a_question_toolbus_cannot_put_is_an_error_to_the_server() -> None:
    asking, session = Asking("s"), object()
    with asking.calling(session, Refusing()):  # type: ignore[arg-type]
        elicited = await asking.elicit(request_context(session), ELICIT)
        sampled = await asking.sample(request_context(session), SAMPLE)
    for answer in (elicited, sampled):
        assert isinstance(answer, ErrorData) and answer.code == INTERNAL_ERROR
        assert "rate_limited" in answer.message


async def test_a_caller_that_cannot_answer_is_declined() -> None:
    asking, session = Asking("s"), object()
    with asking.calling(session, Detached()):  # type: ignore[arg-type]
        elicited = await asking.elicit(request_context(session), ELICIT)
    assert isinstance(elicited, ElicitResult) and elicited.action == "decline"

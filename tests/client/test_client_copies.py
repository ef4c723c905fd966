"""The client's rule for copies of one request: an answer that says its own delivery did
not run is not the request's answer while another copy is unanswered (issue 29).

`toolbus.Client` re-sends an unanswered request; each copy is answered by whichever
worker got it. `unavailable` for a stalled store, `rate_limited` or an expired `timeout`
say only that their delivery did not run: another copy, waiting in a worker's claim, may
still run. So such an answer is held, nothing more is sent, and the client waits, within
the deadline, for the other copies: an answer that says more wins; every copy "not run"
is the answer; a copy still unanswered at the end leaves the outcome unknown (`NoReply`).

The "worker" here is a test client on a real mosquitto answering each copy by hand, so
which copy is answered what, and in which order, is the test's choice, not timing's.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiomqtt
import pytest
import pytest_asyncio

from tests.support.harness import Broker
from tests.support.mqtt import Caller, correlation_of
from toolbus import CallsReply, Client, ErrorCode, NoReply, Reply, Retry
from toolbus.client.client import said
from toolbus.client.requester import Said
from toolbus.wire.contracts import ErrorBody
from toolbus.wire.errors import CallTimeout, InDoubt, InvalidArguments, Unavailable

SETTLED_S = 5.0  # every call below ends well within this, far before its deadline


def error(code: ErrorCode, **details: Any) -> dict[str, Any]:
    return {"code": code, "message": code.value, "details": details}


STORE = error(ErrorCode.UNAVAILABLE, store=True)
SERVER_DOWN = error(ErrorCode.UNAVAILABLE, server="devices")
RATE = error(ErrorCode.RATE_LIMITED, limit="rate", retry_after_ms=1000)
EXPIRED = error(ErrorCode.TIMEOUT, expired=True)


@pytest_asyncio.fixture
async def fake_worker(broker: Broker) -> AsyncIterator[tuple[Caller, str]]:
    """A subscriber on a fresh call topic, answering each copy by hand."""
    prefix = f"cp{uuid.uuid4().hex[:8]}"
    async with Caller(broker.url) as worker:
        await worker.subscribe(f"{prefix}/call/#")
        yield worker, prefix


async def copies(worker: Caller, count: int) -> list[aiomqtt.Message]:
    """The next `count` copies of a request as the worker receives them."""
    return [await worker.next_message() for _ in range(count)]


async def answer(
    worker: Caller,
    copy: aiomqtt.Message,
    failed: dict[str, Any] | None = None,
    *,
    duration_ms: float = 1.0,
    replayed: bool = False,
) -> None:
    """Answers `copy`: ok, or `failed` (an error body). Each answer its own duration, as a
    worker's are: two copies' answers are never byte for byte alike."""
    ident = json.loads(copy.payload)["id"]
    reply = Reply(
        id=ident,
        ok=failed is None,
        result={"text": "ran"} if failed is None else None,
        error=ErrorBody.model_validate(failed) if failed is not None else None,
        duration_ms=duration_ms,
        replayed=replayed,
    )
    response_topic = getattr(copy.properties, "ResponseTopic", None)
    assert response_topic is not None
    await worker.publish(
        response_topic, reply.model_dump_json(exclude_none=True), correlation=correlation_of(copy)
    )


def two_sends(broker: Broker, prefix: str) -> Client:
    """Two sends, 0.2 s apart: the first is never answered before the second is sent."""
    return Client(broker.url, prefix=prefix, retry=Retry(attempts=2, interval_s=0.2))


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        pytest.param(STORE, None, None, id="store-then-ran"),
        pytest.param(RATE, None, None, id="rate-limited-then-ran"),
        pytest.param(SERVER_DOWN, None, None, id="server-down-then-ran"),
        pytest.param(EXPIRED, error(ErrorCode.TIMEOUT, timeout_s=5), CallTimeout, id="expired"),
        pytest.param(STORE, error(ErrorCode.IN_DOUBT), InDoubt, id="store-then-in-doubt"),
    ],
)
async def test_a_later_copys_answer_that_says_more_wins(
    broker: Broker,
    fake_worker: tuple[Caller, str],
    first: dict[str, Any],
    second: dict[str, Any] | None,
    expected: type[Exception] | None,
) -> None:
    """Copy 1 is answered "did not run", then copy 2 with what became of the request:
    the client gives copy 2's answer (it used to give copy 1's, and copy 2 had run)."""
    worker, prefix = fake_worker
    async with two_sends(broker, prefix) as client:
        calling = asyncio.create_task(client.call("act", timeout_s=30), name="call")
        one, two = await copies(worker, 2)
        await answer(worker, one, first)  # the broker keeps their order: this comes first
        await answer(worker, two, second, duration_ms=2.0)
        async with asyncio.timeout(SETTLED_S):
            (outcome,) = await asyncio.gather(calling, return_exceptions=True)
        assert client.sent == 2  # an answer came, held or not: nothing more was sent
    if expected is None:
        assert isinstance(outcome, Reply) and outcome.ok
    else:
        assert type(outcome) is expected
        assert isinstance(outcome, CallTimeout | InDoubt)
        assert outcome.details.get("expired") is None  # copy 2's, not copy 1's


async def test_every_copy_answered_not_run_is_the_answer(
    broker: Broker, fake_worker: tuple[Caller, str]
) -> None:
    """Both copies say they did not run: none did, and the client says so at once (not
    at the deadline), with the answer that says most: a server that was down may have
    been lost mid-call, which "the store was away" cannot contradict."""
    worker, prefix = fake_worker
    async with two_sends(broker, prefix) as client:
        calling = asyncio.create_task(client.call("act", timeout_s=30), name="call")
        one, two = await copies(worker, 2)
        await answer(worker, one, STORE)
        await answer(worker, two, SERVER_DOWN, duration_ms=2.0)
        with pytest.raises(Unavailable) as raised:
            async with asyncio.timeout(SETTLED_S):
                await calling
    assert raised.value.details == {"server": "devices"}


async def test_the_same_answer_delivered_twice_is_one_copys(
    broker: Broker, fake_worker: tuple[Caller, str]
) -> None:
    """Copy 1's `unavailable` comes twice (QoS 1 is at least once; a worker answers its
    request's redelivery with the reply it kept): still one copy's answer, so the client
    waits for copy 2's, which ran."""
    worker, prefix = fake_worker
    async with two_sends(broker, prefix) as client:
        calling = asyncio.create_task(client.call("act", timeout_s=30), name="call")
        one, two = await copies(worker, 2)
        await answer(worker, one, STORE)
        await answer(worker, one, STORE)
        await answer(worker, two, None, duration_ms=2.0)
        async with asyncio.timeout(SETTLED_S):
            reply = await calling
    assert reply.ok


async def test_a_copy_unanswered_at_the_deadline_leaves_the_outcome_unknown(
    broker: Broker, fake_worker: tuple[Caller, str]
) -> None:
    """Copy 1 did not run, copy 2 is never answered (it may have run): not `Unavailable`
    but `NoReply`, with the answer that came and the count of copies (deadline 0.5 s,
    and the client's 2 s for the worker's own answer at the deadline)."""
    worker, prefix = fake_worker
    async with two_sends(broker, prefix) as client:
        calling = asyncio.create_task(client.call("act", id="r1", timeout_s=0.5), name="call")
        one, _ = await copies(worker, 2)
        await answer(worker, one, STORE)
        with pytest.raises(NoReply) as raised:
            async with asyncio.timeout(SETTLED_S):
                await calling
    assert raised.value.id == "r1"  # sent again under it later: the first run's answer
    assert raised.value.details == {"sends": 2, "answered": 1}
    held = raised.value.answer
    assert isinstance(held, Reply) and held.error is not None
    assert held.error.code is ErrorCode.UNAVAILABLE


async def test_a_final_answer_ends_the_call_at_once(
    broker: Broker, fake_worker: tuple[Caller, str]
) -> None:
    """An answer about the request (here the arguments are wrong: every copy is) ends the
    call as it always did, without waiting for the other copy."""
    worker, prefix = fake_worker
    async with two_sends(broker, prefix) as client:
        calling = asyncio.create_task(client.call("act", timeout_s=30), name="call")
        one, _ = await copies(worker, 2)
        await answer(worker, one, error(ErrorCode.INVALID_ARGUMENTS))
        with pytest.raises(InvalidArguments):
            async with asyncio.timeout(SETTLED_S):
                await calling


@pytest.mark.parametrize(
    ("failed", "replayed", "expected"),
    [
        (None, False, Said.FINAL),
        (STORE, False, Said.NOT_RUN),
        (STORE, True, Said.FINAL),  # a run's recorded answer, whatever it says
        (RATE, False, Said.NOT_RUN),
        (EXPIRED, False, Said.NOT_RUN),
        (error(ErrorCode.TIMEOUT, timeout_s=5), False, Said.FINAL),
        (SERVER_DOWN, False, Said.UNKNOWN),
        (error(ErrorCode.IN_DOUBT), False, Said.FINAL),
        (error(ErrorCode.TOOL_ERROR), False, Said.FINAL),
    ],
)
def test_what_an_answer_says_of_its_request(
    failed: dict[str, Any] | None, replayed: bool, expected: Said
) -> None:
    reply = Reply(
        id="r",
        ok=failed is None,
        error=ErrorBody.model_validate(failed) if failed else None,
        duration_ms=1.0,
        replayed=replayed,
    )
    assert said(reply) is expected
    # A message's answer says the least any of its calls does.
    ok = Reply(id="o", ok=True, duration_ms=1.0)
    message = CallsReply(id="m", format="toolbus", ok=False, results=[ok, reply], duration_ms=1)
    assert said(message) is expected

"""Hostile requests through a real broker: the offender gets its error, nobody else loses
anything, and the worker never loses its connection.

The audit's worst case: one request with a control character in `reply_to` made the
broker disconnect the worker, and 1 499 of 2 000 concurrent calls were lost.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.support.harness import Broker, make_settings, running_worker
from tests.support.hostile import envelopes
from tests.support.mqtt import Caller
from toolbus.backends.local.functions import LocalTool
from toolbus.transport import max_packet_bytes
from toolbus.wire.contracts import ErrorCode
from toolbus.worker.service import Worker

CONCURRENT_CALLS = 2000
FUZZ_MAX_PAYLOAD_BYTES = 64 * 1024

# (payload, expected code): each would have cost the worker its connection, run a tool
# and then failed to answer, or been dropped without a word.
HOSTILE = [
    (b'{"tool": "echo", "reply_to": "%s/reply/\\u0001", "arguments": {"text": "x"}}', "forbidden"),
    (b'{"tool": "echo", "reply_to": "%s/reply/\\ud800", "arguments": {"text": "x"}}', "forbidden"),
    (b'{"tool": "echo", "reply_to": "%s/reply/\\u0085x", "arguments": {"text": "x"}}', "forbidden"),
    (b'{"tool": "echo", "reply_to": "%s/reply/#", "arguments": {"text": "x"}}', "forbidden"),
    (b'{"tool_calls": [1]}', "bad_request"),
    (b'{"tool": "echo", "id": "\\ud800", "arguments": {"text": "x"}}', "bad_request"),
    (b'{"tool": "echo", "arguments": {"text": "\\udc00"}}', "bad_request"),
]


@pytest.fixture(scope="module")
def roomy_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """Queues as many requests per session as the compose broker does: mosquitto's
    default (1000) would drop some of the 2 000 concurrent calls itself."""
    broker = Broker(tmp_path_factory.mktemp("mosquitto-roomy"), max_queued_messages=100_000)
    broker.start()
    yield broker
    broker.stop()


@pytest_asyncio.fixture
async def worker(roomy_broker: Broker) -> AsyncIterator[Worker]:
    async with running_worker(make_settings(roomy_broker, concurrency=64)) as w:
        yield w


async def test_hostile_requests_among_many_cost_no_one_else(
    worker: Worker, roomy_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    broker = roomy_broker
    prefix = worker.topics.prefix
    async with Caller(broker.url) as caller, Caller(broker.url, v5=False) as attacker:
        await attacker.subscribe(f"{prefix}/dead")
        calls = [
            caller.call_tool(
                worker.topics,
                "echo",
                {"text": f"n{n}"},
                reply_topic=f"{prefix}/reply/many",
                wait_s=60,
            )
            for n in range(CONCURRENT_CALLS)
        ]
        with caplog.at_level(logging.WARNING, logger="toolbus.service"):
            gathered = asyncio.gather(*calls)
            for payload, _ in HOSTILE:
                await attacker.publish(f"{prefix}/call", payload.replace(b"%s", prefix.encode()))
            replies = await gathered
            letters = [json.loads((await attacker.next_message()).payload) for _ in HOSTILE]
        assert all(reply["ok"] for reply in replies)
        assert len(replies) == CONCURRENT_CALLS
        # The 3.1.1 hostile requests have no usable reply address: each is dead-lettered.
        expected = sorted(code for _, code in HOSTILE)
        assert sorted(letter["error"]["code"] for letter in letters) == expected
        assert not [r for r in caplog.records if "connection lost" in r.getMessage()]
        assert attacker.unclaimed() == []


@pytest_asyncio.fixture(scope="module")
async def fuzz_target(broker: Broker) -> AsyncIterator[tuple[Worker, Caller]]:
    async with (
        running_worker(make_settings(broker, max_payload_bytes=FUZZ_MAX_PAYLOAD_BYTES)) as w,
        Caller(broker.url) as client,
    ):
        await client.subscribe(f"{w.topics.prefix}/dead")
        await client.subscribe(f"{w.topics.prefix}/reply/#")
        yield w, client


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=envelopes(), v5=st.booleans())
async def test_fuzzed_envelopes_through_the_broker_each_get_one_answer(
    fuzz_target: tuple[Worker, Caller], body: Any, v5: bool
) -> None:
    worker, client = fuzz_target
    prefix = worker.topics.prefix
    reply_topic = f"{prefix}/reply/fuzz"
    if not v5:  # an address, so even a success must answer (a bare list has no room)
        body = body if isinstance(body, dict) else {"content": body, "role": "assistant"}
        body["reply_to"] = reply_topic
        if isinstance(body.get("toolbus"), dict) or "tool" not in body:
            body["toolbus"] = {**(body.get("toolbus") or {}), "reply_to": reply_topic}
    payload = json.dumps(body).encode()
    # A larger packet the broker drops for the worker, unread (its Maximum Packet Size;
    # tests/calls/test_oversize_broker.py): every request the worker reads gets one answer.
    assume(len(payload) + 1024 < max_packet_bytes(FUZZ_MAX_PAYLOAD_BYTES))
    await client.publish(
        f"{prefix}/call",
        payload,
        response_topic=reply_topic if v5 else None,
        correlation=b"fuzz" if v5 else None,
    )
    # The next message on the reply or dead-letter topics is this request's answer
    # (one request at a time); a success with a reply_to elsewhere lands under reply/#.
    answer = await client.next_message(timeout_s=15)
    parsed = json.loads(answer.payload)
    for part in parsed.get("results", [parsed]):  # a provider's message: each call's answer
        code = part["error"]["code"] if "error" in part else "ok"
        assert code in {c.value for c in ErrorCode} - {"internal"} | {"ok"}, parsed
    assert worker.subscribed.is_set()


async def test_the_worker_is_healthy_after_the_fuzzing(
    fuzz_target: tuple[Worker, Caller],
) -> None:
    worker, client = fuzz_target
    client.unclaimed()
    reply = await client.call_tool(worker.topics, "echo", {"text": "still here"})
    assert reply["ok"] is True


async def test_numbers_python_cannot_hold_are_answered_through_the_broker(broker: Broker) -> None:
    """Issue 24.6 from the outside. A 5 000-digit numeric string for an integer parameter
    (Python makes no int of more than 4 300 digits: the call answered `internal`) and
    `1e999999` (infinity to Python: it reached the tool and the reply was not JSON) each
    get their code on the caller's reply topic, a 3.1.1 caller's `reply_to` included; the
    tool runs only for the good call."""
    runs: list[int] = []

    async def count_to(n: int) -> dict[str, int]:
        runs.append(n)
        return {"n": n}

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    counting = LocalTool("count_to", "Counts to n.", schema, count_to)
    settings = make_settings(broker, max_payload_bytes=100_000)
    async with running_worker(settings, [counting]) as w, Caller(broker.url) as caller:
        prefix = w.topics.prefix
        digits = await caller.call_tool(
            w.topics, "count_to", {"n": "9" * 5000}, reply_topic=f"{prefix}/reply/digits"
        )
        assert digits["error"]["code"] == "invalid_arguments", digits["error"]
        infinite, _ = await caller.call(
            f"{prefix}/call/count_to",
            b'{"id": "inf", "arguments": {"n": 1e999999}}',
            reply_topic=f"{prefix}/reply/inf",
        )
        assert infinite["error"]["code"] == "bad_request"
        assert infinite["error"]["details"]["reason"] == "not_json"
        # A 3.1.1 caller's address is in the body the number made unreadable: still heard.
        async with Caller(broker.url, v5=False) as old:
            await old.subscribe(f"{prefix}/reply/old")
            for ident, number in (("inf-311", "1e999999"), ("digits-311", "9" * 5000)):
                body = f'{{"id": "{ident}", "reply_to": "{prefix}/reply/old", '
                await old.publish(
                    f"{prefix}/call/count_to", f'{body}"arguments": {{"n": {number}}}}}'
                )
                async with asyncio.timeout(10):
                    answer = json.loads((await old.next_message()).payload)
                assert (answer["id"], answer["error"]["code"]) == (ident, "bad_request")
                assert answer["error"]["details"]["reason"] == "not_json"
        good = await caller.call_tool(
            w.topics, "count_to", {"n": 12}, reply_topic=f"{prefix}/reply/good"
        )
        assert good["result"]["structured"] == {"n": 12}
    assert runs == [12]

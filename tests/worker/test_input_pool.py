"""Input relayed in a pool: two workers share one `$share` subscription and one Redis.

An older server's call waits on the worker whose session holds it. Its continuation may
reach the other worker (behind `$share` the broker picks): that worker asks the holder,
over the pool's Redis, to resume the call, and answers its own request with the round's
end. Which worker the broker picks is its choice, so the test hands the continuation to
the worker that does not hold the call, as the broker would (`Pipeline.handle`), and
reads the reply on the broker. A 2026-07-28 server's call is resumed by whichever
worker gets its continuation, from the token's record. When the holder is gone (its
subscription to the relay closed, as a killed worker's is), the continuation is
answered `in_doubt` at once, never left waiting.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.cli.test_cli import cli_env
from tests.support.asking import ASKING, continuation
from tests.support.harness import Broker, RedisServer, make_settings, measured, running_worker
from tests.support.mqtt import Caller, call_topic, correlation_of
from tests.support.processes import Serve
from toolbus.wire.messages import Inbound
from toolbus.worker.service import Worker

WAIT_S = 20.0
ACCEPT = {"action": "accept", "content": {"device": "lamp"}}


@pytest_asyncio.fixture
async def pool(broker: Broker, redis_server: RedisServer) -> AsyncIterator[list[Worker]]:
    prefix = f"ip{uuid.uuid4().hex[:8]}"
    servers = {
        "legacy": {"command": sys.executable, "args": [str(ASKING), "--legacy"]},
        "modern": {"command": sys.executable, "args": [str(ASKING)]},
    }
    async with AsyncExitStack() as stack:
        workers = [
            await stack.enter_async_context(
                running_worker(
                    make_settings(
                        broker,
                        topic_prefix=prefix,
                        dedup_store=redis_server.url,
                        mcpServers=servers,
                    )
                )
            )
            for _ in range(2)
        ]
        yield workers


class Asker:
    """A caller that can answer, its replies under the pool's prefix (`asker`)."""

    def __init__(self, caller: Caller, prefix: str) -> None:
        self.caller = caller
        self.reply = f"{prefix}/reply/me"

    async def first_round(self, worker: Worker, tool: str) -> tuple[str, str]:
        """The call, asked through the broker: its question's key and token."""
        answer, _ = await self.caller.call(
            call_topic(worker.topics, tool),
            {"input": True, "arguments": {"room": "hall"}},
            reply_topic=self.reply,
            timeout_s=WAIT_S,
        )
        assert answer["error"]["code"] == "input_required", answer
        [key] = answer["error"]["details"]["input_requests"]
        return key, answer["error"]["details"]["continuation"]

    async def continue_at(
        self, worker: Worker, token: str, key: str, ident: str | None = None
    ) -> dict[str, Any]:
        """The continuation (under `ident`, else an id of its own), delivered to `worker`
        as the broker would; its reply, read on the broker within WAIT_S."""
        correlation = uuid.uuid4().hex.encode()
        body = continuation(token, {key: ACCEPT}, id=ident or f"c-{correlation.decode()[:8]}")
        message = Inbound(
            topic=call_topic(worker.topics),
            payload=json.dumps(body).encode(),
            response_topic=self.reply,
            correlation_data=correlation,
        )
        await asyncio.wait_for(worker.pipeline.handle(message), WAIT_S)
        async with asyncio.timeout(WAIT_S):
            while True:
                got = await self.caller.next_message(WAIT_S)
                if correlation_of(got) == correlation:
                    return dict(json.loads(got.payload))


@asynccontextmanager
async def asker(broker: Broker, prefix: str) -> AsyncIterator[Asker]:
    """An `Asker` connected to the broker and subscribed to its reply topic."""
    async with Caller(broker.url) as caller:
        asking = Asker(caller, prefix)
        await caller.subscribe(asking.reply)
        yield asking


async def held_call(asking: Asker, pool: list[Worker]) -> tuple[str, str, Worker, Worker]:
    """An older server's call asked at the pool's first worker: its question's key and
    token, the worker whose session holds it, and the other."""
    key, token = await asking.first_round(pool[0], "legacy.pick_device")
    holders = [w for w in pool if w.pipeline.rounds.held(token) is not None]
    assert len(holders) == 1, "one worker holds the call"
    [other] = [w for w in pool if w is not holders[0]]
    return key, token, holders[0], other


async def test_a_continuation_at_the_other_worker_resumes_the_held_call(
    broker: Broker, pool: list[Worker]
) -> None:
    async with asker(broker, pool[0].topics.prefix) as asking:
        key, token, holder, other = await held_call(asking, pool)
        started = time.monotonic()
        final = await asking.continue_at(other, token, key)
        took_ms = (time.monotonic() - started) * 1000
    assert final["ok"] is True, final
    assert final["result"]["structured"] == {"action": "accept", "device": "lamp"}
    assert holder.pipeline.rounds.held(token) is None
    measured(f"continuation relayed to the holding worker and answered: {took_ms:.1f} ms")


async def test_a_stateless_servers_continuation_is_resumed_by_either_worker(
    broker: Broker, pool: list[Worker]
) -> None:
    async with asker(broker, pool[0].topics.prefix) as asking:
        for worker in pool:  # each worker resumes a call the other may have asked
            key, token = await asking.first_round(worker, "modern.pick_device")
            final = await asking.continue_at(worker, token, key)
            assert final["ok"] is True, final
            assert final["result"]["structured"]["device"] == "lamp"


async def test_when_the_holder_is_gone_the_continuation_is_in_doubt_at_once(
    broker: Broker, pool: list[Worker]
) -> None:
    async with asker(broker, pool[0].topics.prefix) as asking:
        key, token, holder, other = await held_call(asking, pool)
        relay = holder.pipeline.rounds.relay
        assert relay is not None
        await relay.__aexit__(None, None, None)  # what a killed worker's connection does
        started = time.monotonic()
        final = await asking.continue_at(other, token, key)
        took_s = time.monotonic() - started
    assert final["error"]["code"] == "in_doubt", final
    assert final["error"]["details"]["cause"] == "worker_lost"
    assert took_s < 2.0
    measured(f"continuation whose holder is gone: in_doubt after {took_s * 1000:.0f} ms")


@pytest.mark.parametrize("tool", ["legacy.pick_device", "modern.pick_device"])
async def test_a_copy_of_a_continuation_at_the_other_worker_replays(
    broker: Broker, pool: list[Worker], tool: str
) -> None:
    """The continuation's own id is claimed in the shared store: its copy delivered to
    the other worker gets the same reply, and the answers reach the tool once."""
    async with asker(broker, pool[0].topics.prefix) as asking:
        key, token = await asking.first_round(pool[0], tool)
        replies = [await asking.continue_at(worker, token, key, ident="copy-1") for worker in pool]
    first, copy = replies
    assert first["ok"] is True and copy["replayed"] is True
    assert copy["result"] == first["result"]


async def test_a_holder_killed_while_its_call_waits_is_in_doubt_not_a_hang(
    broker: Broker, redis_server: RedisServer, tmp_path: Path
) -> None:
    """The holder is a real `toolbus serve`, SIGKILLed while its call waits for the
    caller; the continuation reaches the worker that lives: `in_doubt`, at once."""
    prefix = f"ik{uuid.uuid4().hex[:8]}"
    servers = tmp_path / "mcp.json"
    legacy = {"command": sys.executable, "args": [str(ASKING), "--legacy"]}
    servers.write_text(json.dumps({"mcpServers": {"legacy": legacy}}))
    env = cli_env(prefix)
    env["TOOLBUS_DEDUP_STORE"] = redis_server.url
    settings = make_settings(
        broker, topic_prefix=prefix, dedup_store=redis_server.url, mcpServers={"legacy": legacy}
    )
    async with (
        Serve(env, "--broker", broker.url, "--mcp-config", str(servers)) as serve,
        running_worker(settings) as alive,
        asker(broker, prefix) as asking,
    ):
        caller = asking.caller
        await caller.subscribe(f"{prefix}/status/workers/+")
        ready: set[str] = set()
        async with asyncio.timeout(WAIT_S):  # both workers' `legacy` servers are ready
            while len(ready) < 2:
                status = json.loads((await caller.next_message(WAIT_S)).payload)
                if status.get("servers", {}).get("legacy", {}).get("state") == "ready":
                    ready.add(status["worker_id"])
        token = key = ""
        for _ in range(8):  # `$share` picks: until the serve process holds one
            key, token = await asking.first_round(alive, "legacy.pick_device")
            if alive.pipeline.rounds.held(token) is None:
                break
        assert token and alive.pipeline.rounds.held(token) is None, "the serve process holds it"
        serve.kill()
        started = time.monotonic()
        final = await asking.continue_at(alive, token, key)
        took_s = time.monotonic() - started
    assert final["error"]["code"] == "in_doubt", final
    assert took_s < 3.0
    measured(f"continuation whose holder was SIGKILLed: in_doubt after {took_s * 1000:.0f} ms")

"""The pool's relay over Redis pub/sub: a message to one worker, and its answer.

Each worker listens on `{prefix}:relay:{owner}` (`owner`: `worker_id/incarnation`, as
its tokens name it, so a restarted worker is another owner). `ask` publishes to the
owner's channel and waits for the answer on its own. Redis says how many listened: none
means the owner is gone, at once. While it waits it asks Redis every `CHECK_S` whether
anyone still listens there (a killed worker's connection closes, and its subscription
with it), so a holder that dies mid-round is noticed within seconds, never waited for
past the bound. Messages are JSON; each is at most what a round's questions or reply
hold (bounded by `token_caller_max_bytes` and the dedup reply bound upstream).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from typing import Any, Self

from redis.asyncio import Redis

from toolbus.wire.tasks import cancel_and_wait

log = logging.getLogger("toolbus.rounds")

CHECK_S = 1.0  # how often a waiting `ask` checks that its worker still listens
LISTEN_POLL_S = 1.0  # the listener's bound on one wait for a message


class RedisRelay:
    """Messages between the workers of one Redis, each to one worker by owner name."""

    def __init__(self, url: str, *, prefix: str, owner: str, timeout_s: float = 5.0) -> None:
        self._redis: Redis = Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._prefix = prefix
        self._owner = owner
        self._handler: Any = None
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._pubsub = self._redis.pubsub()
        self._listener: asyncio.Task[None] | None = None
        self._serving: set[asyncio.Task[None]] = set()

    def _channel(self, owner: str) -> str:
        return f"{self._prefix}:relay:{owner}"

    def serve(self, handler: Any) -> None:
        self._handler = handler

    async def __aenter__(self) -> Self:
        await self._pubsub.subscribe(self._channel(self._owner))
        self._listener = asyncio.create_task(self._listen(), name="relay-listener")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._listener is not None:
            await cancel_and_wait(self._listener)
        for task in list(self._serving):
            await cancel_and_wait(task)
        with contextlib.suppress(Exception):
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py: untyped
        await self._redis.aclose()

    async def _listen(self) -> None:
        while True:
            try:
                message = await self._pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=LISTEN_POLL_S
                )
            except Exception as exc:  # Redis away for a moment: listen again
                log.warning("relay: %s", exc)
                await asyncio.sleep(LISTEN_POLL_S)  # a pause before retrying, not a sync
                continue
            if message is None:
                continue
            try:
                body = json.loads(message["data"])
            except (ValueError, TypeError):
                continue
            self._heard(body)

    def _heard(self, body: dict[str, Any]) -> None:
        if "answer_to" in body:
            waiting = self._waiting.pop(str(body["answer_to"]), None)
            if waiting is not None and not waiting.done():
                waiting.set_result(dict(body.get("answer") or {}))
            return
        if self._handler is None or "ref" not in body:
            return
        task = asyncio.create_task(self._answer(body), name=f"relay-{body['ref']}")
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def _answer(self, body: dict[str, Any]) -> None:
        try:
            answer = await self._handler(dict(body["message"]))
        except Exception:
            log.exception("relay: failed answering another worker")
            answer = {"gone": True}
        reply = {"answer_to": body["ref"], "answer": answer}
        try:
            await self._redis.publish(self._channel(str(body["from"])), json.dumps(reply))
        except Exception as exc:
            log.warning("relay: could not answer another worker: %s", exc)

    async def ask(
        self, owner: str, message: dict[str, Any], within_s: float
    ) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        ref = uuid.uuid4().hex
        answer: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._waiting[ref] = answer
        channel = self._channel(owner)
        try:
            sent = {"ref": ref, "from": self._owner, "message": message}
            if not await self._redis.publish(channel, json.dumps(sent)):
                return None  # nobody listens for that owner: it is gone
            end = loop.time() + within_s
            while True:
                try:
                    async with asyncio.timeout(max(0.0, min(CHECK_S, end - loop.time()))):
                        return await asyncio.shield(answer)
                except TimeoutError:
                    if loop.time() >= end or not await self._listening(channel):
                        return None
        finally:
            self._waiting.pop(ref, None)

    async def _listening(self, channel: str) -> bool:
        counts = await self._redis.pubsub_numsub(channel)
        return bool(counts) and int(counts[0][1]) > 0

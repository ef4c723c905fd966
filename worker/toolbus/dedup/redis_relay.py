"""The pool's relay over Redis pub/sub: a message to one worker, and its answer.

Each worker listens on `{prefix}:relay:{owner}` (`owner`: `worker_id/incarnation`, as
its tokens name it, so a restarted worker is another owner). `ask` publishes to the
owner's channel and waits for the answer on its own. Redis says how many listened: none
means the owner is gone, at once. While it waits it asks Redis every `CHECK_S` whether
anyone still listens there (a killed worker's connection closes, and its subscription
with it), so a holder that dies mid-round is noticed within seconds, never waited for
past the bound. Messages are JSON; each is at most what a round's answers or reply hold:
a continuation's answers are bounded by `max_payload_bytes` (the request carried them),
a round's reply by `[mcp].max_result_bytes`. `max_message_bytes` (wiring sets it from
both) bounds them here too, as defence in depth: only peers holding the store's
credentials can publish on these channels, but a message past the bound is not parsed,
an answer past it is sent as `too_large`, and at most `MAX_SERVING` messages are served
at once (each resumes a held call, so their number follows the held calls'; a flood
beyond it is answered `gone`, never given a task each).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from typing import Any, Self

from redis.asyncio import Redis

from toolbus.dedup.redis_connect import connect, on_node_of
from toolbus.wire.store_url import key_prefix
from toolbus.wire.tasks import cancel_and_wait

log = logging.getLogger("toolbus.rounds")

CHECK_S = 1.0  # how often a waiting `ask` checks that its worker still listens
MAX_MESSAGE_BYTES = 16 << 20  # without wiring's bound: a message's largest JSON
MAX_SERVING = 1024  # messages served at once (each resumes one held call)
LISTEN_POLL_S = 1.0  # the listener's bound on one wait for a message


class RedisRelay:
    """Messages between the workers of one Redis, each to one worker by owner name."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        owner: str,
        timeout_s: float = 5.0,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self._redis: Redis = connect(
            url,
            timeout_s=timeout_s,
        )
        self._prefix = key_prefix(url, prefix)
        self._owner = owner
        self._max_bytes = max_message_bytes
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
        await self._redis.ping()  # a cluster's client learns its slots before subscribing
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
            if len(message["data"]) > self._max_bytes:
                log.warning("relay: a message past max_message_bytes was dropped unread")
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
        if len(self._serving) >= MAX_SERVING:
            log.warning("relay: %d messages served at once; one more answered gone", MAX_SERVING)
            self._send(body, {"gone": True})
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
        await self._answered(body, answer)

    async def _answered(self, body: dict[str, Any], answer: dict[str, Any]) -> None:
        """`answer` to the message `body`, on its asker's channel (`too_large` past the
        bound: the asker is told at once rather than waiting for what never comes)."""
        reply = json.dumps({"answer_to": body.get("ref"), "answer": answer})
        if len(reply) > self._max_bytes:
            log.warning("relay: an answer past max_message_bytes was not sent")
            reply = json.dumps({"answer_to": body.get("ref"), "answer": {"too_large": True}})
        try:
            await self._redis.publish(self._channel(str(body.get("from"))), reply)
        except Exception as exc:
            log.warning("relay: could not answer another worker: %s", exc)

    def _send(self, body: dict[str, Any], answer: dict[str, Any]) -> None:
        task = asyncio.ensure_future(self._answered(body, answer))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def ask(
        self, owner: str, message: dict[str, Any], within_s: float
    ) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        ref = uuid.uuid4().hex
        answer: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._waiting[ref] = answer
        channel = self._channel(owner)
        try:
            sent = json.dumps({"ref": ref, "from": self._owner, "message": message})
            if len(sent) > self._max_bytes:
                return {"too_large": True}
            if not await self._redis.publish(channel, sent):
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
        counts = await self._redis.pubsub_numsub(channel, **on_node_of(self._redis, channel))
        return bool(counts) and int(counts[0][1]) > 0

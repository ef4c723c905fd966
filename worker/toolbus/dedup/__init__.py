"""Deduplication: at most one run per request id, and the same answer to every repeat.

The key is (caller, id), for requests that carry their own id; without a caller, (reply
topic, id): anonymous callers never share ids; a call with neither is not deduplicated.
Before a call runs its id is claimed in the store, with the call's fingerprint (its
canonical tool and normalized arguments); the reply that answers it closes the claim.
A repeat is a request under the same key asking for the same thing, and:

- of a finished call gets the stored reply again, marked `replayed`, without a run;
- of a call still running (here or on another worker sharing the store) waits for
  that reply, within its own deadline;
- of a call whose worker died mid-way runs again if the tool is safe to repeat
  (`idempotent`), and otherwise gets `in_doubt`: it may or may not have taken effect.

A request under a claimed key that asks for something else is no repeat, and never gets
the record's reply: under the caller's own id it is refused (`bad_request`, reason
`id_reused`); under a provider's tool-call id, which providers use again (some OpenAI-
compatible servers number each response's calls `call_0`, ...), it runs: over a
finished record, which it replaces (its own repeats are then known), else unclaimed.

A provider's id is an idempotency key only beside one of ours (v5 correlation data or
`toolbus.id`, in the fingerprint). A request with nothing else (`provider_only`: a 3.1.1
caller, a v5 one without correlation data) asking what a *finished* record asked is a
new question (the model asks its next turn only once it has this one's answer): it runs
again, over the record, unless it is the broker's copy of the very message that made
the record, which is replayed, except for a tool safe to repeat, which runs. The DUP flag
(`redelivered`) alone does not say so: it says the broker sent the message before, not
that a worker read it (a message in flight when a connection dropped comes back with
it); so each record names the delivery that made it (`delivery`: the worker's MQTT
session and the message's packet id, which a resend on the session keeps), and only a
DUP copy of that delivery is it. A run cut short likewise is `in_doubt` (or runs again,
for a tool safe to repeat) only for its own delivery; another message asking the same
takes the key over and runs. A copy that finds the run still going is the same question
sent again, and waits for its reply as any does.

A reply is kept whole up to `max_reply_bytes`; a larger one, or one given up to keep the
store within its bytes (`ledger.py`), is kept as its summary (`summary.py`): its repeats
get `reply_not_kept` and the call still does not run again.

A call that never reached its tool (unknown name, bad arguments, server down) releases
its claim, so a repeat runs afresh. A reply or release the store fails to take is kept
by the worker and written again, and a claim it failed to answer (which a stalled store
may still run) withdrawn (`kept.py`). `Once` is the policy; stores keep the records.

May import: the wire (toolbus.wire) only.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from toolbus.dedup.ledger import Bounds
from toolbus.dedup.memory import MemoryStore
from toolbus.dedup.store import KEY_SEP, Claim, DedupStore, Started, described, fingerprint
from toolbus.dedup.summary import kept_for_repeats
from toolbus.dedup.tasks import TASK_CALLER_MAX_BYTES, MemoryTasks, TaskStore
from toolbus.wire.contracts import Reply
from toolbus.wire.errors import (
    BadRequest,
    CallTimeout,
    Cancelled,
    InDoubt,
    ToolbusError,
    Unavailable,
)

__all__ = [
    "RUN_UNCLAIMED",
    "Bounds",
    "DedupStore",
    "MemoryStore",
    "Once",
    "Verdict",
    "fingerprint",
    "open_store",
]

log = logging.getLogger("toolbus.dedup")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with a call: run it (`key` set when claimed, with the call's
    `fingerprint`), send `reply` again, or answer `error` instead."""

    key: str | None = None
    reply: bytes | None = None
    error: ToolbusError | None = None
    fingerprint: str = ""
    delivery: str | None = None  # the MQTT delivery of the message that claimed `key`


RUN_UNCLAIMED = Verdict()


class Once:
    """The dedup policy over a store.

    Args:
        store: where the records live (memory: this worker; Redis: every replica).
        ttl_s: how long a record is kept after its call.
        idempotent: whether a tool name (as requested) is safe to run twice.
        max_reply_bytes: the largest reply a record keeps whole (else its summary).
        cancel_remember_s: how long a cancel that came before its call is remembered.
        unreachable_runs: a call the store cannot be asked about runs (`dedup_unavailable`).
    """

    def __init__(
        self,
        store: DedupStore,
        ttl_s: float,
        idempotent: Callable[[str], bool],
        *,
        max_reply_bytes: int = 64 << 10,
        cancel_remember_s: float = 60.0,
        unreachable_runs: bool = False,
    ) -> None:
        self.store, self._ttl_s, self._idempotent = store, ttl_s, idempotent
        self._max_reply_bytes, self._cancel_remember_s = max_reply_bytes, cancel_remember_s
        self.unreachable_runs = unreachable_runs

    async def remember_cancel(self, key: str) -> None:
        """The caller cancelled `key`, maybe before its call came: a claim of it within
        `cancel_remember_s` is answered `cancelled` without a run (`cancels.py`)."""
        await self.store.remember_cancel(key, self._cancel_remember_s)

    @staticmethod
    def key(caller: str | None, reply_topic: str | None, ident: str) -> str | None:
        """The store key of a request id: ids are the caller's own, so the caller is in it;
        without one, the reply topic is (one anonymous client must not get another's
        replies). Callers, topics and ids hold no control characters: no two collide.

        None: not deduplicated. A call naming neither a caller nor a reply topic has no
        client its id could belong to (every such publisher would share one id space, and
        one's `1` would silence or refuse another's): it runs unclaimed."""
        if caller:
            return f"{caller}{KEY_SEP}{ident}"
        if reply_topic:
            return f"{KEY_SEP}{reply_topic}{KEY_SEP}{ident}"
        return None

    async def begin(
        self,
        key: str,
        asks: str,
        tool: str,
        deadline_s: float,
        *,
        provider_id: bool = False,
        provider_only: bool = False,
        redelivered: bool = False,
        delivery: str | None = None,
    ) -> Verdict:
        """The verdict on a call under `key` that asks for `asks` (its fingerprint) of
        `tool` (canonical: is it safe to run twice?); `provider_id`: the key's id is a
        provider's tool-call id, which may name another call than the record's;
        `provider_only`: with no id of ours beside it, so a record asking the same is an
        earlier question's, unless this message is the broker's copy (`redelivered`) of
        the `delivery` (its session and packet id) that made the record."""
        deadline = time.monotonic() + deadline_s
        mine = _Asked(asks, delivery)
        claim = await self.store.claim(key, self._ttl_s, fingerprint=asks, delivery=delivery)
        if claim.kind == "running" and claim.asks(asks):
            waited = await self._twin(key, mine, deadline, deadline_s)
            if isinstance(waited, Verdict):
                return waited
            claim = waited
        if claim.kind in ("fresh", "doubtful"):
            return await self._claimed(key, claim, tool, mine)
        if not claim.asks(asks):
            return await self._reused(key, claim, mine, provider_id=provider_id)
        if provider_only:
            return await self._provider_only(key, claim, tool, mine, redelivered=redelivered)
        if claim.kind == "done":
            return Verdict(reply=claim.reply)
        return await self._orphaned(key, claim, tool, mine)

    async def _provider_only(
        self, key: str, claim: Claim, tool: str, mine: _Asked, *, redelivered: bool
    ) -> Verdict:
        """A record asking the same as a call with only a provider's id: the same
        question only when the call is the message that made the record (its delivery);
        after its answer, only the broker's copy of it (DUP) is, and one of a tool safe to
        repeat runs anyway. Any other message is a new question, and runs."""
        same_message = claim.delivered_as(mine.delivery)
        if claim.kind == "done":
            if redelivered and same_message and not self._idempotent(tool):
                return Verdict(reply=claim.reply)
            log.debug("%s asks again after its answer: a new question", described(key))
            return await self._runs_over(key, claim, mine)
        if same_message:  # its own run cut short: in doubt, as for any id
            return await self._orphaned(key, claim, tool, mine)
        # Another message over a run cut short: a new question, and it runs; unclaimed,
        # leaving the orphan in place. The broker's copy of the message cut short comes
        # when its worker's session resumes, maybe only after this run finished: it must
        # still find its own record and be `in_doubt`. Had this run taken the key, that
        # copy would find a finished record of another delivery and run again, a second
        # run of a call that may have taken effect. The price: this run's own copy (its
        # worker gone after the run, before acknowledging it) is not known, and runs.
        started = claim.started
        assert started is not None
        log.info(
            "%s asks anew; the run its record holds was cut short on %s: running it, "
            "unclaimed (the record stays for that run's copy)",
            described(key),
            started.worker_id,
        )
        return RUN_UNCLAIMED

    async def _twin(
        self, key: str, mine: _Asked, deadline: float, deadline_s: float
    ) -> Verdict | Claim:
        """A repeat of a run still going: its reply, within the deadline; else what the
        store says now (released meanwhile: ours to claim, or another request's). A run
        that took the key over meanwhile (another copy of this request, after the first
        run's claim was withdrawn) is waited for in turn: it is the same request."""
        asks = mine.fingerprint
        while True:
            try:
                reply = await self.store.wait(
                    key, max(0.0, deadline - time.monotonic()), fingerprint=asks
                )
            except Exception:  # the store failed; the twin runs on: never "did not run"
                return Verdict(
                    error=CallTimeout(
                        "a call with this id is running; the dedup store failed while its "
                        "reply was awaited",
                        timeout_s=deadline_s,
                        still_running=True,
                        store=True,
                    )
                )
            if reply is not None:
                return Verdict(reply=reply)
            claim = await self.store.claim(
                key, self._ttl_s, fingerprint=asks, delivery=mine.delivery
            )
            if claim.kind != "running" or not claim.asks(asks):
                return claim
            if time.monotonic() >= deadline:
                return Verdict(
                    error=CallTimeout(
                        "a call with this id is still running; its reply did not come in time",
                        timeout_s=deadline_s,
                        still_running=True,
                    )
                )

    async def _reused(self, key: str, claim: Claim, mine: _Asked, *, provider_id: bool) -> Verdict:
        """Another request under a key with a record: never the record's reply."""
        if not provider_id:
            return Verdict(
                error=BadRequest(
                    "this request id was used for a different request (another tool or "
                    "other arguments): send a new request under a new id",
                    reason="id_reused",
                )
            )
        # A provider's id named another call before: this one runs.
        return await self._runs_over(key, claim, mine)

    async def _runs_over(self, key: str, claim: Claim, mine: _Asked) -> Verdict:
        """Another request than the record's under a provider's id: it runs. Over a
        finished record it takes the key (its own repeats are then known); a run still
        going or cut short keeps it (its repeats must find it), and this one runs
        unclaimed."""
        if claim.kind == "done" and await self.store.supersede(
            key, claim, self._ttl_s, fingerprint=mine.fingerprint, delivery=mine.delivery
        ):
            return mine.verdict(key)
        log.debug("%s names another call than its record: run unclaimed", described(key))
        return RUN_UNCLAIMED

    async def _orphaned(self, key: str, claim: Claim, tool: str, mine: _Asked) -> Verdict:
        started = claim.started
        assert started is not None
        if self._idempotent(tool) and await self.store.take_over(
            key, started, self._ttl_s, fingerprint=mine.fingerprint, delivery=mine.delivery
        ):
            log.info(
                "repeat of %s, cut short on %s: safe to repeat, running again",
                described(key),
                started.worker_id,
            )
            return mine.verdict(key)
        return Verdict(error=_in_doubt(started))

    async def _claimed(self, key: str, claim: Claim, tool: str, mine: _Asked) -> Verdict:
        """Ours to run; unless claimed in a store emptied lately, which may have held a run
        of this id: then a tool safe to repeat runs, and any other is refused, the claim
        withdrawn, until the lost records would have expired anyway."""
        if claim.cancelled:
            # Cancelled before it came: claimed, so its answer is recorded and replayed.
            log.info("%s was cancelled before it came: not run", described(key))
            return replace(mine.verdict(key), error=_cancelled_early())
        if claim.kind == "fresh" or self._idempotent(tool):
            return mine.verdict(key)
        await self.store.release(key, fingerprint=mine.fingerprint)
        retry_after_ms = max(0, math.ceil((claim.doubt_until - time.time()) * 1000))
        log.warning(
            "%s refused: the dedup store was emptied and may have held a run of it",
            described(key),
        )
        return Verdict(
            error=Unavailable(
                "the dedup store lost its records lately and this request may have run "
                "before: it was not run; send it again after retry_after_ms",
                store="emptied",
                retry_after_ms=retry_after_ms,
            )
        )

    async def finish(self, verdict: Verdict, reply: Reply) -> None:
        if verdict.key is not None:
            kept, summary = kept_for_repeats(reply, self._max_reply_bytes)
            await self.store.finish(
                verdict.key,
                kept,
                self._ttl_s,
                fingerprint=verdict.fingerprint,
                summary=summary,
                delivery=verdict.delivery,
            )

    async def release(self, verdict: Verdict) -> None:
        if verdict.key is not None:
            await self.store.release(verdict.key, fingerprint=verdict.fingerprint)


@dataclass(frozen=True, slots=True)
class _Asked:
    """What a call asks (its fingerprint) and the MQTT delivery that asked it."""

    fingerprint: str
    delivery: str | None

    def verdict(self, key: str) -> Verdict:
        """Run it, claimed under `key`."""
        return Verdict(key=key, fingerprint=self.fingerprint, delivery=self.delivery)


def _cancelled_early() -> Cancelled:
    return Cancelled(
        "the caller cancelled the call before it started; it was not run",
        started=False,
        in_doubt=False,
        cause="caller",
    )


def _in_doubt(started: Started) -> InDoubt:
    return InDoubt(
        "this request id was being run by a worker that stopped before answering: "
        "it may or may not have taken effect",
        started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started.started_at)),
        worker_id=started.worker_id,
    )


def open_store(
    url: str,
    worker_id: str,
    *,
    prefix: str,
    bounds: Bounds | None = None,
    ttl_s: float = 600.0,
    on_emptied: Callable[[], None] = lambda: None,
) -> DedupStore:
    """`memory` or `redis://host:port/db` (the `toolbus[redis]` extra), either kept within
    `bounds` (bytes per caller and in all, for Redis across the fleet that shares it; the
    count of records for memory, and of kept writes for Redis). `on_emptied` hears each
    time a Redis store is found to have lost its records. A reply or release Redis fails
    to take is kept by this worker and written again, within the same bounds."""
    bounds = bounds or Bounds()
    if url == "memory":
        return MemoryStore(worker_id, bounds=bounds)
    from toolbus.dedup.kept import KeptReplies  # noqa: PLC0415 -- Redis only (tenacity: 0.1 s)
    from toolbus.dedup.redis import RedisStore  # noqa: PLC0415 -- only with a Redis store

    return KeptReplies(
        RedisStore(
            url, worker_id, prefix=prefix, ttl_s=ttl_s, bounds=bounds, on_emptied=on_emptied
        ),
        bounds=bounds,
    )


def open_tasks(
    url: str, worker_id: str, *, prefix: str, caller_max_bytes: int = TASK_CALLER_MAX_BYTES
) -> TaskStore:
    """The task records beside the dedup store: `memory`, or the same Redis."""
    if url == "memory":
        return MemoryTasks(worker_id, caller_max_bytes=caller_max_bytes)
    from toolbus.dedup.redis_tasks import RedisTasks  # noqa: PLC0415 -- only with Redis

    return RedisTasks(url, worker_id, prefix=prefix, caller_max_bytes=caller_max_bytes)

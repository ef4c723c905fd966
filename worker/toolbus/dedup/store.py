"""Dedup records: what a store keeps per request id, and the store's contract.

A request id is claimed before its call runs (`Started`, naming the worker process
that runs it) and closed with the reply that answered it (`Done`). Both carry the
call's fingerprint: what it asked for (`fingerprint`), so a later request under the
same id is a repeat only when it asks for the same thing. A later request with the
same id finds one of four things, as a `Claim`: nothing (it runs), a reply (sent
again), a run still going on a live worker (wait for its reply), or a run whose worker
died (`orphaned`: the call may or may not have taken effect).

Both also name the delivery that made them (`delivery`: the worker's MQTT session and
the message's packet id, `Inbound.delivery_id`), so that a copy the broker marks as
delivered before can be told from another message that asks the same (`Once`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from toolbus.wire.untrusted import shown

# A record written before records kept fingerprints: taken as the same request, as it
# was then, for the `dedup_ttl_s` it still lives.
UNKNOWN = ""


def fingerprint(
    tool: str,
    arguments: dict[str, Any],
    sent_with: bytes | None = None,
    message_id: str | None = None,
) -> str:
    """What a call asks for, as one stable value: sha256 over canonical JSON (sorted keys,
    no spaces) of the canonical tool name and the normalized arguments. Stable across
    processes and versions of Python, so replicas sharing a store agree on it.

    `sent_with` and `message_id`: the correlation data and the `toolbus.id` a provider's
    call id came with. Providers reuse their ids (`call_0` every turn), and a later turn
    may ask exactly what an earlier one did (switch the light on again): only the same
    message sent again (a retry, a redelivery: the same ids of ours) is a repeat of it."""
    asked: dict[str, Any] = {"tool": tool, "arguments": arguments}
    if sent_with is not None:
        asked["sent_with"] = sent_with.hex()
    if message_id is not None:
        asked["message_id"] = message_id
    canonical = json.dumps(
        asked,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,  # normalization leaves JSON values; anything else by its text
    )
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


class StoreUnreachable(Exception):
    """The shared store cannot be reached when the worker starts: a configuration to fix
    (or a Redis to start), said in one line, not a traceback."""


class StoreUnsafe(StoreUnreachable):
    """The shared store is reached but would break at most once (a Redis that evicts
    records at its `maxmemory`): a configuration to fix, said in one line, and the worker
    does not start."""


KEY_SEP = "\x1f"  # between the caller and the request id in a store key (`Once.key`)


def owner_of(key: str) -> str:
    """Whose a key is, for the stores' bounds: its caller (what `Once.key` puts before the
    id), and "" for every anonymous client together (their keys start with `KEY_SEP`; the
    reply topic that tells them apart is free to make, so it buys no share of a bound)."""
    owner, sep, _ = key.partition(KEY_SEP)
    return owner if sep else ""


def described(key: str) -> str:
    """A store key for a log line: the request id and its caller, or "anonymous" -- never
    an anonymous client's reply topic, which may tell who the client is."""
    if key.startswith(KEY_SEP):
        return f"request '{shown(key.rpartition(KEY_SEP)[2])}' of an anonymous caller"
    caller, _, ident = key.partition(KEY_SEP)
    return f"request '{shown(ident)}' of caller '{shown(caller)}'"


@dataclass(frozen=True, slots=True)
class Started:
    """A run in progress: which worker (and which process of it), since when, and what
    it was asked to do."""

    worker_id: str
    incarnation: str  # one per process: a restarted worker is a new incarnation
    started_at: float  # Unix time, seconds
    fingerprint: str = UNKNOWN
    delivery: str | None = None  # the MQTT delivery that made it (None: unknown, QoS 0)

    def to_json(self) -> str:
        """The record as stored; byte for byte what `parse` read (take-overs compare it)."""
        record: dict[str, Any] = {
            "state": "started",
            "worker_id": self.worker_id,
            "incarnation": self.incarnation,
            "started_at": self.started_at,
        }
        if self.fingerprint:
            record["fingerprint"] = self.fingerprint
        if self.delivery is not None:
            record["delivery"] = self.delivery
        return json.dumps(record)


@dataclass(frozen=True, slots=True)
class Done:
    """A call answered: the reply that closed it, what it was asked to do, and the summary
    that may stand in for the reply later (`summary.py`; None: the reply stays whole)."""

    reply: bytes
    fingerprint: str = UNKNOWN
    summary: bytes | None = None
    delivery: str | None = None  # the MQTT delivery of the run that closed it

    def to_json(self) -> str:
        record = {"state": "done", "reply": self.reply.decode()}
        if self.fingerprint:
            record["fingerprint"] = self.fingerprint
        if self.summary is not None:
            record["summary"] = self.summary.decode()
        if self.delivery is not None:
            record["delivery"] = self.delivery
        return json.dumps(record)


@dataclass(frozen=True, slots=True)
class Claim:
    """What a claim found. `fresh`: the id is ours to run now. `doubtful`: ours too, but
    the store was emptied and may have held a run of it (until `doubt_until`)."""

    kind: Literal["fresh", "doubtful", "done", "running", "orphaned"]
    reply: bytes | None = None  # for `done`
    started: Started | None = None  # for `running` and `orphaned`
    fingerprint: str = UNKNOWN  # what the record's call asked for (not for `fresh`)
    doubt_until: float = 0.0  # for `doubtful`: Unix time
    # The record exactly as the store holds it, where one compares it (Redis: a record
    # with its summary, or one the store's books shrank, is no string Python rebuilds).
    stored: str | None = None
    delivery: str | None = None  # the MQTT delivery that made the record (not for `fresh`)
    # For `fresh` and `doubtful`: the caller cancelled this id before it came (a
    # tombstone, `cancels.py`): claimed, and to be answered `cancelled` without a run.
    cancelled: bool = False

    def asks(self, fingerprint: str) -> bool:
        """Does the record hold a call that asked for the same thing as `fingerprint`?"""
        return self.fingerprint in (fingerprint, UNKNOWN)

    def delivered_as(self, delivery: str | None) -> bool:
        """Was the record made by this very delivery (a known one: QoS 0 has none)?"""
        return delivery is not None and self.delivery == delivery


def parse(raw: str | bytes) -> Started | Done:
    """A stored record: the run in progress, or the reply (JSON bytes) that closed it."""
    record = json.loads(raw)
    held = str(record.get("fingerprint", UNKNOWN))
    delivery = record.get("delivery")
    delivery = None if delivery is None else str(delivery)
    if record.get("state") == "started":
        when = record["started_at"]
        return Started(record["worker_id"], record["incarnation"], when, held, delivery)
    summary = None if (kept := record.get("summary")) is None else str(kept).encode()
    return Done(str(record["reply"]).encode(), held, summary, delivery)


# What a finished record costs beyond its key, reply, summary and fingerprint: measured
# with tracemalloc for the memory store's objects (docs/reliability.md, "Limits").
RECORD_OVERHEAD_BYTES = 400


def record_size(
    key: str, reply: bytes, summary: bytes | None, fingerprint: str, delivery: str | None = None
) -> int:
    """The bytes a finished record is counted for, against the store's bounds."""
    extra = (len(summary) if summary is not None else 0) + len(delivery or "")
    return RECORD_OVERHEAD_BYTES + len(key) + len(reply) + extra + len(fingerprint)


class DedupStore(Protocol):
    """Where workers agree on which request ids have run. `async with` opens it.

    `fingerprint` is what the call under `key` asks for (`fingerprint()`): kept in the
    record, so a later call under the same key can tell a repeat from another request;
    `delivery`, the MQTT delivery of the message that asked (`Started.delivery`).
    """

    async def __aenter__(self) -> DedupStore: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def claim(
        self, key: str, ttl_s: float, *, fingerprint: str = UNKNOWN, delivery: str | None = None
    ) -> Claim:
        """Record `key` as started by this worker unless a record exists; say what was found."""
        ...

    async def take_over(
        self,
        key: str,
        previous: Started,
        ttl_s: float,
        *,
        fingerprint: str = UNKNOWN,
        delivery: str | None = None,
    ) -> bool:
        """Replace an orphaned run's record with ours; False if another worker did first."""
        ...

    async def supersede(
        self,
        key: str,
        previous: Claim,
        ttl_s: float,
        *,
        fingerprint: str,
        delivery: str | None = None,
    ) -> bool:
        """Replace a `done` record (`previous`, as claimed) with our run of another request
        under the same key; False if the record changed meanwhile."""
        ...

    async def finish(
        self,
        key: str,
        reply: bytes,
        ttl_s: float,
        *,
        fingerprint: str = UNKNOWN,
        summary: bytes | None = None,
        delivery: str | None = None,
    ) -> None:
        """Close `key` with its reply and wake whoever waits for it: over this worker's own
        run of it (`fingerprint`'s) or no record, never over another run's record.
        `summary` may stand in for the reply later, when the store's bytes bounds ask."""
        ...

    async def release(self, key: str, *, fingerprint: str = UNKNOWN) -> None:
        """Forget this worker's claim of `key` (`fingerprint`'s), whose call never reached
        its tool: a repeat may run afresh. Another run's record there is left alone."""
        ...

    async def remember_cancel(self, key: str, ttl_s: float) -> None:
        """The caller cancelled `key`: a claim of it within `ttl_s` says so (`cancels.py`)."""
        ...

    async def wait(self, key: str, timeout_s: float, *, fingerprint: str = UNKNOWN) -> bytes | None:
        """The reply that closes `key`, once there is one; None after `timeout_s`, or when
        the record turns out to hold another request than `fingerprint`'s."""
        ...

    def held_bytes(self) -> int:
        """The bytes the records hold, as counted against the bounds (memory: this
        worker's; Redis: the fleet's, as last read)."""
        ...

    def gave_way(self) -> Mapping[str, int]:
        """How many finished records this worker made give way at the bounds, by how:
        `shrunk` (the reply to its summary) and `forgotten` (the record)."""
        ...


class NetworkStore(DedupStore, Protocol):
    """A store across a network (Redis), where a claim that failed (raised: timed out,
    connection lost) may still land: the command was sent, the store stalled, and runs it
    once it resumes. Left there, that record says a live worker runs a call that never
    ran (`KeptReplies` withdraws it)."""

    def failed_claim(self, key: str) -> Started | None:
        """What this worker's last claim of `key` tried to write, if that claim raised;
        asking forgets it (the caller keeps it until withdrawn)."""
        ...

    async def unclaim(self, key: str, claimed: Started) -> None:
        """Delete the record under `key` if it is exactly `claimed` (all of it: another
        claim of this process differs only in `started_at`), and wake its waiters."""
        ...

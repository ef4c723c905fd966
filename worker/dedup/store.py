"""Dedup records: what a store keeps per request id, and the store's contract.

A request id is claimed before its call runs (`Started`, naming the worker process
that runs it) and closed with the reply that answered it (`Done`). A later request
with the same id then finds one of four things, as a `Claim`: nothing (it runs), a
reply (sent again), a run still going on a live worker (wait for its reply), or a run
whose worker died (`orphaned`: the call may or may not have taken effect).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal, Protocol

KEY_SEP = "\x1f"  # between the caller and the request id in a store key (`Once.key`)


@dataclass(frozen=True, slots=True)
class Started:
    """A run in progress: which worker (and which process of it) and since when."""

    worker_id: str
    incarnation: str  # one per process: a restarted worker is a new incarnation
    started_at: float  # Unix time, seconds

    def to_json(self) -> str:
        return json.dumps({"state": "started", **asdict(self)})


@dataclass(frozen=True, slots=True)
class Claim:
    """What a claim found. `fresh`: the id is ours to run now."""

    kind: Literal["fresh", "done", "running", "orphaned"]
    reply: bytes | None = None  # for `done`
    started: Started | None = None  # for `running` and `orphaned`


def parse(raw: str | bytes) -> Started | bytes:
    """A stored record: the run in progress, or the reply (JSON bytes) that closed it."""
    record = json.loads(raw)
    if record.get("state") == "started":
        return Started(record["worker_id"], record["incarnation"], record["started_at"])
    return str(record["reply"]).encode()


def done_json(reply: bytes) -> str:
    return json.dumps({"state": "done", "reply": reply.decode()})


class DedupStore(Protocol):
    """Where workers agree on which request ids have run. `async with` opens it."""

    async def __aenter__(self) -> DedupStore: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def claim(self, key: str, ttl_s: float) -> Claim:
        """Record `key` as started by this worker unless a record exists; say what was found."""
        ...

    async def take_over(self, key: str, previous: Started, ttl_s: float) -> bool:
        """Replace an orphaned run's record with ours; False if another worker did first."""
        ...

    async def finish(self, key: str, reply: bytes, ttl_s: float) -> None:
        """Close `key` with its reply and wake whoever waits for it."""
        ...

    async def release(self, key: str) -> None:
        """Forget a claim whose call never reached its tool: a repeat may run afresh."""
        ...

    async def wait(self, key: str, timeout_s: float) -> bytes | None:
        """The reply that closes `key`, once there is one; None after `timeout_s`."""
        ...

"""An emptied Redis: what each worker can write back, and until when an unknown id may be old.

A Redis restarted without its data (or flushed, or replaced by another) has forgotten
which calls ran: a repeat of one would find no record and run it again. Every worker
notices (the store's epoch is checked by every claim and heartbeat) and then:

- writes back what it knows: its `Journal` of the records it wrote that still live
  (its finished calls, as their summary or small reply, and its running claims), so a
  repeat of any of them is a repeat again;
- records that it did, beside the workers it had seen at work within `dedup_ttl_s`
  before (their records were in the store too).

While a worker that was at work then has not written back (it died, it restarted, its
journal overflowed), an id the store does not know may be one of its calls: it is `in
doubt` until that worker's last records would have expired anyway (`Recovery.doubt_until`).
A call in doubt runs only if its tool is safe to repeat; any other is refused `unavailable`
(`details.store: "emptied"`, nothing ran, `retry_after_ms`), and the same id runs once the
window has passed. A live worker is waited for (`GRACE_S`) before it counts as gone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# Every live worker beats (2 s) within SETTLE_S of the loss: by then it has noticed and
# written back, or shows as alive and is waited for, within GRACE_S.
SETTLE_S = 2.5
GRACE_S = 5.0

# Per journal entry beyond its key and record: the dict's entry and the objects.
JOURNAL_OVERHEAD_BYTES = 200


@dataclass(frozen=True, slots=True)
class _Entry:
    record: str  # the record as it is written back (`Done` or `Started` JSON)
    expires_at: float  # Unix time: when the store forgets it anyway
    size: int


class Journal:
    """What this worker wrote to the store and could write back: bounded by bytes,
    oldest first. An entry dropped to keep the bound leaves the journal incomplete until
    that entry would have expired (`incomplete_until`)."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._entries: dict[str, _Entry] = {}
        self._bytes = 0
        self.incomplete_until = 0.0

    def wrote(self, key: str, record: str, expires_at: float) -> None:
        """`record` is what the store holds for `key` now, until `expires_at`."""
        self.forget(key)
        entry = _Entry(record, expires_at, JOURNAL_OVERHEAD_BYTES + len(key) + len(record))
        self._entries[key] = entry
        self._bytes += entry.size
        while self._bytes > self._max_bytes and self._entries:
            oldest = next(iter(self._entries))
            dropped = self._entries[oldest]
            self.forget(oldest)
            if dropped.expires_at > time.time():
                self.incomplete_until = max(self.incomplete_until, dropped.expires_at)

    def forget(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size

    def live(self) -> list[tuple[str, str, float]]:
        """(key, record, seconds left) of every entry the store would still hold."""
        now = time.time()
        for key in [k for k, e in self._entries.items() if e.expires_at <= now]:
            self.forget(key)
        return [(k, e.record, e.expires_at - now) for k, e in self._entries.items()]

    def bytes(self) -> int:
        return self._bytes


@dataclass(frozen=True, slots=True)
class Recovery:
    """The state of one recovery (of the store's epoch `epoch`), as the store holds it:
    the workers seen at work before the loss (`members`: member -> when last seen, Unix
    time), those beating since (`since`: they may not have noticed yet), those that wrote
    back (`written`: member -> until when its journal was incomplete, 0 when whole) and
    those alive now (`alive`)."""

    epoch: str
    began_at: float  # Unix time, when this worker noticed
    members: dict[str, float]
    written: dict[str, float]
    alive: frozenset[str]
    ttl_s: float
    since: frozenset[str] = frozenset()

    def pending(self, now: float) -> bool:
        """Too early to tell (a live worker may not have beaten since), or a live worker
        has not written back yet, within the grace: wait."""
        if now < self.began_at + SETTLE_S:
            return True
        waited_for = self.members.keys() | self.since
        return now < self.began_at + GRACE_S and any(
            m in self.alive for m in waited_for if m not in self.written
        )

    def doubt_until(self) -> float:
        """Until when an id the store does not know may be a call that ran (Unix time;
        in the past: no doubt left). Only workers at work before the loss had records in
        it: one that started since is waited for (`pending`), never doubted."""
        until = max(self.written.values(), default=0.0)
        for member, last_seen in self.members.items():
            if member not in self.written:
                until = max(until, last_seen + self.ttl_s)
        return until


def member(worker_id: str, incarnation: str) -> str:
    """A worker process as recovery names it: one incarnation of a worker id."""
    return f"{worker_id}\x1f{incarnation}"

"""What each caller's finished records cost, and which record gives way at the bounds.

A finished record keeps its reply for repeats. Three bounds keep that from growing with
what one caller sends (`Bounds`): how many finished records are kept (`max_records`), how
many bytes one caller's records hold (`caller_max_bytes`), and how many all of them hold
(`max_bytes`). Past a bound a record gives way, always one of the caller holding the most
(the newcomer's own caller, on a tie), so one caller's flood costs that caller, never
another that holds less:

- past the bytes bounds its oldest record still holding a whole reply with a summary
  is **shrunk** to the summary (`reply_not_kept` for its repeats: never a second run);
  a caller with nothing left to shrink loses its oldest record instead;
- past the count bound its oldest record is **forgotten** (a repeat of it runs again, as
  a repeat after `dedup_ttl_s` does).

"Oldest" is by when a call finished. The ledger only keeps the books: the store asks
`over_*` and `victim_*`, shrinks or forgets the record it is told, and says so here. Each
step is O(1) (O(log n) for the bytes), however many callers there are.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a store may keep of finished calls: records, and bytes per caller and in all."""

    max_records: int = 10_000
    caller_max_bytes: int = 16 << 20
    max_bytes: int = 64 << 20
    # Early cancels (`cancels.py`): per caller, and in all (the memory store's).
    cancel_caller_max_bytes: int = 64 << 10
    cancel_max_bytes: int = 4 << 20


@dataclass(slots=True)
class _Account:
    """One caller's finished records, oldest first: all of them, and those a summary can
    stand in for (`whole`), with what they cost."""

    finished: dict[str, int] = field(default_factory=dict)  # key -> bytes counted
    whole: dict[str, None] = field(default_factory=dict)
    bytes: int = 0


class Ledger:
    """The books of one store's finished records, by owner (the caller, `""` for every
    anonymous client together)."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self._accounts: dict[str, _Account] = {}
        # Owners by how many records they hold, and the most anyone holds (count bound).
        self._by_count: dict[int, dict[str, None]] = {}
        self._most = 0
        # Owners by bytes held, most first: (-bytes, owner), stale entries skipped (bytes bound).
        self._heaviest: list[tuple[int, str]] = []
        self.records = 0
        self.bytes = 0

    def add(self, owner: str, key: str, size: int, *, whole: bool) -> None:
        """`key` finished with a record of `size` bytes (`whole`: a summary can stand in)."""
        account = self._accounts.setdefault(owner, _Account())
        account.finished[key] = size
        if whole:
            account.whole[key] = None
        self._recount(owner, len(account.finished) - 1, len(account.finished))
        self._rebytes(owner, account, size)
        self.records += 1

    def remove(self, owner: str, key: str) -> None:
        """`key`'s record is gone (expired, forgotten, or replaced by a run)."""
        account = self._accounts.get(owner)
        if account is None or key not in account.finished:
            return
        size = account.finished.pop(key)
        account.whole.pop(key, None)
        self._recount(owner, len(account.finished) + 1, len(account.finished))
        self._rebytes(owner, account, -size)
        self.records -= 1
        if not account.finished:
            del self._accounts[owner]

    def shrunk(self, owner: str, key: str, size: int) -> None:
        """`key`'s reply was replaced by its summary: its record now costs `size` bytes."""
        account = self._accounts[owner]
        account.whole.pop(key, None)
        was = account.finished[key]
        account.finished[key] = size
        self._rebytes(owner, account, size - was)

    def over_caller(self, owner: str) -> bool:
        account = self._accounts.get(owner)
        return account is not None and account.bytes > self.bounds.caller_max_bytes

    def over_bytes(self) -> bool:
        return self.bytes > self.bounds.max_bytes

    def over_records(self, adding: int = 0) -> bool:
        return self.records + adding > self.bounds.max_records

    def victim_by_bytes(self, claimer: str) -> str | None:
        """The owner holding the most bytes (`claimer` on a tie), or None."""
        while self._heaviest:
            negative, owner = self._heaviest[0]
            account = self._accounts.get(owner)
            if account is None or account.bytes != -negative:
                heapq.heappop(self._heaviest)  # stale: that owner's bytes changed since
                continue
            mine = self._accounts.get(claimer)
            return claimer if mine is not None and mine.bytes == account.bytes else owner
        return None

    def victim_by_count(self, claimer: str) -> str | None:
        """The owner holding the most records (`claimer` on a tie), or None."""
        if not self._most:
            return None
        most = self._by_count[self._most]
        return claimer if claimer in most else next(iter(most))

    def oldest(self, owner: str, *, whole: bool) -> str | None:
        """`owner`'s oldest finished key (`whole`: the oldest a summary can stand in for)."""
        account = self._accounts.get(owner)
        if account is None:
            return None
        keys = account.whole if whole else account.finished
        return next(iter(keys), None)

    def _recount(self, owner: str, was: int, now: int) -> None:
        """`owner` went from `was` finished records to `now` (one more or one fewer)."""
        if was:
            peers = self._by_count[was]
            del peers[owner]
            if not peers:
                del self._by_count[was]
                if was == self._most and now < was:
                    self._most = now  # the owner that held the most still holds `now`
        if now:
            self._by_count.setdefault(now, {})[owner] = None
            self._most = max(self._most, now)

    def _rebytes(self, owner: str, account: _Account, change: int) -> None:
        account.bytes += change
        self.bytes += change
        if account.bytes:
            heapq.heappush(self._heaviest, (-account.bytes, owner))
        if len(self._heaviest) > 4 * len(self._accounts) + 64:  # stale entries, compacted
            self._heaviest = [(-a.bytes, o) for o, a in self._accounts.items() if a.bytes]
            heapq.heapify(self._heaviest)

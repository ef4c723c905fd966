"""Kept: what a worker remembers of its rounds for a while, bounded by bytes per caller.

calls/rounds.py keeps two things in memory for `input_timeout_s`: a stateless call's open
token by the key of the request that got its questions (what a cancel names), and a held
call's end by its last token (for a continuation that took the token before the store
had the end). Each entry costs its own caller's account (the caller; every anonymous
client together, as the stores count them): over the account's bytes the caller's own
oldest entries give way, never another caller's. Every entry lives equally long, so they
expire in the order they came, and the expired are dropped from the front: an insert
costs O(1), however many are kept.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from toolbus.dedup.holdings import Holdings

ENTRY_OVERHEAD = 128  # bytes an entry costs beyond its key and value (dict slots, tuple)


@dataclass(frozen=True, slots=True)
class _Entry:
    value: str
    account: str
    until: float
    size: int


class Kept:
    """Strings by key for `for_s` each, at most `account_max_bytes` per account."""

    def __init__(self, for_s: float, account_max_bytes: int) -> None:
        self._for_s = for_s
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # oldest first
        self._accounts: dict[str, OrderedDict[str, None]] = {}  # each account's, oldest first
        self._bytes: Holdings[str] = Holdings(account_max_bytes)

    def put(self, key: str, value: str, account: str) -> bool:
        """`value` under `key`, charged to `account`; False when it alone exceeds the
        account's bytes (nothing is kept, nothing given way)."""
        self._expire()
        self.pop(key)
        size = len(key) + len(value) + ENTRY_OVERHEAD
        if size > self._bytes.limit:
            return False
        keys = self._accounts.setdefault(account, OrderedDict())
        while not self._bytes.fits(account, size):
            self.pop(next(iter(keys)))  # the account's own oldest gives way
        keys = self._accounts.setdefault(account, OrderedDict())
        keys[key] = None
        self._entries[key] = _Entry(value, account, time.monotonic() + self._for_s, size)
        self._bytes.add(account, size)
        return True

    def get(self, key: str) -> str | None:
        self._expire()
        entry = self._entries.get(key)
        return None if entry is None else entry.value

    def pop(self, key: str) -> str | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        keys = self._accounts[entry.account]
        del keys[key]
        self._bytes.remove(entry.account, entry.size)
        if not keys:
            del self._accounts[entry.account]
        return entry.value

    def held_bytes(self, account: str) -> int:
        return self._bytes.held(account)

    def __len__(self) -> int:
        return len(self._entries)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.until > now:
                return
            self.pop(key)

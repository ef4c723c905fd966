"""Holdings: the bytes each account holds, for the per-caller bounds of what is kept.

Every store that keeps a caller's things in memory (tokens, tasks, a worker's rounds)
bounds them by bytes per account: the caller, or every anonymous client as one. This
is that count, and nothing else: which record gives way when an account is full
is each store's own rule (dedup/ledger.py keeps the fuller books of finished dedup records).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

A = TypeVar("A", bound=Hashable)


class Holdings(Generic[A]):
    """Bytes held per account; an account holding nothing is not listed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[A, int] = {}

    def held(self, account: A) -> int:
        return self._held.get(account, 0)

    def fits(self, account: A, size: int) -> bool:
        """Whether `size` more bytes keep `account` within the limit."""
        return self.held(account) + size <= self.limit

    def add(self, account: A, size: int) -> None:
        self._held[account] = self.held(account) + size

    def remove(self, account: A, size: int) -> None:
        left = self.held(account) - size
        if left:
            self._held[account] = left
        else:
            self._held.pop(account, None)

"""Tokens: continuations and approvals, each bound to its caller, single-use, expiring.

A token names what a caller may do once: continue a call that asked it something
(`continuation`), or run a call a person approved (`approval`). Its record keeps who may
use it (`holder`: the caller's identity as the dedup key has it), what it binds (an
approval: the tool and its normalized arguments, as a fingerprint), the worker that made
it (`owner`: a held call's questions wait there), what it keeps (`body`), and when it
expires. Taking it is one atomic step: the first request to take it has it, a copy of
that request (the same dedup key) takes it again, any other gets `used`.

An expired record is kept as long again, so a late use is told `expired`, not
`unknown`; another caller's token is `unknown` (nothing says it exists).

Records are bounded by bytes per caller (`token_caller_max_bytes`; every anonymous
client together is one caller, `account_of`): a flood of one caller's questions or gated
calls is refused for that caller (`TokenBoundExceeded`), never displaces another's.
`MemoryTokens` serves one worker; `RedisTokens` (redis_tokens.py) a pool sharing one Redis.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from typing import Literal, Protocol, Self

from toolbus.dedup.holdings import Holdings
from toolbus.dedup.store import KEY_SEP

OPEN = "open"
TAKEN = "taken"
ENDED = "ended"  # a held call ended while nobody waited: `reply` is its answer
TOKEN_CALLER_MAX_BYTES = 1 << 20

TokenKind = Literal["continuation", "approval"]
Refusal = Literal["unknown", "used", "expired", "mismatch"]


def holder_of(caller: str | None, reply_topic: str | None) -> str:
    """Who may use a token made for a call: its caller, or (anonymous) its reply topic, as
    the dedup key has them (`Once.key`); the separator keeps the two apart."""
    if caller:
        return caller
    return f"{KEY_SEP}{reply_topic or ''}"


def account_of(holder: str) -> str:
    """Whose bound a holder's tokens count against: its caller, or "" for every anonymous
    client together (as dedup/store.py `owner_of`: a reply topic is free to make, so it
    buys no share of a bound)."""
    return "" if holder.startswith(KEY_SEP) else holder


def new_token(kind: TokenKind) -> str:
    """An opaque, unguessable token (192 random bits), its kind readable in front."""
    return f"{kind[0]}.{secrets.token_urlsafe(24)}"


@dataclass(frozen=True, slots=True)
class TokenRecord:
    token: str
    kind: TokenKind
    holder: str  # who may use it: `Once.owner_of` the caller
    owner: str  # the worker that made it (`worker_id/incarnation`)
    body: str  # JSON of what it keeps (the questions and the call; the approved call)
    expires_at: float  # Unix time: `expired` after
    binding: str = ""  # an approval's fingerprint of the tool and normalized arguments
    state: str = OPEN
    taker: str | None = None  # the dedup key of the request that took it
    reply: str | None = None  # the call's final reply JSON, when it ended unheard

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> TokenRecord:
        return cls(**json.loads(raw))

    def size(self) -> int:
        return len(self.to_json())

    def forget_at(self, issued_for_s: float) -> float:
        """When nothing is kept: as long after expiry as it was valid (a late use is told)."""
        return self.expires_at + issued_for_s


@dataclass(frozen=True, slots=True)
class Taken:
    """What taking a token gave: its record, or why not."""

    record: TokenRecord | None = None
    refused: Refusal | None = None


class TokenStore(Protocol):
    """Where tokens live; each method may raise when the store is unreachable."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    @property
    def owner(self) -> str:
        """This worker, as its records name their owner."""

    async def put(self, record: TokenRecord, valid_s: float) -> None:
        """Keep a new token for `valid_s`; `TokenBoundExceeded` when its holder's tokens
        would exceed the bound."""

    async def take(self, token: str, holder: str, taker: str, binding: str | None) -> Taken:
        """Take `token` for the request `taker` (its dedup key): the record, marked taken
        (an ended one as it is), or why not. `binding`: an approval's; a mismatch leaves
        it unused."""

    async def end(self, token: str, reply: str) -> bool:
        """The call `token` continues ended while nobody waited: keep its reply for the
        continuation that may still come. False when the token was not open (taken, or
        gone): nothing changed."""

    async def get(self, token: str) -> TokenRecord | None: ...

    async def drop(self, token: str) -> None: ...


class TokenBoundExceeded(Exception):
    """A caller's open tokens fill its bound."""


def refusal(
    record: TokenRecord | None, holder: str, taker: str, binding: str | None, now: float
) -> Refusal | None:
    """Why `record` cannot be taken by `holder` for `taker` now (None: it can): the one
    rule, for every store (the Redis script applies the same)."""
    if record is None or record.holder != holder:
        return "unknown"
    if record.state == ENDED:
        return None  # its call's answer is kept for whoever continues it
    if record.state == TAKEN and record.taker == taker:
        return None  # a copy of the request that took it, even past expiry: its replay
    if record.expires_at <= now:
        return "expired"
    if binding is not None and binding != record.binding:
        return "mismatch"
    return None


class MemoryTokens:
    """One worker's tokens, in its memory."""

    def __init__(self, worker_id: str, *, caller_max_bytes: int = TOKEN_CALLER_MAX_BYTES) -> None:
        self._owner = f"{worker_id}/memory"
        self._records: OrderedDict[str, tuple[TokenRecord, float]] = OrderedDict()
        self._bytes: Holdings[str] = Holdings(caller_max_bytes)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    @property
    def owner(self) -> str:
        return self._owner

    def held_bytes(self, holder: str) -> int:
        """The bytes `holder`'s account holds (every anonymous client's together)."""
        return self._bytes.held(account_of(holder))

    def _forget(self) -> None:
        now = time.time()
        for token, (_, forget_at) in list(self._records.items()):
            if forget_at <= now:
                self._remove(token)

    def _remove(self, token: str) -> None:
        record, _ = self._records.pop(token)
        self._bytes.remove(account_of(record.holder), record.size())

    def _keep(self, record: TokenRecord, forget_at: float) -> None:
        if record.token in self._records:
            self._remove(record.token)
        self._records[record.token] = (record, forget_at)
        self._bytes.add(account_of(record.holder), record.size())

    async def put(self, record: TokenRecord, valid_s: float) -> None:
        self._forget()
        now = time.time()
        # What the caller can no longer use makes room first: taken, or expired.
        for token, (kept, _) in list(self._records.items()):
            if self._bytes.fits(account_of(record.holder), record.size()):
                break
            mine = account_of(kept.holder) == account_of(record.holder)
            if mine and (kept.state != OPEN or kept.expires_at <= now):
                self._remove(token)
        if not self._bytes.fits(account_of(record.holder), record.size()):
            raise TokenBoundExceeded(record.holder)
        self._keep(record, record.forget_at(valid_s))

    async def take(self, token: str, holder: str, taker: str, binding: str | None) -> Taken:
        self._forget()
        kept = self._records.get(token)
        record = kept[0] if kept is not None else None
        refused = refusal(record, holder, taker, binding, time.time())
        if refused is not None or record is None or kept is None:
            return Taken(refused=refused or "unknown")
        if record.state == TAKEN and record.taker != taker:
            return Taken(refused="used")
        if record.state == OPEN:
            record = replace(record, state=TAKEN, taker=taker)
            self._keep(record, kept[1])
        return Taken(record=record)

    async def end(self, token: str, reply: str) -> bool:
        kept = self._records.get(token)
        if kept is None or kept[0].state != OPEN:
            return False
        ended = replace(kept[0], state=ENDED, reply=reply)
        if not self._bytes.fits(account_of(ended.holder), ended.size() - kept[0].size()):
            ended = replace(ended, reply=None)  # told as `unknown`'s kin: not kept
        self._keep(ended, kept[1])
        return True

    async def get(self, token: str) -> TokenRecord | None:
        self._forget()
        kept = self._records.get(token)
        return kept[0] if kept is not None else None

    async def drop(self, token: str) -> None:
        if token in self._records:
            self._remove(token)

"""Early cancels: a cancel that came before its call, remembered so the call never runs.

A cancel may reach the workers before its call does (another worker holds the call in
its queue, or the broker reorders across connections). The cancel handler then finds
nothing running, so it leaves a tombstone under the call's dedup key first, and only
then looks for the running call; a call registers in the running map first, and only
then claims its key, and the claim reports the tombstone (`Claim.cancelled`). Either
the call sees the tombstone or the cancel sees the call.

A tombstone lives `cancel_remember_s`, and only matters to a claim that is fresh: a
finished record (a cancel for a call already answered) keeps its reply, and a running
one is cancelled by whichever worker runs it. The bounds follow the records' habit,
by bytes and per caller: one caller's tombstones hold at most
`Bounds.cancel_caller_max_bytes` (its oldest give way), and in the memory store all
of them at most `Bounds.cancel_max_bytes` (beyond it a new one is not kept: the call
still gets cancelled if it is running here). In Redis each caller's tombstones are one
sorted set by expiry, expiring as a whole with its newest member; and all callers'
together get `Bounds.cancel_max_bytes` of new tombstones per `cancel_remember_s` window
(a counter per window), so what they hold in all stays under twice that, however many
caller names a claim-mode flood invents.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from toolbus.dedup.store import owner_of

TOMBSTONE_OVERHEAD_BYTES = 120  # a dict entry and its float, measured roughly


def tombstones_key(prefix: str, key: str) -> str:
    """The Redis sorted set of the tombstones of `key`'s owner."""
    return f"{prefix}:dedup-cancels:{owner_of(key)}"


def budget_key(prefix: str, ttl_s: float) -> str:
    """The Redis counter of the bytes all callers' new tombstones took in this window
    (windows of `ttl_s`; workers' clocks only need to agree to within a window)."""
    return f"{prefix}:dedup-cancels-budget:{int(time.time() // max(ttl_s, 1.0))}"


def remember_call(
    prefix: str, key: str, ttl_s: float, caller_max_bytes: int, max_bytes: int
) -> tuple[list[str], list[str | int]]:
    """The keys and arguments of `REMEMBER` for a cancel of `key` kept `ttl_s`."""
    zkey = tombstones_key(prefix, key)
    keys = [zkey, zkey + ":bytes", budget_key(prefix, ttl_s)]
    ttl_ms = max(1, int(ttl_s * 1000))
    return keys, [key, ttl_ms, caller_max_bytes, TOMBSTONE_OVERHEAD_BYTES, max_bytes]


def tombstone_size(key: str) -> int:
    return TOMBSTONE_OVERHEAD_BYTES + len(key.encode("utf-8", "surrogatepass"))


class Tombstones:
    """The memory store's tombstones: per owner, oldest first, each with its expiry."""

    def __init__(self, caller_max_bytes: int, max_bytes: int) -> None:
        self._caller_max_bytes, self._max_bytes = caller_max_bytes, max_bytes
        self._by_owner: dict[str, OrderedDict[str, float]] = {}
        self._bytes: dict[str, int] = {}
        self.bytes = 0

    def remember(self, key: str, ttl_s: float) -> bool:
        """A cancel for `key` for `ttl_s`; False when the bounds left no room."""
        owner = owner_of(key)
        self._sweep(owner)
        size = tombstone_size(key)
        stones = self._by_owner.setdefault(owner, OrderedDict())
        if key in stones:
            stones.move_to_end(key)
        else:
            if self.bytes + size > self._max_bytes:
                if not stones:
                    del self._by_owner[owner]
                return False
            self._bytes[owner] = self._bytes.get(owner, 0) + size
            self.bytes += size
        stones[key] = time.monotonic() + ttl_s
        while self._bytes[owner] > self._caller_max_bytes and len(stones) > 1:
            self._drop(owner, next(iter(stones)))
        return True

    def cancelled(self, key: str) -> bool:
        stones = self._by_owner.get(owner_of(key))
        expires_at = None if stones is None else stones.get(key)
        return expires_at is not None and expires_at > time.monotonic()

    def _sweep(self, owner: str) -> None:
        """`owner`'s expired tombstones gone (oldest first: they expire in order)."""
        stones = self._by_owner.get(owner)
        now = time.monotonic()
        while stones:
            key, expires_at = next(iter(stones.items()))
            if expires_at > now:
                break
            self._drop(owner, key)
            stones = self._by_owner.get(owner)

    def _drop(self, owner: str, key: str) -> None:
        stones = self._by_owner[owner]
        del stones[key]
        size = tombstone_size(key)
        self._bytes[owner] -= size
        self.bytes -= size
        if not stones:
            del self._by_owner[owner]
            del self._bytes[owner]


# KEYS[1]: the owner's tombstones (a sorted set, scored by expiry in ms), KEYS[2]: the
# bytes they hold, KEYS[3]: the bytes all owners' new tombstones took in this window.
# ARGV[1]: the store key, ARGV[2]: ttl ms, ARGV[3]: the owner's bound, ARGV[4]: the
# overhead counted per tombstone, ARGV[5]: the window's bound for all owners. A new one
# beyond the window's bound is not kept (0). Expired ones go first, then the oldest
# until the owner is within its bound; both keys expire with the newest tombstone.
REMEMBER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local over = tonumber(ARGV[4])
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  local spent = redis.call('INCRBY', KEYS[3], #ARGV[1] + over)
  redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[2]))
  if spent > tonumber(ARGV[5]) then return 0 end
end
local bytes = tonumber(redis.call('GET', KEYS[2]) or '0')
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  bytes = bytes - #m - over
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then bytes = bytes + #ARGV[1] + over end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
while bytes > tonumber(ARGV[3]) and redis.call('ZCARD', KEYS[1]) > 1 do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  redis.call('ZREM', KEYS[1], oldest)
  bytes = bytes - #oldest - over
end
redis.call('SET', KEYS[2], math.max(bytes, 0), 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# Is there a live tombstone for ARGV[1] in KEYS[1]? (Inlined into the claim script.)
CANCELLED_LUA = """
local function cancelled(zkey, member)
  local score = redis.call('ZSCORE', zkey, member)
  if not score then return false end
  local t = redis.call('TIME')
  return tonumber(score) > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

"""Tokens in Redis: a pool's continuations and approvals, taken once by whichever worker.

The same semantics as `MemoryTokens` (tokens.py), across every worker sharing one Redis:
a record is a JSON string under `{p}:token:{token}`, kept until as long after its expiry
as it was valid (a late use is told `expired`); its holder's bytes are counted in the
hash `{p}:token-bytes:{account}`, one field per token (`size:forget_ms:expires_ms:open`),
`account` the holder's caller, or "" for every anonymous client together
(`tokens.account_of`: a reply topic is free to make, so it buys no share of a bound).
Every step that reads and writes is one Lua script, so two workers taking one token at
once cannot both have it: `TAKE` applies `tokens.refusal`'s rule, then marks the record
taken by the request that took it. `PUT` makes room the way the memory store does (the
holder's taken, ended or expired records go first) and refuses past the bound.
"""

from __future__ import annotations

import time
import uuid
from typing import Self, cast

from toolbus.dedup.redis_connect import connect
from toolbus.dedup.store import KEY_SEP
from toolbus.dedup.tokens import (
    TOKEN_CALLER_MAX_BYTES,
    Refusal,
    Taken,
    TokenBoundExceeded,
    TokenRecord,
    account_of,
)
from toolbus.wire.store_url import key_prefix

# The holder's counted bytes: entries past their forget time dropped, this token's own
# left out; `spare` lists what may give way (taken, ended or expired), soonest expiry
# first. Sets `total` and `spare`. `BYTES` (the holder's hash), `NOW`, `SELF` set first.
_COUNT = """
local total, spare = 0, {}
local all = redis.call('HGETALL', BYTES)
for i = 1, #all, 2 do
  local size, forget, exp, open = string.match(all[i + 1], '(%d+):(%d+):(%d+):(%d)')
  if tonumber(forget) <= NOW then
    redis.call('HDEL', BYTES, all[i])
  elseif all[i] ~= SELF then
    total = total + tonumber(size)
    if open == '0' or tonumber(exp) <= NOW then
      table.insert(spare, {all[i], tonumber(size), tonumber(exp)})
    end
  end
end
table.sort(spare, function(a, b) return a[3] < b[3] end)
"""

# ARGV: json, token, limit, now ms, forget ms, expires ms, ttl ms, record key prefix.
PUT = (
    "local NOW, SELF, BYTES = tonumber(ARGV[4]), ARGV[2], KEYS[2]\n"
    + _COUNT
    + """
local size, limit = string.len(ARGV[1]), tonumber(ARGV[3])
local i = 1
while total + size > limit and i <= #spare do
  redis.call('DEL', ARGV[8] .. spare[i][1])
  redis.call('HDEL', KEYS[2], spare[i][1])
  total = total - spare[i][2]
  i = i + 1
end
if total + size > limit then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[7])
redis.call('HSET', KEYS[2], ARGV[2], size .. ':' .. ARGV[5] .. ':' .. ARGV[6] .. ':1')
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[7]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[7])
end
return 1
"""
)

# `tokens.account_of` in Lua: an anonymous holder starts with the key separator.
_ACCOUNT = f"""
local function account(holder)
  if string.sub(holder, 1, 1) == '{KEY_SEP}' then return '' end
  return holder
end
"""

# A record's new JSON, counted anew and marked no longer open in its account's hash.
_RECOUNT = (
    _ACCOUNT
    + """
local function recount(bytes, token, out)
  local entry = redis.call('HGET', bytes, token)
  if entry then
    local forget, exp = string.match(entry, '%d+:(%d+):(%d+):%d')
    redis.call('HSET', bytes, token, string.len(out) .. ':' .. forget .. ':' .. exp .. ':0')
  end
end
"""
)

# `tokens.refusal`'s rule, then taken by ARGV[2]. ARGV: holder, taker, binding, whether
# a binding is given ('1'), now (s), token. Returns {refusal} or {'', record json}.
TAKE = (
    _RECOUNT
    + """
local raw = redis.call('GET', KEYS[1])
if not raw then return {'unknown'} end
local r = cjson.decode(raw)
if r.holder ~= ARGV[1] then return {'unknown'} end
if r.state == 'ended' then return {'', raw} end
if r.state == 'taken' and r.taker == ARGV[2] then return {'', raw} end
if tonumber(r.expires_at) <= tonumber(ARGV[5]) then return {'expired'} end
if ARGV[4] == '1' and r.binding ~= ARGV[3] then return {'mismatch'} end
if r.state == 'taken' then
  if r.taker ~= ARGV[2] then return {'used'} end
  return {'', raw}
end
r.state, r.taker = 'taken', ARGV[2]
local out = cjson.encode(r)
redis.call('SET', KEYS[1], out, 'KEEPTTL')
recount(KEYS[2], ARGV[6], out)
return {'', out}
"""
)

# An open record's held call ended unheard: its reply kept, unless that would take its
# holder past the bound. ARGV: reply json, limit, now ms, token, bytes-hash prefix.
END = (
    _RECOUNT
    + """
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local r = cjson.decode(raw)
if r.state ~= 'open' then return 0 end
local NOW, SELF, BYTES = tonumber(ARGV[3]), ARGV[4], ARGV[5] .. account(r.holder)
"""
    + _COUNT
    + """
r.state, r.reply = 'ended', ARGV[1]
local out = cjson.encode(r)
if total + string.len(out) > tonumber(ARGV[2]) then
  r.reply = cjson.null
  out = cjson.encode(r)
end
redis.call('SET', KEYS[1], out, 'KEEPTTL')
recount(BYTES, ARGV[4], out)
return 1
"""
)

# ARGV: token, bytes-hash prefix.
DROP = (
    _ACCOUNT
    + """
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HDEL', ARGV[2] .. account(cjson.decode(raw).holder), ARGV[1])
return 1
"""
)


class RedisTokens:
    """The tokens of the workers sharing one Redis."""

    def __init__(
        self,
        url: str,
        worker_id: str,
        *,
        prefix: str,
        caller_max_bytes: int = TOKEN_CALLER_MAX_BYTES,
        timeout_s: float = 5.0,
    ) -> None:
        self._redis = connect(
            url,
            timeout_s=timeout_s,
        )
        self._owner = f"{worker_id}/{uuid.uuid4().hex}"
        self._prefix = key_prefix(url, prefix)
        self._caller_max_bytes = caller_max_bytes
        self._put = self._redis.register_script(PUT)
        self._take = self._redis.register_script(TAKE)
        self._end = self._redis.register_script(END)
        self._drop = self._redis.register_script(DROP)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._redis.aclose()

    @property
    def owner(self) -> str:
        return self._owner

    def _records(self) -> str:
        return f"{self._prefix}:token:"

    def _holders(self) -> str:
        return f"{self._prefix}:token-bytes:"

    async def held_bytes(self, holder: str) -> int:
        """The bytes `holder`'s kept tokens count (tests, `toolbus status`)."""
        now_ms = time.time() * 1000
        total = 0
        account = self._holders() + account_of(holder)
        for entry in (await self._redis.hgetall(account)).values():
            size, forget, _, _ = _text(entry).split(":")
            total += int(size) if int(forget) > now_ms else 0
        return total

    async def put(self, record: TokenRecord, valid_s: float) -> None:
        now = time.time()
        forget_at = record.forget_at(valid_s)
        stored = await self._put(
            keys=[self._records() + record.token, self._holders() + account_of(record.holder)],
            args=[
                record.to_json(),
                record.token,
                self._caller_max_bytes,
                int(now * 1000),
                int(forget_at * 1000),
                int(record.expires_at * 1000),
                max(1, int((forget_at - now) * 1000)),
                self._records(),
            ],
        )
        if not stored:
            raise TokenBoundExceeded(record.holder)

    async def take(self, token: str, holder: str, taker: str, binding: str | None) -> Taken:
        bound = "0" if binding is None else "1"
        refused, *raw = await self._take(
            keys=[self._records() + token, self._holders() + account_of(holder)],
            args=[holder, taker, binding or "", bound, time.time(), token],
        )
        if raw:
            return Taken(record=TokenRecord.from_json(raw[0]))
        return Taken(refused=cast(Refusal, _text(refused)))  # one of the script's four

    async def end(self, token: str, reply: str) -> bool:
        ended = await self._end(
            keys=[self._records() + token],
            args=[reply, self._caller_max_bytes, int(time.time() * 1000), token, self._holders()],
        )
        return bool(ended == 1)

    async def get(self, token: str) -> TokenRecord | None:
        raw = await self._redis.get(self._records() + token)
        return None if raw is None else TokenRecord.from_json(raw)

    async def drop(self, token: str) -> None:
        await self._drop(keys=[self._records() + token], args=[token, self._holders()])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

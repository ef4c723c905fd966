"""The Lua the Redis store runs: compare-and-set writes, and the books of finished records.

Each script is one round trip and atomic. Writes compare first: a late close must not
touch a record another worker wrote meanwhile (a take-over while our heartbeat had lapsed,
a claim after the record expired).

The books (`_LEDGER`) keep the Redis store within the same bounds as the memory store's
ledger (`ledger.py`), across every worker sharing it: per finished record its bytes
(`{p}:dedup-sizes`), when it expires (`{p}:dedup-ledger`, scored by expiry: the books of
expired records are settled a few at a time, at each close), and per owner its records
oldest first (`{p}:dedup-owned:{owner}`), those whose reply a summary can stand in for
(`{p}:dedup-whole:{owner}`), and its bytes (`{p}:dedup-owners`, the total in
`{p}:dedup-bytes`). Closing a record that takes its owner past `caller_max_bytes`, or the
store past `max_bytes`, shrinks the oldest whole reply of the owner holding the most to
its summary, or, with none left, deletes that owner's oldest finished record; a bounded
number of steps per close, so no script holds Redis long.
"""

from __future__ import annotations

from toolbus.dedup.cancels import CANCELLED_LUA

# Is the record under KEYS[1] this incarnation's run (ARGV[1..3]: worker id, incarnation,
# fingerprint)?
_OURS = """
local function ours(raw)
  local ok, record = pcall(cjson.decode, raw)
  return ok and type(record) == 'table' and record.state == 'started'
    and record.worker_id == ARGV[1] and record.incarnation == ARGV[2]
    and (record.fingerprint or '') == ARGV[3]
end
local function started(raw)
  local ok, record = pcall(cjson.decode, raw)
  return ok and type(record) == 'table' and record.state == 'started'
end
"""

# The books, for a store whose keys start with `P` (set by the script using them).
_LEDGER = """
local LEDGER, SIZES = P .. ':dedup-ledger', P .. ':dedup-sizes'
local OWNERS, TOTAL, SEQ = P .. ':dedup-owners', P .. ':dedup-bytes', P .. ':dedup-seq'
local MAX_STEPS = 256
local gave_way = {0, 0}  -- shrunk, forgotten: what the close returns beside its 1
local function owned(owner) return P .. ':dedup-owned:' .. owner end
local function whole(owner) return P .. ':dedup-whole:' .. owner end
local function record_key(k) return P .. ':dedup:' .. k end
local function owner_of(k)
  local sep = string.find(k, '\\31', 1, true)
  if sep == nil then return '' end
  return string.sub(k, 1, sep - 1)
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function unaccount(k)
  local size = redis.call('HGET', SIZES, k)
  if not size then return end
  local owner = owner_of(k)
  redis.call('HDEL', SIZES, k)
  redis.call('ZREM', LEDGER, k)
  redis.call('ZREM', owned(owner), k)
  redis.call('ZREM', whole(owner), k)
  if tonumber(redis.call('ZINCRBY', OWNERS, -tonumber(size), owner)) <= 0 then
    redis.call('ZREM', OWNERS, owner)
  end
  redis.call('DECRBY', TOTAL, size)
end
local function account(k, size, is_whole, expires_at)
  unaccount(k)
  local owner, seq = owner_of(k), redis.call('INCR', SEQ)
  redis.call('HSET', SIZES, k, size)
  redis.call('ZADD', LEDGER, expires_at, k)
  redis.call('ZADD', owned(owner), seq, k)
  if is_whole then redis.call('ZADD', whole(owner), seq, k) end
  redis.call('ZINCRBY', OWNERS, size, owner)
  redis.call('INCRBY', TOTAL, size)
end
local function settle_expired(now)
  for _, k in ipairs(redis.call('ZRANGEBYSCORE', LEDGER, '-inf', now, 'LIMIT', 0, 64)) do
    unaccount(k)
  end
end
local function finished(raw)
  local ok, record = pcall(cjson.decode, raw or '')
  if ok and type(record) == 'table' and record.state == 'done' then return record end
  return nil
end
-- The owner's oldest whole reply becomes its summary; else its oldest record goes.
local function give_way(owner, overhead)
  local oldest = redis.call('ZRANGE', whole(owner), 0, 0)
  if #oldest > 0 then
    local k = oldest[1]
    redis.call('ZREM', whole(owner), k)
    local record = finished(redis.call('GET', record_key(k)))
    if record and record.summary then
      record.reply, record.summary = record.summary, nil
      local shrunk = cjson.encode(record)
      redis.call('SET', record_key(k), shrunk, 'KEEPTTL')
      local was = tonumber(redis.call('HGET', SIZES, k) or '0')
      local size = overhead + string.len(k) + string.len(shrunk)
      redis.call('HSET', SIZES, k, size)
      redis.call('ZINCRBY', OWNERS, size - was, owner)
      redis.call('INCRBY', TOTAL, size - was)
      gave_way[1] = gave_way[1] + 1
    elseif not record then
      unaccount(k)  -- gone, or another run's now: nothing of it is kept here
    end
    return 1
  end
  oldest = redis.call('ZRANGE', owned(owner), 0, 0)
  if #oldest == 0 then return 0 end
  local k = oldest[1]
  if finished(redis.call('GET', record_key(k))) then
    redis.call('DEL', record_key(k))
    gave_way[2] = gave_way[2] + 1
  end
  unaccount(k)
  return 1
end
local function bound(owner, overhead, caller_max, max)
  local steps = 0
  while steps < MAX_STEPS and tonumber(redis.call('ZSCORE', OWNERS, owner) or '0') > caller_max do
    if give_way(owner, overhead) == 0 then break end
    steps = steps + 1
  end
  while steps < MAX_STEPS and tonumber(redis.call('GET', TOTAL) or '0') > max do
    local top = redis.call('ZREVRANGE', OWNERS, 0, 0, 'WITHSCORES')
    if #top == 0 then break end
    local victim = top[1]
    if redis.call('ZSCORE', OWNERS, owner) == top[2] then victim = owner end  -- a tie: its own
    if give_way(victim, overhead) == 0 then break end
    steps = steps + 1
  end
end
"""

# Claim KEYS[1] with ARGV[1] for ARGV[2] ms (SET NX), if the store's epoch (KEYS[2]) is
# still ARGV[3]: another epoch is a store emptied or replaced, where the claim must not
# land unnoticed. Answers 1 (claimed), 2 (claimed, and the caller's tombstones, KEYS[3],
# hold an early cancel of ARGV[4]: `cancels.py`), the record there (a string), false
# (gone between the two: expired) or {'emptied'} (nothing written).
CLAIM = (
    CANCELLED_LUA
    + """
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return {'emptied'} end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if cancelled(KEYS[3], ARGV[4]) then return 2 end
  return 1
end
return redis.call('GET', KEYS[1])
"""
)

# Replace the record only if it still is ARGV[1] (compare and set): an orphaned run, or a
# reply to another request under the same key (ARGV[4]: the store key, ARGV[5]: the
# prefix), whose books are closed: it is a run now.
TAKE_OVER = (
    "local P = ARGV[5]\n"
    + _LEDGER
    + """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  unaccount(ARGV[4])
  return 1
end
return 0
"""
)

# Close with the reply (ARGV[4], for ARGV[5] ms) our own run, or a record gone meanwhile
# (expired, or a store that lost its records: the reply is still the truth); wake waiters
# on ARGV[6]; then keep the books (ARGV[7]: prefix, [8]: store key, [9]: overhead, [10]:
# whether a summary can stand in, [11]: caller_max_bytes, [12]: max_bytes), answering
# {1, shrunk, forgotten}. This call's reply already there (a write that went through
# although its answer was lost, shrunk since) is done. ARGV[13] '1': a write-back into an
# emptied store, which also replaces a run claimed there since: the call ran before it.
FINISH = (
    _OURS
    + "local P = ARGV[7]\n"
    + _LEDGER
    + """
local raw = redis.call('GET', KEYS[1])
if raw == ARGV[4] then return 1 end
if raw then
  local was = finished(raw)
  if was and (was.fingerprint or '') == ARGV[3] then return 1 end
  if not ours(raw) and not (ARGV[13] == '1' and started(raw)) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
redis.call('PUBLISH', ARGV[6], 'done')
local now, k, overhead = now_ms(), ARGV[8], tonumber(ARGV[9])
settle_expired(now)
account(k, overhead + string.len(k) + string.len(ARGV[4]), ARGV[10] == '1', now + tonumber(ARGV[5]))
bound(owner_of(k), overhead, tonumber(ARGV[11]), tonumber(ARGV[12]))
return {1, gave_way[1], gave_way[2]}
"""
)

# Write back a run (ARGV[1], for ARGV[2] ms) into an emptied store, over nothing or over
# a run claimed there since (a claim in doubt: the run written back came first).
WRITE_RUN = (
    _OURS
    + """
local raw = redis.call('GET', KEYS[1])
if raw and not started(raw) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
)

# Delete our own run's claim only (compare and delete); wake waiters on ARGV[4].
RELEASE = (
    _OURS
    + """
local raw = redis.call('GET', KEYS[1])
if not raw or not ours(raw) then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[4], 'released')
return 1
"""
)

# Delete the record only if it is exactly ARGV[1] (a claim that failed, landed late);
# wake waiters on ARGV[2].
UNCLAIM = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'released')
return 1
"""

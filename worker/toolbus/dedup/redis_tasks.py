"""Task records in Redis: every worker of a pool answers `tasks/get`, and notices dead owners.

A record is a JSON string under `{p}:task:{id}` that lives `task_ttl_s`; the ids of tasks
still running are in `{p}:tasks:working`. Each worker keeps `{p}:task-owner:{worker_id}`
set to its incarnation, refreshed every `HEARTBEAT_S` and gone `ALIVE_TTL_S` after its last
beat: a running task whose owner's key is gone, or names another incarnation, was cut
short. Whoever reads it first (a `tasks/get`, or any worker's sweep each heartbeat) marks
it failed in doubt, once (`MARK` compares the owner), and the sweeper pushes that end to
the task's caller. So a dead worker's task is reported failed within `ALIVE_TTL_S` plus
one heartbeat. Bytes are counted per caller in `{p}:task-bytes:{caller}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import replace
from typing import Self

from toolbus.dedup.redis_connect import connect
from toolbus.dedup.redis_fleet import ALIVE_TTL_S, HEARTBEAT_S
from toolbus.dedup.tasks import (
    TASK_CALLER_MAX_BYTES,
    TaskBoundExceeded,
    TaskRecord,
    not_kept,
    orphaned,
)
from toolbus.wire.store_url import key_prefix
from toolbus.wire.tasks import cancel_and_wait

log = logging.getLogger("toolbus.dedup")

# The caller's counted bytes (entries `size:expires_ms`, stale ones dropped) and, unless
# it would go over, the write. KEYS: record, working set, caller's bytes.
_COUNT = """
local total = 0
local all = redis.call('HGETALL', KEYS[3])
for i = 1, #all, 2 do
  local size, exp = string.match(all[i + 1], '(%d+):(%d+)')
  if tonumber(exp) <= tonumber(ARGV[5]) then
    redis.call('HDEL', KEYS[3], all[i])
  elseif all[i] ~= ARGV[2] then
    total = total + tonumber(size)
  end
end
local fits = total + tonumber(ARGV[3]) <= tonumber(ARGV[4])
"""

# ARGV: json, task id, size, limit, now ms, expires ms, ttl ms
CREATE = (
    """
local kept = redis.call('GET', KEYS[1])
if kept then return kept end
"""
    + _COUNT
    + """
if not fits then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[7])
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3] .. ':' .. ARGV[6])
redis.call('PEXPIRE', KEYS[3], ARGV[7])
return ''
"""
)

# ARGV: json, task id, size, limit, now ms, expires ms, stripped json, its size. A record
# gone (past its TTL while it ran) is not written again: it would never expire (2). One
# ended already (another worker's sweep found this one's owner silent and failed it in
# doubt) or another owner's is left as it is (3): its end was told, and stays true.
FINISH = (
    """
local kept = redis.call('GET', KEYS[1])
if not kept then
  redis.call('SREM', KEYS[2], ARGV[2])
  return 2
end
local stored = cjson.decode(kept)
if stored.owner ~= cjson.decode(ARGV[1]).owner or stored.status == 'completed'
   or stored.status == 'failed' or stored.status == 'cancelled' then
  return 3
end
"""
    + _COUNT
    + """
local body, size = ARGV[1], ARGV[3]
if not fits then body, size = ARGV[7], ARGV[8] end
redis.call('SET', KEYS[1], body, 'KEEPTTL')
redis.call('SREM', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[2], size .. ':' .. ARGV[6])
return fits and 1 or 0
"""
)

# A running task's new state, only while its owner still holds it. ARGV: owner, json, id
MARK = """
local kept = redis.call('GET', KEYS[1])
if not kept then redis.call('SREM', KEYS[2], ARGV[3]) return 0 end
local record = cjson.decode(kept)
if record.owner ~= ARGV[1] or record.status == 'completed' or record.status == 'failed'
   or record.status == 'cancelled' then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
local ended = cjson.decode(ARGV[2]).status
if ended == 'completed' or ended == 'failed' or ended == 'cancelled' then
  redis.call('SREM', KEYS[2], ARGV[3])
end
return 1
"""


class RedisTasks:
    """Task records shared by the workers of one Redis."""

    def __init__(
        self,
        url: str,
        worker_id: str,
        *,
        prefix: str,
        caller_max_bytes: int = TASK_CALLER_MAX_BYTES,
        timeout_s: float = 5.0,
    ) -> None:
        self._redis = connect(
            url,
            timeout_s=timeout_s,
        )
        self._worker_id, self._incarnation = worker_id, uuid.uuid4().hex
        self._prefix = key_prefix(url, prefix)
        self._caller_max_bytes = caller_max_bytes
        self._create = self._redis.register_script(CREATE)
        self._finish = self._redis.register_script(FINISH)
        self._mark = self._redis.register_script(MARK)
        self._heartbeat: asyncio.Task[None] | None = None
        self._mine: set[str] = set()  # ids of the tasks this worker runs

    @property
    def owner(self) -> str:
        return f"{self._worker_id}/{self._incarnation}"

    def _key(self, task_id: str) -> str:
        return f"{self._prefix}:task:{task_id}"

    def _working(self) -> str:
        return f"{self._prefix}:tasks:working"

    def _bytes(self, caller: str | None) -> str:
        return f"{self._prefix}:task-bytes:{caller or ''}"

    def _alive(self, worker_id: str) -> str:
        return f"{self._prefix}:task-owner:{worker_id}"

    async def __aenter__(self) -> Self:
        await self._beat()
        self._heartbeat = asyncio.create_task(self._beat_forever(), name="task-heartbeat")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._heartbeat is not None:
            await cancel_and_wait(self._heartbeat)
        with contextlib.suppress(Exception):  # its tasks were ended by the drain
            await self._redis.delete(self._alive(self._worker_id))
        await self._redis.aclose()

    async def _beat(self) -> None:
        await self._redis.set(
            self._alive(self._worker_id), self._incarnation, px=int(ALIVE_TTL_S * 1000)
        )

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)  # a period, not a synchronisation
            try:
                await self._beat()
            except Exception as exc:  # Redis away for a moment: keep beating
                log.warning("task heartbeat failed: %s", exc)

    def _args(self, record: TaskRecord) -> list[str | int]:
        return [
            record.to_json(),
            record.task_id,
            record.size(),
            self._caller_max_bytes,
            int(time.time() * 1000),
            int(record.expires_at * 1000),
        ]

    async def create(self, record: TaskRecord) -> TaskRecord | None:
        keys = [self._key(record.task_id), self._working(), self._bytes(record.caller)]
        ttl_ms = max(1, int((record.expires_at - time.time()) * 1000))
        found = await self._create(keys=keys, args=[*self._args(record), ttl_ms])
        if found == 0:
            raise TaskBoundExceeded(record.caller)
        if found:
            return await self._checked(TaskRecord.from_json(found))
        self._mine.add(record.task_id)
        return None

    async def get(self, task_id: str) -> TaskRecord | None:
        raw = await self._redis.get(self._key(task_id))
        return None if raw is None else await self._checked(TaskRecord.from_json(raw))

    async def _checked(self, record: TaskRecord) -> TaskRecord:
        """`record`, failed in doubt if its owner is gone (marked so in the store)."""
        if record.finished or await self._lives(record.owner):
            return record
        failed = orphaned(record)
        await self._mark(
            keys=[self._key(record.task_id), self._working()],
            args=[record.owner, failed.to_json(), record.task_id],
        )
        return await self.get(record.task_id) or failed

    async def _lives(self, owner: str) -> bool:
        worker_id, _, incarnation = owner.rpartition("/")
        if owner == self.owner:
            return True
        alive = await self._redis.get(self._alive(worker_id))
        return alive is not None and _text(alive) == incarnation

    async def update(self, task_id: str, status: str, message: str | None) -> bool:
        kept = await self._redis.get(self._key(task_id))
        if kept is None:
            return False
        changed = replace(TaskRecord.from_json(kept), status=status, message=message)
        marked = await self._mark(
            keys=[self._key(task_id), self._working()],
            args=[self.owner, changed.to_json(), task_id],
        )
        return bool(marked)

    async def finish(self, record: TaskRecord) -> TaskRecord | None:
        stripped = replace(record, reply=not_kept(record))
        keys = [self._key(record.task_id), self._working(), self._bytes(record.caller)]
        args = [*self._args(record), stripped.to_json(), stripped.size()]
        kept = await self._finish(keys=keys, args=args)
        self._mine.discard(record.task_id)
        if kept == 3:
            return None
        return stripped if kept == 0 else record

    async def orphans(self) -> list[TaskRecord]:
        ids = [_text(i) for i in await self._redis.smembers(self._working())]
        if not ids:
            return []
        found = []
        for raw in await self._redis.mget([self._key(i) for i in ids]):
            if raw is not None:
                found.append(TaskRecord.from_json(raw))
        ended = []
        for record in found:
            if record.finished or await self._lives(record.owner):
                continue
            failed = orphaned(record)
            marked = await self._mark(
                keys=[self._key(record.task_id), self._working()],
                args=[record.owner, failed.to_json(), record.task_id],
            )
            if marked:
                ended.append(failed)
        return ended

    def running(self) -> int:
        return len(self._mine)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

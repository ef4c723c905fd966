"""How the Redis stores reach Redis: one URL names a single server, a Sentinel-watched
primary, or a Redis Cluster, and every store (records, dispatch, tokens, tasks, relay)
opens its client here.

- `redis://[user:password@]host:port/db`, `rediss://…` (TLS), `unix://path`: one server.
- `redis+sentinel://[user:password@]host:port[,host:port…]/service[/db]`: the Sentinels
  are asked which server is the primary of `service`; after a failover the client asks
  again on its next connection, so the workers follow the promoted replica without a
  restart. The user and password are the primary's (Sentinels themselves without one).
- `redis+cluster://[user:password@]host:port[,host:port…]`: a Redis Cluster, found from
  any of the nodes named. Every key toolbus writes carries its prefix as a hash tag
  (`{toolbus}:dedup:…`), so the keys one script touches share a slot, as a cluster
  requires: the cluster holds them on one primary and its replicas (failover, not spread).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff

from toolbus.wire.store_url import CLUSTER, SENTINEL, where


def connect(url: str, *, timeout_s: float, **options: Any) -> Redis:
    """A client for the store `url` names; `options` as `redis.asyncio.Redis` takes them
    (a `retry`, say). A cluster's client is a `RedisCluster`, used through the same
    commands (typed as `Redis`: the stores use only what both answer)."""
    options.update(socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    if url.startswith(f"{SENTINEL}://"):
        taken = where(url)
        service, db = taken.path[0], int(taken.path[1]) if len(taken.path) > 1 else 0
        sentinels = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves it bare
            list(taken.hosts),
            sentinel_kwargs={"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s},
        )
        primary: Redis = sentinels.master_for(
            service, username=taken.username, password=taken.password, db=db, **options
        )
        return primary
    if url.startswith(f"{CLUSTER}://"):
        taken = where(url)
        nodes = [ClusterNode(host, port) for host, port in taken.hosts]
        # redis-py's cluster retries any error, timeouts included, 3 times by default: a
        # hung node would hold each command four timeouts. Once more is enough to follow
        # a slot that moved (the client learns the new owner before it sends again).
        options.setdefault("retry", Retry(ExponentialBackoff(cap=0.5, base=0.05), 1))
        return RedisCluster(  # type: ignore[return-value]  # the commands the stores use
            startup_nodes=nodes, username=taken.username, password=taken.password, **options
        )
    return Redis.from_url(url, **options)


def on_node_of(client: Redis, key: str) -> dict[str, Any]:
    """What a command that names no key needs to reach the node holding `key` (or the
    channel `key`) on a cluster: PUBSUB NUMSUB counts one node's subscribers, INFO tells
    of one node's memory. Nothing on one server."""
    if isinstance(client, RedisCluster):
        return {"target_nodes": client.get_node_from_key(key)}
    return {}

"""The shared store's URL, taken apart without Redis's client: one server
(`redis://`, `rediss://`, `unix://`), a Sentinel-watched primary (`redis+sentinel://`) or a
Redis Cluster (`redis+cluster://`); `dedup/redis_connect.py` opens it. Checked where the
settings are read (no `redis` import there) and shown in logs without its password.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

SENTINEL, CLUSTER = "redis+sentinel", "redis+cluster"
SCHEMES = ("redis://", "rediss://", "unix://", f"{SENTINEL}://", f"{CLUSTER}://")


@dataclass(frozen=True)
class Where:
    """A store URL taken apart: what kind, which hosts, and what to say in logs."""

    scheme: str
    hosts: tuple[tuple[str, int], ...]
    path: tuple[str, ...]
    username: str | None
    password: str | None

    @property
    def shown(self) -> str:
        """The URL without its user and password (log lines and errors)."""
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)
        return f"{self.scheme}://{hosts}/{'/'.join(self.path)}".rstrip("/")


class StoreUrlError(ValueError):
    """A store URL that does not parse; its text never quotes the URL (a password)."""


def where(url: str) -> Where:
    """`url` taken apart; a comma-separated host list is kept whole (urllib would not).
    A host may be `[IPv6]:port`; a password with `@ : / ? #` in it is percent-encoded."""
    default = 26379 if url.startswith(f"{SENTINEL}://") else 6379
    try:
        parts = urlsplit(url)
        credentials, _, hosts = parts.netloc.rpartition("@")
        user, _, password = credentials.partition(":")
        listed = []
        for host in filter(None, hosts.split(",")):
            one = urlsplit(f"//{host}")  # brackets of an IPv6 host removed, port checked
            listed.append((one.hostname or "127.0.0.1", one.port or default))
    except ValueError:  # the text may hold a piece of the password: never passed on
        raise StoreUrlError("the store URL's hosts do not parse: host:port[,host:port]") from None
    return Where(
        parts.scheme,
        tuple(listed),
        tuple(filter(None, parts.path.split("/"))),
        unquote(user) or None,
        unquote(password) or None,
    )


def check(url: str) -> str:
    """`url` if it names a store these clients can open; ValueError saying why not."""
    if not url.startswith(SCHEMES):
        raise StoreUrlError(
            "dedup_store is `memory` or a redis://, rediss://, unix://, redis+sentinel:// "
            "or redis+cluster:// URL"
        )
    if url.startswith("unix://"):
        return url
    taken = where(url)
    if not taken.hosts:
        raise StoreUrlError(f"{taken.scheme} needs host:port[,host:port]")
    many = url.startswith((f"{SENTINEL}://", f"{CLUSTER}://"))
    if not many and len(taken.hosts) > 1:
        raise StoreUrlError(f"{taken.scheme}:// names one server: redis+sentinel:// for several")
    if many and urlsplit(url).query:  # they would be dropped unheard
        raise StoreUrlError(f"{taken.scheme}:// takes no query options (? in a password: %3F)")
    if taken.scheme == SENTINEL and not taken.path:
        raise StoreUrlError("redis+sentinel:// needs the service: …/host:port/mymaster")
    if taken.scheme == CLUSTER and taken.path:
        raise StoreUrlError("redis+cluster:// takes no database (a cluster has only 0)")
    db = taken.path[1:] if taken.scheme == SENTINEL else taken.path
    if len(db) > 1 or (db and not db[0].isdigit()):
        raise StoreUrlError("the store URL's database is a number: …/0")
    return url


def key_prefix(url: str, prefix: str) -> str:
    """The prefix of every key: a hash tag on a cluster (one slot for a script's keys)."""
    return f"{{{prefix}}}" if url.startswith(f"{CLUSTER}://") else prefix

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
        """The URL without its password (log lines and errors)."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.hosts)
        return f"{self.scheme}://{hosts}/{'/'.join(self.path)}".rstrip("/")


def where(url: str) -> Where:
    """`url` taken apart; a comma-separated host list is kept whole (urllib would not)."""
    parts = urlsplit(url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    user, _, password = credentials.partition(":")
    listed = []
    for host in filter(None, hosts.split(",")):
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "")
        listed.append((name or "127.0.0.1", int(port or (26379 if SENTINEL in url else 6379))))
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
        raise ValueError("dedup_store is `memory` or a redis://, redis+sentinel:// URL")
    if url.startswith((f"{SENTINEL}://", f"{CLUSTER}://")):
        taken = where(url)
        if not taken.hosts:
            raise ValueError(f"{taken.scheme} needs host:port[,host:port]")
        if taken.scheme == SENTINEL and not taken.path:
            raise ValueError("redis+sentinel:// needs the service: …/host:port/mymaster")
    return url


def key_prefix(url: str, prefix: str) -> str:
    """The prefix of every key: a hash tag on a cluster (one slot for a script's keys)."""
    return f"{{{prefix}}}" if url.startswith(f"{CLUSTER}://") else prefix

"""Nodes: the brokers of a cluster, in the order they are tried, round the list.

`broker_url` may name several nodes. A connection goes to the node `current` names; a
node that does not answer, or is lost, moves `current` on to the next (`advance`), so the
next connect, with the caller's own backoff, tries another. `first` connects to the first
node that answers, each tried once. The worker's two connections and `toolbus.Client`'s
one use it alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from toolbus.transport.errors import SubscriptionRefused, TransportError
from toolbus.wire.broker import BrokerUrl

T = TypeVar("T")


class Nodes:
    """A cluster's nodes (one for a single broker), and the one the next connect uses."""

    def __init__(self, brokers: BrokerUrl | tuple[BrokerUrl, ...]) -> None:
        self.all = brokers if isinstance(brokers, tuple) else (brokers,)
        if not self.all:
            raise ValueError("no broker to connect to")
        self._turn = 0

    @property
    def current(self) -> BrokerUrl:
        return self.all[self._turn % len(self.all)]

    def advance(self) -> None:
        """The current node did not answer, or was lost: the next connect tries the next."""
        self._turn += 1

    async def first(self, connect: Callable[[], Awaitable[T]]) -> T:
        """`connect()` until a node answers, each tried once from the current one on;
        the last node's error when none does. A refused subscription (an ACL, the same on
        every node) is raised at once."""
        for left in reversed(range(len(self.all))):
            try:
                return await connect()
            except SubscriptionRefused:
                raise
            except TransportError:
                self.advance()
                if not left:
                    raise
        raise AssertionError("unreachable: the last node's error is raised")

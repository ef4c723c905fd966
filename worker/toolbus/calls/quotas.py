"""Quotas: how fast each caller may start calls and how many it may have running.

`[callers.NAME]` (and `[callers."*"]` for the rest) set `rate_per_s` with `burst` (a
token bucket) and `max_in_flight`. Each caller has its own bucket and count, so one
caller flooding spends its own quota, not the others' slots: a request beyond its
caller's quota is answered `rate_limited` with `retry_after_ms` at once, before it is
claimed, waits for a server or reaches a tool, and it holds its message slot only for
as long as that answer takes to publish.

The state per caller is small and bounded (`max_callers`): callers with nothing running
are forgotten, least recently seen first, when more than that many are known.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType

from toolbus.config.callers import CallerProfile, caller_profile
from toolbus.wire.errors import RateLimited

MAX_CALLERS = 10_000
UNKNOWN_RETRY_S = 0.1  # before a caller's first call has finished: a guess, soon replaced
RETRY_BOUNDS_S = (0.01, 30.0)
DURATION_WEIGHT = 0.2  # of each finished call in the moving average of call durations


@dataclass(slots=True)
class _Caller:
    profile: CallerProfile
    tokens: float
    refilled_at: float
    in_flight: int = 0
    mean_duration_s: float | None = None


class Ticket:
    """One admitted call; leaving it (`with`) frees the caller's in-flight place."""

    __slots__ = ("_clock", "_quotas", "_started_at", "_state")

    def __init__(self, quotas: Quotas | None, state: _Caller | None, clock: Callable[[], float]):
        self._quotas, self._state, self._clock = quotas, state, clock
        self._started_at = clock()

    def __enter__(self) -> Ticket:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        state = self._state
        if state is None:
            return
        self._state = None
        state.in_flight -= 1
        took_s = self._clock() - self._started_at
        mean = state.mean_duration_s
        state.mean_duration_s = took_s if mean is None else mean + DURATION_WEIGHT * (took_s - mean)


UNLIMITED = Ticket(None, None, time.monotonic)


class Quotas:
    """Admission by caller. `admit(caller)` returns a `Ticket` or raises `RateLimited`."""

    def __init__(
        self,
        profiles: Mapping[str, CallerProfile],
        *,
        max_callers: int = MAX_CALLERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._profiles = dict(profiles)
        self._enabled = any(profile.limited for profile in self._profiles.values())
        self._callers: OrderedDict[str, _Caller] = OrderedDict()
        self._max_callers = max_callers
        self._clock = clock

    def __len__(self) -> int:
        return len(self._callers)

    def admit(self, caller: str | None) -> Ticket:
        if not self._enabled:
            return UNLIMITED
        state = self._state(caller or "")
        profile = state.profile
        now = self._clock()
        if profile.max_in_flight is not None and state.in_flight >= profile.max_in_flight:
            wait_s = state.mean_duration_s or UNKNOWN_RETRY_S
            raise _limited(
                f"caller has {state.in_flight} calls running, its limit", "in_flight", wait_s
            )
        if profile.rate_per_s is not None:
            burst = _burst(profile)
            state.tokens = min(burst, state.tokens + (now - state.refilled_at) * profile.rate_per_s)
            state.refilled_at = now
            if state.tokens < 1:
                wait_s = (1 - state.tokens) / profile.rate_per_s
                raise _limited(f"over {profile.rate_per_s:g} calls/s", "rate", wait_s)
            state.tokens -= 1
        state.in_flight += 1
        return Ticket(self, state, self._clock)

    def room(self, caller: str | None) -> int | None:
        """How many more calls `caller` may start now (None: no in-flight bound): a
        message's calls run no wider than this, so the quota judges them as it would
        judge them one after another."""
        if not self._enabled:
            return None
        state = self._state(caller or "")
        bound = state.profile.max_in_flight
        return None if bound is None else max(0, bound - state.in_flight)

    def _state(self, caller: str) -> _Caller:
        state = self._callers.get(caller)
        if state is not None:
            self._callers.move_to_end(caller)
            return state
        profile = caller_profile(self._profiles, caller or None)
        state = _Caller(profile, tokens=float(_burst(profile)), refilled_at=self._clock())
        self._callers[caller] = state
        self._forget_idle()
        return state

    def _forget_idle(self) -> None:
        """Beyond `max_callers`, forget the least recently seen callers with nothing
        running (a forgotten caller starts again with a full bucket)."""
        excess = len(self._callers) - self._max_callers
        if excess <= 0:
            return
        idle: list[str] = []
        for name, state in self._callers.items():  # least recently seen first
            if state.in_flight == 0:
                idle.append(name)
                if len(idle) == excess:
                    break
        for name in idle:
            del self._callers[name]


def _burst(profile: CallerProfile) -> int:
    if profile.burst is not None:
        return profile.burst
    return max(1, math.ceil(profile.rate_per_s or 1))


def _limited(message: str, limit: str, wait_s: float) -> RateLimited:
    low, high = RETRY_BOUNDS_S
    retry_after_ms = math.ceil(min(high, max(low, wait_s)) * 1000)
    return RateLimited(
        f"rate limited: {message}; retry in {retry_after_ms} ms",
        limit=limit,
        retry_after_ms=retry_after_ms,
    )

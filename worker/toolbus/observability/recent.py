"""Recent calls: outcomes and durations over the last few minutes, for the status page.

A ring of one bucket per minute (`minutes` of them, the oldest dropped as a new one
begins). Each bucket counts calls by outcome (`ok` or an error code: a closed set),
dead letters by code, and durations in a fixed histogram (`BOUNDS_S`, log-spaced from
1 ms to 56 s), so its size never depends on the traffic: p50 and p99 are read off the
merged histogram, as the bucket's upper bound (an estimate, like Prometheus's).
Nothing about a call's arguments, its caller or its reply is kept.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# 1 ms ... 56 s, about 12 bounds a decade: an estimate within ~20 % of the true value.
BOUNDS_S: tuple[float, ...] = tuple(
    round(0.001 * 10 ** (i / 12), 6) for i in range(int(12 * 4.78) + 1)
)
MAX_KEYS = 64  # outcomes or codes one bucket tells apart; the rest add up as `other`


@dataclass
class _Minute:
    start: int  # minutes since the epoch
    outcomes: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    histogram: list[int] = field(default_factory=lambda: [0] * (len(BOUNDS_S) + 1))


def _count(counter: Counter[str], key: str) -> None:
    counter[key if key in counter or len(counter) < MAX_KEYS else "other"] += 1


class RecentCalls:
    """The last `minutes` minutes of calls, bounded whatever the traffic.

    Args:
        minutes: how many one-minute buckets are kept (the window).
        clock: seconds since the epoch (tests move it).
    """

    def __init__(self, minutes: int = 5, clock: Callable[[], float] = time.time) -> None:
        self.minutes, self._clock = minutes, clock
        self._ring: deque[_Minute] = deque(maxlen=minutes)

    def _current(self) -> _Minute:
        now = int(self._clock() // 60)
        if not self._ring or self._ring[-1].start != now:
            self._ring.append(_Minute(now))
        return self._ring[-1]

    def call_done(self, outcome: str, duration_s: float) -> None:
        minute = self._current()
        _count(minute.outcomes, outcome)
        minute.histogram[bisect.bisect_left(BOUNDS_S, duration_s)] += 1

    def dead_lettered(self, code: str) -> None:
        _count(self._current().dead_letters, code)

    def snapshot(self) -> dict[str, Any]:
        """The window as plain values: calls by outcome, errors and dead letters by code,
        p50/p99 in milliseconds (None without calls), and one row per minute."""
        oldest = int(self._clock() // 60) - self.minutes + 1
        minutes = [m for m in self._ring if m.start >= oldest]
        outcomes: Counter[str] = Counter()
        dead: Counter[str] = Counter()
        histogram = [0] * (len(BOUNDS_S) + 1)
        rows = []
        for minute in minutes:
            outcomes.update(minute.outcomes)
            dead.update(minute.dead_letters)
            histogram = [a + b for a, b in zip(histogram, minute.histogram, strict=True)]
            rows.append(
                {
                    "minute": minute.start * 60,
                    "calls": sum(minute.outcomes.values()),
                    "errors": sum(n for k, n in minute.outcomes.items() if k != "ok"),
                    "p50_ms": _quantile_ms(minute.histogram, 0.5),
                    "p99_ms": _quantile_ms(minute.histogram, 0.99),
                }
            )
        return {
            "window_s": self.minutes * 60,
            "calls": sum(outcomes.values()),
            "outcomes": dict(outcomes.most_common()),
            "errors": {k: n for k, n in outcomes.most_common() if k != "ok"},
            "dead_letters": dict(dead.most_common()),
            "p50_ms": _quantile_ms(histogram, 0.5),
            "p99_ms": _quantile_ms(histogram, 0.99),
            "minutes": rows,
        }


def _quantile_ms(histogram: list[int], q: float) -> float | None:
    total = sum(histogram)
    if not total:
        return None
    rank, seen = q * total, 0
    for i, n in enumerate(histogram):
        seen += n
        if seen >= rank and n:
            bound = BOUNDS_S[i] if i < len(BOUNDS_S) else BOUNDS_S[-1]
            return round(bound * 1000, 3)
    return round(BOUNDS_S[-1] * 1000, 3)

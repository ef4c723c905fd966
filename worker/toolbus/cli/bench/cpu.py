"""CPU time of a process tree, read from /proc (Linux): where a run's CPU went.

`utime + stime` of `/proc/PID/stat` (every thread of the process, in clock ticks of
`SC_CLK_TCK`) for a process and all its descendants, found through each process's
parent id. The tree is found once, before a window (scanning /proc is the slow part);
a `Reading` of its processes taken as the window opens and one as it closes give the
CPU seconds the tree spent inside it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Reading:
    """CPU ticks used so far by each process of a tree."""

    ticks: dict[int, int]

    def seconds_since(self, earlier: Reading) -> float:
        spent = sum(t - earlier.ticks.get(pid, 0) for pid, t in self.ticks.items())
        return spent / TICKS_PER_S


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent id, utime + stime) of one process; None if it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses.
    fields = text[text.rindex(")") + 2 :].split()
    # After the name: state, ppid, ..., utime is field 14 and stime 15 of the whole line.
    return int(fields[1]), int(fields[11]) + int(fields[12])


def tree(root: int) -> set[int]:
    """The ids of `root` and every descendant, now."""
    parents: dict[int, int] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = stat[0]
    members = {root} if root in parents else set()
    while found := {pid for pid, parent in parents.items() if parent in members} - members:
        members |= found
    return members


def read(pids: set[int]) -> Reading:
    """CPU ticks of these processes now (one that is gone is left out)."""
    ticks = {pid: stat[1] for pid in pids if (stat := _stat(pid)) is not None}
    return Reading(ticks)

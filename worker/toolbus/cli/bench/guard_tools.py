"""The guards' own local tools, installed as a plugin in the run's scratch directory.

The guard worker finds them through the `toolbus.tools` entry point once the plugin's
folder is on its PYTHONPATH (a module and a `.dist-info` with the entry points, nothing
installed for good). They import `toolbus` from the worker under test, so with
`--worker-tree` they run on that checkout's `progress` and `tool`.

- `bench_guard_count(key, hold_s)`: appends a line to the run's executions file for each
  run, so a repeat that ran again is counted, not guessed; with `hold_s` it reports
  progress 1 once running, then waits, so a repeat can be sent while it runs.
- `bench_guard_steps(n)`: reports progress 1..n (`toolbus.progress`), then answers.
- `bench_guard_hold(hold_s, key)`: reports progress 1 once running, then waits: the caller
  cancels it on that update, so no sleep decides when it is running; cancelled, it
  writes `stopped {key}` (`stopped`): a `cancelled` reply alone does not show the tool
  stopped.
"""

from __future__ import annotations

from pathlib import Path

MODULE = "toolbus_bench_guards"
COUNT_TOOL = "bench_guard_count"
STEPS_TOOL = "bench_guard_steps"
HOLD_TOOL = "bench_guard_hold"
MCP_STEPS_TOOL = "bench_guard_mcp_steps"  # guard_server.py's, on the MCP path
MCP_HOLD_TOOL = "bench_guard_mcp_hold"

_SOURCE = '''\
"""toolbus bench's guard tools (written by toolbus.cli.bench.guard_tools)."""

import asyncio

from toolbus import progress, tool

EXECUTIONS = {executions!r}


@tool
async def {count}(key: str, hold_s: float = 0.0) -> dict[str, str]:
    """Writes a line per run (the bench counts them); holding, it reports that it runs
    and waits `hold_s` (a repeat then finds it running); then answers its key."""
    with open(EXECUTIONS, "a") as f:
        f.write(key + "\\n")
    if hold_s:
        progress(1, None, "running")
        await asyncio.sleep(hold_s)
    return {{"key": key}}


@tool
async def {steps}(n: int) -> dict[str, int]:
    """Reports progress 1..n, then answers n."""
    for step in range(1, n + 1):
        progress(step, n, "step")
        await asyncio.sleep(0)  # each update its own turn of the loop, as real work has
    return {{"steps": n}}


@tool
async def {hold}(hold_s: float, key: str = "") -> dict[str, float]:
    """Reports that it runs, then holds for `hold_s` (a caller cancels it before); a
    line `stopped {{key}}` says the cancel reached it (the bench waits for that line)."""
    progress(1, None, "running")
    try:
        await asyncio.sleep(hold_s)
    except asyncio.CancelledError:
        with open(EXECUTIONS, "a") as f:
            f.write("stopped " + key + "\\n")
        raise
    return {{"held_s": hold_s}}
'''


def install(directory: Path) -> tuple[Path, Path]:
    """The plugin written under `directory`: (the folder to put on PYTHONPATH, the file
    its counting tool writes a line to per run)."""
    folder = directory / "guard-plugin"
    folder.mkdir(parents=True, exist_ok=True)
    executions = directory / "guard-executions"
    source = _SOURCE.format(
        executions=str(executions), count=COUNT_TOOL, steps=STEPS_TOOL, hold=HOLD_TOOL
    )
    (folder / f"{MODULE}.py").write_text(source)
    dist = folder / f"{MODULE}-1.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {MODULE}\nVersion: 1.0\n")
    points = "".join(f"{name} = {MODULE}:{name}\n" for name in (COUNT_TOOL, STEPS_TOOL, HOLD_TOOL))
    (dist / "entry_points.txt").write_text(f"[toolbus.tools]\n{points}")
    return folder, executions


def stopped(path: Path, key: str) -> bool:
    """Did the holding tool (ours, or guard_server.py's) see its cancel for `key`?"""
    return path.exists() and f"stopped {key}" in path.read_text().splitlines()


def executions(path: Path, key: str) -> int:
    """How many times the counting tool ran with `key`."""
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line == key)

"""MCP output without bounds: huge stdout lines, results and stderr lines; time and CPU.

Run: `make bench-mcp-output` or `.venv/bin/python bench/mcp_output.py [--worker-tree DIR]
[--only NAME] [--scale F]` (F multiplies every size; the suite runs it small). Each case
starts one stdio MCP server (tests/support/servers/misbehaving.py) under an `McpBackend` in a
process of its own, makes one call that produces the output, then one ordinary call on
the same server, and prints the wall time of the first call, the CPU time the worker
process spent on it (user + system, the server's own CPU not counted), what it answered
and whether the server still answered afterwards. `--worker-tree DIR` imports `toolbus`
from another checkout's `toolbus` package (e.g. `git archive` of an older commit) for a
before/after pair; docs/reliability.md has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for bench.paired

from bench.paired import package_of
from toolbus.backends.mcp import McpBackend, McpServer
from toolbus.config import McpPolicy, McpServerConfig
from toolbus.tools.registry import Registry

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "tests" / "support" / "servers" / "misbehaving.py"
CALL_LIMIT_S = 300.0

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "stdout-line-100mb": ("stdout_flood", {"mbytes": 100}),
    "result-50mb": ("big_result", {"mbytes": 50}),
    "result-50mb-id-last": ("big_answer_id_last", {"mbytes": 50}),
    "stderr-line-100kb": ("stderr_flood", {"kbytes": 100}),
}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def outcome_of(server: Any, tool: str, arguments: dict[str, Any]) -> str:
    try:
        async with asyncio.timeout(CALL_LIMIT_S):
            result = await server.call(tool, arguments)
    except TimeoutError:
        return f"no answer in {CALL_LIMIT_S:.0f} s"
    except Exception as exc:
        code = getattr(exc, "code", type(exc).__name__)
        return f"{code} {json.dumps(getattr(exc, 'details', {}))}"
    return f"ok ({len(result.text)} chars)"


async def run_case(name: str, scale: float) -> dict[str, Any]:
    tool, sizes = CASES[name]
    arguments = {key: size * scale for key, size in sizes.items()}
    with tempfile.TemporaryDirectory(prefix="toolbus-mcp-output-") as state:
        config = McpServerConfig.model_validate(
            {"command": sys.executable, "args": [str(SERVER)], "env": {"TB_STATE_DIR": state}}
        )
        policy = McpPolicy(startup_base_delay_s=0.05, recovery_max_delay_s=0.5)
        ready = asyncio.Event()

        def changed(server: McpServer) -> None:
            if server.state == "ready":
                ready.set()
            else:
                ready.clear()

        async with McpBackend(
            {"m": config}, Registry(), {}, policy, listeners=[changed]
        ) as backend:
            await backend.wait_settled()
            server = backend.servers["m"]
            began, cpu = time.monotonic(), cpu_s()
            answered = await outcome_of(server, tool, arguments)
            wall_s, cpu_spent_s = time.monotonic() - began, cpu_s() - cpu
            async with asyncio.timeout(60):  # a restarted session may take a moment
                await ready.wait()
            after = await outcome_of(server, "work", {"value": "after"})
            return {
                "case": name,
                "wall_s": round(wall_s, 2),
                "cpu_s": round(cpu_spent_s, 2),
                "answered": answered,
                "next_call": after,
                "last_error": server.last_error,
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-tree", type=Path, help="import toolbus from DIR/worker")
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every size")
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:  # a child: one case, one process, its own CPU figures
        print(json.dumps(asyncio.run(run_case(args.case, args.scale))))
        return
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="toolbus-mcp-output-tree-") as tree:
        if args.worker_tree is not None:  # its package imported as `toolbus`, first
            (Path(tree) / "toolbus").symlink_to(package_of(args.worker_tree.resolve()))
            env["PYTHONPATH"] = os.pathsep.join([tree, str(ROOT)])
        else:
            env["PYTHONPATH"] = str(ROOT)
        for name in args.only or list(CASES):
            child = subprocess.run(
                [sys.executable, __file__, "--case", name, "--scale", str(args.scale)],
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=CALL_LIMIT_S * 2 + 120,
            )
            lines = child.stdout.strip().splitlines()
            print(lines[-1] if lines else f"{name}: failed: {child.stderr[-2000:]}", flush=True)


if __name__ == "__main__":
    main()

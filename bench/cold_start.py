"""Cold start: `toolbus serve` spawned, to its first answered local call.

Run: `.venv/bin/python bench/cold_start.py [--runs N] [--worker-tree DIR]`. A private
mosquitto (TCP_NODELAY, as shipped); for each run a new `toolbus serve` process, with no
MCP server and with the demo MCP server (started in the background, as ever), while a
caller already subscribed to its reply topic publishes an `echo` call every 10 ms (QoS 0:
those before the worker subscribes are dropped) until the first answer. Printed: each
case's runs and median (and the worker's CPU time by its first answer, which a busy
machine disturbs less), then what the imports alone take in a fresh interpreter (the
entry point, the worker's wiring, the mcp SDK, the OTLP exporter), so that the start-up
can be read against them. `--worker-tree DIR` runs DIR's `toolbus` (before/after pairs).
`--importtime N`: one more local-only start under `-X importtime`, and the N packages
whose modules took longest to import in it (each module's own time, summed by package).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "worker"))

from toolbus.cli.bench.mosquitto import private_broker
from toolbus.transport import MqttConnection
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.messages import Outbound

ANSWER_BOUND_S = 60.0
SEND_EVERY_S = 0.01
IMPORTS = (
    "toolbus.cli.main",
    "toolbus.worker.wiring",
    "mcp",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
)


def environment(worker_tree: Path | None) -> dict[str, str]:
    """The bench's own environment without `TOOLBUS_*` and `OTEL_*` (a config file is
    the whole truth); DIR's package first where a worker tree is measured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLBUS_", "OTEL_"))}
    if worker_tree is not None:
        env["PYTHONPATH"] = str(worker_tree / "worker")
    return env


def cpu_s(pid: int) -> float:
    """The process's CPU time so far, user and system, all its threads (Linux's /proc);
    NaN elsewhere. Less at the mercy of a busy machine than the wall clock."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def first_answer(
    broker_url: str, config: Path, env: dict[str, str], prefix: str, stderr: int | IO[str]
) -> tuple[float, float]:
    """Seconds from the spawn to the first `ok` reply to an `echo` call, and the CPU
    seconds the worker had spent by then."""
    reply = f"{prefix}/reply/cold"
    async with MqttConnection(BrokerUrl.from_url(broker_url)) as caller:
        await caller.subscribe([reply])
        answers = caller.messages()
        body = json.dumps({"tool": "echo", "arguments": {"text": "cold"}}).encode()
        call = Outbound(topic=f"{prefix}/call", payload=body, qos=0, response_topic=reply)
        started = time.perf_counter()
        serve = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "toolbus", "serve", "--config", str(config)),
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr,
        )

        async def keep_calling() -> None:
            while True:
                await caller.publish(call)
                await asyncio.sleep(SEND_EVERY_S)  # the call's pace, not a sync

        calling = asyncio.create_task(keep_calling(), name="cold-calls")
        try:
            async with asyncio.timeout(ANSWER_BOUND_S):
                async for answer in answers:
                    if json.loads(answer.payload).get("ok") is True:
                        return time.perf_counter() - started, cpu_s(serve.pid)
            raise RuntimeError("the reply subscription ended")
        finally:
            calling.cancel()
            serve.terminate()
            async with asyncio.timeout(30):
                await serve.wait()


def import_time(module: str, env: dict[str, str]) -> float:
    """Seconds a fresh interpreter takes to import `module` (its start not counted)."""
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip())


def import_profile(lines: list[str], top: int) -> list[str]:
    """`-X importtime`'s lines, summed by top-level package (each module's own time, so
    nothing counts twice): the `top` largest, and the total."""
    own: Counter[str] = Counter()
    for line in lines:
        if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
            continue
        self_us, _, name = (field.strip() for field in line[len("import time:") :].split("|"))
        package = name.split(".")[0]
        own[package if package != "toolbus" else ".".join(name.split(".")[:2])] += int(self_us)
    shown = [f"  {name}: {us / 1000:.0f} ms" for name, us in own.most_common(top)]
    total_ms, modules = (
        sum(own.values()) / 1000,
        sum(1 for line in lines if line.startswith("import time:") and "self [us]" not in line),
    )
    start = "imports of one start (to its first answer, and its stop)"
    return [f"{start}: {modules} modules, {total_ms:.0f} ms", *shown]


async def profiled_start(broker_url: str, tmp: Path, env: dict[str, str], top: int) -> list[str]:
    """One more local-only start under `-X importtime`: what it imported, by package."""
    prefix = f"cold{uuid.uuid4().hex[:8]}"
    config = tmp / f"{prefix}.json"
    config.write_text(json.dumps({"broker_url": broker_url, "topic_prefix": prefix}))
    log = tmp / f"{prefix}.importtime"
    with log.open("w") as stderr:
        await first_answer(
            broker_url, config, {**env, "PYTHONPROFILEIMPORTTIME": "1"}, prefix, stderr
        )
    return import_profile(log.read_text().splitlines(), top)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--worker-tree", type=Path, help="measure DIR's toolbus package")
    parser.add_argument(
        "--importtime",
        type=int,
        metavar="N",
        default=0,
        help="one more local-only start under -X importtime: its N costliest packages",
    )
    args = parser.parse_args()
    env = environment(args.worker_tree.resolve() if args.worker_tree else None)
    demo = {"command": sys.executable, "args": ["-m", "toolbus", "demo-server"]}
    with private_broker() as broker, tempfile.TemporaryDirectory() as tmp:
        for case, servers in (("local tools only", {}), ("with an MCP server", {"demo": demo})):
            took = []
            for _ in range(args.runs):
                prefix = f"cold{uuid.uuid4().hex[:8]}"
                config = Path(tmp) / f"{prefix}.json"
                settings = {"broker_url": broker.url, "topic_prefix": prefix}
                config.write_text(json.dumps({**settings, "mcpServers": servers}))
                quiet = asyncio.subprocess.DEVNULL
                took.append(asyncio.run(first_answer(broker.url, config, env, prefix, quiet)))
            runs = ", ".join(f"{t:.2f}" for t, _ in took)
            median = statistics.median(t for t, _ in took)
            print(f"start to first answered echo, {case}: median {median:.2f} s ({runs})")
            cpu = ", ".join(f"{c:.2f}" for _, c in took)
            median = statistics.median(c for _, c in took)
            print(f"  the worker's CPU by then, {case}: median {median:.2f} s ({cpu})")
        if args.importtime:
            profile = asyncio.run(profiled_start(broker.url, Path(tmp), env, args.importtime))
            print("\n".join(profile))
    for module in IMPORTS:
        print(f"import {module}: {import_time(module, env):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

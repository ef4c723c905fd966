"""bench/profile_stages.py's split of a py-spy recording, and the load generator's ids.

The split is what bench/README.md's per-stage tables are read from: a frame of a library
every stage uses (pydantic, asyncio) counts for the stage that called it, and a thread
that only waits is left out. Run on a recording written here (py-spy's raw format: one
stack a line, root first, `;` between frames, the sample count last).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from toolbus.cli.bench.loadgen import ClosedLoop

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "profile_stages.py"
_spec = importlib.util.spec_from_file_location("profile_stages", SCRIPT)
assert _spec is not None and _spec.loader is not None
profile_stages = importlib.util.module_from_spec(_spec)  # a script in bench/, not a package
_spec.loader.exec_module(profile_stages)

LOOP = "run (asyncio/runners.py:190);BaseEventLoop._run_once (asyncio/base_events.py:1922)"
THREAD = "Thread._bootstrap (threading.py:1002);Thread.run (threading.py:982)"
RECORDING = "\n".join(
    [
        # the SDK's session validating a result: pydantic under the SDK is the SDK's
        f"{LOOP};ClientSession.call_tool (mcp/client/session.py:1086);"
        "TypeAdapter.validate_json (pydantic/type_adapter.py:466) 30",
        # decode under the pipeline: the innermost stage wins
        f"{LOOP};Pipeline.handle (toolbus/doors/envelope/pipeline.py:216);"
        "decode (toolbus/doors/envelope/decode.py:90);JSONDecoder.decode (json/decoder.py:337) 20",
        # the event loop's own step, under no stage
        f"{LOOP};EpollSelector.select (selectors.py:468) 40",
        # the OTLP exporter's thread encoding: busy, in another thread
        f"{THREAD};OTLPSpanExporter.export "
        "(opentelemetry/exporter/otlp/proto/http/trace_exporter/__init__.py:150) 10",
        # a thread waiting on a child process: idle, left out
        f"{THREAD};ThreadedChildWatcher._do_waitpid (asyncio/unix_events.py:1404) 99",
    ]
)


def test_samples_are_split_by_the_innermost_stage(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text(RECORDING + "\n")
    loop, threads, idle = profile_stages.split(raw)
    assert loop == {
        "MCP: SDK ClientSession": 30,
        "decode": 20,
        "asyncio event loop": 40,
    }
    assert threads == {"tracing: span export (OTLP encode, HTTP)": 10}
    assert idle == 99


def test_the_load_generator_gives_each_request_an_id_of_its_own() -> None:
    def payloads(body: bytes) -> list[dict[str, object]]:
        loop = ClosedLoop(
            topic="t",
            payload=body,
            reply_topic="r",
            in_flight=1,
            warmup_s=0.0,
            duration_s=1.0,
            check_ok=True,
            ids=True,
        )
        return [json.loads(loop.body(n)) for n in (1, 2)]

    first, second = payloads(b'{"arguments": {"text": "x"}}')
    assert first["arguments"] == second["arguments"] == {"text": "x"}
    assert first["id"] != second["id"]
    other, _ = payloads(b"{}")  # another process: never the same ids
    assert set(other) == {"id"} and other["id"] != first["id"]


def test_toolbus_bench_ids_reach_every_load_generator() -> None:
    from toolbus.cli.bench.phases import RESPONDERS, loadgen_commands

    echo = RESPONDERS["toolbus-echo"]
    with_ids = loadgen_commands("mqtt://127.0.0.1:1", "p", echo, (2, 2), ids=True)
    assert len(with_ids) == 2 and all("--ids" in command for command in with_ids)
    assert not any("--ids" in c for c in loadgen_commands("mqtt://127.0.0.1:1", "p", echo, (4,)))

"""The command line against real processes: `toolbus serve` (bundled config), `call`, `tools`, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.support.harness import DEMO_SERVER, Broker
from tests.support.mqtt import Caller
from tests.support.processes import Serve, install_plugin, run_bounded, start_serve
from tests.support.tool_definitions import checked_name
from toolbus.backends.mcp import McpBackend
from toolbus.backends.mcp.server import McpServer
from toolbus.cli.main import main
from toolbus.config import Settings
from toolbus.tools.registry import Registry
from toolbus.worker.service import Worker

ROOT = Path(__file__).parents[2]
BIN = Path(sys.executable).parent
CLI_TIMEOUT_S = 60.0
# A stop whose broker is gone: the 2 s call, then nothing waited for (not 30 s a message).
STOPPED_AT_ONCE_S = 15.0


def cli_env(prefix: str, extra_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["TOOLBUS_TOPIC_PREFIX"] = prefix
    env["TOOLBUS_LOG_FORMAT"] = "json"
    env["PATH"] = (
        f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # the bundled config runs `toolbus demo-server`
    )
    if extra_path is not None:
        env["PYTHONPATH"] = f"{extra_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


async def run_cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    return await run_bounded(sys.executable, "-m", "toolbus", *args, env=env, bound_s=CLI_TIMEOUT_S)


async def test_call_prints_the_reply_and_exits_by_outcome(
    broker: Broker, demo_worker: Worker
) -> None:
    env = cli_env(demo_worker.topics.prefix)
    code, out, _ = await run_cli(
        "call",
        "control_zwave_device",
        "device_name=Living Room Lamp",
        "command=dim",
        "brightness=40",
        "--broker",
        broker.url,
        env=env,
    )
    reply = json.loads(out)
    assert code == 0, out
    assert reply["result"]["structured"]["received"] == {
        "deviceName": "Living Room Lamp",
        "action": "dim",
        "level": 40,
    }
    # brightness=40 came as the text "40" (key=value is text): the schema's integer made it.
    assert ("arguments.level", "string_to_integer") in {
        (n["path"], n["rule"]) for n in reply["normalized"]
    }

    code, out, _ = await run_cli(
        "call",
        "echo",
        "--json",
        '{"text": "t", "data": [1, true]}',
        "--broker",
        broker.url,
        env=env,
    )
    assert code == 0 and json.loads(out)["result"]["structured"] == {"text": "t", "data": [1, True]}

    code, out, _ = await run_cli("call", "no_such_tool", "--broker", broker.url, env=env)
    assert code == 1 and json.loads(out)["error"]["code"] == "unknown_tool"


async def test_call_sends_what_the_user_typed(broker: Broker, demo_worker: Worker) -> None:
    """`key=value` is text, always; `key:=JSON` is JSON; options may stand between pairs."""
    env = cli_env(demo_worker.topics.prefix)
    code, out, err = await run_cli(
        "call",
        "echo",
        "text=true",
        "--timeout",
        "20",
        'data:={"n": 5, "on": true, "tags": ["a"], "none": null}',
        "--broker",
        broker.url,
        env=env,
    )
    assert code == 0, err
    assert json.loads(out)["result"]["structured"] == {
        "text": "true",
        "data": {"n": 5, "on": True, "tags": ["a"], "none": None},
    }
    # Text that would read as JSON's NaN or a number stays text: nothing invalid is sent.
    code, out, err = await run_cli(
        "call", "echo", "text=NaN", "data=1e400", "--broker", broker.url, env=env
    )
    assert code == 0, err
    assert json.loads(out)["result"]["structured"] == {"text": "NaN", "data": "1e400"}


async def test_call_with_a_number_for_a_string_parameter(
    broker: Broker, demo_worker: Worker
) -> None:
    # `text:=1234` sends the number 1234; echo's `text` is a string.
    code, out, _ = await run_cli(
        "call",
        "echo",
        "text:=1234",
        "--broker",
        broker.url,
        env=cli_env(demo_worker.topics.prefix),
    )
    reply = json.loads(out)
    assert code == 0, out
    assert reply["result"]["structured"]["text"] == "1234"
    assert [(n["path"], n["rule"]) for n in reply["normalized"]] == [
        ("arguments.text", "number_to_string")
    ]


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (["text:=NaN"], "text:=NaN"),
        (["text:=-Infinity"], "text:=-Infinity"),
        (["data:=[1e400]"], "data:=[1e400]"),
        (["text:=nope"], "text:=nope"),
        (["--json", '{"text": NaN}'], "--json"),
        (["--json", '{"data": {"x": 1e999}}'], "--json"),
        (["--json", "{"], "--json"),
        (["--json", "[1]"], "--json"),
    ],
)
def test_call_refuses_what_has_no_json_form_naming_it(
    given: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A usage error (exit 2) before anything is sent, naming the pair or the flag. The
    broker is a closed port: a value that slipped through would fail otherwise (4)."""
    closed = f"mqtt://127.0.0.1:{_closed_port()}"
    with pytest.raises(SystemExit) as refused:
        main(["call", "echo", *given, "--broker", closed, "--timeout", "2"])
    assert refused.value.code == 2
    assert named in capsys.readouterr().err


async def test_a_refused_pair_exits_2_from_the_command_line(broker: Broker) -> None:
    code, out, err = await run_cli(
        "call", "echo", "text:=NaN", "--broker", broker.url, env=cli_env("unused")
    )
    assert (code, out) == (2, "")
    assert "text:=NaN" in err


async def test_tools_lists_definitions(broker: Broker, demo_worker: Worker) -> None:
    code, out, _ = await run_cli(
        "tools", "--json", "--broker", broker.url, env=cli_env(demo_worker.topics.prefix)
    )
    assert code == 0
    assert {"echo", "datetime", "control_zwave_device"} <= {t["name"] for t in json.loads(out)}


async def test_call_without_worker_or_broker(broker: Broker, tmp_path: Path) -> None:
    env = cli_env(f"nobody{uuid.uuid4().hex[:6]}")
    # Sent although no worker's status says it is online: no reply (the statuses' own
    # exit, 5, is tests/cli/test_cli_outcomes.py's).
    code, _, err = await run_cli(
        "call",
        "echo",
        "text=x",
        "--timeout",
        "0.5",
        "--no-worker-check",
        "--broker",
        broker.url,
        env=env,
    )
    assert code == 3, err
    closed = f"mqtt://127.0.0.1:{_closed_port()}"
    code, _, err = await run_cli("call", "echo", "--timeout", "2", "--broker", closed, env=env)
    assert code == 4, err
    code, _, _ = await run_cli("call", "echo", "notapair", "--broker", broker.url, env=env)
    assert code == 2


def _closed_port() -> int:
    from tests.support.harness import free_port

    return free_port()


SLOW_PLUGIN = textwrap.dedent(
    """
    import asyncio, logging
    from toolbus import tool

    @tool
    async def slow(seconds: float) -> str:
        "Works for a while."
        logging.getLogger("tb_slow").warning("slow started")
        await asyncio.sleep(seconds)
        return "done"
    """
)


class ServeProcess:
    """`toolbus serve` with the bundled config, its log lines readable as events."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read(), name="serve-log")

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            try:
                await self.events.put(json.loads(line))
            except ValueError:
                await self.events.put({"event": line.decode(errors="replace")})

    async def wait_event(self, text: str, count: int = 1, timeout_s: float = 30.0) -> None:
        seen = 0
        async with asyncio.timeout(timeout_s):
            while seen < count:
                if text in (await self.events.get()).get("event", ""):
                    seen += 1


@pytest_asyncio.fixture
async def serve(broker: Broker, tmp_path: Path) -> AsyncIterator[tuple[ServeProcess, str]]:
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "tb_slow.py").write_text(SLOW_PLUGIN)
    dist = plugin / "tb_slow-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tb-slow\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[toolbus.tools]\nslow = tb_slow:slow\n")
    prefix = f"serve{uuid.uuid4().hex[:8]}"
    proc = await start_serve(broker.url, cli_env(prefix, plugin), stderr=asyncio.subprocess.PIPE)
    served = ServeProcess(proc)
    try:
        yield served, prefix
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        served._reader.cancel()


async def wait_ready(caller: Caller, prefix: str) -> None:
    """Until the worker's retained status says online with the demo server ready."""
    await caller.subscribe(f"{prefix}/status/workers/+")
    async with asyncio.timeout(30):
        while True:
            status = json.loads((await caller.next_message()).payload)
            devices = status["servers"].get("devices", {})
            if status["state"] == "online" and devices.get("state") == "ready":
                return


async def test_serve_bundled_config_and_sigterm_with_calls_in_flight(
    broker: Broker, caller: Caller, serve: tuple[ServeProcess, str]
) -> None:
    served, prefix = serve
    await wait_ready(caller, prefix)

    # The README's promise: the bundled worker answers the headline call.
    code, out, err = await run_cli(
        "call",
        "control_zwave_device",
        "device_name=Switch One",
        "command=on",
        "--broker",
        broker.url,
        env=cli_env(prefix),
    )
    assert code == 0, err
    assert json.loads(out)["result"]["structured"]["device"]["state"] == "on"

    reply_topic = f"{prefix}/reply/sigterm"
    await caller.subscribe(reply_topic)
    for n in range(4):
        await caller.publish(
            f"{prefix}/call/slow",
            json.dumps({"id": f"s{n}", "arguments": {"seconds": 1.0}}),
            response_topic=reply_topic,
        )
    await served.wait_event("slow started", count=4)
    served.proc.send_signal(signal.SIGTERM)

    replies: list[dict[str, Any]] = []
    offline = False
    async with asyncio.timeout(30):
        while len(replies) < 4 or not offline:
            message = await caller.next_message()
            body = json.loads(message.payload)
            if message.topic.value == reply_topic:
                replies.append(body)
            elif body.get("state") == "offline":
                offline = True
    assert sorted(r["id"] for r in replies) == ["s0", "s1", "s2", "s3"]
    assert all(r["ok"] and r["result"]["text"] == "done" for r in replies)
    async with asyncio.timeout(30):
        assert await served.proc.wait() == 0


async def test_mappings_with_the_bundled_config() -> None:
    code, out, err = await run_cli(
        "mappings",
        "ControlZwaveDevice",
        "--config",
        str(ROOT / "config" / "toolbus.toml"),
        env=cli_env("unused"),
    )
    assert code == 0, err
    assert out.startswith("## control_zwave_device")
    assert "`device_name` (static map)" in out and "(enum_case)" in out
    code, _, _ = await run_cli("mappings", "no_such_tool", env=cli_env("unused"))
    assert code == 1


def log_events(stderr: str) -> list[dict[str, Any]]:
    """The JSON log lines among a command's stderr lines (`TOOLBUS_LOG_FORMAT=json`)."""
    events = []
    for line in stderr.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # the command's own lines, for a person
    return [e for e in events if isinstance(e, dict)]


async def test_mappings_says_what_it_read_and_which_server_is_down(tmp_path: Path) -> None:
    """A server whose command does not exist is down at its first attempt (no retries),
    told by name, and `mappings` exits 1; what the live server offers is printed."""
    config = tmp_path / "mcp.json"
    missing = tmp_path / "no-such-server"
    config.write_text(
        json.dumps({"mcpServers": {"devices": DEMO_SERVER, "ghost": {"command": str(missing)}}})
    )
    env = cli_env("unused")
    code, out, err = await run_cli("mappings", "--mcp-config", str(config), env=env)
    assert code == 1, err
    assert "## control_zwave_device" in out and "## echo" in out
    assert str(config) in err.splitlines()[0]  # which configuration, before anything else
    down = [e for e in log_events(err) if e.get("server") == "ghost"]
    assert [(e["event"].split(" (")[0], e["attempts"]) for e in down] == [
        ("MCP connection failed after 1 attempt", 1)
    ]
    told = [line for line in err.splitlines()[1:] if "ghost" in line and line[:1] != "{"]
    assert len(told) == 1 and str(missing) in told[0]  # the server, and why it is down

    # Asked about a tool of the live server only: the missing one was not asked about.
    code, out, err = await run_cli(
        "mappings", "ControlZwaveDevice", "--mcp-config", str(config), env=env
    )
    assert code == 0, err
    assert out.startswith("## control_zwave_device")


async def test_a_missing_command_is_retried_by_a_worker_not_by_mappings() -> None:
    """The pair: a worker keeps its start-up attempts for a command that does not exist
    (it may be installed while it runs); the one-shot look gives up at the first."""
    settings = Settings.model_validate(
        {
            "mcpServers": {"ghost": {"command": str(ROOT / "no-such-server")}},
            "mcp": {"startup_base_delay_s": 0.01, "startup_attempts": 3},
        }
    )
    attempts: dict[bool, list[int]] = {True: [], False: []}
    for retry, seen in attempts.items():

        def down(server: McpServer, seen: list[int] = seen) -> None:
            if server.state == "down":  # attempts now: the start-up's, not a later retry's
                seen.append(server.attempts)

        backend = McpBackend(
            settings.mcp_servers,
            Registry(),
            settings.tools,
            settings.mcp,
            listeners=[down],
            retry_missing_command=retry,
        )
        async with backend, asyncio.timeout(30):
            await backend.wait_settled()
    assert attempts == {True: [3], False: [1]}


async def test_tools_in_a_providers_format(broker: Broker, demo_worker: Worker) -> None:
    """A provider's format prints its JSON, --json or not; ours is a table unless --json."""
    env = cli_env(demo_worker.topics.prefix)
    code, out, _ = await run_cli("tools", "--format", "anthropic", "--broker", broker.url, env=env)
    assert code == 0
    names = {checked_name("anthropic", definition) for definition in json.loads(out)}
    assert {"echo", "datetime", "control_zwave_device"} <= names
    code, out, _ = await run_cli(
        "tools", "--broker", broker.url, "--format", "openai", "--json", env=env
    )
    assert code == 0
    assert "datetime" in {checked_name("openai", definition) for definition in json.loads(out)}
    code, out, _ = await run_cli("tools", "--broker", broker.url, env=env)
    assert code == 0
    with pytest.raises(ValueError):  # noqa: PT011 -- a table, not JSON, is the point
        json.loads(out)
    assert "control_zwave_device" in out and "mcp:devices" in out
    code, _, _ = await run_cli("tools", "--format", "gemini", "--broker", broker.url, env=env)
    assert code == 2


async def test_sigint_as_the_broker_goes_stops_at_once_and_cleanly(tmp_path: Path) -> None:
    """Ctrl-C while the broker goes too (`make run`'s broker used to share its process
    group): a worker draining a call when its broker dies answers nothing more and
    publishes no `offline` (no connection will come back), exits as soon as the call
    is done, not after a publish timeout per message, and logs no error."""
    own = Broker(tmp_path)
    own.start()
    prefix = f"sigint{uuid.uuid4().hex[:8]}"
    plugin = install_plugin(tmp_path / "plugin", "tb_slow", SLOW_PLUGIN, {"slow": "tb_slow:slow"})
    env = cli_env(prefix, plugin)
    env["TOOLBUS_PUBLISH_TIMEOUT_S"] = "30"  # a wait for a reconnect would take this long
    try:
        async with Serve(env, "--broker", own.url) as served:
            await served.wait_for("subscribed to")
            async with Caller(own.url) as caller:
                await caller.publish(
                    f"{prefix}/call/slow",
                    json.dumps({"id": "s", "arguments": {"seconds": 2.0}}),
                    response_topic=f"{prefix}/reply/sigint",
                )
            await served.wait_for("slow started")
            os.kill(served.pid, signal.SIGINT)
            await served.wait_for('"stopping"')
            own.kill()
            async with asyncio.timeout(STOPPED_AT_ONCE_S):
                code = await served.exit_code()
        assert code == 0
        assert "worker" in served.output and "stopped" in served.output
        errors = [line for line in served.stderr if '"level":"error"' in line]
        assert errors == []
        assert "never retrieved" not in served.output
    finally:
        own.kill()


async def test_serve_with_its_dedup_store_out_of_reach_says_so_in_one_line(
    broker: Broker, tmp_path: Path
) -> None:
    """A Redis that cannot be reached at start-up is a configuration to fix, like a broker
    that cannot: one line and exit 4 (it was a 76-line traceback and exit 1). The URL's
    password is not in it."""
    config = tmp_path / "toolbus.toml"
    port = _closed_port()
    config.write_text(f'dedup_store = "redis://:s3cret-pw@127.0.0.1:{port}/0"\n')
    env = cli_env(f"redis{uuid.uuid4().hex[:6]}")
    code, _, err = await run_cli("serve", "--config", str(config), "--broker", broker.url, env=env)
    assert code == 4, err
    said = [line for line in err.splitlines() if not line.startswith("{")]  # not log lines
    assert len(said) == 1 and said[0].startswith("toolbus: cannot reach the dedup store"), err
    assert f"127.0.0.1:{port}" in said[0]
    assert "Traceback" not in err and "s3cret-pw" not in err

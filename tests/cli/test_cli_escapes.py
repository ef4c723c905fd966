"""The command line prints no terminal control a server, a reply or a config file chose.

A real `toolbus serve` behind a real mosquitto serves a hostile MCP server process
(tests/support/servers/terminal_escapes.py: ESC sequences that set the window title and
clear the screen, BEL, the C1 CSI U+009B, DEL, a line break before a forged line, in its
tool's name, description, parameter names, enum values and default, in its answers, and
in the error that refuses a start). The real `toolbus tools`, `call`, `mappings`,
`health` and `status` print what it said, and `serve` refuses config keys of the same
text: in none of their output, stdout or stderr, is there a C0 control but the layout's
own line breaks, or a C1 control or DEL. What the server said is still shown, escaped.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.cli.test_cli import run_cli
from tests.support.harness import Broker, free_port
from tests.support.mqtt import Caller
from tests.support.processes import RUN_BOUND_S, serve_env
from tests.support.servers.terminal_escapes import ATTACK
from toolbus.worker.exit_codes import EXIT_ERROR, EXIT_OK, EXIT_USAGE

SERVER = Path(__file__).parents[1] / "support" / "servers" / "terminal_escapes.py"
# Anything a terminal acts on: C0 but the line break, DEL, C1.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
SHOWN = "\\u001b]0;pwned\\u0007\\u001b[2J\\u009b2J\\u007f\\u000aforged line"  # ATTACK, escaped
IN_JSON = "\\u001b]0;pwned\\u0007\\u001b[2J\\u009b2J\\u007f\\nforged line"  # JSON's own \n


def printable_output(*texts: str) -> None:
    """No control character a terminal would act on, and no line a server's break began."""
    for text in texts:
        found = sorted(set(CONTROL.findall(text)))
        assert not found, (found, text)
        assert not any(line.startswith("forged line") for line in text.splitlines()), text


def servers(**extra_env: str) -> dict[str, Any]:
    hostile = {"command": sys.executable, "args": [str(SERVER)]}
    refusing = {**hostile, "env": {"TB_REFUSE_INIT": "1", **extra_env}}
    return {"evil": hostile, "down": refusing}


def write_config(path: Path, prefix: str, http_port: int) -> Path:
    """The worker's config: the hostile server, one refusing to start (down at its first
    attempt: no retry waited for), the HTTP listener for `health`."""
    config = {
        "topic_prefix": prefix,
        "worker_id": f"w-{prefix}",
        "http_port": http_port,
        "log_format": "json",
        "mcp": {"startup_attempts": 1},
        "mcpServers": servers(),
    }
    path.write_text(json.dumps(config))
    return path


class Served:
    """A `toolbus serve` process, its stderr read as it comes (and checked at the end)."""

    def __init__(self, config: Path, broker: Broker, prefix: str, http_port: int) -> None:
        self.config, self.broker, self.prefix, self.http_port = config, broker, prefix, http_port
        self.stderr: list[str] = []
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "toolbus",
            "serve",
            "--config",
            str(self.config),
            "--broker",
            self.broker.url,
            env=serve_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read(), name="serve-stderr")

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.stderr.append(line.decode(errors="replace"))

    async def stop(self) -> str:
        """Its whole output, once stopped."""
        assert self.proc is not None and self.proc.stdout is not None
        if self.proc.returncode is None:
            self.proc.kill()
        async with asyncio.timeout(RUN_BOUND_S):
            out = (await self.proc.stdout.read()).decode(errors="replace")
            await self._reader
            await self.proc.wait()
        return out + "".join(self.stderr)


async def wait_settled(broker: Broker, prefix: str) -> None:
    """Until the worker's retained status is online with `evil` ready and `down` down."""
    async with Caller(broker.url) as watcher:
        await watcher.subscribe(f"{prefix}/status/workers/+")
        async with asyncio.timeout(RUN_BOUND_S):
            while True:
                status = json.loads((await watcher.next_message()).payload)
                states = {name: s.get("state") for name, s in status["servers"].items()}
                if status["state"] == "online" and states == {"evil": "ready", "down": "down"}:
                    return


@pytest_asyncio.fixture(scope="module")
async def served(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    prefix = f"esc{uuid.uuid4().hex[:8]}"
    port = free_port()
    config = write_config(tmp_path_factory.mktemp("escapes") / "toolbus.json", prefix, port)
    worker = Served(config, broker, prefix, port)
    await worker.start()
    try:
        await wait_settled(broker, prefix)
        yield worker
    finally:
        # What `serve` itself wrote (its JSON log lines) is command-line output too.
        printable_output(await worker.stop())


def cli(served: Served) -> dict[str, str]:
    return serve_env(topic_prefix=served.prefix, log_format="json")


async def test_tools_prints_a_servers_text_escaped(served: Served) -> None:
    env = cli(served)
    code, table, err = await run_cli("tools", "--broker", served.broker.url, env=env)
    assert code == EXIT_OK, err
    printable_output(table, err)
    assert "Grabs\\u001b]0;pwned" in table and "what\\u001b]0;pwned" in table
    for listing in (["--json"], ["--format", "openai"], ["--format", "anthropic"]):
        code, out, err = await run_cli("tools", *listing, "--broker", served.broker.url, env=env)
        assert code == EXIT_OK, err
        printable_output(out, err)
        assert f"what{IN_JSON}" in out


async def test_call_prints_a_servers_answers_escaped(served: Served) -> None:
    """The reply's JSON as it came, but its C1 controls and DEL escaped too (every JSON
    encoder escapes C0 only): still JSON, with the same values."""
    env = cli(served)
    code, out, err = await run_cli("tools", "--json", "--broker", served.broker.url, env=env)
    assert code == EXIT_OK, err
    name = next(t["name"] for t in json.loads(out) if t["origin"] == "mcp:evil")
    arguments = json.dumps({f"what{ATTACK}": "two"})
    code, out, err = await run_cli(
        "call", name, "--json", arguments, "--broker", served.broker.url, env=env
    )
    printable_output(out, err)
    assert code == EXIT_OK, out + err
    reply = json.loads(out)
    assert IN_JSON in out and reply["result"]["text"] == f"grabbed{ATTACK}"

    failing = json.dumps({f"what{ATTACK}": "two", "mode": "fail"})
    code, out, err = await run_cli(
        "call", name, "--json", failing, "--broker", served.broker.url, env=env
    )
    printable_output(out, err)
    assert code == EXIT_ERROR, out + err
    assert json.loads(out)["error"]["code"] == "tool_error"
    assert IN_JSON in out

    # A tool name typed with the attack in it (a script passing on what a model chose):
    # the worker's `bad_request` reply and argparse's own complaint, both escaped.
    code, out, err = await run_cli("call", f"x{ATTACK}", "--broker", served.broker.url, env=env)
    printable_output(out, err)
    assert code == EXIT_ERROR and json.loads(out)["error"]["code"] == "bad_request"
    code, out, err = await run_cli("call", "echo", f"--{ATTACK}", env=env)
    printable_output(out, err)
    assert code == EXIT_USAGE


async def test_health_and_status_print_a_servers_error_escaped(served: Served) -> None:
    """`down`'s last error is the JSON-RPC error it refused `initialize` with: /readyz
    carries it to `health`, the retained status to `status`."""
    env = cli(served)
    url = f"http://127.0.0.1:{served.http_port}"
    code, out, err = await run_cli("health", "--url", url, env=env)
    printable_output(out, err)
    assert code == EXIT_OK, err  # ready: degraded, a server down
    assert f"down down (MCPError: cannot start{SHOWN})" in out
    for shape in (["--once"], ["--json"]):
        code, out, err = await run_cli("status", *shape, "--broker", served.broker.url, env=env)
        printable_output(out, err)
        assert code == EXIT_OK, err


async def test_mappings_prints_a_servers_schema_escaped(tmp_path: Path) -> None:
    mcp_config = tmp_path / "mcp.json"
    mcp_config.write_text(json.dumps({"mcpServers": servers()}))
    config = tmp_path / "toolbus.toml"
    config.write_text("[mcp]\nstartup_attempts = 1\n")
    env = serve_env(log_format="json")
    code, out, err = await run_cli(
        "mappings", "--config", str(config), "--mcp-config", str(mcp_config), env=env
    )
    printable_output(out, err)
    assert code == EXIT_ERROR, err  # `down` is down
    assert f"| `what{SHOWN}` (required) |" in out
    assert f"(announced as `grab{SHOWN}`)" in out
    assert f"MCP server down is down: MCPError: cannot start{SHOWN}" in err


@pytest.mark.parametrize("suffix", [".toml", ".json"])
async def test_a_config_files_key_is_printed_escaped(tmp_path: Path, suffix: str) -> None:
    """An unknown key is named in the one line that refuses it: escaped, still one line."""
    key = f"k{ATTACK}"
    config = tmp_path / f"toolbus{suffix}"
    if suffix == ".toml":
        config.write_text(f"{json.dumps(key)} = {json.dumps(f'v{ATTACK}')}\n")
    else:
        config.write_text(json.dumps({key: 1, "topic_prefix": f"p{ATTACK}"}))
    env = serve_env()
    for command in (["serve"], ["mappings"], ["health"]):
        code, out, err = await run_cli(*command, "--config", str(config), env=env)
        printable_output(out, err)
        assert code == (1 if command == ["health"] else EXIT_USAGE), err
        assert f"unknown key `k{SHOWN}`" in err

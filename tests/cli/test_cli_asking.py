"""`toolbus call` when the tool asks or the call waits for an approval, as a real process
against `AskingWorker` (the issue 32 contract) on a real mosquitto: on a terminal (a
pseudo-terminal as its standard input) it asks the person; piped, it asks nothing and
nothing waits on it. Then against a real worker relaying an MCP server of each
generation (tests/support/servers/asking_server.py)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tests.cli.test_cli import cli_env
from tests.support.asking_worker import AskingWorker, elicitation, sampling
from tests.support.harness import Broker, make_settings, running_worker
from toolbus.worker.exit_codes import EXIT_ERROR, EXIT_OK

BOUND_S = 30.0
ASKING = Path(__file__).parents[1] / "support" / "servers" / "asking_server.py"
DEVICE = elicitation("Which Switch One?", device={"type": "string", "enum": ["hall", "porch"]})


@pytest_asyncio.fixture
async def asking(broker: Broker) -> AsyncIterator[AskingWorker]:
    worker = AskingWorker(broker.url, f"cli{uuid.uuid4().hex[:8]}")
    worker.questions["pick"] = [{"device": DEVICE, "summary": sampling("Say hi")}]
    worker.gated.add("wipe")
    async with worker.running():
        yield worker
    assert not worker.violations


async def toolbus_call(
    broker: Broker, worker: AskingWorker | str, *args: str, typed: bytes | None = None
) -> tuple[int, str, str]:
    """`toolbus call ARGS`: its standard input a pseudo-terminal `typed` is typed on
    ahead (the terminal keeps it until read), or, with `typed` None, nothing at all."""
    argv = ("call", *args, "--broker", broker.url, "--no-worker-check", "--timeout", "10")
    terminal, stdin = pty.openpty() if typed is not None else (None, asyncio.subprocess.DEVNULL)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "toolbus",
        *argv,
        env=cli_env(worker if isinstance(worker, str) else worker.prefix),
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        if terminal is not None:
            os.close(stdin)
            os.write(terminal, typed or b"")
        async with asyncio.timeout(BOUND_S):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if terminal is not None:
            os.close(terminal)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_on_a_terminal_the_person_is_asked(broker: Broker, asking: AskingWorker) -> None:
    # answer the form, pick the second device; type a completion and end it; approve.
    code, out, err = await toolbus_call(
        broker, asking, "pick", "room=hall", typed=b"a\n2\nHello there.\n\n"
    )
    assert code == EXIT_OK, err
    answers = json.loads(out)["result"]["structured"]["answers"]
    assert answers == [
        {
            "device": {"action": "accept", "content": {"device": "porch"}},
            "summary": {
                "role": "assistant",
                "content": {"type": "text", "text": "Hello there."},
                "model": "toolbus-call-user",
                "stopReason": "endTurn",
            },
        }
    ]
    assert "Which Switch One?" in err and "Say hi" in err
    assert asking.requests[0]["input"] is True

    code, out, err = await toolbus_call(broker, asking, "wipe", "disk=b", typed=b"y\n")
    assert code == EXIT_OK, err
    assert "wipe" in err and asking.runs[-1] == ("wipe", {"disk": "b"})


async def test_a_refused_approval_runs_nothing(broker: Broker, asking: AskingWorker) -> None:
    code, out, _ = await toolbus_call(broker, asking, "wipe", "disk=b", typed=b"n\n")
    assert code == EXIT_ERROR
    assert json.loads(out)["error"]["code"] == "approval_required"
    assert asking.runs == []


async def test_piped_nothing_is_asked_and_nothing_waits(
    broker: Broker, asking: AskingWorker
) -> None:
    """No `input: true`: the worker declines for it; a gated call is printed as refused."""
    code, out, _ = await toolbus_call(broker, asking, "pick")
    assert code == EXIT_OK
    assert json.loads(out)["result"]["structured"]["answers"] == [
        {"device": {"action": "decline"}, "summary": {"error": "sampling refused"}}
    ]
    assert "input" not in asking.requests[0]
    code, out, _ = await toolbus_call(broker, asking, "wipe", "disk=b")
    assert code == EXIT_ERROR
    reply = json.loads(out)
    assert reply["error"]["code"] == "approval_required"
    assert reply["error"]["details"]["call"] == {"tool": "wipe", "arguments": {"disk": "b"}}
    assert asking.runs == [("pick", {})]


async def test_a_real_workers_servers_are_answered_at_the_terminal(broker: Broker) -> None:
    """The worker's relay, both server generations: the form answered, a completion typed."""
    servers = {
        "modern": {"command": sys.executable, "args": [str(ASKING)]},
        "legacy": {"command": sys.executable, "args": [str(ASKING), "--legacy"]},
    }
    settings = make_settings(broker, mcpServers=servers)
    async with running_worker(settings) as worker:
        prefix = worker.topics.prefix
        for tool in ("modern.pick_device", "legacy.pick_device"):
            code, out, err = await toolbus_call(
                broker, prefix, tool, "room=hall", typed=b"a\nlamp\n"
            )
            assert code == EXIT_OK, err
            assert json.loads(out)["result"]["structured"] == {"action": "accept", "device": "lamp"}
            assert "Which device in hall?" in err
        for tool in ("modern.summarize", "legacy.summarize"):
            code, out, err = await toolbus_call(
                broker, prefix, tool, "text=long", typed=b"a short summary\n\n"
            )
            assert code == EXIT_OK, err
            assert json.loads(out)["result"]["structured"] == {
                "summary": "a short summary",
                "model": "toolbus-call-user",
            }
            assert "Summarize: long" in err

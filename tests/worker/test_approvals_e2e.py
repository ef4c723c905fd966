"""Approval gates from the outside: a real mosquitto, a real `toolbus serve`, and a real
MCP server process (tests/support/servers/approval_server.py) that writes down every call
it gets, so a test reads from the server itself that a gated call did not reach it.

The server runs twice: `sure` (`trusted = true`: its annotations are believed) and `wild`
(not trusted: its annotations are hints only, so every tool of it is `destructive`).
Beside them `asks`, the tests' 2026-07-28 server whose tools ask their caller.
Every caller's profile (`[callers."*"]`) says `approve = ["destructive"]`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.cli.test_cli import cli_env
from tests.support.asking import ASKING
from tests.support.harness import Broker, unique_prefix
from tests.support.mqtt import Caller
from tests.support.processes import RUN_BOUND_S, Serve

SERVER = Path(__file__).parents[1] / "support" / "servers" / "approval_server.py"
APPROVAL_TIMEOUT_S = 3.0  # long enough to approve, short enough to watch one expire


@dataclass
class Gated:
    """A worker whose callers must have destructive calls approved, and its server's log."""

    serve: Serve
    prefix: str
    log: Path

    def reached(self, mark: str) -> list[str]:
        """The calls the MCP servers received (both write one log), in order, of those
        whose target starts with `mark` (each test its own)."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [line for line in lines if line.partition(" ")[2].startswith(mark)]

    async def call(
        self, client: Caller, tool: str, arguments: dict[str, Any], **fields: Any
    ) -> dict[str, Any]:
        """`tool` called on its call topic (`caller/tool` under topic identity), `fields`
        in the body; answered in the reply space of the topic's caller, if any."""
        body = {"arguments": arguments, **fields}
        caller, _, _ = tool.rpartition("/")
        reply_topic = f"{self.prefix}/reply/{caller or 'anyone'}/r"
        reply, _ = await client.call(f"{self.prefix}/call/{tool}", body, reply_topic=reply_topic)
        return reply


@asynccontextmanager
async def gated_worker(broker: Broker, tmp_path: Path, **settings: str) -> AsyncIterator[Gated]:
    prefix = unique_prefix()
    log = tmp_path / "reached.log"
    server = {
        "command": sys.executable,
        "args": [str(SERVER)],
        "env": {"TB_APPROVAL_LOG": str(log)},
    }
    servers = tmp_path / "mcp.json"
    asks = {"command": sys.executable, "args": [str(ASKING)]}
    servers.write_text(
        json.dumps(
            {"mcpServers": {"sure": {**server, "trusted": True}, "wild": server, "asks": asks}}
        )
    )
    env = cli_env(prefix)
    env["TOOLBUS_CALLERS"] = json.dumps({"*": {"approve": ["destructive"]}})
    env["TOOLBUS_APPROVAL_TIMEOUT_S"] = str(APPROVAL_TIMEOUT_S)
    env.update({f"TOOLBUS_{k.upper()}": v for k, v in settings.items()})
    async with (
        Serve(env, "--broker", broker.url, "--mcp-config", str(servers)) as serve,
        Caller(broker.url) as watcher,
    ):
        await watcher.subscribe(f"{prefix}/status/workers/+")
        async with asyncio.timeout(RUN_BOUND_S):  # both servers listed their tools
            while True:
                status = json.loads((await watcher.next_message(RUN_BOUND_S)).payload)
                states = {name: s.get("state") for name, s in status["servers"].items()}
                if all(states.get(name) == "ready" for name in ("sure", "wild", "asks")):
                    break
        yield Gated(serve, prefix, log)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def worker(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gated]:
    """One gated worker for the module's tests (claim mode), each test its own targets."""
    async with gated_worker(broker, tmp_path_factory.mktemp("approvals")) as gated:
        yield gated


def code(reply: dict[str, Any]) -> str:
    return "ok" if reply["ok"] else str(reply["error"]["code"])


async def test_a_destructive_call_reaches_the_server_only_once_approved(
    broker: Broker, worker: Gated
) -> None:
    async with Caller(broker.url) as ops:
        # `Target` is respelled `target`: the call shown is the call as it would run.
        gated = await worker.call(ops, "wipe", {"Target": "/one"}, caller="ops", id="w-1")
        assert code(gated) == "approval_required", gated
        details = gated["error"]["details"]
        assert details["call"] == {"tool": "wipe", "arguments": {"target": "/one"}}
        assert (details["reason"], details["expires_in_s"]) == ("destructive", APPROVAL_TIMEOUT_S)
        assert worker.reached("/one") == []
        # A redelivery of the gated request is gated again (a new approval): nothing runs.
        again = await worker.call(ops, "wipe", {"Target": "/one"}, caller="ops", id="w-1")
        assert code(again) == "approval_required"
        assert worker.reached("/one") == []
        # The same request, approved: it runs once; a copy of it is replayed, not run.
        approved = {"caller": "ops", "id": "w-1", "approval": details["approval"]}
        assert code(await worker.call(ops, "wipe", {"target": "/one"}, **approved)) == "ok"
        assert worker.reached("/one") == ["wipe /one"]
        copy = await worker.call(ops, "wipe", {"target": "/one"}, **approved)
        assert (code(copy), copy["replayed"]) == ("ok", True)
        assert worker.reached("/one") == ["wipe /one"]


async def test_a_replayed_altered_expired_or_other_callers_approval_is_refused(
    broker: Broker, worker: Gated
) -> None:
    async with Caller(broker.url) as ops:
        first = await worker.call(ops, "wipe", {"target": "/two/a"}, caller="ops")
        token = first["error"]["details"]["approval"]

        async def refusal(arguments: dict[str, Any], caller: str = "ops") -> str:
            reply = await worker.call(ops, "wipe", arguments, caller=caller, approval=token)
            assert code(reply) == "approval_invalid", reply
            return str(reply["error"]["details"]["reason"])

        assert await refusal({"target": "/two/b"}) == "mismatch"  # altered: left unused
        assert await refusal({"target": "/two/a"}, caller="eve") == "unknown"  # not eve's
        used = await worker.call(ops, "wipe", {"target": "/two/a"}, caller="ops", approval=token)
        assert code(used) == "ok"
        assert await refusal({"target": "/two/a"}) == "used"  # replayed under another id
        late = (await worker.call(ops, "wipe", {"target": "/two/c"}, caller="ops"))["error"]
        await asyncio.sleep(late["details"]["expires_in_s"])  # the approval's own lifetime
        token = late["details"]["approval"]
        assert await refusal({"target": "/two/c"}) == "expired"
        assert worker.reached("/two") == ["wipe /two/a"]


async def test_only_a_trusted_servers_annotations_let_a_call_pass(
    broker: Broker, worker: Gated
) -> None:
    async with Caller(broker.url) as ops:
        outcomes = {
            tool: code(await worker.call(ops, tool, {"target": f"/three/{tool}"}, caller="ops"))
            for tool in ["peek", "plain", "wipe", "wild.peek", "wild.plain", "wild.wipe"]
        }
    # Only what a trusted server says is read-only passes; without annotations, or from an
    # untrusted server, a tool may destroy.
    assert outcomes == {
        "peek": "ok",
        "plain": "approval_required",
        "wipe": "approval_required",
        "wild.peek": "approval_required",
        "wild.plain": "approval_required",
        "wild.wipe": "approval_required",
    }
    assert worker.reached("/three") == ["peek /three/peek"]


def tool_use(target: str, approval: str | None = None) -> dict[str, Any]:
    """An Anthropic assistant turn calling `wipe`, toolbus's options under `toolbus`."""
    options: dict[str, Any] = {"caller": "anthropic"}
    if approval is not None:
        options["approval"] = approval
    use = {"type": "tool_use", "id": "toolu_1", "name": "wipe", "input": {"target": target}}
    return {"role": "assistant", "content": [use], "toolbus": options}


async def test_a_311_caller_and_a_provider_shaped_request_are_gated_too(
    broker: Broker, worker: Gated
) -> None:
    async with Caller(broker.url, v5=False) as old, Caller(broker.url) as provider:
        gated = await worker.call(old, "wipe", {"target": "/four/311"}, caller="old")
        assert code(gated) == "approval_required"
        token = gated["error"]["details"]["approval"]
        approved = await worker.call(
            old, "wipe", {"target": "/four/311"}, caller="old", approval=token
        )
        assert code(approved) == "ok"
        assert worker.reached("/four") == ["wipe /four/311"]

        async def turn(approval: str | None = None) -> dict[str, Any]:
            reply, _ = await provider.call(
                f"{worker.prefix}/call",
                tool_use("/four/p", approval),
                reply_topic=f"{worker.prefix}/reply/p",
            )
            [result] = reply["results"]  # a provider's message gets a `CallsReply`
            return dict(result)

        gated = await turn()
        assert code(gated) == "approval_required", gated
        assert worker.reached("/four") == ["wipe /four/311"]
        assert code(await turn(gated["error"]["details"]["approval"])) == "ok"
        assert worker.reached("/four") == ["wipe /four/311", "wipe /four/p"]


async def test_under_topic_identity_the_approval_is_the_topic_callers(
    broker: Broker, tmp_path: Path
) -> None:
    async with (
        gated_worker(broker, tmp_path, caller_identity="topic") as topical,
        Caller(broker.url) as caller,
    ):
        gated = await topical.call(caller, "kitchen/wipe", {"target": "/k"})
        assert code(gated) == "approval_required"
        token = gated["error"]["details"]["approval"]
        elsewhere = await topical.call(caller, "garage/wipe", {"target": "/k"}, approval=token)
        assert elsewhere["error"]["details"]["reason"] == "unknown"
        assert topical.reached("/k") == []
        approved = await topical.call(caller, "kitchen/wipe", {"target": "/k"}, approval=token)
        assert code(approved) == "ok"
        assert topical.reached("/k") == ["wipe /k"]


async def test_a_call_approved_once_is_not_gated_again_when_its_server_asks(
    broker: Broker, worker: Gated
) -> None:
    """A 2026-07-28 server's call that asks its caller after it was approved: the
    continuation resumes it (its tool and arguments from the token, as approved), never
    `approval_required` again for the same call."""
    async with Caller(broker.url) as ops:
        tool, arguments = "asks.pick_device", {"room": "hall"}
        gated = await worker.call(ops, tool, arguments, caller="ops", input=True)
        assert code(gated) == "approval_required", gated
        approval = gated["error"]["details"]["approval"]
        asked = await worker.call(ops, tool, arguments, caller="ops", input=True, approval=approval)
        assert code(asked) == "input_required", asked
        details = asked["error"]["details"]
        [key] = details["input_requests"]
        answers = {key: {"action": "accept", "content": {"device": "lamp"}}}
        final = await worker.call(
            ops,
            tool,
            {},
            caller="ops",
            continuation=details["continuation"],
            input_responses=answers,
        )
    assert code(final) == "ok", final
    assert final["result"]["structured"] == {"action": "accept", "device": "lamp"}

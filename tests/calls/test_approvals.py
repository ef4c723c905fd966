"""The approval gate in-process (calls/approvals.py): who is gated for what, an anonymous
caller's approvals bound to its reply topic, and the bytes a caller's open approvals may
hold. The gate from the outside (a real worker, a real MCP server): tests/worker/
test_approvals_e2e.py; in a pool sharing Redis: tests/dedup/test_tokens.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.calls.test_pipeline import Rig, rig_for
from tests.support.tools import Probe, probe_tools
from toolbus.calls.approvals import Approvals, destructive
from toolbus.config.callers import CallerProfile
from toolbus.dedup import MemoryStore
from toolbus.dedup.tokens import MemoryTokens
from toolbus.tools.registry import Registry, Tool
from toolbus.wire.contracts import ToolResult


def gated_rig(callers: dict[str, Any], **overrides: Any) -> Rig:
    probe = Probe()
    return rig_for(probe_tools(probe), probe, store=MemoryStore("w1"), callers=callers, **overrides)


async def test_an_anonymous_callers_approval_is_its_reply_topics() -> None:
    rig = gated_rig({"*": {"approve": ["busy"]}})
    gated = await rig.call("busy", {"arguments": {"n": 1}})
    token = gated["error"]["details"]["approval"]
    approved = {"arguments": {"n": 1}, "approval": token}
    await rig.request("busy", approved, response_topic="tb/reply/other")
    other = rig.reply("tb/reply/other")
    assert (other["error"]["code"], other["error"]["details"]["reason"]) == (
        "approval_invalid",
        "unknown",
    )
    assert (await rig.call("busy", approved))["ok"]
    assert rig.probe.calls == 1


async def test_beyond_a_callers_token_bytes_its_next_gated_call_is_rate_limited() -> None:
    probe = Probe()
    rig = rig_for(
        probe_tools(probe),
        probe,
        tokens=MemoryTokens("w1", caller_max_bytes=1024),
        callers={"ops": {"approve": ["busy"]}},
    )
    codes = []
    for n in range(6):
        reply = await rig.call("ops/busy", {"arguments": {"n": n, "hold_ms": 1.0}})
        codes.append(reply["error"]["code"])
        if reply["error"]["code"] == "rate_limited":
            assert reply["error"]["details"]["limit"] == "token_bytes"
    assert codes[0] == "approval_required" and codes[-1] == "rate_limited"
    # Another caller's approvals are its own.
    assert (await rig.call("ops2/busy", {"arguments": {"n": 1}}))["ok"]
    assert rig.probe.calls == 1


async def test_destructive_does_not_reach_local_tools_and_forbidden_comes_first() -> None:
    rig = gated_rig({"ops": {"approve": ["destructive"], "tools": ["busy", "echo"]}})
    assert (await rig.call("ops/busy", {"arguments": {"n": 1}}))["ok"]
    refused = await rig.call("ops/explode", {"arguments": {}})
    assert refused["error"]["code"] == "forbidden"  # not an approval for a forbidden call


async def _invoke(arguments: dict[str, Any], context: object) -> ToolResult:
    return ToolResult(text="")


def mcp_tool(server: str, annotations: dict[str, Any] | None) -> Tool:
    return Tool("wipe", "", {"type": "object"}, _invoke, server=server, annotations=annotations)


@pytest.mark.parametrize(
    ("annotations", "trusted", "gated"),
    [
        (None, True, True),  # says nothing: may destroy
        ({}, True, True),
        ({"readOnlyHint": True}, True, False),
        ({"readOnlyHint": True}, False, True),  # an untrusted server's word is a hint
        ({"destructiveHint": False}, True, False),
        ({"destructiveHint": False}, False, True),
        ({"destructiveHint": True}, True, True),
        ({"readOnlyHint": False}, True, True),  # destructiveHint's default is true
        ({"idempotentHint": True}, True, True),
    ],
)
def test_what_destructive_means(
    annotations: dict[str, Any] | None, trusted: bool, gated: bool
) -> None:
    assert destructive(mcp_tool("s", annotations), trusted) is gated


def test_a_tool_named_is_gated_by_any_name_that_resolves_and_star_lends_its_list() -> None:
    registry = Registry({"nuke": "s.wipe"})
    tool = mcp_tool("s", {"readOnlyHint": True})
    registry.register_all([tool])
    approvals = Approvals(
        {"ops": CallerProfile(approve=["nuke"]), "*": CallerProfile(approve=["destructive"])},
        trusted=["s"],
    )
    approvals.refresh(registry)
    assert approvals.reason("ops", tool) == "tool"
    assert approvals.reason("eve", tool) is None  # `*`: read-only on a trusted server
    untrusted = Approvals({"*": CallerProfile(approve=["destructive"])})
    untrusted.refresh(registry)
    assert untrusted.reason(None, tool) == "destructive"  # its server is not trusted

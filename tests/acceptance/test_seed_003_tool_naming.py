"""Seed 003, ADR 0139 (centralized tool naming normalization): its bugs and decisions, as
toolbus meets them: one resolver for every tool name (exact, aliases case-insensitive,
any spelling), and caller profiles that filter the tool list and the calls alike.

The ADR's characters are callers here (`maestro`, `coach`); its `TOOL_CONFIG` keys are
tool names; `CHARACTER_TOOL_ALIASES` is `aliases` in the configuration.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from tests.acceptance.parts import SEARCH, call
from tests.support.harness import Broker, make_settings, running_worker
from tests.support.mqtt import Caller
from toolbus import Client
from toolbus.backends.local.functions import LocalTool, tool
from toolbus.config import Settings
from toolbus.worker.service import Worker


def _named(name: str) -> LocalTool:
    @tool(name=name, description=f"The {name} tool.")
    async def answer(topic: str = "") -> dict[str, str]:
        return {"tool": name, "topic": topic}

    return answer


TOOLS = [SEARCH, *(_named(n) for n in ("create_mindmap", "flashcard", "demo", "pdf", "webcam"))]
ALIASES = {
    "MindMap": "create_mindmap",
    "flashcards": "flashcard",
    "websearch": "search",
    "htmlinteractive": "demo",
}
CALLERS = {
    # As the characters' data names their tools: PascalCase, through the aliases.
    "maestro": {"tools": ["MindMap", "WebSearch", "HtmlInteractive", "Flashcards"]},
    "coach": {"tools": ["Pdf", "Webcam"]},
}
FRONTEND_ONLY = {"pdf": {"model_invocable": False}, "webcam": {"model_invocable": False}}


def settings(broker: Broker, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"aliases": ALIASES, "callers": CALLERS, "tools": FRONTEND_ONLY}
    return make_settings(broker, **{**values, **overrides})


@pytest_asyncio.fixture(scope="module")
async def worker(broker: Broker) -> AsyncIterator[Worker]:
    async with running_worker(settings(broker), TOOLS) as running:
        yield running


def tool_rules(reply: dict[str, Any]) -> list[str]:
    return [entry["rule"] for entry in reply["normalized"] if entry["path"] == "tool"]


async def test_a_caller_gets_only_its_tools(caller: Caller, worker: Worker) -> None:
    """Seed 003_e5d418c29df57bf1.txt: "Bug 4".

    Every tool for everyone was the bug: the maestro's list holds its four tools, and a
    call to another is `forbidden`.
    """
    mine = {t["name"] for t in await caller.list_tools(worker.topics, "maestro")}
    assert mine == {"create_mindmap", "search", "demo", "flashcard"}
    everyone = {t["name"] for t in await caller.list_tools(worker.topics)}
    assert mine < everyone and "datetime" in everyone
    refused = await call(caller, worker, "datetime", {}, caller="maestro")
    assert refused["error"]["code"] == "forbidden"


async def test_pascal_case_names_resolve_and_unknown_ones_say_so(
    caller: Caller, worker: Worker
) -> None:
    """Seed 003_e5d418c29df57bf1.txt: "ProposalInjector".

    A PascalCase name finds its tool (an alias, or the name in another spelling); one
    that finds nothing is `unknown_tool` with the closest names, never silently nothing.
    """
    spelled = await call(caller, worker, "CreateMindmap", {"topic": "planets"})
    assert (spelled["tool"], tool_rules(spelled)) == ("create_mindmap", ["tool_spelling"])
    aliased = await call(caller, worker, "WebSearch", {"query": "planets"})
    assert (aliased["tool"], tool_rules(aliased)) == ("search", ["alias"])
    unknown = await call(caller, worker, "CreateMindmaps", {})
    assert unknown["error"]["code"] == "unknown_tool"
    assert "create_mindmap" in unknown["error"]["details"]["candidates"]


async def test_a_tools_own_name_matches_directly(caller: Caller, worker: Worker) -> None:
    """Seed 003_e5d418c29df57bf1.txt: "Direct `TOOL_CONFIG` key match (already lowercase)"."""
    reply = await call(caller, worker, "flashcard", {"topic": "verbs"})
    assert (reply["ok"], reply["tool"]) == (True, "flashcard")
    assert reply["normalized"] == []


async def test_aliases_match_in_any_case(caller: Caller, worker: Worker) -> None:
    """Seed 003_e5d418c29df57bf1.txt: "Case-insensitive lookup via `CHARACTER_TOOL_ALIASES` map"."""
    for name in ("MindMap", "mindmap", "MINDMAP"):
        reply = await call(caller, worker, name, {"topic": "rivers"})
        assert (reply["tool"], tool_rules(reply)) == ("create_mindmap", ["alias"]), name


async def test_the_adrs_known_aliases(caller: Caller, worker: Worker) -> None:
    """Seed 003_e5d418c29df57bf1.txt:
    "Known aliases: `flashcards` -> `flashcard`, `websearch` -> `search`, `htmlinteractive` -> `demo`"."""
    for alias, target in (
        ("flashcards", "flashcard"),
        ("websearch", "search"),
        ("htmlinteractive", "demo"),
    ):
        reply = await call(caller, worker, alias, {})
        assert (reply["ok"], reply["tool"], tool_rules(reply)) == (True, target, ["alias"]), alias


async def test_one_alias_entry_serves_calls_profiles_and_lists(
    broker: Broker, caller: Caller
) -> None:
    """Seed 003_e5d418c29df57bf1.txt: "Single source of truth: `src/lib/tools/constants.ts`".

    The `aliases` table is the one place: adding `Quiz` there (one change) makes it a
    name for calls, for caller profiles and for their tool lists at once. Deliberate
    difference: it is configuration, not a source file.
    """
    extended = settings(
        broker,
        aliases={**ALIASES, "Quiz": "flashcard"},
        callers={**CALLERS, "tutor": {"tools": ["Quiz"]}},
    )
    async with running_worker(extended, TOOLS) as worker:
        assert (await call(caller, worker, "quiz", {}))["tool"] == "flashcard"
        listed = await caller.list_tools(worker.topics, "tutor")
        assert [t["name"] for t in listed] == ["flashcard"]
        assert (await call(caller, worker, "QUIZ", {}, caller="tutor"))["ok"]


async def test_the_tool_list_and_the_calls_are_filtered_alike(
    broker: Broker, caller: Caller, worker: Worker
) -> None:
    """Seed 003_e5d418c29df57bf1.txt: "Tool definition filtering".

    What a caller's model is offered (here in Anthropic's format, through the client
    naming its caller) is exactly what that caller may call.
    """
    async with Client(broker.url, prefix=worker.topics.prefix, caller="maestro") as client:
        offered = {t["name"] for t in await client.tools(format="anthropic")}
    assert offered == {"create_mindmap", "search", "demo", "flashcard"}
    for name in sorted(offered):
        assert (await call(caller, worker, name, {}, caller="maestro"))["ok"], name
    refused = await call(caller, worker, "echo", {"text": "x"}, caller="maestro")
    assert refused["error"]["code"] == "forbidden"


async def test_frontend_only_tools_give_a_coach_no_definitions(
    caller: Caller, worker: Worker
) -> None:
    """Seed 003_e5d418c29df57bf1.txt: "Key insight: coach/buddy tools are frontend-only".

    `pdf` and `webcam` are `model_invocable = false`: callable (the UI triggers them) but
    in no tool list; the coach, whose tools they are, is offered none, which is right.
    """
    assert await caller.list_tools(worker.topics, "coach") == []
    everyone = {t["name"] for t in await caller.list_tools(worker.topics)}
    assert not {"pdf", "webcam"} & everyone
    reply = await call(caller, worker, "Pdf", {"topic": "homework"}, caller="coach")
    assert (reply["ok"], reply["tool"]) == (True, "pdf"), reply

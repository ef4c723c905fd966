"""Local tools: the decorator, schemas from type hints, results, and the entry-point group."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.backends.local.functions import (
    ENTRY_POINT_GROUP,
    LocalTool,
    load_entry_points,
    to_result,
    tool,
)
from toolbus.calls.call import Call
from toolbus.calls.execute import Outcome
from toolbus.config import Settings
from toolbus.tools.context import DETACHED
from toolbus.wire.contracts import ErrorCode
from toolbus.wire.errors import InvalidArguments, ToolFailed
from toolbus.worker.wiring import build_executor, build_registry


def test_schema_from_hints() -> None:
    @tool
    async def lamp(room: str, level: int = 50, mode: Literal["warm", "cold"] = "warm") -> str:
        """Set a lamp."""
        return room

    assert lamp.name == "lamp" and lamp.description == "Set a lamp."
    schema = lamp.input_schema
    assert schema["required"] == ["room"]
    assert schema["properties"]["level"] == {"type": "integer", "default": 50}
    assert schema["properties"]["mode"]["enum"] == ["warm", "cold"]
    assert schema["additionalProperties"] is False


def test_given_schema_and_name() -> None:
    given = {"type": "object", "properties": {"q": {"type": "string"}}}

    @tool(name="search", schema=given, timeout_s=3)
    async def whatever(q: str) -> str:
        return q

    assert (whatever.name, whatever.input_schema, whatever.timeout_s) == ("search", given, 3)


def test_sync_functions_are_refused() -> None:
    def sync(x: int) -> int:
        return x

    with pytest.raises(TypeError):
        tool(sync)  # type: ignore[arg-type]


async def test_exceptions_become_tool_error_and_toolbus_errors_pass_through() -> None:
    @tool
    async def bad(kind: str) -> str:
        if kind == "mine":
            raise InvalidArguments("nope")
        raise KeyError(kind)

    invoke = bad.to_tool().invoke
    with pytest.raises(ToolFailed) as caught:
        await invoke({"kind": "x"}, DETACHED)
    assert caught.value.details["exception"] == "KeyError"
    with pytest.raises(InvalidArguments):
        await invoke({"kind": "mine"}, DETACHED)


class Unusual(BaseException):
    """Neither an Exception nor one of Python's own control signals."""


@pytest.mark.parametrize(
    "raised", [SystemExit(3), KeyboardInterrupt(), Unusual("odd")], ids=lambda e: type(e).__name__
)
async def test_base_exceptions_from_a_tool_are_its_failure(raised: BaseException) -> None:
    """`sys.exit()` in a tool is that call's `tool_error`, not the worker's end."""

    @tool
    async def quits() -> str:
        raise raised

    with pytest.raises(ToolFailed) as caught:
        await quits.to_tool().invoke({}, DETACHED)
    assert caught.value.code is ErrorCode.TOOL_ERROR
    assert caught.value.details["exception"] == type(raised).__name__


@pytest.mark.parametrize("signal", [asyncio.CancelledError, GeneratorExit])
async def test_cancellation_and_generator_exit_keep_their_meaning(
    signal: type[BaseException],
) -> None:
    """A timeout or shutdown cancels the tool: that must reach the executor as such."""

    @tool
    async def stopped() -> str:
        raise signal

    with pytest.raises(signal):
        await stopped.to_tool().invoke({}, DETACHED)


def test_results() -> None:
    assert to_result("t").text == "t"
    assert to_result({"a": 1}).structured == {"a": 1}
    assert to_result([1, 2]).structured == {"result": [1, 2]}
    assert to_result(None).text == ""


async def test_builtin_datetime_and_echo() -> None:
    by_name = {t.name: t for t in BUILTIN_TOOLS}
    now = await by_name["datetime"](timezone="Europe/Berlin")
    assert now["timezone"] == "Europe/Berlin" and now["iso"].endswith(("+01:00", "+02:00"))
    with pytest.raises(InvalidArguments):
        await by_name["datetime"](timezone="Mars/Olympus")
    assert await by_name["echo"](text="x", data={"k": [1]}) == {"text": "x", "data": {"k": [1]}}


@pytest.fixture
def plugin_on_path(tmp_path: Path) -> Iterator[Path]:
    """An installed-looking distribution that contributes tools through the entry-point group."""
    (tmp_path / "tb_plugin.py").write_text(
        textwrap.dedent(
            """
            from toolbus import tool

            @tool
            async def shout(text: str) -> str:
                "Upper-cases the text."
                return text.upper()

            TOOLS = [shout]
            NOT_A_TOOL = 42
            """
        )
    )
    dist = tmp_path / "tb_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tb-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nshout = tb_plugin:TOOLS\nbroken = tb_plugin_missing:X\nodd = tb_plugin:NOT_A_TOOL\n"
    )
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("tb_plugin", None)


async def test_entry_point_tools_load_and_broken_ones_are_skipped(plugin_on_path: Path) -> None:
    loaded = load_entry_points()
    assert [t.name for t in loaded] == ["shout"]
    assert isinstance(loaded[0], LocalTool)
    assert (await loaded[0].to_tool().invoke({"text": "hi"}, DETACHED)).text == "HI"


@tool(timeout_s=0.05)
async def stubborn() -> str:
    """Swallows the cancellation at its deadline and answers anyway."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        return "late"
    return "never"


HANGING: list[asyncio.Event] = []  # set by `hangs` once it waits: the test's own event


@tool(timeout_s=0.05)
async def hangs() -> str:
    """Never answers."""
    for entered in HANGING:
        entered.set()
    await asyncio.Event().wait()
    return "never"


async def _execute(local: LocalTool) -> Outcome:
    settings = Settings()
    executor = build_executor(settings, build_registry([local], settings))
    return await executor.execute(Call(id="a", tool=local.name, arguments={}, topic="t"))


async def test_a_tool_past_its_deadline_times_out_and_leaves_its_task_uncancelled() -> None:
    outcome = await _execute(hangs)
    assert outcome.error is not None and outcome.error.code is ErrorCode.TIMEOUT
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the deadline's cancel taken back


async def test_a_tool_that_swallows_its_deadline_keeps_its_answer() -> None:
    outcome = await _execute(stubborn)
    assert outcome.error is None and outcome.result is not None
    assert outcome.result.text == "late"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_cancellation_from_outside_is_not_a_timeout() -> None:
    """A shutdown's cancel passes through the deadline as a cancellation."""
    entered = asyncio.Event()
    HANGING[:] = [entered]
    running = asyncio.create_task(_execute(hangs))
    async with asyncio.timeout(5):
        await entered.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


async def test_a_second_tool_of_a_name_replaces_the_first_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An installed package's `echo` shadows the built-in: the later one answers, and the
    start-up log names both, so an operator is never surprised by whose tool ran."""

    @tool(name="echo")
    async def shadow(text: str) -> str:
        """Not the built-in echo."""
        return f"shadow:{text}"

    settings = Settings()
    with caplog.at_level("WARNING", logger="toolbus.service"):
        registry = build_registry([*BUILTIN_TOOLS, shadow], settings)
    executor = build_executor(settings, registry)
    outcome = await executor.execute(Call(id="a", tool="echo", arguments={"text": "hi"}, topic="t"))
    assert outcome.result is not None and outcome.result.text == "shadow:hi"
    warned = [r for r in caplog.records if "defined twice" in r.getMessage()]
    assert len(warned) == 1 and "shadow" in warned[0].getMessage()

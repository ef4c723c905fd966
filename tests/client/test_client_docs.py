"""docs/client.md's examples, run as written: each `python run:NAME` block is a program,
started as its own process against a broker and worker of this module's own, with
`tests/support/model_standin.py` in place of the providers' APIs (`ANTHROPIC_BASE_URL`,
`OPENAI_BASE_URL`, dummy keys). What reached the stand-in is judged with the SDKs' own
parameter types; the loop must end with the model's final text, which quotes what the
tools said. Every other Python block in the page must at least compile.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from anthropic.types import MessageCreateParams, MessageParam, ToolParam
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from openai.types.responses import FunctionToolParam, ResponseInputItemParam
from pydantic import TypeAdapter

from tests.support.asking_worker import AskingWorker, elicitation, sampling
from tests.support.harness import Broker, make_settings, running_worker
from tests.support.model_standin import ECHOED, FINAL, SAMPLED, TOOL, ModelStandIn
from tests.support.processes import run_bounded

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "client.md"
BLOCK = re.compile(r"^```python(?P<info>[^\n]*)\n(?P<code>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
NAME_REGEX = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # Anthropic's and OpenAI's tool names
RUN_BOUND_S = 90.0


def blocks() -> list[tuple[str | None, str]]:
    """(name or None, code) of every Python block in the page, in order."""
    found = []
    for match in BLOCK.finditer(PAGE.read_text(encoding="utf-8")):
        info = match["info"].strip()
        found.append(
            (info.removeprefix("run:") if info.startswith("run:") else None, match["code"])
        )
    return found


def runnable() -> dict[str, str]:
    return {name: code for name, code in blocks() if name is not None}


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The examples use the default prefix `toolbus`: a broker no other test shares."""
    broker = Broker(tmp_path_factory.mktemp("docs-broker"))
    broker.start()
    yield broker
    broker.stop()


@pytest_asyncio.fixture
async def worker(own_broker: Broker) -> AsyncIterator[None]:
    settings = make_settings(own_broker, topic_prefix="toolbus")
    async with running_worker(settings):
        yield


async def run_example(
    code: str, broker: Broker, model: ModelStandIn, tmp_path: Path, typed: bytes | None = None
) -> str:
    """The block as a program of its own (`typed` on its standard input); its output."""
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLBUS_", "OTEL_"))}
    env.update(
        TOOLBUS_BROKER_URL=broker.url,
        ANTHROPIC_BASE_URL=model.url,
        ANTHROPIC_API_KEY="test-key",
        OPENAI_BASE_URL=f"{model.url}/v1",
        OPENAI_API_KEY="test-key",
        NO_PROXY="127.0.0.1,localhost",
    )
    exit_code, out, err = await run_bounded(
        sys.executable, str(script), env=env, cwd=tmp_path, bound_s=RUN_BOUND_S, typed=typed
    )
    assert exit_code == 0, err[-3000:]
    return out


def test_every_block_compiles_and_the_runnable_ones_are_known() -> None:
    for _, code in blocks():
        compile(code, str(PAGE), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    assert set(runnable()) == set(JUDGES)


def judge_quickstart(output: str, model: ModelStandIn) -> None:
    lines = output.splitlines()
    assert lines[0] == "echo {'text': 'hello', 'data': None}"
    assert any(line.startswith("echo - ") for line in lines)
    assert "unknown_tool" in lines[-1] and "'echo'" in lines[-1]
    assert not model.requests  # no model in this one


def final_line(output: str) -> str:
    """The model's final text, which quotes what each `echo` call sent back."""
    last = output.strip().splitlines()[-1]
    assert last.startswith(FINAL), output
    assert all(text in last for text in ECHOED)
    return last


def judge_anthropic(output: str, model: ModelStandIn) -> None:
    final_line(output)
    first, second = model.requests["/v1/messages"]
    for tool in first["tools"]:
        TypeAdapter(ToolParam).validate_python(tool)
        assert NAME_REGEX.match(tool["name"]) and tool["input_schema"]["type"] == "object"
    assert TOOL in {tool["name"] for tool in first["tools"]}
    TypeAdapter(list[MessageParam]).validate_python(second["messages"])
    asked = [b for b in model.answers["/v1/messages"][0]["content"] if b["type"] == "tool_use"]
    assistant, results = second["messages"][-2:]
    assert assistant["role"] == "assistant"
    assert [b["id"] for b in assistant["content"] if b["type"] == "tool_use"] == [
        b["id"] for b in asked
    ]
    assert results["role"] == "user"
    assert [(b["type"], b["tool_use_id"]) for b in results["content"]] == [
        ("tool_result", b["id"]) for b in asked
    ]
    assert not any(b.get("is_error") for b in results["content"])


def judge_openai_chat(output: str, model: ModelStandIn) -> None:
    final_line(output)
    first, second = model.requests["/v1/chat/completions"]
    for tool in first["tools"]:
        TypeAdapter(ChatCompletionFunctionToolParam).validate_python(tool)
        assert tool["type"] == "function" and NAME_REGEX.match(tool["function"]["name"])
    TypeAdapter(list[ChatCompletionMessageParam]).validate_python(second["messages"])
    asked = model.answers["/v1/chat/completions"][0]["choices"][0]["message"]["tool_calls"]
    tool_messages = second["messages"][-len(asked) :]
    assert [(m["role"], m["tool_call_id"]) for m in tool_messages] == [
        ("tool", call["id"]) for call in asked
    ]
    assert second["messages"][-len(asked) - 1]["role"] == "assistant"


def judge_openai_responses(output: str, model: ModelStandIn) -> None:
    final_line(output)
    first, second = model.requests["/v1/responses"]
    for tool in first["tools"]:
        TypeAdapter(FunctionToolParam).validate_python(tool)
        assert tool["type"] == "function" and NAME_REGEX.match(tool["name"])
    asked = [i for i in model.answers["/v1/responses"][0]["output"] if i["type"] == "function_call"]
    outputs = [i for i in second["input"] if i.get("type") == "function_call_output"]
    # Judged: what toolbus made. The model's turn as the SDK serializes it (`input +=
    # response.output`) carries nulls its own param types refuse: not ours to judge.
    TypeAdapter(list[ResponseInputItemParam]).validate_python(outputs)
    assert [i["call_id"] for i in outputs] == [i["call_id"] for i in asked]
    calls = [i for i in second["input"] if i.get("type") == "function_call"]
    assert [i["call_id"] for i in calls] == [i["call_id"] for i in asked]  # the model's turn kept


JUDGES: dict[str, Callable[[str, ModelStandIn], None]] = {
    "quickstart": judge_quickstart,
    "anthropic": judge_anthropic,
    "openai-chat": judge_openai_chat,
    "openai-responses": judge_openai_responses,
}


@pytest.mark.parametrize("name", sorted(JUDGES))
async def test_the_example_runs_as_written(
    name: str, own_broker: Broker, worker: None, tmp_path: Path
) -> None:
    with ModelStandIn() as model:
        output = await run_example(runnable()[name], own_broker, model, tmp_path)
    JUDGES[name](output, model)


ASKED = {
    "summary": sampling("Summarize: the hall light is on.", system="Be brief."),
    "who": elicitation("Who is asking?", name={"type": "string", "title": "Name"}),
}
SAMPLING_PATHS = {"anthropic": "/v1/messages", "openai-chat": "/v1/chat/completions"}


@pytest.mark.parametrize("name", sorted(SAMPLING_PATHS))
async def test_the_loops_answer_sampling_with_the_model_and_elicitation_with_a_prompt(
    name: str, own_broker: Broker, tmp_path: Path
) -> None:
    """The loops as written, against a worker whose `echo` asks (`AskingWorker`, the
    issue 32 contract): its sampling request reaches the stand-in model in the provider's
    own shape and the model's answer comes back as an MCP `CreateMessageResult`; its
    elicitation is answered with what is typed on standard input."""
    asking = AskingWorker(own_broker.url, "toolbus")
    asking.questions[TOOL] = [ASKED]
    async with asking.running():
        with ModelStandIn() as model:
            output = await run_example(
                runnable()[name], own_broker, model, tmp_path, typed=b"Ada\nAda\n"
            )
    assert not asking.violations
    assert FINAL in output.strip().splitlines()[-1]  # after the prompts input() wrote
    path = SAMPLING_PATHS[name]
    sampled = [body for body in model.requests[path] if "tools" not in body]
    looped = [body for body in model.requests[path] if "tools" in body]
    assert len(sampled) == len(ECHOED) and len(looped) == 2  # one per `echo` call
    for body in sampled:
        if name == "anthropic":
            TypeAdapter(MessageCreateParams).validate_python(body)
            assert body["system"] == "Be brief." and body["max_tokens"] == 100
        else:
            TypeAdapter(list[ChatCompletionMessageParam]).validate_python(body["messages"])
            assert body["messages"][0] == {"role": "system", "content": "Be brief."}
            assert body["max_completion_tokens"] == 100
    completion = {
        "role": "assistant",
        "content": {"type": "text", "text": f"{SAMPLED} Summarize: the hall light is on."},
        "model": looped[0]["model"],
        "stopReason": "endTurn",
    }
    who = {"action": "accept", "content": {"name": "Ada"}}
    assert asking.answers == [[{"summary": completion, "who": who}]] * len(ECHOED)

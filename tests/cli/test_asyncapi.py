"""docs/asyncapi.yaml: the AsyncAPI project's parser accepts it, and it says what the code does.

The parser (`@asyncapi/parser`, installed by scripts/ensure-asyncapi) judges the document
as AsyncAPI tools read it. The rest holds it to the code: its addresses route as
`Topics` routes them, its payloads are schemas/*.json, and what the providers' SDKs emit
and what our code answers validates against the messages that describe them.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator, ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from tests.support.providers import (
    anthropic_message,
    chat_completion,
    ollama_response,
    response,
    tool_use,
)
from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.cli import asyncapi
from toolbus.config import Settings
from toolbus.tools.definitions import listing
from toolbus.wire.contracts import (
    WIRE_MODELS,
    CallsReply,
    Reply,
    ReplyFormat,
    ToolResult,
    ToolsFormat,
)
from toolbus.wire.formats.incoming import read
from toolbus.wire.formats.outgoing import Answered, conversation
from toolbus.wire.topics import Route, Topics
from toolbus.worker.wiring import build_registry

ROOT = Path(__file__).parents[2]
DOCUMENT_PATH = ROOT / "docs" / "asyncapi.yaml"
DOCUMENT: dict[str, Any] = yaml.safe_load(DOCUMENT_PATH.read_text(encoding="utf-8"))
MESSAGES: dict[str, Any] = DOCUMENT["components"]["messages"]
BASE = "urn:toolbus:asyncapi"
REGISTRY: Registry[Any] = Registry().with_resource(
    BASE, Resource.from_contents(DOCUMENT, default_specification=DRAFT7)
)
PROVIDER_CALLS = {
    ReplyFormat.ANTHROPIC: "anthropicCalls",
    ReplyFormat.OPENAI: "openaiChatCalls",
    ReplyFormat.OPENAI_RESPONSES: "openaiResponsesCalls",
    ReplyFormat.OLLAMA: "ollamaCalls",
}
PROVIDER_REPLIES = {
    ReplyFormat.ANTHROPIC: "anthropicReply",
    ReplyFormat.OPENAI: "openaiChatReply",
    ReplyFormat.OPENAI_RESPONSES: "openaiResponsesReply",
    ReplyFormat.OLLAMA: "ollamaReply",
}


def payload(message: str) -> Draft7Validator:
    """A validator of `message`'s payload, its references resolved in the document."""
    assert message in MESSAGES
    schema = {"$ref": f"{BASE}#/components/messages/{message}/payload"}
    return Draft7Validator(schema, registry=REGISTRY)


@dataclass(frozen=True)
class Parsed:
    returncode: int
    lines: dict[Path, list[str]]  # per document, what the parser said of it


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> Parsed:
    """The parser's verdict on the committed document and on a broken one, in one run
    (it takes seconds to load). `make test` installs it first; here it is a no-op then."""
    installed = subprocess.run(
        [str(ROOT / "scripts" / "ensure-asyncapi")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    document = asyncapi.build()
    # Where the old hand-written document had it: QoS belongs to operation bindings.
    document["components"]["messageBindings"]["request"]["mqtt"]["qos"] = 1
    broken = tmp_path_factory.mktemp("asyncapi") / "broken.yaml"
    broken.write_text(yaml.safe_dump(document), encoding="utf-8")
    documents = [DOCUMENT_PATH, broken]
    result = subprocess.run(
        ["node", str(ROOT / "tools" / "asyncapi" / "validate.cjs"), *map(str, documents)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert not result.stderr, result.stderr
    lines: dict[Path, list[str]] = {path: [] for path in documents}
    for line in result.stdout.splitlines():
        file, _, said = line.partition(": ")
        lines[Path(file)].append(said)
    return Parsed(result.returncode, lines)


def test_the_asyncapi_parser_finds_no_error_and_no_warning(parsed: Parsed) -> None:
    said = parsed.lines[DOCUMENT_PATH]
    assert said[-1].startswith("no errors"), said
    assert not [line for line in said if line.startswith(("error ", "warning "))], said


def test_the_parser_check_fails_on_a_document_the_parser_refuses(parsed: Parsed) -> None:
    assert parsed.returncode == 1
    (broken,) = (path for path in parsed.lines if path != DOCUMENT_PATH)
    assert any(line.startswith("error asyncapi-document-resolved") for line in parsed.lines[broken])


def test_schemas_check_fails_on_a_stale_document(tmp_path: Path) -> None:
    stale = tmp_path / "asyncapi.yaml"
    asyncapi.write(stale)
    assert asyncapi.check(stale)
    stale.write_text(stale.read_text(encoding="utf-8").replace("qos: 1", "qos: 2", 1))
    assert not asyncapi.check(stale)
    command = [sys.executable, "-m", "toolbus", "schemas", "--check"]
    paths = ["--dir", str(ROOT / "schemas"), "--asyncapi", str(stale)]
    result = subprocess.run([*command, *paths], capture_output=True, timeout=60, check=False)
    assert result.returncode == 1  # the repository's document: tests/wire/test_contracts.py


def test_the_payloads_are_the_generated_schema_files() -> None:
    components = DOCUMENT["components"]["schemas"]
    for stem, model in WIRE_MODELS.items():
        text = (ROOT / "schemas" / f"{stem}.json").read_text(encoding="utf-8")
        moved = json.loads(text.replace('"#/$defs/', '"#/components/schemas/'))
        for name, definition in moved.pop("$defs", {}).items():
            assert components[name] == definition, name
        del moved["$schema"], moved["$id"]
        assert components[model.__name__] == moved, stem


def address(channel: str, **levels: str) -> str:
    found: str = DOCUMENT["channels"][channel]["address"]
    for name, value in {"prefix": "tb", **levels}.items():
        found = found.replace(f"{{{name}}}", value)
    assert "{" not in found, found
    return found


def test_the_addresses_route_as_the_worker_routes_them() -> None:
    claim = Topics("tb", "g", ("tb/reply/",))
    bound = Topics("tb", "g", ("tb/reply/",), caller_identity="topic")
    assert claim.route(address("call")) == Route(False)
    assert claim.route(address("callTool", tool="lamp")) == Route(False, None, "lamp")
    assert bound.route(address("callCaller", caller="k")) == Route(False, "k")
    assert bound.route(address("callCallerTool", caller="k", tool="lamp")) == Route(
        False, "k", "lamp"
    )
    ambiguous = claim.route(address("callCallerTool", caller="k", tool="lamp"))
    assert isinstance(ambiguous, Route) and ambiguous.ambiguous  # caller k's lamp, or tool k/lamp
    assert claim.route(address("tools")) == Route(True)
    assert claim.route(address("toolsCaller", caller="k")) == Route(True, "k")
    assert bound.route(address("toolsCaller", caller="k")) == Route(True, "k")
    assert address("dead") == claim.dead
    assert address("workerStatus", worker_id="w1") == claim.status("w1")
    levels = {"server": "s", "worker_id": "w1"}
    server_status = address("serverStatus", **levels)
    named = inspect.signature(claim.server_status).parameters
    assert server_status == claim.server_status(**{name: levels[name] for name in named})
    # None of what the worker publishes on its own could ever be made a reply topic.
    for own in (address("dead"), address("workerStatus", worker_id="w1"), server_status):
        assert claim.reply_problem(own, None) == "worker_topic"
    assert DOCUMENT["channels"]["reply"]["address"] is None
    prefix = DOCUMENT["components"]["parameters"]["prefix"]
    assert prefix["default"] == Settings.model_validate({}).topic_prefix


def test_every_example_is_valid_and_read_as_its_message_says() -> None:
    expected = {"envelope": ReplyFormat.TOOLBUS} | {v: k for k, v in PROVIDER_CALLS.items()}
    seen = 0
    for key, message in MESSAGES.items():
        for example in message.get("examples", []):
            payload(key).validate(example["payload"])
            seen += 1
            if key in expected:
                assert read(example["payload"]).format is expected[key], (key, example["name"])
    assert seen >= 10


SDK_OBJECTS = [
    (ReplyFormat.ANTHROPIC, tool_use("toolu_1", "echo", {"text": "hi"})),
    (ReplyFormat.ANTHROPIC, anthropic_message(tool_use("toolu_1", "echo", {"text": "hi"}))),
    (ReplyFormat.ANTHROPIC, anthropic_message(tool_use("toolu_1", "echo", {}))["content"]),
    (ReplyFormat.OPENAI, chat_completion(("call_1", "echo", '{"text": "hi"}'))),
    (
        ReplyFormat.OPENAI,
        chat_completion(("call_1", "echo", "{}"))["choices"][0]["message"],
    ),
    (
        ReplyFormat.OPENAI,
        chat_completion(("call_1", "echo", "{}"))["choices"][0]["message"]["tool_calls"],
    ),
    (ReplyFormat.OPENAI_RESPONSES, response(("call_1", "echo", '{"text": "hi"}'))),
    (ReplyFormat.OPENAI_RESPONSES, response(("call_1", "echo", "{}"))["output"]),
    (ReplyFormat.OPENAI_RESPONSES, response(("call_1", "echo", "{}"))["output"][1]),
    (ReplyFormat.OLLAMA, ollama_response(("echo", {"text": "hi"}))),
    (ReplyFormat.OLLAMA, ollama_response(("echo", {}))["message"]),
]


@pytest.mark.parametrize(("fmt", "published"), SDK_OBJECTS)
def test_what_a_providers_sdk_emits_is_its_message_and_no_other(
    fmt: ReplyFormat, published: Any
) -> None:
    assert read(published).format is fmt  # the worker reads it so
    payload(PROVIDER_CALLS[fmt]).validate(published)
    for other, message in PROVIDER_CALLS.items():
        if other is not fmt:
            assert not payload(message).is_valid(published), message


def answered(fmt: ReplyFormat) -> CallsReply:
    ok = Reply(id="c1", ok=True, tool="echo", result=ToolResult(text="hi"), duration_ms=1.0)
    failed = Reply.model_validate(
        {
            "id": "c2",
            "ok": False,
            "error": {"code": "tool_error", "message": "no"},
            "duration_ms": 1,
        }
    )
    calls = [Answered("c1", "echo", ok), Answered("c2", "echo", failed)]
    return CallsReply(
        id="m1",
        format=fmt,
        ok=False,
        append=conversation(fmt, calls),
        results=[ok, failed],
        duration_ms=2.0,
    )


@pytest.mark.parametrize("fmt", list(PROVIDER_REPLIES))
def test_a_reply_in_a_providers_format_is_its_message_and_no_other(fmt: ReplyFormat) -> None:
    body = json.loads(answered(fmt).model_dump_json(by_alias=True, exclude_none=True))
    payload(PROVIDER_REPLIES[fmt]).validate(body)
    payload("callsReply").validate(body)
    for other, message in PROVIDER_REPLIES.items():
        if other is not fmt:
            assert not payload(message).is_valid(body), message
    with pytest.raises(ValidationError):  # `append` is checked item by item
        payload(PROVIDER_REPLIES[fmt]).validate({**body, "append": [{"role": "system"}]})


@pytest.mark.parametrize("tools_format", list(ToolsFormat))
def test_a_tool_listing_in_every_format_is_a_tools_reply(tools_format: ToolsFormat) -> None:
    registry = build_registry(BUILTIN_TOOLS, Settings.model_validate({}))
    structured = listing(registry, tools_format).structured()
    reply = Reply(
        id="r1", ok=True, result=ToolResult(text="echo", structured=structured), duration_ms=1.0
    )
    body = json.loads(reply.model_dump_json(by_alias=True, exclude_none=True))
    payload("toolsReply").validate(body)
    spoiled = json.loads(json.dumps(body))
    spoiled["result"]["structured"]["tools"][0] = {"description": "a definition without a name"}
    assert not payload("toolsReply").is_valid(spoiled)

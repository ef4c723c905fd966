"""Outgoing formats: our replies as what each provider's SDK takes back, judged by the SDKs.

In-process and offline: every item `conversation` produces is validated with the SDK's own
parameter type (tests/support/providers.py), and the facts each format must keep (ids, order,
the error flag, where images go) are asserted beside it, where those types are lenient.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.support.providers import (
    ANTHROPIC_MESSAGE,
    CHAT_MESSAGE,
    RESPONSES_INPUT_ITEM,
    check,
    materialized,
    ollama_message,
    strictly,
)
from toolbus.tools.parameters import summarize
from toolbus.tools.shapes import build_shape
from toolbus.tools.validate import CompiledSchema, check_arguments
from toolbus.wire.contracts import ContentItem, ErrorBody, ErrorCode, Reply, ReplyFormat, ToolResult
from toolbus.wire.errors import InvalidArguments
from toolbus.wire.formats.outgoing import MAX_ERROR_CHARS, Answered, conversation, error_text

PROVIDERS = [
    ReplyFormat.ANTHROPIC,
    ReplyFormat.OPENAI,
    ReplyFormat.OPENAI_RESPONSES,
    ReplyFormat.OLLAMA,
]
PNG = (  # a real 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
TIFF = base64.b64encode(b"II*\x00" + bytes(8)).decode()
PARAMETERS = [
    {"name": "device", "type": "string", "required": True, "enum": ["lamp", "fan"]},
    {"name": "level", "type": "integer", "required": False, "description": "0 to 100"},
    {"name": "note", "type": "string|null", "required": False},
]


def ok(
    text: str = "",
    structured: Any = None,
    content: list[ContentItem] | None = None,
) -> Reply:
    result = ToolResult(text=text, structured=structured, content=content)
    return Reply(id="r", ok=True, tool="t", result=result, duration_ms=1.0)


def failed(code: ErrorCode, message: str, **details: Any) -> Reply:
    error = ErrorBody(code=code, message=message, details=details)
    return Reply(id="r", ok=False, error=error, duration_ms=1.0)


CASES: dict[str, Reply] = {
    "success": ok("21.5 °C in the kitchen"),
    "invalid_arguments": failed(
        ErrorCode.INVALID_ARGUMENTS,
        "arguments for set_level do not match its schema",
        errors=[{"path": "device", "problem": "'oven' is not one of ['lamp', 'fan']"}],
        parameters=PARAMETERS,
    ),
    "unknown_tool": failed(
        ErrorCode.UNKNOWN_TOOL, "no tool named 'set_lvl'", candidates=["set_level"]
    ),
    "timeout": failed(ErrorCode.TIMEOUT, "set_level did not finish within 5 s", timeout_s=5),
    "image": ok("a chart", content=[ContentItem(type="image", mime_type="image/png", data=PNG)]),
    "image_only": ok(content=[ContentItem(type="image", mime_type="image/png", data=PNG)]),
    "unsupported_image": ok(content=[ContentItem(type="image", mime_type="image/tiff", data=TIFF)]),
    "audio": ok(
        "said", content=[ContentItem(type="audio", mime_type="audio/wav", data="UklGRg==")]
    ),
    "resource_and_link": ok(
        content=[
            ContentItem(type="resource", uri="file:///notes.txt", text="milk, eggs"),
            ContentItem(type="resource_link", uri="https://example.com/doc", mime_type="text/html"),
        ]
    ),
    "empty": ok(),
    "blank": ok("  \n"),
    "structured_only": ok(structured={"temperature_c": 21.5, "room": "kitchen"}),
    "structured_array": ok(structured=[1, 2.5, 3]),
    "named_link_and_blob": ok(
        content=[
            ContentItem(
                type="resource_link",
                uri="file:///r.pdf",
                name="report",
                mime_type="application/pdf",
            ),
            ContentItem(
                type="resource", uri="blob://one", mime_type="application/octet-stream", data="AAE="
            ),
        ]
    ),
}
WITH_IMAGE = {"image", "image_only"}


def answered(*names: str) -> list[Answered]:
    return [Answered(f"call_{i}_{name}", f"tool_{i}", CASES[name]) for i, name in enumerate(names)]


def appended_in(format: ReplyFormat, calls: list[Answered]) -> list[dict[str, Any]]:
    """`conversation`, its JSON values typed loosely for indexing in the tests."""
    return conversation(format, calls)


def texts_of(format: ReplyFormat, appended: list[dict[str, Any]]) -> list[str]:
    """Every text the model reads, per call, whatever the format."""
    if format == ReplyFormat.ANTHROPIC:
        return [
            "\n".join(part["text"] for part in block["content"] if part["type"] == "text")
            for block in appended[0]["content"]
        ]
    if format == ReplyFormat.OPENAI_RESPONSES:
        return [
            item["output"]
            if isinstance(item["output"], str)
            else "\n".join(p["text"] for p in item["output"] if p["type"] == "input_text")
            for item in appended
        ]
    return [message["content"] for message in appended if message["role"] == "tool"]


# -- the SDKs accept every item -----------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("format", PROVIDERS)
def test_every_case_is_what_the_sdk_takes(format: ReplyFormat, case: str) -> None:
    appended = appended_in(format, answered(case))
    assert appended
    for item in appended:
        check(format, item)
    (text,) = texts_of(format, appended)
    if case not in WITH_IMAGE or format == ReplyFormat.OPENAI:
        assert text.strip()  # something to read, never an empty answer
    error = CASES[case].error
    if error is not None:  # the text says it failed, and how: the only error flag but Anthropic's
        assert text.startswith(f"error ({error.code.value}): ")


@pytest.mark.parametrize("count", [1, 2, 5])
@pytest.mark.parametrize("format", PROVIDERS)
def test_calls_are_answered_in_order(format: ReplyFormat, count: int) -> None:
    mix = ["success", "invalid_arguments", "image", "unknown_tool", "timeout"][:count]
    calls = answered(*mix)
    appended = appended_in(format, calls)
    for item in appended:
        check(format, item)
    ids = [call.call_id for call in calls]
    if format == ReplyFormat.ANTHROPIC:
        (message,) = appended
        assert [block["tool_use_id"] for block in message["content"]] == ids
    elif format == ReplyFormat.OPENAI:
        tool_messages = [m for m in appended if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in tool_messages] == ids
        assert appended[: len(ids)] == tool_messages  # no other message between the answers
    elif format == ReplyFormat.OPENAI_RESPONSES:
        assert [item["call_id"] for item in appended] == ids
        assert {item["type"] for item in appended} == {"function_call_output"}
    else:
        assert [m["tool_name"] for m in appended] == [call.name for call in calls]


@pytest.mark.parametrize("format", PROVIDERS)
def test_a_structured_array_a_named_link_and_a_binary_resource_are_carried(
    format: ReplyFormat,
) -> None:
    """Structured content of any JSON value, and MCP's resource links and embedded
    resources, as text every provider takes (issue 32)."""
    appended = json.dumps(appended_in(format, answered("structured_array", "named_link_and_blob")))
    assert "[1,2.5,3]" in appended
    assert "[link: report: file:///r.pdf (application/pdf)]" in appended
    assert "resource blob://one (application/octet-stream) content left out" in appended


def test_toolbus_format_appends_nothing() -> None:
    assert appended_in(ReplyFormat.TOOLBUS, answered("success", "timeout")) == []


# -- each format's own facts --------------------------------------------------------------


def test_anthropic_one_user_message_is_error_only_on_failure_images_as_blocks() -> None:
    names = ["success", "timeout", "image", "unsupported_image", "empty", "structured_only"]
    (message,) = appended_in(ReplyFormat.ANTHROPIC, answered(*names))
    assert message["role"] == "user"
    blocks = dict(zip(names, message["content"], strict=True))
    assert all(block["type"] == "tool_result" for block in blocks.values())
    assert blocks["timeout"]["is_error"] is True
    assert [name for name, block in blocks.items() if "is_error" in block] == ["timeout"]
    assert blocks["image"]["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
    }
    assert [part["type"] for part in blocks["unsupported_image"]["content"]] == ["text"]
    for block in blocks.values():  # the API refuses empty content and blank text blocks
        assert block["content"]
        assert all(p["text"].strip() for p in block["content"] if p["type"] == "text")
    assert blocks["structured_only"]["content"] == [
        {"type": "text", "text": '{"temperature_c":21.5,"room":"kitchen"}'}
    ]


def test_openai_images_follow_all_tool_messages_in_one_user_message() -> None:
    calls = answered("image", "success", "image_only", "unsupported_image")
    appended = appended_in(ReplyFormat.OPENAI, calls)
    assert [m["role"] for m in appended] == ["tool", "tool", "tool", "tool", "user"]
    images = [part for part in appended[-1]["content"] if part["type"] == "image_url"]
    assert (
        images == [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}] * 2
    )
    captions = [part["text"] for part in appended[-1]["content"] if part["type"] == "text"]
    assert [calls[0].call_id in captions[0], calls[2].call_id in captions[1]] == [True, True]
    assert all(isinstance(m["content"], str) for m in appended[:4])  # tool messages: text only


def test_openai_without_images_appends_only_tool_messages() -> None:
    appended = appended_in(ReplyFormat.OPENAI, answered("success", "unsupported_image", "audio"))
    assert [m["role"] for m in appended] == ["tool"] * 3


def test_responses_output_is_text_or_a_list_with_the_images() -> None:
    appended = appended_in(ReplyFormat.OPENAI_RESPONSES, answered("success", "image"))
    assert appended[0] == {
        "type": "function_call_output",
        "call_id": "call_0_success",
        "output": "21.5 °C in the kitchen",
    }
    assert appended[1]["output"] == [
        {"type": "input_text", "text": "a chart"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},
    ]


def test_ollama_names_the_tool_as_the_model_did_and_carries_images() -> None:
    image, unsupported = appended_in(ReplyFormat.OLLAMA, answered("image", "unsupported_image"))
    assert image == {"role": "tool", "tool_name": "tool_0", "content": "a chart", "images": [PNG]}
    assert "images" not in unsupported
    assert unsupported["content"].strip()


JPEG = base64.b64encode(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(16)).decode()
WEBP = base64.b64encode(b"RIFF\x24\x00\x00\x00WEBPVP8 " + bytes(16)).decode()


@pytest.mark.parametrize("format", PROVIDERS)
def test_images_are_typed_by_their_bytes(format: ReplyFormat) -> None:
    """A provider refuses the whole request for an image that is not what it says, or
    not base64: the bytes decide, and what does not decode is left out with a note."""
    wrapped = "\n".join(PNG[i : i + 20] for i in range(0, len(PNG), 20))
    items = [
        ContentItem(type="image", mime_type="image/png", data=JPEG),  # mislabelled
        ContentItem(type="image", data=wrapped),  # no type, base64 wrapped in lines
        ContentItem(type="resource", uri="file:///a.webp", mime_type="image/webp", data=WEBP),
        ContentItem(type="image", mime_type="image/png", data="not base64!"),
        ContentItem(type="image", mime_type="image/png", data=TIFF),  # base64, not a PNG
    ]
    appended = appended_in(format, [Answered("c", "t", ok("seen", content=items))])
    for item in appended:
        check(format, item)
    if format == ReplyFormat.ANTHROPIC:
        images = [
            (part["source"]["media_type"], part["source"]["data"])
            for part in appended[0]["content"][0]["content"]
            if part["type"] == "image"
        ]
    elif format == ReplyFormat.OPENAI:
        images = [
            tuple(part["image_url"]["url"][len("data:") :].split(";base64,"))
            for part in appended[-1]["content"]
            if part["type"] == "image_url"
        ]
    elif format == ReplyFormat.OPENAI_RESPONSES:
        images = [
            tuple(part["image_url"][len("data:") :].split(";base64,"))
            for part in appended[0]["output"]
            if part["type"] == "input_image"
        ]
    else:  # Ollama images carry no type, and its models take PNG and JPEG only
        assert appended[0]["images"] == [JPEG, PNG]
        return
    assert images == [("image/jpeg", JPEG), ("image/png", PNG), ("image/webp", WEBP)]


def test_results_keep_the_tools_text_as_given() -> None:
    text = "line one\n\n  indented\tline two " + "x" * 20_000
    reply = ok(text)
    for format in PROVIDERS:
        appended = appended_in(format, [Answered("c", "t", reply)])
        assert texts_of(format, appended) == [text]


# -- errors the model can act on ----------------------------------------------------------


def test_invalid_arguments_names_the_problems_and_the_parameters() -> None:
    text = error_text(CASES["invalid_arguments"].error)
    assert text.startswith("error (invalid_arguments): ")
    lines = text.splitlines()
    assert "- device: 'oven' is not one of ['lamp', 'fan']" in lines
    assert "- device (string, required, one of: lamp, fan)" in lines
    assert "- level (integer): 0 to 100" in lines
    assert "- note (string|null)" in lines


def test_problems_the_message_already_names_are_not_repeated() -> None:
    said = failed(
        ErrorCode.INVALID_ARGUMENTS,
        "arguments for t do not match its schema: a: 'x' is not of type 'integer'",
        errors=[
            {"path": "a", "problem": "'x' is not of type 'integer'"},
            {"path": "b", "problem": "'y' is not of type 'integer'"},
        ],
    )
    lines = error_text(said.error).splitlines()
    assert lines[1:] == ["problems:", "- b: 'y' is not of type 'integer'"]


def test_invalid_arguments_from_the_validator_lists_what_the_tool_takes() -> None:
    schema = {
        "type": "object",
        "properties": {
            "device": {"type": "string", "enum": ["lamp", "fan"]},
            "level": {"type": "integer"},
        },
        "required": ["device"],
    }
    with pytest.raises(InvalidArguments) as raised:
        check_arguments("set_level", CompiledSchema("set_level", schema), {"level": "high"})
    # What the executor adds to every `invalid_arguments` of a known tool:
    raised.value.details.update(summarize(schema, build_shape(schema)).details())
    text = error_text(raised.value.body())
    assert text.startswith("error (invalid_arguments): ")
    assert "- device (string, required, one of: lamp, fan)" in text.splitlines()
    assert "- level (integer)" in text.splitlines()


def test_unknown_tool_names_the_candidates() -> None:
    text = error_text(CASES["unknown_tool"].error)
    assert text.splitlines()[-1].endswith("set_level")


@pytest.mark.parametrize("format", PROVIDERS)
def test_a_huge_error_is_bounded(format: ReplyFormat) -> None:
    hostile = failed(
        ErrorCode.INVALID_ARGUMENTS,
        "m" * 50_000,
        errors=[{"path": f"p{i}", "problem": "x" * 200} for i in range(500)],
        parameters=[
            {"name": f"n{i}", "type": "string", "enum": list(range(50)), "description": "d" * 999}
            for i in range(200)
        ],
    )
    appended = appended_in(format, [Answered("c", "t", hostile)])
    for item in appended:
        check(format, item)
    (text,) = texts_of(format, appended)
    assert len(text) <= MAX_ERROR_CHARS
    lines = text.splitlines()
    assert lines[0].startswith("error (invalid_arguments): ")
    # The huge message crowds out neither the problems nor the parameters.
    assert "problems:" in lines
    assert "parameters:" in lines
    assert lines[lines.index("parameters:") + 1].startswith("- n0 (string, one of: 0, 1, 2")


def test_details_of_any_json_shape_never_break_the_text() -> None:
    odd = failed(
        ErrorCode.INVALID_ARGUMENTS,
        "odd",
        errors=["not an object", {"path": None}, {"problem": {"nested": [1]}}],
        parameters=[3, {"name": 5}, {"name": "x", "type": ["string", None], "enum": [1, None]}],
    )
    lines = error_text(odd.error).splitlines()
    assert "- x (string, one of: 1, null)" in lines


# -- the documented examples --------------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "formats.md"
DOC_IDS = {
    ReplyFormat.ANTHROPIC: ("toolu_01", "toolu_02"),
    ReplyFormat.OPENAI: ("call_01", "call_02"),
    ReplyFormat.OPENAI_RESPONSES: ("call_01", "call_02"),
    ReplyFormat.OLLAMA: ("call_1", "call_2"),
}


@pytest.mark.parametrize("format", PROVIDERS)
def test_the_documented_example_is_what_the_code_appends(format: ReplyFormat) -> None:
    examples = dict(
        re.findall(r"<!-- appended: ([a-z-]+) -->\n```json\n(.*?)\n```", DOC.read_text(), re.S)
    )
    temperature = ok("21.5 °C in the kitchen")
    refused = failed(
        ErrorCode.INVALID_ARGUMENTS,
        "arguments for set_level do not match its schema: device: "
        "'oven' is not one of ['lamp', 'fan']",
        errors=[
            {
                "path": "device",
                "problem": "'oven' is not one of ['lamp', 'fan']",
                "expected": {"enum": ["lamp", "fan"]},
            }
        ],
        parameters=[
            {"name": "device", "type": "string", "required": True, "enum": ["lamp", "fan"]},
            {
                "name": "level",
                "type": "integer",
                "required": False,
                "description": "Brightness, 0 to 100.",
            },
        ],
    )
    first, second = DOC_IDS[format]
    calls = [
        Answered(first, "get_temperature", temperature),
        Answered(second, "set_level", refused),
    ]
    documented = json.loads(examples[format.value])
    assert documented == appended_in(format, calls)
    for item in documented:
        check(format, item)


# -- the checks themselves bite -----------------------------------------------------------


def test_the_sdk_checks_refuse_wrong_items() -> None:
    tool_result: dict[str, Any] = {"type": "tool_result", "tool_use_id": "t", "content": []}
    wrong_image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/tiff", "data": TIFF},
    }
    # Lazily validated: the adapter alone returns, iterating the content refuses it.
    lazy = ANTHROPIC_MESSAGE.validate_python(
        {"role": "user", "content": [{**tool_result, "content": [wrong_image]}]}
    )
    with pytest.raises(ValidationError):
        materialized(lazy)
    # Lenient about keys: a misspelled flag is dropped, the strict check sees it.
    misspelled = {"role": "user", "content": [{**tool_result, "is_eror": True}]}
    ANTHROPIC_MESSAGE.validate_python(misspelled)
    with pytest.raises(AssertionError):
        strictly(ANTHROPIC_MESSAGE, misspelled)
    with pytest.raises(ValidationError):  # a tool message answers a tool_call_id
        strictly(CHAT_MESSAGE, {"role": "tool", "content": "x"})
    with pytest.raises(ValidationError):  # tool messages carry no images in Chat Completions
        strictly(
            CHAT_MESSAGE,
            {
                "role": "tool",
                "tool_call_id": "c",
                "content": [{"type": "image_url", "image_url": {"url": "data:,"}}],
            },
        )
    with pytest.raises(ValidationError):
        strictly(
            RESPONSES_INPUT_ITEM, {"type": "function_call_output", "call_id": "c", "output": 5}
        )
    with pytest.raises(AssertionError):  # `tool_call_id` is Chat's name, not a Responses key
        strictly(
            RESPONSES_INPUT_ITEM,
            {"type": "function_call_output", "call_id": "c", "output": "x", "tool_call_id": "c"},
        )
    with pytest.raises(ValidationError):
        ollama_message({"role": "tool", "tool_name": "t", "content": 5})
    with pytest.raises(AssertionError):  # Chat's key on an Ollama message is dropped
        ollama_message({"role": "tool", "tool_name": "t", "content": "x", "tool_call_id": "c"})

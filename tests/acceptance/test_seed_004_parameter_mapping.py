"""Seed 004, the parameter mapping document: the analysis context a caller sends in
snake_case reaches the tool in the seed's internal camelCase shape, through a worker over
MQTT; and its validation rules, under the `strict` guard preset that applies them.

The tool is `escalate_analysis` (the document's first), a local tool declaring the
document's `ClaudeCodeContext` as its schema and answering with what it received. The
transformations are configuration, as docs/normalization.md's example writes them: two
static map entries (`stuck_description`, `code_scope`), respelling for the rest, lenient
findings, and `focusArea.files` as paths. The worker runs `[guards] preset = "strict"`:
the seed's string, array and file path rules, and its words for a refusal. The default
guards are looser (markup, templates, `..` in prose and paths of any characters pass):
see docs/normalization.md and tests/normalization/test_guards_strict.py.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from tests.acceptance.parts import call
from tests.support.harness import Broker, make_settings, running_worker
from tests.support.mqtt import Caller
from toolbus.backends.local.functions import LocalTool
from toolbus.worker.service import Worker

STRINGS = {"type": "array", "items": {"type": "string"}}
PLACE = {
    "type": "object",
    "properties": {
        "file": {"type": "string"},
        "line": {"type": "integer"},
        "functionName": {"type": "string"},
    },
    "required": ["file"],
}
FINDING = {
    "type": "object",
    "properties": {
        "type": {"type": "string"},
        "severity": {"type": "string"},
        "location": PLACE,
        "description": {"type": "string"},
        "evidence": STRINGS,
    },
    "required": ["type", "severity", "description"],
}
CONTEXT = {
    "type": "object",
    "properties": {
        "attemptedApproaches": STRINGS,
        "partialFindings": {"type": "array", "items": FINDING},
        "stuckPoints": STRINGS,
        "focusArea": {
            "type": "object",
            "properties": {
                "files": STRINGS,
                "entryPoints": {"type": "array", "items": PLACE},
                "serviceNames": {**STRINGS, "default": []},
                "searchPatterns": STRINGS,
            },
            "required": ["files", "entryPoints"],
        },
        "analysisBudgetRemaining": {"type": "number", "default": 60},
    },
    "required": ["attemptedApproaches", "partialFindings", "stuckPoints", "focusArea"],
}


async def _received(**arguments: Any) -> dict[str, Any]:
    return {"received": arguments}


ESCALATE = LocalTool(
    name="escalate_analysis",
    description="Escalate an analysis that got stuck; answers with what it received.",
    input_schema={
        "type": "object",
        "properties": {"analysisContext": CONTEXT},
        "required": ["analysisContext"],
    },
    fn=_received,
)
CONFIG = {
    "guards": {"preset": "strict"},
    "argument_maps": {
        "escalate_analysis": {
            "analysisContext.stuck_description": "stuckPoints",
            "analysisContext.code_scope": "focusArea",
        }
    },
    "tools": {
        "escalate_analysis": {
            "rename_arguments": True,  # a local tool: renaming is asked for, not assumed
            "parameters": {
                "analysisContext.partialFindings": {"lenient": True},
                "analysisContext.focusArea.files": {"path": True},
            },
        }
    },
}

# The document's "Correct External API Call", and its "Internal TypeScript Object".
SEED_FINDING: dict[str, Any] = {
    "type": "performance",
    "severity": "medium",
    "location": {"file": "src/services/ApiService.ts", "line": 145, "functionName": "fetchData"},
    "description": "Synchronous database call in async function",
    "evidence": ["Line 145: db.query() should be await db.query()"],
}
EXTERNAL: dict[str, Any] = {
    "analysisContext": {
        "attempted_approaches": ["Analyzed main function flow", "Checked error handling patterns"],
        "partial_findings": [SEED_FINDING],
        "stuck_description": "Unable to trace execution path through Promise.all() chains",
        "code_scope": {
            "files": ["src/services/ApiService.ts", "src/utils/DatabaseUtil.ts"],
            "entryPoints": [
                {"file": "src/services/ApiService.ts", "line": 42, "functionName": "handleRequest"}
            ],
            "serviceNames": ["ApiService", "DatabaseService"],
        },
    }
}
INTERNAL: dict[str, Any] = {
    "attemptedApproaches": ["Analyzed main function flow", "Checked error handling patterns"],
    "partialFindings": [SEED_FINDING],
    "stuckPoints": ["Unable to trace execution path through Promise.all() chains"],
    "focusArea": EXTERNAL["analysisContext"]["code_scope"],
    "analysisBudgetRemaining": 60,
}


@pytest_asyncio.fixture(scope="module")
async def worker(broker: Broker) -> AsyncIterator[Worker]:
    async with running_worker(make_settings(broker, **CONFIG), [ESCALATE]) as running:
        yield running


def context(**changes: Any) -> dict[str, Any]:
    """The external call with some of its `analysisContext` fields replaced."""
    arguments = copy.deepcopy(EXTERNAL)
    arguments["analysisContext"].update(changes)
    return arguments


async def escalate(client: Caller, worker: Worker, arguments: dict[str, Any]) -> dict[str, Any]:
    return await call(client, worker, "escalate_analysis", arguments)


def received(reply: dict[str, Any]) -> dict[str, Any]:
    assert reply["ok"], reply
    return dict(reply["result"]["structured"]["received"]["analysisContext"])


def report(reply: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """{path: (to, rule)} of every change reported."""
    return {e["path"]: (e["to"], e["rule"]) for e in reply["normalized"]}


def violations(reply: dict[str, Any]) -> list[tuple[str, str, Any]]:
    assert reply["error"]["code"] == "invalid_arguments", reply
    return [(v["path"], v["rule"], v.get("limit")) for v in reply["error"]["details"]["violations"]]


async def test_attempted_approaches(caller: Caller, worker: Worker) -> None:
    """Seed 004_80f8cea26bef6723.txt: "attempted_approaches → attemptedApproaches".

    The array arrives as it was sent, under the schema's name; each string is checked
    (a control character is refused).
    """
    reply = await escalate(caller, worker, EXTERNAL)
    assert received(reply)["attemptedApproaches"] == INTERNAL["attemptedApproaches"]
    path = "arguments.analysisContext.attempted_approaches"
    assert report(reply)[path] == ("attemptedApproaches", "snake_to_camel")
    unsafe = await escalate(caller, worker, context(attempted_approaches=["ok", "bell\x07"]))
    assert [rule for _, rule, _ in violations(unsafe)] == ["forbidden_characters"]


async def test_partial_findings(caller: Caller, worker: Worker) -> None:
    """Seed 004_80f8cea26bef6723.txt: "partial_findings → partialFindings".

    Each finding is checked against the Finding schema; an invalid one is skipped and
    reported (`lenient_drop`), the call goes on.
    """
    findings = [SEED_FINDING, {"type": "bug"}]
    reply = await escalate(caller, worker, context(partial_findings=findings))
    assert received(reply)["partialFindings"] == INTERNAL["partialFindings"]
    assert "lenient_drop" in {rule for _, rule in report(reply).values()}, reply["normalized"]


async def test_stuck_description(caller: Caller, worker: Worker) -> None:
    """Seed 004_80f8cea26bef6723.txt: "stuck_description → stuckPoints".

    One string becomes a one-item array (the static map renames, the schema's shape
    wraps); an array is taken as it is.
    """
    reply = await escalate(caller, worker, EXTERNAL)
    assert received(reply)["stuckPoints"] == INTERNAL["stuckPoints"]
    rules = {rule for _, rule in report(reply).values()}
    assert {"static_map", "wrap_array"} <= rules
    both = await escalate(caller, worker, context(stuck_description=["one", "two"]))
    assert received(both)["stuckPoints"] == ["one", "two"]


async def test_code_scope(caller: Caller, worker: Worker) -> None:
    """Seed 004_80f8cea26bef6723.txt: "code_scope → focusArea".

    The container is renamed, its properties mapped (`service_names` respelled), and an
    optional array left out gets its default, empty.
    """
    scope = {"files": ["src/a.ts"], "entry_points": [{"file": "src/a.ts", "line": 1}]}
    reply = await escalate(caller, worker, context(code_scope=scope))
    assert received(reply)["focusArea"] == {
        "files": ["src/a.ts"],
        "entryPoints": [{"file": "src/a.ts", "line": 1}],
        "serviceNames": [],
    }
    assert report(reply)["arguments.analysisContext.code_scope"] == ("focusArea", "static_map")


async def test_strings_up_to_2000_characters(caller: Caller, worker: Worker) -> None:
    """Seed 004_80f8cea26bef6723.txt: "Maximum length: 2000 characters"."""
    assert (await escalate(caller, worker, context(stuck_description="x" * 2000)))["ok"]
    refused = await escalate(caller, worker, context(stuck_description="x" * 2001))
    assert violations(refused) == [
        ("arguments.analysisContext.stuckPoints[0]", "max_string_length", 2000)
    ]


async def test_angle_brackets_and_braces_are_refused(caller: Caller, worker: Worker) -> None:
    """Seed 004_80f8cea26bef6723.txt: "Regex pattern: `^[^<>{}]*$` (no angle brackets or braces)".

    "Issue: `String contains potentially unsafe characters`", "Cause: Input contains `<`,
    `>`, `{`, or `}` characters", "Solution: Remove or escape special characters".
    """
    for text in ("<script>alert(1)</script>", "{{7*7}}", "a > b", "{}"):
        refused = await escalate(caller, worker, context(attempted_approaches=["ok", text]))
        assert violations(refused) == [
            ("arguments.analysisContext.attemptedApproaches[1]", "forbidden_characters", None)
        ], text
        assert refused["error"]["details"]["violations"][0]["reason"] == "unsafe_characters"
        assert "String contains potentially unsafe characters" in refused["error"]["message"]
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    reply = await escalate(caller, worker, context(attempted_approaches=[escaped]))
    assert received(reply)["attemptedApproaches"] == [escaped]


async def test_traversal_is_refused(caller: Caller, worker: Worker) -> None:
    """Seed 004_80f8cea26bef6723.txt: "Path traversal protection: no `..` sequences".

    "Issue: `Path traversal detected`", "Cause: File path contains `..` sequences",
    "Solution: Use absolute paths without parent directory references". A string
    validation rule in the seed, so in any string; in `focusArea.files` (a path
    parameter) in any encoding too.
    """
    cases: list[tuple[dict[str, Any], str]] = [
        ({"code_scope": {"files": ["../../etc/passwd"], "entryPoints": []}}, "files[0]"),
        ({"code_scope": {"files": ["src/%2e%2e/%2e%2e/etc"], "entryPoints": []}}, "files[0]"),
        ({"stuck_description": "went .. nowhere"}, "stuckPoints[0]"),
    ]
    for changes, where in cases:
        refused = await escalate(caller, worker, context(**changes))
        found = {(path, rule) for path, rule, _ in violations(refused)}
        path = "arguments.analysisContext." + ("focusArea." if "files" in where else "") + where
        assert (path, "path_traversal") in found, changes
        assert "Path traversal detected" in refused["error"]["message"]
    place = {"file": "/srv/repo/src/services/ApiService.ts", "line": 42}
    scope = {"files": ["src/services/ApiService.ts"], "entryPoints": [place]}
    reply = await escalate(caller, worker, context(code_scope=scope))
    assert received(reply)["focusArea"]["entryPoints"] == [place]


async def test_arrays_up_to_100_items(caller: Caller, worker: Worker) -> None:
    """Seed 004_80f8cea26bef6723.txt: "Maximum array size: 100 items"."""
    assert (await escalate(caller, worker, context(attempted_approaches=["a"] * 100)))["ok"]
    refused = await escalate(caller, worker, context(attempted_approaches=["a"] * 101))
    assert violations(refused) == [
        ("arguments.analysisContext.attemptedApproaches", "max_array_length", 100)
    ]


async def test_file_paths_up_to_255_characters_of_the_seeds_alphabet(
    caller: Caller, worker: Worker
) -> None:
    """Seed 004_80f8cea26bef6723.txt: "File paths: maximum 255 characters, alphanumeric + `._-/`".

    The seed's file paths are its `files` arrays and `file` fields: the values of every
    field of those names are judged as file paths.
    """
    longest = "src/" + "d" * 248 + ".ts"  # 255 characters
    scope = {"files": [longest], "entryPoints": [{"file": longest, "line": 1}]}
    assert received(await escalate(caller, worker, context(code_scope=scope)))["focusArea"][
        "files"
    ] == [longest]
    base = "arguments.analysisContext.focusArea"
    for bad, rule in (
        ("src/my file (copy).ts", "path_invalid"),
        (longest + "x", "max_path_length"),
    ):
        in_files = {"files": [bad], "entryPoints": []}
        refused = await escalate(caller, worker, context(code_scope=in_files))
        assert [(p, r) for p, r, _ in violations(refused)] == [(f"{base}.files[0]", rule)]
        in_entry = {"files": [], "entryPoints": [{"file": bad, "line": 1}]}
        refused = await escalate(caller, worker, context(code_scope=in_entry))
        assert [(p, r) for p, r, _ in violations(refused)] == [
            (f"{base}.entryPoints[0].file", rule)
        ]


async def test_findings_take_the_array_limit(caller: Caller, worker: Worker) -> None:
    """Seed 004_80f8cea26bef6723.txt: "Finding objects: maximum 50 findings per array".

    Deliberate difference: findings are an array like any other, so the default limit
    is 100, not 50 (`[tools.NAME.parameters."analysisContext.partialFindings"]
    max_array_length = 50` sets the seed's): 51 pass, 101 are refused.
    """
    fifty_one = await escalate(caller, worker, context(partial_findings=[SEED_FINDING] * 51))
    assert len(received(fifty_one)["partialFindings"]) == 51
    too_many = await escalate(caller, worker, context(partial_findings=[SEED_FINDING] * 101))
    assert [rule for _, rule, _ in violations(too_many)] == ["max_array_length"]


async def test_the_documents_example_arrives_as_its_internal_object(
    caller: Caller, worker: Worker
) -> None:
    """Seed 004_80f8cea26bef6723.txt: "Correct External API Call".

    The document's external call, sent as written, reaches the tool as the document's
    internal object, `analysisBudgetRemaining: 60` included (the schema's default).
    """
    reply = await escalate(caller, worker, EXTERNAL)
    assert received(reply) == INTERNAL

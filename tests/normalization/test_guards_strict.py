"""The `strict` guard preset (issue 24.7): the parameter-mapping seed's rules, on demand.

In-process through the pipeline (`Rig`) for each rule, the defaults that let ordinary
values through, a tool's preset against the global one, keys, and the pairs with
normalization and deduplication; over a real mosquitto, the audit's four attacks, and
the look-alikes docs/normalization.md says pass (the rules are literal; a path guard
decodes). The seed's scenario itself runs in tests/acceptance/test_seed_004_*.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from tests.calls.test_pipeline import Rig, rig_for
from tests.support.harness import Broker, make_settings, running_worker
from tests.support.mqtt import Caller
from tests.support.tools import Probe
from toolbus.backends.local.functions import LocalTool
from toolbus.config import ConfigError, load_settings
from toolbus.dedup import MemoryStore

NORMALIZATION_DOC = Path(__file__).parents[2] / "docs" / "normalization.md"
OPEN_OBJECT = {"type": "object", "additionalProperties": True}
STRINGS = {"type": "array", "items": {"type": "string"}}
SCHEMA = {
    "type": "object",
    "properties": {
        "text": {"type": "string"},
        "tags": STRINGS,
        "file": {"type": "string"},
        "files": STRINGS,
        "meta": OPEN_OBJECT,
    },
}
PATH_310 = "src/" + "d" * 303 + ".ts"  # the audit's 310-character path
ATTACKS: list[tuple[dict[str, Any], list[tuple[str, str, str | None]]]] = [
    (
        {"text": "<script>alert(1)</script>"},
        [("arguments.text", "forbidden_characters", "unsafe_characters")],
    ),
    ({"text": "{{7*7}}"}, [("arguments.text", "forbidden_characters", "unsafe_characters")]),
    ({"text": "../../etc/passwd"}, [("arguments.text", "path_traversal", "traversal")]),
    ({"files": [PATH_310]}, [("arguments.files[0]", "max_path_length", None)]),
]


class Counted:
    """A local tool that keeps what it was given: a refused call leaves it empty."""

    def __init__(self, name: str = "note") -> None:
        self.received: list[dict[str, Any]] = []

        async def run(**arguments: Any) -> dict[str, Any]:
            self.received.append(arguments)
            return {"received": arguments}

        self.tool = LocalTool(name, "Keeps a note; answers with what it got.", SCHEMA, run)


def strict_rig(*tools: Counted, **overrides: Any) -> Rig:
    """A pipeline with `tools` (one `note` when none), strict globally unless overridden."""
    local = [t.tool for t in tools] or [Counted().tool]
    # Room for the seed's limits at once (2000 characters, 100 items).
    settings: dict[str, Any] = {
        "guards": {"preset": "strict"},
        "max_payload_bytes": 16384,
        **overrides,
    }
    return rig_for(local, Probe(), **settings)


def violations(reply: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    assert reply["error"]["code"] == "invalid_arguments", reply
    return [
        (v["path"], v["rule"], v.get("reason")) for v in reply["error"]["details"]["violations"]
    ]


# -- each rule under strict --------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        *ATTACKS,
        ({"text": "x" * 2001}, [("arguments.text", "max_string_length", None)]),
        ({"tags": ["a"] * 101}, [("arguments.tags", "max_array_length", None)]),
        ({"file": "f" * 256}, [("arguments.file", "max_path_length", None)]),
        ({"files": ["src/my file.ts"]}, [("arguments.files[0]", "path_invalid", "characters")]),
        ({"file": "C:\\x.ts"}, [("arguments.file", "path_invalid", "characters")]),
        ({"tags": ["ok", "a..b"]}, [("arguments.tags[1]", "path_traversal", "traversal")]),
    ],
)
async def test_strict_refuses_each_of_the_seeds_rules(
    arguments: dict[str, Any], expected: list[tuple[str, str, str | None]]
) -> None:
    note = Counted()
    rig = strict_rig(note)
    reply = await rig.call("note", {"arguments": arguments})
    assert violations(reply) == expected
    assert note.received == []


async def test_strict_passes_what_is_within_the_seeds_rules() -> None:
    note = Counted()
    rig = strict_rig(note)
    within = {
        "text": "x" * 2000,
        "tags": ["Line 145: db.query() should be await db.query()"] * 100,
        "file": "f" * 255,
        "files": ["src/services/ApiService.ts", "/srv/repo/a-b_c.d/e"],
        "meta": {"one.two": "single . dots", "x-y": 1},
    }
    assert (await rig.call("note", {"arguments": within}))["ok"]
    assert note.received == [within]


async def test_the_defaults_let_ordinary_values_through() -> None:
    """The default preset keeps only the lengths and control characters: markup,
    templates, prose with `..` and paths with spaces reach the tool."""
    note = Counted()
    rig = rig_for([note.tool], Probe())
    ordinary = {
        "text": "<b>bold</b> {{name}} went .. nowhere",
        "tags": ["a < b", "{}"],
        "file": "src/my file (copy).ts",
        "files": [PATH_310],
        "meta": {"<key>": "{x}", "a..b": 1},
    }
    assert (await rig.call("note", {"arguments": ordinary}))["ok"]
    assert note.received == [ordinary]
    long_key = await rig.call("note", {"arguments": {"meta": {"k" * 2001: 1}}})
    assert violations(long_key) == [("arguments.meta", "max_string_length", None)]


async def test_the_seeds_words_are_in_the_message() -> None:
    """Seed 004: "String contains potentially unsafe characters", "Path traversal detected"."""
    rig = strict_rig()
    unsafe = await rig.call("note", {"arguments": {"text": "<script>"}})
    assert "String contains potentially unsafe characters" in unsafe["error"]["message"]
    traversal = await rig.call("note", {"arguments": {"text": "a/../b"}})
    assert "Path traversal detected" in traversal["error"]["message"]


# -- a tool's preset and the global one --------------------------------------------------


async def test_a_tools_preset_wins_over_the_global_one() -> None:
    loose, tight = Counted("loose"), Counted("tight")
    strict_globally = strict_rig(loose, tight, tools={"loose": {"guards": {"preset": "default"}}})
    default_globally = strict_rig(
        loose, tight, guards={}, tools={"tight": {"guards": {"preset": "strict"}}}
    )
    for rig in (strict_globally, default_globally):
        assert (await rig.call("loose", {"arguments": {"text": "<b>"}}))["ok"]
        refused = await rig.call("tight", {"arguments": {"text": "<b>"}})
        assert violations(refused) == [
            ("arguments.text", "forbidden_characters", "unsafe_characters")
        ]
    assert len(loose.received) == 2 and tight.received == []


async def test_a_tools_own_limits_narrow_its_preset() -> None:
    """The names the schema declares are the tool's own: a string limit shorter than
    `files` bounds the values and the keys the caller chose, not them."""
    rig = strict_rig(tools={"note": {"guards": {"max_string_length": 4}}})
    assert (await rig.call("note", {"arguments": {"files": ["a.ts"]}}))["ok"]
    too_long = await rig.call("note", {"arguments": {"text": "x" * 5}})
    assert violations(too_long) == [("arguments.text", "max_string_length", None)]
    chosen = await rig.call("note", {"arguments": {"meta": {"color": 1}}})
    assert violations(chosen) == [("arguments.meta", "max_string_length", None)]


# -- keys --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "rule", "reason"),
    [
        ("<img>", "forbidden_characters", "unsafe_characters"),
        ("{{7*7}}", "forbidden_characters", "unsafe_characters"),
        ("a..b", "path_traversal", "traversal"),
        ("k" * 2001, "max_string_length", None),
    ],
)
async def test_strict_judges_keys_as_it_judges_values(
    key: str, rule: str, reason: str | None
) -> None:
    """At the top of an open schema and inside an object the schema leaves open: the
    settled walk (no properties to respell) must not pass them either."""
    note = Counted()
    rig = strict_rig(note)
    top = await rig.call("note", {"arguments": {"text": "ok", key: 1}})
    inner = await rig.call("note", {"arguments": {"meta": {"fine": 1, key: 1}}})
    assert violations(top) == [("arguments", rule, reason)]
    assert violations(inner) == [("arguments.meta", rule, reason)]
    assert inner["error"]["details"]["violations"][0]["key"] == 1  # its place, not its text
    assert note.received == []


@pytest.mark.parametrize("key", ["k" * 2001, "bell\x07"])
async def test_the_defaults_bound_keys_as_they_bound_values(key: str) -> None:
    note = Counted()
    rig = rig_for([note.tool], Probe())
    reply = await rig.call("note", {"arguments": {"meta": {key: 1}}})
    assert [(path, rule) for path, rule, _ in violations(reply)] == [
        ("arguments.meta", "max_string_length" if len(key) > 2000 else "forbidden_characters")
    ]
    assert note.received == []


# -- with normalization ------------------------------------------------------------------


async def test_keys_are_judged_after_renaming_as_the_tool_receives_them() -> None:
    """`te..xt` is a spelling of the declared `text`: the tool gets `text`, nothing to
    refuse. A key that stays as sent is judged as sent."""
    note = Counted()
    rig = strict_rig(note, tools={"note": {"rename_arguments": True}})
    renamed = await rig.call("note", {"arguments": {"te..xt": "hi"}})
    assert renamed["ok"] and note.received == [{"text": "hi"}]
    assert [e["rule"] for e in renamed["normalized"]] == ["spelling"]
    kept = await rig.call("note", {"arguments": {"meta": {"te..xt": "hi"}}})
    assert violations(kept) == [("arguments.meta", "path_traversal", "traversal")]


async def test_a_nested_objects_keys_and_values_are_judged() -> None:
    rig = strict_rig()
    nested = {"meta": {"inner": {"deep": [{"<k>": "v", "ok": "{{x}}"}]}}}
    reply = await rig.call("note", {"arguments": nested})
    assert violations(reply) == [
        ("arguments.meta.inner.deep[0]", "forbidden_characters", "unsafe_characters"),
        ("arguments.meta.inner.deep[0].ok", "forbidden_characters", "unsafe_characters"),
    ]


async def test_shapes_are_made_first_then_judged() -> None:
    """A string wrapped into an array, or JSON text parsed into one, is judged as the
    array the tool would get (bound and items); a JSON object's text is judged as the
    object (its braces are JSON, its keys and values are judged)."""
    note = Counted()
    rig = strict_rig(note)
    wrapped = await rig.call("note", {"arguments": {"tags": "one"}})
    assert wrapped["ok"] and note.received[-1] == {"tags": ["one"]}
    unsafe = await rig.call("note", {"arguments": {"tags": "<b>"}})
    assert violations(unsafe) == [
        ("arguments.tags[0]", "forbidden_characters", "unsafe_characters")
    ]
    too_many = await rig.call("note", {"arguments": {"tags": json.dumps(["a"] * 101)}})
    assert violations(too_many) == [("arguments.tags", "max_array_length", None)]
    parsed = await rig.call("note", {"arguments": {"meta": '{"a": 1}'}})
    assert parsed["ok"] and note.received[-1] == {"meta": {"a": 1}}
    bad_key = await rig.call("note", {"arguments": {"meta": '{"<a>": 1}'}})
    assert violations(bad_key) == [("arguments.meta", "forbidden_characters", "unsafe_characters")]
    assert len(note.received) == 2


async def test_a_parameter_marked_path_is_a_file_path_under_strict() -> None:
    rig = strict_rig(tools={"note": {"parameters": {"text": {"path": True}}}})
    reply = await rig.call("note", {"arguments": {"text": "src/%2e%2e/x"}})
    assert violations(reply) == [
        ("arguments.text", "path_traversal", "traversal"),  # the path guard's, decoded
        ("arguments.text", "path_invalid", "characters"),  # `%`: not among the seed's
    ]


# -- with deduplication ------------------------------------------------------------------


async def test_a_refused_call_does_not_claim_its_id() -> None:
    note = Counted()
    rig = rig_for([note.tool], Probe(), store=MemoryStore("w1"), guards={"preset": "strict"})
    refused = await rig.call("note", {"id": "s1", "arguments": {"text": "{{7*7}}"}})
    assert violations(refused) == [("arguments.text", "forbidden_characters", "unsafe_characters")]
    again = await rig.call("note", {"id": "s1", "arguments": {"text": "49"}})
    assert again["ok"] and again["replayed"] is False
    assert note.received == [{"text": "49"}]


# -- configuration -----------------------------------------------------------------------


def test_an_unknown_preset_is_a_configuration_error(tmp_path: Path) -> None:
    config = tmp_path / "toolbus.toml"
    config.write_text('[guards]\npreset = "strcit"\n\n[tools.note.guards]\npreset = "paranoid"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    found = {p.key: p for p in caught.value.problems}
    assert set(found) == {"guards.preset", "tools.note.guards.preset"}
    assert {p.kind for p in found.values()} == {"invalid_value"}
    assert all("strict" in p.expected for p in found.values())


# -- over a real broker ------------------------------------------------------------------


async def test_the_audits_four_attacks_never_reach_a_tool(broker: Broker, caller: Caller) -> None:
    """Issue 24.7: `<script>`, `{{7*7}}`, `..` and a 310-character path reached a tool;
    under `strict` each is refused and the counting tool never runs."""
    note = Counted()
    settings = make_settings(broker, guards={"preset": "strict"})
    async with running_worker(settings, [note.tool]) as worker:
        for arguments, expected in ATTACKS:
            reply = await caller.call_tool(worker.topics, "note", arguments)
            assert violations(reply) == expected
        assert note.received == []
        assert (await caller.call_tool(worker.topics, "note", {"text": "7*7"}))["ok"]
    assert note.received == [{"text": "7*7"}]


def literal_rules_table() -> list[tuple[str, str, str, str]]:
    """docs/normalization.md's look-alikes that pass `strict` (sent, read as, and the rule
    and reason of their refusal with `path = true`), read from its table."""
    lines = NORMALIZATION_DOC.read_text().splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith("| sent | read as")), None)
    assert header is not None, "docs/normalization.md lists no look-alikes that pass `strict`"
    rows: list[tuple[str, str, str, str]] = []
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        sent, read_as, passes, refused = line.strip("|").split(" | ")
        assert passes.strip() == "pass", line
        [sent_value], [read_value] = (
            re.findall(r"`([^`]*)`", sent),
            re.findall(r"`([^`]*)`", read_as),
        )
        rule, reason = re.findall(r"`([^`]*)`", refused)
        rows.append((sent_value, read_value, rule, reason))
    return rows


def decoded(text: str) -> str:
    """Percent-decoding and NFKC, until stable: what a tool that undoes them reads."""
    while (again := unicodedata.normalize("NFKC", unquote(text))) != text:
        text = again
    return text


async def test_the_strict_rules_are_literal_as_documented(broker: Broker, caller: Caller) -> None:
    """docs/normalization.md's table, over a real broker: each look-alike reads as what
    `strict` refuses, passes its character rules as sent (the tool gets it unchanged), and
    is refused by the path guard, which decodes, where the parameter is marked a path."""
    rows = literal_rules_table()
    looks_like = {read_as[0] if read_as[0] in "<{" else ".." for _, read_as, _, _ in rows}
    assert looks_like == {"<", "{", ".."}, rows
    note, filer = Counted(), Counted("filer")
    settings = make_settings(
        broker,
        guards={"preset": "strict"},
        tools={"filer": {"parameters": {"text": {"path": True}}}},
    )
    async with running_worker(settings, [note.tool, filer.tool]) as worker:
        for sent, read_as, rule, reason in rows:
            assert decoded(sent) == read_as and sent != read_as
            meant = await caller.call_tool(worker.topics, "note", {"text": read_as})
            assert not meant["ok"], read_as  # what it reads as is refused
            passed = await caller.call_tool(worker.topics, "note", {"text": sent})
            assert passed["ok"], (sent, passed)
            assert note.received[-1] == {"text": sent}
            refused = await caller.call_tool(worker.topics, "filer", {"text": sent})
            assert ("arguments.text", rule, reason) in violations(refused), (sent, refused)
    assert filer.received == []

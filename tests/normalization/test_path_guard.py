"""The path guard (normalization/paths.py) through the executor: each audit reproduction.

Issue 11 found `%2e%2e/`, `file:///etc/passwd`, `~/.ssh/id_rsa`, fullwidth dots (U+FF0E) and
`.. /` passing, and relative paths reaching the tool unanchored. Each is listed here
with the rule and reason it now gets; tests/normalization/test_path_properties.py generates the rest.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.support.normalize_cases import mcp_tool, run
from toolbus.config import ParameterSettings, Settings
from toolbus.wire.contracts import ErrorCode

SCHEMA = {
    "type": "object",
    "properties": {
        "file": {"type": "string"},
        "files": {"type": "array", "items": {"type": "string"}},
        "note": {"type": "string"},
    },
}


def settings(roots: list[str] | None = None, **parameter: Any) -> Settings:
    path = {"path": True, "allowed_roots": ["/srv/repo"] if roots is None else roots}
    return Settings.model_validate(
        {
            "tools": {
                "read_file": {"parameters": {"file": path | parameter, "files": path | parameter}}
            }
        }
    )


async def refusal(arguments: dict[str, Any], config: Settings | None = None) -> dict[str, Any]:
    outcome = await run(config or settings(), mcp_tool("read_file", SCHEMA), arguments)
    assert outcome.error is not None and outcome.error.code is ErrorCode.INVALID_ARGUMENTS
    [violation] = outcome.error.details["violations"]
    assert isinstance(violation, dict)
    return violation


async def passed(arguments: dict[str, Any], config: Settings | None = None) -> dict[str, Any]:
    outcome = await run(config or settings(), mcp_tool("read_file", SCHEMA), arguments)
    assert outcome.ok, outcome.error and outcome.error.details
    assert outcome.result is not None and isinstance(outcome.result.structured, dict)
    return outcome.result.structured


@pytest.mark.parametrize(
    ("attempt", "rule", "reason"),
    [
        # The audit's reproductions.
        ("%2e%2e/%2e%2e/etc/passwd", "path_traversal", "traversal"),
        ("file:///etc/passwd", "path_outside_roots", "outside_roots"),
        ("~/.ssh/id_rsa", "path_outside_roots", "home"),
        ("\uff0e\uff0e/\uff0e\uff0e/etc/passwd", "path_traversal", "traversal"),
        (".. /.. /etc/passwd", "path_traversal", "traversal"),
        # Their relatives.
        ("%252e%252e%252fetc", "path_traversal", "traversal"),
        ("\uff05\uff12\uff45\uff05\uff12\uff45/etc", "path_traversal", "traversal"),
        ("..\\..\\etc\\passwd", "path_traversal", "traversal"),
        ("\u2025/etc", "path_traversal", "traversal"),
        (".../etc", "path_traversal", "traversal"),
        ("/srv/repo/../../etc/passwd", "path_traversal", "traversal"),
        ("/srv/repository/x", "path_outside_roots", "outside_roots"),
        ("file://evil.example/srv/repo/x", "path_outside_roots", "remote_host"),
        ("~root/.ssh/id_rsa", "path_outside_roots", "home"),
        ("%7e/.ssh/id_rsa", "path_outside_roots", "home"),
        ("C:\\Windows\\win.ini", "path_outside_roots", "drive"),
        ("\\\\server\\share\\x", "path_outside_roots", "unc"),
        ("https://example.com/x", "path_invalid", "url"),
        ("src/a%00.py", "path_invalid", "control_characters"),
        ("src/\u202eyp.exe", "path_invalid", "control_characters"),
        ("%c0%ae%c0%ae/etc", "path_invalid", "encoding"),
        ("%u002e%u002e/etc", "path_invalid", "encoding"),
        ("%2525252e%2525252e/etc", "path_invalid", "encoding"),
    ],
)
async def test_each_attempt_is_refused_with_its_reason(
    attempt: str, rule: str, reason: str
) -> None:
    violation = await refusal({"file": attempt})
    assert (violation["path"], violation["rule"], violation["reason"]) == (
        "arguments.file",
        rule,
        reason,
    )


async def test_a_refusal_names_what_was_decoded_and_the_roots() -> None:
    violation = await refusal({"files": ["src/ok.py", "file:///%2e%2e/etc"]})
    assert violation["path"] == "arguments.files[1]"
    assert violation["decoded"] == ["percent", "file_url"]
    encoded = await refusal({"file": "/etc/passwd"})
    assert encoded["allowed_roots"] == ["/srv/repo"] and encoded["decoded"] == []


async def test_relative_paths_are_anchored_to_the_first_root_and_reported() -> None:
    config = settings(["/srv/repo", "/var/data"])
    outcome = await run(
        config,
        mcp_tool("read_file", SCHEMA),
        {"files": ["src/cache.py", "/var/data/x.csv", "src%2Fa b .py", "file:///srv/repo/y"]},
    )
    assert outcome.ok and outcome.result is not None
    assert outcome.result.structured == {
        "files": [
            "/srv/repo/src/cache.py",
            "/var/data/x.csv",
            "/srv/repo/src/a b .py",
            "/srv/repo/y",
        ]
    }
    report = {e.path: (e.from_, e.to) for e in outcome.normalized if e.rule == "path_canonical"}
    assert report == {
        "arguments.files[0]": ("anchored", "under /srv/repo"),
        "arguments.files[2]": ("percent, anchored", "under /srv/repo"),
        "arguments.files[3]": ("file_url", "under /srv/repo"),
    }


async def test_canonical_paths_pass_unchanged_and_unreported() -> None:
    config = settings(["/srv/repo"])
    outcome = await run(config, mcp_tool("read_file", SCHEMA), {"file": "/srv/repo/src/a.py"})
    assert outcome.ok and outcome.result is not None
    assert outcome.result.structured == {"file": "/srv/repo/src/a.py"}
    assert outcome.normalized == []


async def test_without_roots_relative_paths_pass_and_absolute_ones_do_not() -> None:
    config = settings([])
    assert await passed({"file": "src\\.\\cache.py"}, config) == {"file": "src/cache.py"}
    assert (await refusal({"file": "/srv/repo/x"}, config))["reason"] == "outside_roots"
    assert (await refusal({"file": "a/../../b"}, config))["reason"] == "traversal"


async def test_names_that_only_look_odd_pass() -> None:
    for name in ("..hidden", "a..b", ".env", "~backup", "notes:2024.txt", "caf\u00e9.md"):
        assert await passed({"file": f"docs/{name}"}) == {"file": f"/srv/repo/docs/{name}"}


async def test_the_forbidden_patterns_hold_for_the_decoded_path() -> None:
    config = settings(forbidden_pattern="[;|]")
    violation = await refusal({"file": "src/a%3Brm"}, config)
    assert (violation["rule"], violation["pattern"]) == ("forbidden_characters", "[;|]")


async def test_an_unmarked_parameter_is_not_a_path() -> None:
    assert await passed({"note": "../../etc/passwd"}) == {"note": "../../etc/passwd"}


# -- configuration -----------------------------------------------------------------


def test_roots_are_normalized() -> None:
    param = ParameterSettings(path=True, allowed_roots=["/srv//repo/./", "/"])
    assert param.allowed_roots == ["/srv/repo", "/"]


@pytest.mark.parametrize(
    "root", ["srv/repo", "~/work", "/srv/../etc", "/srv/r%2e", "/srv\\repo", "/srv/\uff52"]
)
def test_roots_that_could_never_match_are_refused(root: str) -> None:
    with pytest.raises(ValidationError, match="allowed root"):
        ParameterSettings(path=True, allowed_roots=[root])


async def test_roots_make_a_path_parameter_by_themselves() -> None:
    config = Settings.model_validate(
        {"tools": {"read_file": {"parameters": {"file": {"allowed_roots": ["/srv/repo"]}}}}}
    )
    assert (await refusal({"file": "%2e%2e/etc"}, config))["rule"] == "path_traversal"
    assert await passed({"file": "a.py"}, config) == {"file": "/srv/repo/a.py"}


def test_a_parameter_pattern_must_compile() -> None:
    with pytest.raises(ValidationError, match="forbidden_pattern"):
        ParameterSettings(forbidden_pattern="[")


def test_a_global_pattern_must_compile_too() -> None:
    with pytest.raises(ValidationError, match="forbidden_pattern"):
        Settings.model_validate({"guards": {"forbidden_pattern": "(unclosed"}})

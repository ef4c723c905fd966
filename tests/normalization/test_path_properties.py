"""Property tests of the path guard: generated escapes are refused, generated paths inside pass.

An escape is built from a way out (`..`, a foreign absolute path, a `file:` URL, `~`,
a drive, a UNC share) and written in every encoding the guard undoes, mixed at random
character by character: percent-encoding (single, double), fullwidth and other NFKC
forms, whitespace around segments, backslashes. A legitimate path is written the same
ways and must come out canonical, inside a root, and unchanged by a second pass.
"""

from __future__ import annotations

import unicodedata
from urllib.parse import quote

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.normalize_cases import mcp_tool
from toolbus.config import GuardSettings, ParameterSettings, ToolSettings
from toolbus.normalization.guards import Guards
from toolbus.normalization.paths import inside, judge
from toolbus.wire.errors import InvalidArguments

ROOT_SETS = [("/srv/repo",), ("/srv/repo", "/home/agent/work")]
FAST = settings(max_examples=200, deadline=None)  # the three together well under 5 s

# Each character (or the whole `..`) written as something the guard must decode first.
DOT = st.sampled_from([".", "%2e", "%2E", "%252e", "\uff0e", "\u2024", "\ufe52", "%ef%bc%8e"])
SLASH = st.sampled_from(["/", "\\", "%2f", "%2F", "%5c", "%252f", "\uff0f", "\uff3c", "//"])
FILE = st.sampled_from(["file:", "FILE:", "\uff46\uff49\uff4c\uff45:", "file%3a"])
TILDE = st.sampled_from(["~", "%7e", "%7E", "\uff5e", "%257e"])
SPACE = st.sampled_from(["", "", " ", "  ", "\u3000", "\u00a0", "%20"])


@st.composite
def dotdot(draw: st.DrawFn) -> str:
    """A `..` segment, or what a system reads as one, with whitespace around it."""
    core = draw(
        st.one_of(
            st.tuples(DOT, DOT).map("".join),
            st.sampled_from(["\u2025", "\ufe30", "...", ". .", "%2e%2e%2e"]),
        )
    )
    return draw(SPACE) + core + draw(SPACE)


@st.composite
def joined(draw: st.DrawFn, segments: list[str]) -> str:
    return "".join(s + draw(SLASH) for s in segments[:-1]) + segments[-1]


NAMES = st.sampled_from(["etc", "passwd", "srv", "repo", "src", ".ssh", "id_rsa", "x"])


@st.composite
def escapes(draw: st.DrawFn) -> str:
    """A path that leaves every root in `ROOT_SETS`, in some encoding."""
    tail = draw(st.lists(NAMES, min_size=1, max_size=3))
    kind = draw(
        st.sampled_from(
            ["traversal", "rooted_traversal", "foreign", "file", "remote", "home", "drive", "unc"]
        )
    )
    if kind == "traversal":
        inner = draw(st.lists(NAMES, max_size=2))
        ups = draw(st.lists(dotdot(), min_size=1, max_size=4))
        text = draw(joined([*inner, *ups, *tail]))
    elif kind == "rooted_traversal":  # starts inside a root, then climbs out
        ups = draw(st.lists(dotdot(), min_size=1, max_size=3))
        text = draw(SLASH) + draw(joined(["srv", "repo", *ups, *tail]))
    elif kind in ("foreign", "file"):
        near = draw(
            st.sampled_from([["etc"], ["var"], ["srv", "repo2"], ["srv", "rep"], ["home", "agent"]])
        )
        text = draw(SLASH) + draw(joined([*near, *tail]))
        if kind == "file":
            host = draw(st.sampled_from(["", "localhost", "LOCALHOST"]))
            text = (
                f"{draw(FILE)}//{host}{text}" if host or draw(st.booleans()) else draw(FILE) + text
            )
    elif kind == "remote":  # a path inside the root, but on another machine
        host = draw(st.sampled_from(["evil.example", "10.0.0.1", "%65vil", "localhost.evil"]))
        text = f"{draw(FILE)}//{host}/" + draw(joined(["srv", "repo", *tail]))
    elif kind == "home":
        user = draw(st.sampled_from(["", "root", "agent"]))
        text = draw(SPACE) + draw(TILDE) + user + draw(SLASH) + draw(joined(tail))
    elif kind == "drive":
        text = draw(st.sampled_from(["C:", "c:", "\uff23:"])) + draw(SLASH) + draw(joined(tail))
    else:  # a UNC share, named like a root or not
        share = draw(st.sampled_from([["srv", "repo"], ["server", "share"]]))
        text = draw(st.sampled_from(["\\\\", "//", "%5c%5c", "\uff3c\uff3c"]))
        text += draw(joined([*share, *tail]))
    # Then the whole of it, maybe, percent-encoded once or twice more.
    for _ in range(draw(st.integers(0, 2))):
        text = quote(text, safe=draw(st.sampled_from(["", "/"])))
    return text


SEGMENT = (
    st.text(
        st.characters(categories=["L", "N"], include_characters="-_.+@ ,()"),
        min_size=1,
        max_size=8,
    )
    .map(str.strip)
    .filter(
        lambda s: (
            bool(s)
            and s.strip(".") != ""  # `.`, `..`: not names
            and not s.startswith("~")
            and s[1:2] != ":"
            and unicodedata.normalize("NFKC", s) == s
            and "%" not in s
        )
    )
)


@st.composite
def inside_paths(draw: st.DrawFn) -> tuple[tuple[str, ...], str, str]:
    """Roots, a path inside one of them written in some encoding, and its canonical form."""
    roots = draw(st.sampled_from(ROOT_SETS))
    segments = draw(st.lists(SEGMENT, min_size=1, max_size=4))
    absolute = draw(st.booleans())
    root = draw(st.sampled_from(roots)) if absolute else roots[0]
    canonical = f"{root}/{'/'.join(segments)}"
    padded = [draw(SPACE.filter(lambda s: "%" not in s)) + s for s in segments]
    text = draw(joined(padded))
    if absolute:
        text = root + draw(SLASH) + text
        if draw(st.booleans()):
            text = "file://" + text
    if draw(st.booleans()):
        text = quote(text, safe="/")
    return roots, text, canonical


@FAST
@given(st.sampled_from(ROOT_SETS), escapes())
def test_every_escape_is_refused(roots: tuple[str, ...], attempt: str) -> None:
    verdict = judge(attempt, roots)
    assert verdict.refusal is not None, (attempt, verdict)


@FAST
@given(inside_paths())
def test_paths_inside_pass_canonical_and_stay_inside(
    case: tuple[tuple[str, ...], str, str],
) -> None:
    roots, text, canonical = case
    verdict = judge(text, roots)
    assert verdict.refusal is None, (text, verdict)
    assert verdict.canonical == canonical
    assert any(inside(verdict.canonical, root) for root in roots)
    again = judge(verdict.canonical, roots)
    assert (again.canonical, again.decoded, again.refusal) == (canonical, (), None)


GUARDS = Guards(GuardSettings())
TOOL = mcp_tool(
    "read_file",
    {"type": "object", "properties": {"files": {"type": "array", "items": {"type": "string"}}}},
    ToolSettings(parameters={"files": ParameterSettings(path=True, allowed_roots=["/srv/repo"])}),
)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(escapes(), inside_paths().map(lambda c: c[1])), min_size=1, max_size=5))
def test_the_guards_refuse_exactly_the_escapes(attempts: list[str]) -> None:
    """Through `Guards.check_values`: a mixed list is refused item by item, or passes inside."""
    refused = {i for i, text in enumerate(attempts) if judge(text, ["/srv/repo"]).refusal}
    try:
        checked, _ = GUARDS.check_values(TOOL, {"files": attempts})
    except InvalidArguments as error:
        paths = {v["path"] for v in error.details["violations"]}
        assert paths == {f"arguments.files[{i}]" for i in refused}
        assert refused
    else:
        assert not refused
        assert all(inside(path, "/srv/repo") for path in checked["files"])

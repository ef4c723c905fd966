"""The path guard: a path argument decoded, judged, and anchored inside its allowed roots.

For a parameter marked `path = true`. The guard first undoes every reading a tool (or
the library, shell or OS behind it) might give the text, so it judges what the tool
will act on:

1. percent-encoding and Unicode compatibility forms (NFKC), alternately, until the text
   is stable, at most `MAX_DECODE_ROUNDS` times: `%2e%2e`, `%252e`, fullwidth dots,
   slashes and percent signs;
2. a `file:` URL becomes its path (`file:///p`, `file://localhost/p`, `file:/p`);
3. backslashes are separators; whitespace around a segment, `.` and empty segments go.

It then refuses control and format characters (NUL, bidi overrides), another host or
URL scheme, a segment of dots (`..`, `...`, `.. .`), a leading `~`, a Windows drive or
UNC path, and an absolute path outside every allowed root (any absolute path when there
are none). A relative path is anchored to the first allowed root.

The tool receives the canonical form that was judged, never the raw text: a guard that
judges one string and passes on another is bypassed by whatever decodes differently.
The check is lexical. The worker does not resolve symlinks: its filesystem is often not
the tool's (a remote or containerised MCP server), and a check made here before the tool
opens the file could not hold anyway. A root must not hold links that lead out of it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from toolbus.config.tools import REFUSED_CATEGORIES

# Double encoding is an attack pattern, triple is exotic; deeper is refused, not guessed at.
MAX_DECODE_ROUNDS = 4

# Rules (the stable `rule` of a violation) and the reasons under each.
TRAVERSAL = "path_traversal"  # reasons: traversal
OUTSIDE_ROOTS = "path_outside_roots"  # reasons: outside_roots, home, drive, unc, remote_host
INVALID = "path_invalid"  # reasons: encoding, control_characters, url

# Cc control, Cf format (bidi overrides, zero-width), Cs lone surrogates, line separators.
_IIS_ESCAPE = re.compile(r"%u[0-9a-fA-F]{4}")
_FILE_URL = re.compile(r"file:", re.IGNORECASE)
_OTHER_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_DRIVE = re.compile(r"[A-Za-z]:")
_LOCAL_HOSTS = frozenset({"", "localhost"})


@dataclass(frozen=True, slots=True)
class Refusal:
    rule: str
    reason: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the guard made of one path: its canonical form, or why it is refused.

    `decoded` names the steps that changed the text (`percent`, `nfkc`, `file_url`,
    `backslash`, `whitespace`, `dot_segments`, `anchored`), in order.
    """

    canonical: str
    decoded: tuple[str, ...]
    refusal: Refusal | None = None


class _Refused(Exception):  # a private control signal; it never leaves this module
    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(reason)
        self.refusal = Refusal(rule, reason)


def judge(text: str, roots: Sequence[str]) -> Verdict:
    """The canonical form of `text` inside `roots` (normalized absolute paths), or a refusal."""
    steps: list[str] = []
    try:
        canonical = _canonical(text, roots, steps)
    except _Refused as refused:
        return Verdict(text, tuple(steps), refused.refusal)
    return Verdict(canonical, tuple(steps))


def inside(path: str, root: str) -> bool:
    """Lexically: `path` is `root` or below it (both normalized absolute paths)."""
    return root in ("/", path) or path.startswith(root + "/")


def _canonical(text: str, roots: Sequence[str], steps: list[str]) -> str:
    text = _decode(text, steps)
    # isprintable (in C) is False for every refused category, and for a few allowed ones.
    if not text.isprintable() and any(
        unicodedata.category(char) in REFUSED_CATEGORIES for char in text
    ):
        raise _Refused(INVALID, "control_characters")
    text = _strip_file_url(text, steps)
    if "\\" in text:
        text = text.replace("\\", "/")
        steps.append("backslash")
    if text.startswith("//"):
        # A UNC share (`\\host\share`) on Windows; implementation-defined on POSIX.
        raise _Refused(OUTSIDE_ROOTS, "unc")
    segments = _segments(text, steps)
    if segments and segments[0].startswith("~"):
        raise _Refused(OUTSIDE_ROOTS, "home")
    if segments and _DRIVE.match(segments[0]):
        raise _Refused(OUTSIDE_ROOTS, "drive")
    if text.startswith("/"):
        absolute = "/" + "/".join(segments)
        if not any(inside(absolute, root) for root in roots):
            raise _Refused(OUTSIDE_ROOTS, "outside_roots")
        return absolute
    relative = "/".join(segments)
    if not roots:
        return relative or "."
    steps.append("anchored")
    # With `..` refused, a relative path is inside every root; the first one anchors it.
    root = roots[0]
    return root if not relative else f"{root.rstrip('/')}/{relative}"


def _decode(text: str, steps: list[str]) -> str:
    """Percent-decoding and NFKC in turn until neither changes the text."""
    for _ in range(MAX_DECODE_ROUNDS):
        changed = False
        if "%" in text:
            try:
                decoded = unquote(text, errors="strict")
            except UnicodeDecodeError:  # overlong forms (`%c0%ae`) and other invalid UTF-8
                raise _Refused(INVALID, "encoding") from None
            if decoded != text:
                text, changed = decoded, True
                _note(steps, "percent")
        normal = unicodedata.normalize("NFKC", text)
        if normal != text:
            text, changed = normal, True
            _note(steps, "nfkc")
        if not changed:
            if _IIS_ESCAPE.search(text):  # `%u002e`: a non-standard escape some servers decode
                raise _Refused(INVALID, "encoding")
            return text
    raise _Refused(INVALID, "encoding")


def _strip_file_url(text: str, steps: list[str]) -> str:
    if _FILE_URL.match(text):
        rest = text[len("file:") :].replace("\\", "/")
        if rest.startswith("//"):
            host, slash, path = rest[2:].partition("/")
            if host.lower() not in _LOCAL_HOSTS:
                raise _Refused(OUTSIDE_ROOTS, "remote_host")
            rest = slash + path
        if not rest.startswith("/"):
            raise _Refused(INVALID, "url")
        steps.append("file_url")
        return rest
    if _OTHER_URL.match(text):
        raise _Refused(INVALID, "url")
    return text


def _segments(text: str, steps: list[str]) -> list[str]:
    kept = []
    for i, segment in enumerate(text.split("/")):
        stripped = segment.strip()
        if stripped != segment:
            _note(steps, "whitespace")
        bare = "".join(stripped.split())
        if len(bare) >= 2 and bare.strip(".") == "":
            # `..`, and what some systems read as it: `...`, `. .` (Windows drops dots and
            # spaces that end a segment).
            raise _Refused(TRAVERSAL, "traversal")
        if stripped in ("", "."):
            if (i > 0 or not text.startswith("/")) and text != "/":  # not the root itself
                _note(steps, "dot_segments")
            continue
        kept.append(stripped)
    return kept


def _note(steps: list[str], step: str) -> None:
    if step not in steps:
        steps.append(step)

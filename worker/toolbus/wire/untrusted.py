"""Untrusted text: what a string from a caller must be before we publish to it or echo it.

Topics, ids and correlation data come from whoever sent the request. A topic the
broker calls malformed (mosquitto 2.0 refuses control characters) makes it disconnect
the publisher, and with it every request that connection held: one bad request would
cost every caller. So every topic is checked here before it is used, every echoed
string is checked the same way, and what goes into a log line or an error detail is
bounded and made printable first. So is everything the command line prints: a tool's
name, description or schema, a reply, a server's error or a config file's key is
whatever a server, a caller or a file's author chose, and a terminal would run its
escape sequences.
"""

from __future__ import annotations

import re
from typing import Any

MAX_TOPIC_BYTES = 65_535  # MQTT 5 §1.5.4: a UTF-8 string's length is two bytes
MAX_ECHO_BYTES = 1024  # correlation data: far beyond a UUID, far below a flood
SHOWN_CHARS = 200  # a caller's string in a log line or an error detail


def _nonchar_ranges() -> str:
    planes = "".join(
        f"{chr(plane * 0x10000 + 0xFFFE)}{chr(plane * 0x10000 + 0xFFFF)}" for plane in range(17)
    )
    return "\ufdd0-\ufdef" + planes


# C0 and C1 controls and DEL (MQTT 5 §1.5.4 says "should not", mosquitto refuses them),
# lone surrogates (they cannot be encoded as UTF-8 at all) and Unicode non-characters.
_BAD_BUT_C0 = f"\x7f-\x9f\ud800-\udfff{_nonchar_ranges()}"
_BAD_CHAR = re.compile(f"[\x00-\x1f{_BAD_BUT_C0}]")
_BAD_CHAR_BUT_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f{_BAD_BUT_C0}]")
_WILDCARD = re.compile(r"[+#]")
# A JSON escape of a surrogate: only then can parsed JSON hold a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]", re.ASCII)


def text_problem(text: str) -> str | None:
    """Why `text` may not be echoed (a reason key), or None when it may."""
    if _BAD_CHAR.search(text):
        return "bad_character"
    return None


def topic_problem(topic: str, *, max_bytes: int = MAX_TOPIC_BYTES) -> str | None:
    """Why we may not publish to `topic` (a reason key), or None when we may."""
    if not topic:
        return "empty"
    if (problem := text_problem(topic)) is not None:
        return problem
    if len(topic.encode()) > max_bytes:
        return "too_long"
    if _WILDCARD.search(topic):
        return "wildcard"
    if topic.startswith("$"):
        return "system_topic"
    return None


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` for a log line or an error detail: printable and at most `limit` characters
    (plus a note of how much was left out)."""
    head = printable(text[:limit])
    if len(text) > limit:
        head += f"...(+{len(text) - limit} chars)"
    return head


def printable(text: str, *, newlines: bool = False) -> str:
    """`text` with every character a terminal or an MQTT topic must not get (C0 and C1
    controls, DEL, lone surrogates, non-characters) written as its `\\uXXXX` escape: a
    terminal shown it runs no escape sequence (a window title, a cleared screen, a bell)
    and starts no line of its own.

    The one escaping function for every log line, error detail and command-line output.
    `newlines`: keep `\\n`, for text whose own layout puts them there and whose untrusted
    parts hold none (JSON, which escapes a string's own; a document escaped line by line).
    The escape is JSON's too (a character beyond U+FFFF as its surrogate pair), so JSON
    text stays valid JSON with the same value."""
    return (_BAD_CHAR_BUT_NEWLINE if newlines else _BAD_CHAR).sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code > 0xFFFF:  # only the non-characters of the upper planes get here
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def may_hold_surrogates(payload: bytes) -> bool:
    """Could JSON parsed from `payload` hold a lone surrogate? Only through an escape
    (raw surrogates are not UTF-8), so payloads without one need no walk."""
    return _SURROGATE_ESCAPE.search(payload) is not None


def surrogate_path(value: Any, path: str = "") -> str | None:
    """The path of the first string (key or value) holding a lone surrogate, if any."""
    if isinstance(value, str):
        return shown(path or ".") if _has_surrogate(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if _has_surrogate(key):
                return shown(here)
            if (found := surrogate_path(item, here)) is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if (found := surrogate_path(item, f"{path}[{index}]")) is not None:
                return found
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False

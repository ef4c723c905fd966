"""Strict: the parameter-mapping seed's validation rules, as the guard preset `strict`.

The seed (`004`, "Validation Rules") checks every string for `^[^<>{}]*$` and for `..`,
and file paths for at most 255 characters of `[A-Za-z0-9._/-]`. Its file paths are the
values of its `files` arrays and `file` fields (`code_scope.files`, `entryPoints[].file`,
`location.file`): it decides by the field's name, so `strict` does too (`PATH_NAMES`,
matched on the names the tool's schema uses, after normalization), and also treats a
parameter marked `path = true` as a file path. Under `strict` the two string rules
become forbidden patterns (so every level, keys and the settled walk see them), each
refused with its own rule and reason; the seed's words for them go in the message.
"""

from __future__ import annotations

import re
from typing import Any

UNSAFE = r"[<>{}]"
TRAVERSAL = r"\.\."
# The patterns `strict` adds to a tool's forbidden ones, with the rule and reason each
# refusal carries (the path guard's `path_traversal`/`traversal` for `..`: the same threat).
RULES: dict[str, tuple[str, str]] = {
    UNSAFE: ("forbidden_characters", "unsafe_characters"),
    TRAVERSAL: ("path_traversal", "traversal"),
}
PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in RULES)

PATH_NAMES = frozenset({"file", "files"})
MAX_PATH_LENGTH = 255
_NOT_PATH_CHARACTER = re.compile(r"[^A-Za-z0-9._/-]")

# The seed's own words ("Common Issues and Debugging"), by a violation's `reason`.
WORDS = {
    "unsafe_characters": "String contains potentially unsafe characters",
    "traversal": "Path traversal detected",
}


def path_violations(text: str) -> list[tuple[str, dict[str, Any]]]:
    """What `strict` refuses in a file path: (rule, facts) for each rule broken."""
    found: list[tuple[str, dict[str, Any]]] = []
    if len(text) > MAX_PATH_LENGTH:
        found.append(("max_path_length", {"limit": MAX_PATH_LENGTH, "actual": len(text)}))
    bad = _NOT_PATH_CHARACTER.search(text)
    if bad is not None:
        found.append(("path_invalid", {"reason": "characters", "position": bad.start()}))
    return found

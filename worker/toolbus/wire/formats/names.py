"""Provider names: each canonical tool name as the providers' name rule allows it.

Anthropic and OpenAI (Chat Completions and Responses) take tool names matching
`^[a-zA-Z0-9_-]{1,64}$`; Ollama hands names to models trained on the same, and MCP
clients hand them on to those providers. Our canonical names may also hold `.` and `/`
(a server-qualified name, an MCP tool's own name), so some need another spelling:

- a name that fits is its own provider name;
- otherwise `.` and `/` become `__` (the registry's own qualifier spelling, so
  `devices.set_level` is listed as `devices__set_level`) and any other character `_`;
- a result that is too long, or that another name also becomes or already is, is cut
  and ends in `_` and hex digits of the canonical name's SHA-256: every name of such a
  group gets a suffix, so none of them keeps the plain spelling by accident of order.

The table is a function of the set of names only, never of their order or of who asks,
and no two names share a provider name. The registry resolves each provider name back
to its tool exactly (`Registry.resolve`), before any spelling-insensitive guess.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable

PROVIDER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_CHARS = 64
DIGEST_CHARS = 8  # 32 bits: a second collision, after the first, is not going to happen


def provider_names(canonical: Iterable[str]) -> dict[str, str]:
    """Canonical name -> provider name, for a whole set at once (all distinct)."""
    names = sorted(set(canonical))
    table = {name: name for name in names if PROVIDER_NAME.fullmatch(name)}
    respelled = {name: _respelled(name) for name in names if name not in table}
    counts = Counter(respelled.values())
    for name, plain in respelled.items():
        if len(plain) <= MAX_CHARS and counts[plain] == 1 and plain not in table:
            table[name] = plain
    taken = set(table.values())
    for name, plain in respelled.items():
        if name not in table:
            table[name] = _suffixed(name, plain, taken)
            taken.add(table[name])
    return table


def _respelled(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", re.sub(r"[./]", "__", name))


def _suffixed(name: str, plain: str, taken: set[str]) -> str:
    """`plain`, cut, with a digest of `name`: longer digests until it is free."""
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    for digits in range(DIGEST_CHARS, MAX_CHARS - 1, 4):
        candidate = f"{plain[: MAX_CHARS - 1 - digits]}_{digest[:digits]}"
        if candidate not in taken:
            return candidate
    raise AssertionError(f"no free provider name for {name!r}")  # a SHA-256 collision

"""Hostile request envelopes for property tests: the fields toolbus reads, filled with what
an attacker would put there (control characters, lone surrogates, wildcards, `$` topics,
huge numbers, wrong types, very long strings), in every shape the decoder accepts."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

PIECES = [
    "\x00",
    "\x01",
    "\x1b[2J",
    "\x7f",
    "\x85",
    "\ud800",
    "\udfff",
    "\ud83d\ude00",
    "\ufffe",
    "\ufdd0",
    "\u202e",
    "+",
    "#",
    "/",
    "$SYS/",
    "$share/g/",
    "tb/reply/",
    "tb/call/",
    "../",
    "%2e%2e/",
    "echo",
    "caller",
    " ",
    "\\",
    '"',
]

hostile_text = st.one_of(
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=4)), max_size=8).map("".join),
    st.integers(1, 5).map(lambda n: "x" * (n * 20_000)),  # over every string bound
)
numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 1e308, 2**53 + 1]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, hostile_text)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(hostile_text, inner, max_size=4)
    ),
    max_leaves=12,
)
tool_names = st.one_of(st.sampled_from(["echo", "Echo", "ECHO", "no_such_tool"]), hostile_text)

ENVELOPE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "id": st.one_of(hostile_text, values),
    "tool": st.one_of(tool_names, values),
    "arguments": st.one_of(st.dictionaries(hostile_text, values, max_size=4), values),
    "reply_to": st.one_of(hostile_text, values),
    "caller": st.one_of(hostile_text, values),
    "timeout_s": st.one_of(numbers, values),
    "deadline_ms": st.one_of(numbers, values),
    "traceparent": st.one_of(hostile_text, values),
    "publish_trace": values,
}


@st.composite
def tool_call(draw: st.DrawFn, shape: str) -> dict[str, Any]:
    """One call of a provider's message, its fields drawn hostile."""
    ident = draw(st.one_of(hostile_text, values))
    name = draw(tool_names)
    if shape == "tool_use":
        return {"type": "tool_use", "id": ident, "name": name, "input": draw(values)}
    if shape == "function_call":
        arguments = draw(st.one_of(values, values.map(json.dumps)))
        return {"type": "function_call", "call_id": ident, "name": name, "arguments": arguments}
    arguments = draw(st.one_of(values, values.map(json.dumps)))
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": arguments}}


@st.composite
def envelopes(draw: st.DrawFn) -> Any:
    """A toolbus envelope, or a provider's shape (one call, a list of calls, a whole
    message), its fields and its `toolbus` options drawn hostile."""
    body = draw(st.fixed_dictionaries({}, optional=ENVELOPE_FIELDS))
    shape = draw(
        st.sampled_from(
            ["envelope", "tool_use", "function", "tool_calls", "blocks", "message", "output"]
        )
    )
    options = draw(st.one_of(st.none(), st.fixed_dictionaries({}, optional=ENVELOPE_FIELDS)))
    if options is not None and shape != "envelope":
        body["toolbus"] = options
    calls = st.lists(st.one_of(values, tool_call("tool_use"), tool_call("function")), max_size=3)
    if shape == "tool_use":
        body |= {"type": "tool_use", "name": draw(tool_names), "input": draw(values)}
    elif shape == "function":
        arguments = draw(st.one_of(values, values.map(json.dumps)))
        body |= {"type": "function", "function": {"name": draw(tool_names), "arguments": arguments}}
    elif shape == "tool_calls":
        body |= {"tool_calls": draw(calls)}
    elif shape == "blocks":
        return draw(calls)  # a bare list, as `message.content` or `response.output` is
    elif shape == "message":
        body |= {"type": "message", "role": "assistant", "content": draw(calls)}
    elif shape == "output":
        items = st.lists(st.one_of(values, tool_call("function_call")), max_size=3)
        body |= {"object": "response", "output": draw(items)}
    return body

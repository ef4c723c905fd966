"""Hostile requests in-process: each gets a clear error and costs nobody else anything.

The audit's reproductions, one by one, through the pipeline with a list-collecting
publisher: whatever a request holds, exactly one answer leaves (a reply, or a dead
letter when there is no usable reply address), to a topic the broker will accept,
as UTF-8 JSON, and never bigger than the limits say.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.calls.test_pipeline import REPLY, Rig, rig_for
from tests.support.hostile import envelopes, tool_names
from tests.support.tools import Probe, probe_tools
from toolbus.calls.quotas import Quotas
from toolbus.config.callers import CallerProfile
from toolbus.wire.contracts import ErrorCode
from toolbus.wire.messages import Inbound
from toolbus.wire.untrusted import shown, topic_problem

BAD_TOPIC_CHARS = ["\x00", "\x01", "\x1f", "\x7f", "\x85", "\x9f", "\ufffe", "\U0010ffff", "\ufdd0"]


def hostile_rig(**settings: Any) -> Rig:
    probe = Probe()
    return rig_for(probe_tools(probe), probe, **settings)


async def send(rig: Rig, topic: str, payload: bytes, **inbound: Any) -> None:
    await rig.pipeline.handle(Inbound(topic=topic, payload=payload, **inbound))


def only_answer(rig: Rig, *, many: bool = False) -> tuple[str, dict[str, Any]]:
    """The one message the pipeline published (the first of them, when `many` may be),
    checked as the broker would check it."""
    assert many or len(rig.sent.sent) == 1, rig.sent.sent
    out = rig.sent.sent.pop(0)
    assert topic_problem(out.topic) is None
    for key, value in out.user_properties:
        assert topic_problem(key) is None and topic_problem(value) is None
    return out.topic, dict(json.loads(out.payload.decode("utf-8")))


def dead_code(rig: Rig) -> str:
    topic, letter = only_answer(rig)
    assert topic == "tb/dead"
    return str(letter["error"]["code"])


def reply_code(rig: Rig, topic: str = REPLY) -> str:
    got, reply = only_answer(rig)
    assert got == topic
    if "results" in reply:  # a provider's shape: the one call's own answer
        [reply] = reply["results"]
    return str(reply["error"]["code"]) if not reply["ok"] else "ok"


# -- reply topics -----------------------------------------------------------------------


@pytest.mark.parametrize("char", BAD_TOPIC_CHARS)
async def test_a_reply_to_with_a_bad_character_is_dead_lettered(char: str) -> None:
    rig = hostile_rig()
    body = {"tool": "echo", "arguments": {"text": "x"}, "reply_to": f"tb/reply/{char}"}
    await send(rig, "tb/call", json.dumps(body).encode())
    assert dead_code(rig) == "forbidden"


@pytest.mark.parametrize("char", BAD_TOPIC_CHARS)
async def test_a_v5_response_topic_with_a_bad_character_is_dead_lettered(char: str) -> None:
    rig = hostile_rig()
    await send(
        rig,
        "tb/call/echo",
        b'{"arguments": {"text": "x"}}',
        response_topic=f"tb/reply/a{char}b",
        correlation_data=b"c",
    )
    assert dead_code(rig) == "forbidden"


@pytest.mark.parametrize(
    "reply_to",
    [
        "tb/reply/\\ud800",  # a lone surrogate, as JSON writes it
        "",
        "tb/reply/+",
        "tb/reply/#",
        "$SYS/x",
        "$share/g/tb/reply/x",
        "tb/call/echo",
        "tb/tools",
        "tb/reply/" + "x" * 70_000,
    ],
)
async def test_reply_topics_we_would_not_publish_to_are_dead_lettered(reply_to: str) -> None:
    rig = hostile_rig(max_payload_bytes=100_000)
    payload = b'{"tool": "echo", "arguments": {"text": "x"}, "reply_to": "%s"}' % reply_to.encode()
    await send(rig, "tb/call", payload)
    topic, letter = only_answer(rig)
    assert topic == "tb/dead"
    assert letter["error"]["code"] == "forbidden"
    assert len(letter["error"]["details"]["reply_topic"]) < 300  # echoed, but bounded


async def test_correlation_data_too_long_to_echo_is_dead_lettered() -> None:
    rig = hostile_rig()
    await send(rig, "tb/call/echo", b"{}", response_topic=REPLY, correlation_data=b"c" * 5000)
    assert dead_code(rig) == "bad_request"


# -- strings that cannot be echoed ---------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        b'{"id": "\\ud800", "arguments": {"text": "x"}}',
        b'{"id": "a\\u0001b", "arguments": {"text": "x"}}',
        b'{"id": "' + b"i" * 300 + b'", "arguments": {"text": "x"}}',
        b'{"arguments": {"text": "\\udfff"}}',
        b'{"arguments": {"\\ud83d": "x"}}',
        b'{"arguments": {"text": ["ok", {"deep": "\\ud800\\u0041"}]}}',
        b'{"caller": "\\ud800", "arguments": {"text": "x"}}',
        b'{"caller": "kit\\u0000chen", "arguments": {"text": "x"}}',
        b'{"tool_calls": [1]}',
        b'{"tool_calls": [null]}',
        b'{"tool_calls": "x"}',
    ],
)
async def test_strings_that_cannot_be_echoed_get_bad_request_and_run_nothing(
    payload: bytes,
) -> None:
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe)
    await send(rig, "tb/call/busy", payload, response_topic=REPLY, correlation_data=b"c")
    topic, reply = only_answer(rig)
    assert topic == REPLY
    assert reply["error"]["code"] == "bad_request"
    assert probe.calls == 0
    assert reply["id_generated"] is True or "\\" not in reply["id"]


def function_call(arguments: str) -> bytes:
    body = {"type": "function", "function": {"name": "busy", "arguments": arguments}}
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    "payload",
    [
        b'{"tool": "echo", "arguments": {"text": "\xed\xa0\x80"}}',  # surrogate as UTF-8 bytes
        '{"tool": "echo", "arguments": {"text": "x"}}'.encode("utf-16"),
        function_call('{"n": "\\ud800"}'),  # parsed only once the envelope is read
        function_call("[" * 5000 + "]" * 5000),
        function_call('{"n": NaN}'),
        json.dumps({"tool": "no\nFAKE LOG LINE \u001b[31m", "arguments": {}}).encode(),
    ],
)
async def test_payloads_that_slip_past_a_naive_check_get_bad_request(payload: bytes) -> None:
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe, max_payload_bytes=64 * 1024)
    await send(rig, "tb/call", payload, response_topic=REPLY, correlation_data=b"c")
    assert reply_code(rig) == "bad_request"
    assert probe.calls == 0


async def test_a_valid_surrogate_pair_is_a_character_like_any_other() -> None:
    rig = hostile_rig()
    await send(
        rig,
        "tb/call/echo",
        b'{"arguments": {"text": "\\ud83d\\ude00"}}',
        response_topic=REPLY,
        correlation_data=b"c",
    )
    _, reply = only_answer(rig)
    assert reply["result"]["structured"]["text"] == "\U0001f600"


async def test_a_huge_topic_gets_a_small_reply_and_a_bounded_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = hostile_rig()
    with caplog.at_level(logging.DEBUG):
        await send(
            rig, "tb/call/" + "t" * 60_000, b"{}", response_topic=REPLY, correlation_data=b"c"
        )
    _, reply = only_answer(rig)
    assert reply["error"]["code"] == "bad_request"
    assert len(json.dumps(reply)) < 2000
    assert caplog.records
    assert max(len(record.getMessage()) for record in caplog.records) < 2000


# -- caller identity: topic mode -------------------------------------------------------

TOPIC_MODE = {
    "caller_identity": "topic",
    "callers": {"kitchen": {"tools": ["echo"]}, "anonymous": {"tools": []}},
}


async def call_as(rig: Rig, topic: str, body: dict[str, Any], reply_topic: str | None) -> None:
    await send(
        rig,
        topic,
        json.dumps(body).encode(),
        response_topic=reply_topic,
        correlation_data=b"c" if reply_topic else None,
    )


async def test_topic_mode_the_caller_is_the_topic_level() -> None:
    rig = hostile_rig(**TOPIC_MODE)
    mine = "tb/reply/kitchen/r1"
    await call_as(rig, "tb/call/kitchen/echo", {"arguments": {"text": "x"}}, mine)
    assert reply_code(rig, mine) == "ok"
    await call_as(rig, "tb/call/kitchen", {"tool": "echo", "arguments": {"text": "x"}}, mine)
    assert reply_code(rig, mine) == "ok"
    await call_as(rig, "tb/call/kitchen/busy", {"arguments": {"n": 1}}, mine)
    assert reply_code(rig, mine) == "forbidden"  # kitchen's profile: echo only


async def test_topic_mode_a_body_caller_that_differs_is_forbidden() -> None:
    rig = hostile_rig(**TOPIC_MODE)
    mine = "tb/reply/garage/r1"
    body = {"caller": "kitchen", "arguments": {"text": "x"}}
    await call_as(rig, "tb/call/garage/echo", body, mine)
    assert reply_code(rig, mine) == "forbidden"
    await call_as(rig, "tb/call", {**body, "tool": "echo"}, "tb/reply/anonymous/r")
    assert reply_code(rig, "tb/reply/anonymous/r") == "forbidden"  # no claim without a topic


async def test_topic_mode_replies_only_under_the_callers_own_level() -> None:
    rig = hostile_rig(**TOPIC_MODE)
    for reply_topic in ("tb/reply/kitchen/r1", "tb/reply/kitchenette/r", "tb/reply/x"):
        await call_as(rig, "tb/call/garage/echo", {"arguments": {"text": "x"}}, reply_topic)
        assert dead_code(rig) == "forbidden"
    body = {"tool": "echo", "arguments": {"text": "x"}, "reply_to": "tb/reply/kitchen/r1"}
    await call_as(rig, "tb/call/garage", body, None)
    assert dead_code(rig) == "forbidden"


async def test_topic_mode_anonymous_requests_get_the_anonymous_profile() -> None:
    rig = hostile_rig(**TOPIC_MODE)
    anon = "tb/reply/anonymous/r"
    await call_as(rig, "tb/call", {"tool": "echo", "arguments": {"text": "x"}}, anon)
    assert reply_code(rig, anon) == "forbidden"  # `anonymous` may use nothing
    await call_as(rig, "tb/tools", {}, anon)
    _, listing = only_answer(rig)
    assert listing["result"]["structured"]["tools"] == []


async def test_topic_mode_only_the_bare_topics_are_the_anonymous_caller() -> None:
    """A login named `anonymous` publishing on its own level became the anonymous
    caller, with its profile and its reply space (issue 24.3): the level is reserved."""
    rig = hostile_rig(caller_identity="topic", callers={"anonymous": {"tools": ["echo"]}})
    anon = "tb/reply/anonymous/r"
    for topic, body in (
        ("tb/call/anonymous/echo", {"arguments": {"text": "x"}}),
        ("tb/call/anonymous", {"tool": "echo", "arguments": {"text": "x"}}),
        ("tb/tools/anonymous", {}),
    ):
        await call_as(rig, topic, body, anon)
        _, reply = only_answer(rig)
        assert reply["error"]["code"] == "forbidden", topic
        assert reply["error"]["details"]["reason"] == "reserved_caller", topic
    await call_as(rig, "tb/call", {"tool": "echo", "arguments": {"text": "x"}}, anon)
    assert reply_code(rig, anon) == "ok"


async def test_require_caller_refuses_anonymous_requests() -> None:
    rig = hostile_rig(caller_identity="topic", require_caller=True)
    anon = "tb/reply/anonymous/r"
    await call_as(rig, "tb/call", {"tool": "echo", "arguments": {"text": "x"}}, anon)
    assert reply_code(rig, anon) == "forbidden"
    await call_as(rig, "tb/call/kitchen/echo", {"arguments": {"text": "x"}}, "tb/reply/kitchen/a")
    assert reply_code(rig, "tb/reply/kitchen/a") == "ok"


@pytest.mark.parametrize("topic", ["tb/call//echo", "tb/tools/kitchen/x", "tb/call/" + "k" * 300])
async def test_topic_mode_malformed_request_topics_are_refused(topic: str) -> None:
    rig = hostile_rig(**TOPIC_MODE)
    await call_as(rig, topic, {"tool": "echo"}, None)
    assert dead_code(rig) == "bad_request"


@pytest.mark.parametrize(
    ("tool_level", "reason"), [("ech\x7fo", "bad_character"), ("e" * 300, "name_too_long")]
)
async def test_topic_mode_a_bad_tool_level_is_answered_under_the_callers_replies(
    tool_level: str, reason: str
) -> None:
    """The caller level is sound (the broker's ACL vouched for it): the refusal of the
    tool level goes to that caller's reply topic, not to the dead letters."""
    rig = hostile_rig(**TOPIC_MODE)
    mine = "tb/reply/kitchen/r1"
    await call_as(rig, f"tb/call/kitchen/{tool_level}", {"arguments": {"text": "x"}}, mine)
    got, reply = only_answer(rig)
    assert got == mine
    assert reply["error"]["code"] == "bad_request"
    assert reply["error"]["details"]["reason"] == reason
    body = {"arguments": {"text": "x"}, "reply_to": mine}  # a 3.1.1 caller's address
    await call_as(rig, f"tb/call/kitchen/{tool_level}", body, None)
    assert reply_code(rig, mine) == "bad_request"
    # Another caller's replies stay out of reach, whatever the tool level holds.
    await call_as(rig, f"tb/call/garage/{tool_level}", {"arguments": {}}, mine)
    assert dead_code(rig) == "forbidden"


async def test_claim_mode_call_caller_tool_topics_name_the_caller_for_quotas() -> None:
    rig = hostile_rig(callers={"garage": {"rate_per_s": 0.01, "burst": 1}})
    await call_as(rig, "tb/call/garage/echo", {"arguments": {"text": "x"}}, REPLY)
    assert reply_code(rig) == "ok"
    await call_as(rig, "tb/call/garage/echo", {"arguments": {"text": "x"}}, REPLY)
    assert reply_code(rig) == "rate_limited"


async def test_require_caller_in_claim_mode() -> None:
    rig = hostile_rig(require_caller=True)
    await call_as(rig, "tb/call/kitchen/echo", {"arguments": {"text": "x"}}, REPLY)
    assert reply_code(rig) == "ok"
    for body in ({"arguments": {"text": "x"}}, {"caller": "", "arguments": {"text": "x"}}):
        await call_as(rig, "tb/call/echo", body, REPLY)
        assert reply_code(rig) == "forbidden"


@pytest.mark.parametrize("reply_to", ["tb/dead", "tb/status/workers/w1", "tb/status"])
async def test_a_reply_never_lands_on_dead_letters_or_statuses(reply_to: str) -> None:
    rig = hostile_rig(reply_prefixes=["tb/"])
    body = {"tool": "echo", "arguments": {"text": "x"}, "reply_to": reply_to}
    await call_as(rig, "tb/call", body, None)
    assert dead_code(rig) == "forbidden"


async def test_claim_mode_keeps_call_caller_tool_topics() -> None:
    rig = hostile_rig(callers={"kitchen": {"tools": ["echo"]}})
    await call_as(rig, "tb/call/kitchen/echo", {"arguments": {"text": "x"}}, REPLY)
    assert reply_code(rig) == "ok"
    await call_as(rig, "tb/call/kitchen/busy", {"arguments": {"n": 1}}, REPLY)
    assert reply_code(rig) == "forbidden"


def test_shown_is_printable_and_bounded() -> None:
    text = shown("a\x01b\ud800" + "x" * 500)
    assert text.isprintable()
    assert len(text) < 260


# -- fuzzing: whatever the envelope holds, exactly one well-formed answer -------------

FUZZ_RIG = hostile_rig(max_payload_bytes=64 * 1024)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=envelopes(),
    v5=st.booleans(),
    topic_tool=st.one_of(st.none(), tool_names),
    raw=st.booleans(),
)
async def test_fuzzed_envelopes_get_exactly_one_answer_and_never_internal(
    body: Any, v5: bool, topic_tool: str | None, raw: bool
) -> None:
    topic = f"tb/call/{topic_tool}" if topic_tool else "tb/call"
    # `raw`: non-ASCII as bytes, lone surrogates too (as a hostile client may send them).
    payload = (
        json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
        if raw
        else json.dumps(body).encode()
    )
    await send(
        FUZZ_RIG,
        topic,
        payload,
        response_topic=REPLY if v5 else None,
        correlation_data=b"c" if v5 else None,
    )
    if not v5 and FUZZ_RIG.sent.sent == []:
        # A 3.1.1 success without a usable reply address publishes nothing, by design.
        return
    codes = {code.value for code in ErrorCode} - {"internal"}
    if v5 or not FUZZ_RIG.sent.on("tb/dead"):  # a reply (3.1.1: to a drawn `reply_to`)
        where, answer = only_answer(FUZZ_RIG)
        assert where.startswith("tb/reply/")
        assert isinstance(answer["ok"], bool)
        for part in answer.get("results", [answer]):  # a provider's message: each call's
            assert part.get("error", {}).get("code", "ok") in codes | {"ok"}, answer
        return
    # No reply address: a dead letter for the message, or for each call of it that failed.
    while FUZZ_RIG.sent.sent:
        where, letter = only_answer(FUZZ_RIG, many=True)
        assert where == "tb/dead"
        assert letter["error"]["code"] in codes, letter
        assert len(json.dumps(letter)) < 2 * len(payload) + 4096


def test_quota_state_stays_bounded_with_many_caller_names() -> None:
    quotas = Quotas({"*": CallerProfile(rate_per_s=1.0)}, max_callers=50)
    for n in range(1000):
        with quotas.admit(f"caller-{n}"):
            pass
    assert len(quotas) <= 51


async def test_a_profile_without_tools_takes_them_from_the_default_profile() -> None:
    rig = hostile_rig(callers={"*": {"tools": ["echo"]}, "garage": {"max_in_flight": 2}})
    body = {"caller": "garage", "tool": "echo", "arguments": {"text": "x"}}
    await call_as(rig, "tb/call", body, REPLY)
    assert reply_code(rig) == "ok"
    await call_as(rig, "tb/call", {"caller": "garage", "tool": "busy", "arguments": {}}, REPLY)
    assert reply_code(rig) == "forbidden"
    assert rig.pipeline.executor.access.unknown == {}

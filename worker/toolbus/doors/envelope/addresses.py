"""Reply addresses: where a request's answer goes, and until when its sender listens.

An MQTT v5 caller names its reply topic in the Response Topic (with Correlation Data);
a 3.1.1 caller in the body's `reply_to` (the envelope's top level or its `toolbus`
object; beside a provider's shape only under `toolbus`). Either is checked here before
anything runs: a reply topic we will not publish to is `forbidden`, and leaves the
request without an address (so it is dead-lettered). When the sender stops waiting
travels with it: the v5 Message Expiry Interval and the body's `deadline_ms`.
"""

from __future__ import annotations

import time

from toolbus.calls.call import ReplyAddress
from toolbus.wire.contracts import Options
from toolbus.wire.errors import BadRequest, Forbidden
from toolbus.wire.formats.incoming import ENVELOPE, Shape
from toolbus.wire.messages import Inbound
from toolbus.wire.topics import Topics
from toolbus.wire.untrusted import MAX_ECHO_BYTES, shown


def response_address(message: Inbound, topics: Topics, caller: str | None) -> ReplyAddress | None:
    """The v5 reply address, once checked: a bad one raises with no address at all."""
    if message.response_topic is None:
        return None
    _check_reply_topic(topics, message.response_topic, caller)
    data = message.correlation_data
    if data is not None and len(data) > MAX_ECHO_BYTES:
        raise BadRequest(
            "correlation data is too long to echo",
            reason="correlation_data_too_long",
            limit_bytes=MAX_ECHO_BYTES,
            size_bytes=len(data),
        )
    return ReplyAddress(message.response_topic, data, _expiry_at(message))


def body_address(
    message: Inbound, topics: Topics, body: object, shape: Shape
) -> ReplyAddress | None:
    """A 3.1.1 caller's `reply_to`, once checked (the envelope model reports a wrong type)."""
    reply_to = _reply_to(body, shape)
    if not isinstance(reply_to, str):
        return None
    _check_reply_topic(topics, reply_to, topics.caller_of(message.topic))
    return ReplyAddress(reply_to, expires_at=_expiry_at(message))


def deadline_at(message: Inbound, options: Options) -> float | None:
    """The first of the message's expiry and the body's wall-clock `deadline_ms`."""
    at = _expiry_at(message)
    if options.deadline_ms is not None:
        wall = time.monotonic() + options.deadline_ms / 1000 - time.time()
        at = wall if at is None else min(at, wall)
    return at


def _reply_to(body: object, shape: Shape) -> object:
    options = shape.options
    if shape is ENVELOPE and isinstance(body, dict):
        if "reply_to" in body:
            return body["reply_to"]
        options = body.get("toolbus")
    return options.get("reply_to") if isinstance(options, dict) else None


def _check_reply_topic(topics: Topics, topic: str, caller: str | None) -> None:
    """Any reply topic we will not publish to is `forbidden`; `details.reason` says why."""
    problem = topics.reply_problem(topic, caller)
    if problem is not None:
        raise Forbidden(
            "reply topic is not one a reply may be published to",
            reason=problem,
            reply_topic=shown(topic),
            allowed_prefixes=list(topics.reply_space(caller)),
        )


def _expiry_at(message: Inbound) -> float | None:
    if message.expiry_s is None:
        return None
    return message.received_at + message.expiry_s

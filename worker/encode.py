"""Encode: an outcome becomes a reply (or a dead letter) ready to publish."""

from __future__ import annotations

import base64
import math
import time

from toolbus.contracts import DeadLetter, ErrorBody, Reply
from toolbus.decode import Call, Rejected, ReplyAddress
from toolbus.execute import Outcome
from toolbus.messages import Outbound
from toolbus.normalization.report import to_wire


def reply_for_call(call: Call, outcome: Outcome) -> Reply:
    return Reply(
        id=call.id,
        id_generated=call.id_generated,
        ok=outcome.ok,
        tool=outcome.tool,
        result=outcome.result if outcome.ok else None,
        error=outcome.error.body() if outcome.error is not None else None,
        duration_ms=round(outcome.duration_ms, 3),
        normalized=to_wire(outcome.normalized),
    )


def reply_for_rejected(rejected: Rejected) -> Reply:
    return Reply(
        id=rejected.id,
        id_generated=rejected.id_generated,
        ok=False,
        error=rejected.error.body(),
        duration_ms=0.0,
    )


def outbound_reply(
    address: ReplyAddress, reply: Reply, trace_headers: tuple[tuple[str, str], ...] = ()
) -> Outbound:
    """The reply as a publish; an MQTT 3.1.1 caller (no correlation data) gets the
    trace context in the body too, since it cannot read user properties."""
    if trace_headers and address.correlation_data is None:
        reply = reply.model_copy(update={"traceparent": dict(trace_headers).get("traceparent")})
    return Outbound(
        topic=address.topic,
        payload=reply.model_dump_json(by_alias=True, exclude_none=True).encode(),
        correlation_data=address.correlation_data,
        user_properties=trace_headers,
        expiry_s=_remaining_s(address.expires_at),
    )


def _remaining_s(expires_at: float | None) -> int | None:
    """A reply lives as long as its sender waits: no broker keeps it for a caller gone.
    Whole seconds (the MQTT unit), at least one, so a late answer still leaves."""
    if expires_at is None:
        return None
    return max(1, math.ceil(expires_at - time.monotonic()))


def dead_letter(
    *,
    dead_topic: str,
    topic: str,
    payload: bytes,
    error: ErrorBody,
    ident: str | None,
    max_payload_bytes: int,
) -> Outbound:
    kept = payload[:max_payload_bytes]
    try:
        text, encoding = kept.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(kept).decode(), "base64"
    letter = DeadLetter(
        topic=topic,
        error=error,
        id=ident,
        payload=text,
        encoding=encoding,
        payload_bytes=len(payload),
        truncated=len(kept) < len(payload),
    )
    return Outbound(topic=dead_topic, payload=letter.model_dump_json(exclude_none=True).encode())

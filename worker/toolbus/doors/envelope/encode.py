"""Encode: an outcome becomes a reply (or a dead letter) ready to publish."""

from __future__ import annotations

import base64
import codecs
import math
import time
from collections.abc import Sequence

from toolbus.calls.call import ReplyAddress
from toolbus.calls.replies import internal_reply
from toolbus.doors.envelope.decode import Calls, Rejected
from toolbus.wire.contracts import CallsReply, DeadLetter, ErrorBody, Reply, ReplyFormat
from toolbus.wire.formats.outgoing import Answered, conversation
from toolbus.wire.messages import Outbound


def calls_reply(
    calls: Calls, replies: Sequence[Reply], received_at: float, *, checked: bool = False
) -> CallsReply:
    """One reply for a message's calls. In a provider's format `append` carries what each
    call returned, and `results` only how it went (ok, error, duration, `normalized`):
    nothing travels twice. `checked`: a call whose reply cannot be encoded (a backend's
    bug) answers `internal` alone, and the others keep their answers."""
    if checked:
        replies = [_encodable(reply) for reply in replies]
    answered = [Answered(c.id, c.tool, r) for c, r in zip(calls.calls, replies, strict=True)]
    provider = calls.format is not ReplyFormat.TOOLBUS
    return CallsReply(
        id=calls.id,
        id_generated=calls.id_generated,
        format=calls.format,
        ok=all(reply.ok for reply in replies),
        append=conversation(calls.format, answered),
        results=[r.model_copy(update={"result": None}) for r in replies] if provider else replies,
        duration_ms=round((time.monotonic() - received_at) * 1000, 3),
    )


def _encodable(reply: Reply) -> Reply:
    try:
        reply.model_dump_json()
    except Exception:  # whatever the serializer raises: this one call's answer is lost
        return internal_reply(reply.id, reply.id_generated)
    return reply


def calls_failure(calls: Calls, replies: Sequence[Reply]) -> ErrorBody | None:
    """The one dead letter's error for a message of calls with no reply address: the
    first failure's code, and each failed call's id and code (a replay had its letter)."""
    failed = [(r.id, r.error) for r in replies if r.error is not None and not r.replayed]
    if not failed:
        return None
    return ErrorBody(
        code=failed[0][1].code,
        message=f"{len(failed)} of {len(replies)} calls failed",
        details={"calls": [{"id": ident, "code": error.code.value} for ident, error in failed]},
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
    address: ReplyAddress,
    reply: Reply | CallsReply,
    trace_headers: tuple[tuple[str, str], ...] = (),
) -> Outbound:
    """The reply as a publish; an MQTT 3.1.1 caller (no correlation data) gets the
    trace context and baggage in the body too, since it cannot read user properties."""
    if trace_headers and address.correlation_data is None:
        reply = reply.model_copy(update=dict(trace_headers))
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
    # At most MQTT's four-byte interval: a `deadline_ms` centuries away must still encode.
    return min(MAX_EXPIRY_S, max(1, math.ceil(expires_at - time.monotonic())))


MAX_EXPIRY_S = 0xFFFFFFFF


def dead_letter(
    *,
    dead_topic: str,
    topic: str,
    payload: bytes,
    error: ErrorBody,
    ident: str | None,
    max_payload_bytes: int,
) -> Outbound:
    """The message as a dead letter, keeping at most `max_payload_bytes` of its payload
    (it may hold personal data); `payload_bytes` is always the whole payload's size."""
    kept = payload[:max_payload_bytes]
    truncated = len(kept) < len(payload)
    try:
        text, encoding = _utf8_text(kept, cut=truncated), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(kept).decode(), "base64"
    letter = DeadLetter(
        topic=topic,
        error=error,
        id=ident,
        payload=text,
        encoding=encoding,
        payload_bytes=len(payload),
        truncated=truncated,
    )
    return Outbound(topic=dead_topic, payload=letter.model_dump_json(exclude_none=True).encode())


def _utf8_text(data: bytes, *, cut: bool) -> str:
    """`data` as UTF-8. When it was `cut` from a longer payload, a character the cut split
    in half is dropped (the text is marked truncated anyway) instead of making the whole
    text look binary; any other invalid byte still raises."""
    if not cut:
        return data.decode("utf-8")
    # Not final: an incomplete sequence at the end is held back, not an error.
    return codecs.getincrementaldecoder("utf-8")().decode(data, final=False)

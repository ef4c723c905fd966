"""What stands in for a reply the dedup store does not keep whole.

A finished call's record keeps its reply, so a repeat gets it again. A reply larger than
`max_reply_bytes` is never kept whole, and a kept one may give way to keep a caller, or
the store, within its bytes (`ledger.py`): either way the record stays, holding this
summary instead, a reply of its own with the code `reply_not_kept` that says whether the
run succeeded (`details.ok`), how it failed (`details.error_code`) and how large the reply
was (`details.reply_bytes`). A repeat gets the summary, marked `replayed`, and the call is
never run again for it: at most once holds whatever the reply's size.
"""

from __future__ import annotations

from toolbus.wire.contracts import Reply
from toolbus.wire.errors import ReplyNotKept

SUMMARY_WORTH_BYTES = 1024  # a reply this small is kept whole: a summary would save nothing


def summary_of(reply: Reply, size: int) -> bytes:
    """The summary that stands in for `reply`, `size` bytes as stored."""
    details: dict[str, object] = {"ok": reply.ok, "reply_bytes": size}
    if reply.error is not None:
        details["error_code"] = reply.error.code.value
    not_kept = ReplyNotKept(
        "this request ran and was answered; its reply is not kept for repeats, and the "
        "call does not run again",
        **details,
    )
    stand_in = Reply(
        id=reply.id,
        ok=False,
        tool=reply.tool,
        error=not_kept.body(),
        duration_ms=reply.duration_ms,
        trace_id=reply.trace_id,
    )
    return stand_in.model_dump_json(by_alias=True, exclude_defaults=True).encode()


def kept_for_repeats(reply: Reply, max_reply_bytes: int) -> tuple[bytes, bytes | None]:
    """What a finished call's record keeps: the reply as stored, and the summary that can
    stand in for it later (None: too small to be worth one, or already the summary)."""
    whole = reply.model_dump_json(by_alias=True).encode()
    if len(whole) <= SUMMARY_WORTH_BYTES:
        return whole, None
    summary = summary_of(reply, len(whole))
    if len(whole) > max_reply_bytes:
        return summary, None
    return whole, summary

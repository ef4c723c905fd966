"""Routing: a continuation that reaches another worker than the one holding its call.

Behind `$share` a caller's continuation lands on any worker of the pool. A 2026-07-28
server's call needs no routing (any worker resumes it from its token). A held call
(an older server asking on its session) waits on the one worker whose session holds
it: the token names that worker (`owner`), and the worker that received the
continuation asks it, through the shared store's relay (Redis pub/sub: the store the
pool shares already, so no broker ACL has to let workers talk to each other and no
caller can publish into it), to resume the call with the answers and say how the
round ended. That worker answers its own request: it claims it, waits, replies.

What happens when the holder died: the relay tells at once when nobody listens on the
holder's channel (it exited, or was killed and its connection dropped), and checks
again each `CHECK_S` while it waits; either way the continuation is answered
`in_doubt` (the server may have acted on the earlier round), never left to hang. The
wait is bounded by the continuation's own deadline too.
"""

from __future__ import annotations

import logging
from typing import Any

from toolbus.calls.asked import Asked
from toolbus.calls.preparation import Outcome
from toolbus.calls.relay import Relay
from toolbus.calls.replies import reply_for
from toolbus.calls.rounds import Rounds
from toolbus.tools.context import Answers
from toolbus.wire.asking import InputRequest
from toolbus.wire.contracts import Reply
from toolbus.wire.errors import InDoubt, ReplyNotKept

log = logging.getLogger("toolbus.rounds")


class Routing:
    """Held calls' rounds across the pool: asked of their holder, answered for others."""

    def __init__(self, rounds: Rounds, relay: Relay) -> None:
        self._rounds = rounds
        self._relay = relay
        relay.serve(self._serve)

    async def resume(
        self, owner: str, token: str, answers: Answers, key: str | None, deadline_s: float
    ) -> Outcome | Asked | Reply | None:
        """The round `owner` runs for these answers: its questions, or the call's final
        reply (its id the holder's blank: the caller's request gives it); None: the
        question is not open there any more (timed out, or the call ended); an outcome
        `in_doubt` when `owner` is gone."""
        message = {"token": token, "answers": answers, "key": key, "deadline_s": deadline_s}
        answered = await self._relay.ask(owner, message, deadline_s)
        if answered is None:
            log.warning("the worker holding a call is gone: the continuation is in doubt")
            gone = InDoubt(
                "the worker holding the call stopped before it went on",
                in_doubt=True,
                started=True,
                cause="worker_lost",
            )
            return Outcome(error=gone, invoked=True)
        if "asked" in answered:
            asked = answered["asked"]
            questions = {k: InputRequest.model_validate(q) for k, q in asked["questions"].items()}
            return Asked(questions, asked["token"], asked["expires_in_s"])
        if "reply" in answered:
            return Reply.model_validate_json(answered["reply"])
        if answered.get("too_large"):  # past the relay's bound, either way
            lost = ReplyNotKept("the round's answer was too large to relay", relay=True)
            return Outcome(error=lost, invoked=True)
        return None

    async def _serve(self, message: dict[str, Any]) -> dict[str, Any]:
        """Another worker's continuation of a call held here: its next round."""
        token = str(message.get("token"))
        held = self._rounds.held(token)
        if held is None:
            ending = self._rounds.ending(token)  # it ended here unheard a moment ago
            if ending is not None:
                return {"reply": ending.model_dump_json(exclude_none=True)}
            return {"gone": True}
        ended = await self._rounds.resume(
            held, dict(message["answers"]), message.get("key"), None, float(message["deadline_s"])
        )
        if ended is None:
            return {"gone": True}
        if isinstance(ended, Asked):
            questions = {
                k: q.model_dump(mode="json", by_alias=True) for k, q in ended.questions.items()
            }
            return {
                "asked": {
                    "questions": questions,
                    "token": ended.token,
                    "expires_in_s": ended.expires_in_s,
                }
            }
        return {"reply": reply_for("", False, ended).model_dump_json(exclude_none=True)}

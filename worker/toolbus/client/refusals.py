"""The broker refusing to take a request, or to let its answer come (`RequestRefused`),
and what to check then: the topic the client chose against what the broker's ACL lets
its login publish."""

from __future__ import annotations

from toolbus.transport import reason_name
from toolbus.wire.errors import RequestRefused


def refused(packet: str, code: int, what: str, topic: str) -> RequestRefused:
    """The broker refused `what` on `topic` in its `packet` (PUBACK, SUBACK) with `code`."""
    return RequestRefused(
        f"the broker refused {what} {topic} ({reason_name(packet, code)}, reason 0x{code:02x})",
        topic=topic,
        reason_code=code,
    )


def explained(
    exc: RequestRefused, in_topic: bool, caller: str | None, login: str | None
) -> RequestRefused:
    """`exc` with what to check added (`refused_why`)."""
    why = refused_why(in_topic=in_topic, caller=caller, login=login)
    return RequestRefused(f"{exc.message}: {why}", **exc.details)


def refused_why(*, in_topic: bool, caller: str | None, login: str | None) -> str:
    """The likely cause, in words: a client that names its caller in the body where the
    workers (and so the ACL) take it from the topic, a caller that is not the login, or
    else the ACL itself."""
    shown = login or "(none)"
    if not in_topic:
        return (
            f"check the broker's ACL for the topics of login {shown}; where the workers "
            'take the caller from the topic (caller_identity = "topic"), say so here too '
            '(caller_identity="topic"; the command line: TOOLBUS_CALLER_IDENTITY=topic)'
        )
    if caller is None and login:
        return (
            "under caller_identity topic the request names its caller in the topic, and "
            f"the ACL lets login {login} publish as {login} only: give --caller {login}"
        )
    if caller != login:
        return (
            "under caller_identity topic the ACL lets a login publish as its own caller "
            f"only: the caller is {caller or '(none)'}, the login {shown} (--caller)"
        )
    return f"check the broker's ACL for the topics of login {shown}"

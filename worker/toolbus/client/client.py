"""Client: `toolbus.Client`, what a program calls tools through, instead of raw MQTT.

    async with toolbus.Client("mqtt://localhost:1883") as client:
        reply = await client.call("echo", {"text": "hi"})       # or raises UnknownTool, ...
        tools = await client.tools(format="anthropic")          # for the model's `tools=`
        messages.extend(await client.run_tool_calls(message))   # a model's tool calls, run

One connection and one private reply topic for the client's lifetime, re-made across
broker restarts, and every request re-sent unchanged (the same id) while no answer comes:
that is `toolbus.client.requester`; a call whose task is cancelled is cancelled at the
workers (`cancelling`). This module knows which topic a call goes to for its caller,
errors as the `toolbus.wire.errors` classes of their codes, which answers say only that
their own delivery did not run (`said`: the requester waits for the other copies'), and
a provider's message sent as its SDK made it, answered by a `CallsReply` whose `append`
goes back into the conversation. docs/client.md shows it in agent loops.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

from toolbus.client.answers import OnProgress, read_answer, said
from toolbus.client.answers import raise_failed as _raise_failed
from toolbus.client.bodies import provider_body
from toolbus.client.cancelling import Canceller
from toolbus.client.presence import Presence
from toolbus.client.refusals import explained
from toolbus.client.requester import Requester, Retry
from toolbus.client.rounds import Asked, Callbacks, Rounds
from toolbus.wire.broker import BrokerUrl, broker_urls
from toolbus.wire.contracts import CallsReply, ErrorBody, ErrorCode, Reply, ReplyFormat, ToolsFormat
from toolbus.wire.errors import NoReply, RequestRefused, ToolbusError
from toolbus.wire.topics import ANONYMOUS_CALLER, CallerIdentity, Topics

# What `toolbus.client.client` offers (`Retry` lives in requester, `said` in answers).
__all__ = ["Client", "NoReply", "Retry", "provider_body", "said"]

DEFAULT_TIMEOUT_S = 30.0  # the workers' own `default_timeout_s`
# Past a call's deadline, the wait for the worker's own `timeout` answer: the expiry that
# carries the deadline is in whole seconds (rounded up), and the answer must travel back.
REPLY_GRACE_S = 2.0
DEFAULT_RETRY = Retry()  # frozen: one shared default is safe; 3 sends, 5 s apart

T = TypeVar("T", bound=Reply | CallsReply)  # what a worker answers


class Client:
    """Tool calls through toolbus workers: `async with Client(broker) as client`.

    Args:
        broker: the broker, as a URL (`mqtt://user:password@host:1883`, `mqtts://...`)
            or a `BrokerUrl` (TLS files, a password kept apart from the URL); a cluster's
            nodes as a list or URLs separated by commas, tried in order.
        prefix: the workers' `topic_prefix`.
        reply_prefix: one of the workers' `allowed_reply_prefixes` (default
            `{prefix}/reply/`, theirs by default). Replies come to
            `{reply_prefix}{caller}/{client_id}`, or `{reply_prefix}{client_id}` without
            a caller.
        caller: who this client is to the workers (their caller profiles and quotas).
        caller_identity: how the workers learn it; theirs, `claim` (the default: named in
            each request) or `topic` (named by the topic, `{prefix}/call/{caller}/{tool}`,
            which the broker's ACL ties to this client's login).
        retry: when, and how often, an unanswered request is sent again (the same id).
        client_id: the MQTT client identifier (random by default). A broker that binds
            logins to client ids (mosquitto's dynamic security, docs/security.md) needs
            the one bound to the login: the caller's login itself, as `add-caller` makes it.
        connect_timeout_s: bound on connecting (and each acknowledgement).
        keepalive_s: MQTT keepalive: a broker node silent this long is pinged, and left
            (for the next node, or again) after as long again without an answer.
        timeout_s: each request's deadline unless the call gives one. It travels as
            the request's MQTT expiry: the worker stops the call then and answers
            `timeout` (`CallTimeout`); with no answer at all, `NoReply`.
        on_resend: called before each repeat of an unanswered request with that send's
            number and the sends allowed (`2, 3`): `toolbus call` tells its user.
        fail_when_taken_over: another connection took this client id over (0x8E): fail
            with `SessionTakenOver` (`toolbus call`), not reconnect after a backoff.
        require_worker: read the workers' retained statuses on the same connection,
            and raise `NoWorker` (a `NoReply`) within about a second, the request unsent,
            when they show no worker online (see `toolbus.client.presence`); off by
            default: a library rides out a worker restart on its retries.
    """

    def __init__(
        self,
        broker: BrokerUrl | str | Sequence[BrokerUrl | str],
        *,
        prefix: str = "toolbus",
        reply_prefix: str | None = None,
        caller: str | None = None,
        caller_identity: CallerIdentity = "claim",
        retry: Retry = DEFAULT_RETRY,
        client_id: str | None = None,
        connect_timeout_s: float = 10.0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        on_resend: Callable[[int, int], None] | None = None,
        require_worker: bool = False,
        fail_when_taken_over: bool = False,
        keepalive_s: int = 60,
    ) -> None:
        if caller_identity not in ("claim", "topic"):
            raise ValueError("caller_identity is `claim` or `topic`, as the workers have it")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.prefix, self.caller, self._in_topic = prefix, caller, caller_identity == "topic"
        self._cancels = Canceller(prefix, caller, self._in_topic)
        nodes = _nodes(broker)
        self._login, self._timeout_s = nodes[0].username, timeout_s
        client_id = client_id or f"toolbus-client-{uuid.uuid4().hex[:12]}"
        # In `topic` mode a reply sits under the caller's level (`anonymous` without one).
        level = caller or (ANONYMOUS_CALLER if self._in_topic else None)
        replies = reply_prefix if reply_prefix is not None else f"{prefix}/reply/"
        topics = Topics(prefix, "", (replies,))
        self._presence = Presence(topics) if require_worker else None
        self._requester = Requester(
            nodes,
            reply_topic=f"{replies}{level}/{client_id}" if level else f"{replies}{client_id}",
            client_id=client_id,
            retry=retry,
            connect_timeout_s=connect_timeout_s,
            on_resend=on_resend,
            watch=self._presence.subscribe if self._presence else None,
            heard=self._presence.take if self._presence else None,
            fail_when_taken_over=fail_when_taken_over,
            keepalive_s=keepalive_s,
        )

    async def __aenter__(self) -> Self:
        """Connected and subscribed to the reply topic. Raises `TransportError` when the
        broker cannot be reached now (`BrokerRefused` when it refuses us); a connection
        lost later is made again, and the requests in flight are sent again on it."""
        try:
            await self._requester.__aenter__()
        except RequestRefused as exc:  # the reply topic's subscription: say what to check
            raise explained(exc, self._in_topic, self.caller, self._login) from None
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._requester.__aexit__(exc_type, exc, tb)

    @property
    def client_id(self) -> str:
        return self._requester.client_id

    @property
    def reply_topic(self) -> str:
        return self._requester.reply_topic

    @property
    def sent(self) -> int:
        """Requests published, first sends and repeats."""
        return self._requester.sent

    @property
    def resent(self) -> int:
        """Repeats of requests no answer had come for."""
        return self._requester.resent

    @property
    def connects(self) -> int:
        """Connections made: 1, and one more after each time the broker went away."""
        return self._requester.connects

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        id: str | None = None,
        on_progress: OnProgress | None = None,
        extend_on_progress: bool = False,
        **asking: Unpack[Callbacks],
    ) -> Reply:
        """Run `tool` and return its reply (`reply.result.text`, `.structured`,
        `.content`). Raises the `toolbus.wire.errors` class of the worker's error code
        (`UnknownTool`, `InvalidArguments`, `CallTimeout`, ...), or `NoReply`.

        `id` (random by default) is what a repeat is known by: the same id sent again,
        by this client's retries or by you later, is answered from the first run.
        Arguments with no JSON form (NaN, infinities) raise `ValueError`, unsent;
        arguments that are not a mapping (`call("echo", "hi")`), `TypeError`.

        `on_progress` asks for the call's progress: called with each `Progress` update
        (`.progress`, `.total`, `.message`), in order, all before this returns.
        `extend_on_progress`: each update restarts the deadline on the worker, up to
        the tool's `max_timeout_s` (this client still waits `timeout_s` at most).

        `on_input`, `on_sampling`, `on_approval` answer what the tool asks and approve a
        gated call, round by round (`toolbus.client.rounds`; `max_rounds`, 10).
        """
        if arguments is not None and not isinstance(arguments, Mapping):
            raise TypeError(
                f"arguments are a mapping of parameter names to values, e.g. "
                f'call({tool!r}, {{"text": "hi"}}), not a {type(arguments).__name__}'
            )
        ident = id or uuid.uuid4().hex
        body: dict[str, Any] = {"id": ident, "arguments": dict(arguments or {})}
        if on_progress is not None:
            body["progress"] = True
        if extend_on_progress:
            body["extend_on_progress"] = True
        if (rounds := Rounds.of(asking)) is not None and rounds.input:
            body["input"] = True
        if self._in_topic and self.caller:
            topic = f"{self.prefix}/call/{self.caller}/{tool}"
        else:
            topic, body["tool"] = f"{self.prefix}/call", tool
        asked = Asked(topic, dict(body), self._calls_topic(), ident)

        async def send(topic: str, body: dict[str, Any], ident: str) -> Reply:
            parse, claimed = Reply.model_validate_json, self._claimed(body)
            return await self._ask(topic, claimed, timeout_s, ident, parse, on_progress=on_progress)

        reply = await send(topic, body, ident)
        return _raise_failed(
            await rounds.drive(reply, asked, send, self._cancel) if rounds else reply
        )

    async def tools(
        self, format: ToolsFormat | str = ToolsFormat.TOOLBUS, *, timeout_s: float | None = None
    ) -> list[dict[str, Any]]:
        """The definitions of the tools this client may call, in `format`: `toolbus`,
        `mcp`, or the shape a provider's `tools=` takes (`anthropic`, `openai`,
        `openai-responses`, `ollama`). `tool_list` also says what they may lack."""
        definitions, _ = await self.tool_list(format, timeout_s=timeout_s)
        return definitions

    async def tool_list(
        self, format: ToolsFormat | str = ToolsFormat.TOOLBUS, *, timeout_s: float | None = None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """`tools`, and the MCP servers that were not ready (`{server, state}`): the
        worker waits for servers still connecting within the deadline; a server named
        here may have tools the list lacks (ask again later)."""
        body = self._claimed({"format": ToolsFormat(format).value})
        topic = f"{self.prefix}/tools"
        if self._in_topic and self.caller:
            topic = f"{topic}/{self.caller}"
        reply = _raise_failed(
            await self._ask(topic, body, timeout_s, None, Reply.model_validate_json)
        )
        structured = reply.result.structured if reply.result is not None else None
        listed = structured.get("tools") if isinstance(structured, dict) else None
        if not isinstance(listed, list):
            raise ToolbusError.from_body(
                ErrorBody(code=ErrorCode.INTERNAL, message="the tool list came without tools"),
                reply=reply,
            )
        pending = structured.get("pending") if isinstance(structured, dict) else None
        return (
            [item for item in listed if isinstance(item, dict)],
            [item for item in pending if isinstance(item, dict)]
            if isinstance(pending, list)
            else [],  # a worker from before issue 30 sends none
        )

    async def run_tool_calls(
        self,
        message: Any,
        *,
        reply_format: ReplyFormat | str | None = None,
        timeout_s: float | None = None,
        **asking: Unpack[Callbacks],
    ) -> list[dict[str, Any]]:
        """Run the tool calls of a model's message and return what to append to the
        conversation, in the message's own provider format (or `reply_format`).

        `message` is what the SDK gave you, as it is: an Anthropic `Message`, its
        `content` or one `tool_use` block; an OpenAI `ChatCompletion`, its message or
        one tool call; a Responses `Response`, its `output` or one `function_call`; an
        Ollama response. SDK objects (pydantic models) or plain dicts and lists. The
        calls run concurrently; one call's failure is an error result the model sees,
        never an exception. Raises when the message as a whole is refused. The callbacks
        answer its calls' questions and approvals as `call`'s do.
        """
        answer = await self.run_tool_calls_reply(
            message, reply_format=reply_format, timeout_s=timeout_s, **asking
        )
        return [dict(item) for item in answer.append]

    async def run_tool_calls_reply(
        self,
        message: Any,
        *,
        reply_format: ReplyFormat | str | None = None,
        timeout_s: float | None = None,
        **asking: Unpack[Callbacks],
    ) -> CallsReply:
        """As `run_tool_calls`, the whole answer: `append`, and each call's own `Reply`
        in `results` (ok, error code, duration, what normalization changed)."""
        body = provider_body(message)
        options: dict[str, Any] = dict(body.get("toolbus") or {})
        # Our id for the request: calls without ids of their own (Ollama's) take it, so
        # a repeat sent while the first is still running is answered once, not run twice.
        own = body.get("id") if isinstance(body.get("id"), str) else None
        ident = options.setdefault("id", own or uuid.uuid4().hex)
        if reply_format is not None:
            options["reply_format"] = ReplyFormat(reply_format).value
        if self.caller and not self._in_topic:
            options["caller"] = self.caller
        if (rounds := Rounds.of(asking)) is not None and rounds.input:
            options["input"] = True
        body["toolbus"] = options
        topic = self._calls_topic()
        answer = await self._ask(topic, body, timeout_s, ident, read_answer)
        if not isinstance(answer, CallsReply):
            # A plain `Reply`: one call answered in our own format, or, as an error where
            # a provider's format was due, the message refused whole (nothing to append).
            if not answer.ok and options.get("reply_format") != ReplyFormat.TOOLBUS.value:
                _raise_failed(answer)
            answer = CallsReply(
                id=answer.id,
                id_generated=answer.id_generated,
                format=ReplyFormat.TOOLBUS,
                ok=answer.ok,
                results=[answer],
                duration_ms=answer.duration_ms,
                trace_id=answer.trace_id,
                traceparent=answer.traceparent,
            )

        async def send(topic: str, body: dict[str, Any], ident: str) -> Reply:
            parse = Reply.model_validate_json
            return await self._ask(topic, self._claimed(body), timeout_s, ident, parse)

        return await rounds.settle(answer, body, send, topic, self._cancel) if rounds else answer

    async def request(
        self, topic: str, body: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> Reply | CallsReply:
        """Any body on any topic, answered as it comes, an error reply included (no
        exception): for shapes and topics the methods above do not make. The body is
        sent as given; give it an `id` for its repeats to be known as such."""
        ident = body.get("id") if isinstance(body.get("id"), str) else None
        return await self._ask(topic, dict(body), timeout_s, ident, read_answer)

    def _calls_topic(self) -> str:
        """Where a request naming its tool in the body goes (a continuation needs none)."""
        in_topic = self._in_topic and self.caller
        return f"{self.prefix}/call/{self.caller}" if in_topic else f"{self.prefix}/call"

    def _claimed(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body naming the caller, where the workers read it from the body."""
        if self.caller and not self._in_topic:
            body["caller"] = self.caller
        return body

    async def _ask(
        self,
        topic: str,
        body: dict[str, Any],
        timeout_s: float | None,
        ident: str | None,
        parse: Callable[[bytes], T],
        *,
        on_progress: OnProgress | None = None,
    ) -> T:
        deadline_s = timeout_s if timeout_s is not None else self._timeout_s
        if deadline_s <= 0:
            raise ValueError("timeout_s must be positive")
        if self._presence is not None:
            await self._presence.check()  # NoWorker: unsent, so it cannot run later
        try:
            return await self._requester.request(
                topic,
                # Never NaN or Infinity on the wire: Python writes them, JSON has none.
                json.dumps(body, separators=(",", ":"), allow_nan=False).encode(),
                parse,
                timeout_s=deadline_s,
                grace_s=REPLY_GRACE_S,
                correlation=uuid.uuid4().bytes,
                ident=ident,
                judge=said,
                on_progress=on_progress,
            )
        except RequestRefused as exc:  # an ACL's "not authorized": say what to check
            raise explained(exc, self._in_topic, self.caller, self._login) from None
        except asyncio.CancelledError:  # not wanted any more: the workers hear so
            await self._cancel(ident)
            raise

    async def _cancel(self, ident: str | None) -> None:
        await self._cancels.send(self._requester.connection, ident, self.reply_topic)


def _nodes(broker: BrokerUrl | str | Sequence[BrokerUrl | str]) -> tuple[BrokerUrl, ...]:
    """The broker, or a cluster's nodes (a list, or URLs separated by commas), in order."""
    given = broker_urls(broker) if isinstance(broker, str) else broker
    listed = [given] if isinstance(given, BrokerUrl) else list(given)
    return tuple(n if isinstance(n, BrokerUrl) else BrokerUrl.from_url(n) for n in listed)

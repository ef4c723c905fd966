"""Topic templates, who a request topic says the caller is, and where replies may go.

{prefix}/call              request; tool named in the body
{prefix}/call/{tool}       request; tool named by the topic (caller_identity = "claim")
{prefix}/call/{caller}     request from {caller}; tool in the body (caller_identity = "topic")
{prefix}/call/{caller}/{tool}   request from a named caller
{prefix}/tools             list tool definitions (answered like a call)
{prefix}/tools/{caller}    list the tool definitions that caller may use
{prefix}/cancel            cancel a call; the body names its `id` (and `caller`, claim mode)
{prefix}/cancel/{caller}   cancel one of {caller}'s calls (caller_identity = "topic")
{prefix}/tasks/get         a task's state; the caller in the body (`claim`)
{prefix}/tasks/get/{caller}   a task's state for {caller} (`topic`)
{prefix}/dead              dead letters: requests that could not be answered
{prefix}/status/workers/{worker_id}           retained worker status, last will `offline`
{prefix}/status/servers/{name}/{worker_id}    retained state of one MCP server at one worker

Two ways to learn the caller (`caller_identity`): `claim` takes what the request says
(the body's `caller`, or `call/{caller}/{tool}` when no tool has that name), which any
client can forge; `topic` takes the level after `call/` or `tools/`, which the broker's
ACL ties to the client's login (compose/mosquitto/acl). In `topic` mode a
reply may only go under `{reply_prefix}{caller}/`, so no client can make the worker
publish on another caller's replies.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from toolbus.wire.untrusted import text_problem, topic_problem

MAX_REPLY_TOPIC_BYTES = 1024
MAX_NAME_CHARS = 200
TOPIC_CACHE_SIZE = 4096  # a caller or tool named by a topic level

CallerIdentity = Literal["claim", "topic"]

ANONYMOUS_CALLER = "anonymous"  # the caller of a request that names none


@dataclass(frozen=True, slots=True)
class Route:
    """What a request topic says: a call or a tool listing, and maybe its caller and tool."""

    list_tools: bool
    caller: str | None = None
    tool: str = ""  # "" when the body names it
    ambiguous: bool = False  # claim mode `call/a/b`: caller `a` and tool `b`, or tool `a/b`


@dataclass(frozen=True, slots=True)
class Topics:
    prefix: str
    shared_group: str
    reply_prefixes: tuple[str, ...]
    caller_identity: CallerIdentity = "claim"
    require_caller: bool = False

    @property
    def call(self) -> str:
        return f"{self.prefix}/call"

    @property
    def tools(self) -> str:
        return f"{self.prefix}/tools"

    @property
    def cancel(self) -> str:
        return f"{self.prefix}/cancel"

    @property
    def cancels(self) -> str:
        """Every worker's plain (never shared) filter: whichever runs the call hears it."""
        return f"{self.cancel}/#"  # matches `cancel` itself too

    def cancel_caller(self, topic: str) -> str | None:
        """The caller level of a cancel topic ("" for none); None: not a usable one."""
        if topic == self.cancel:
            return ""
        caller = topic.removeprefix(self.cancel + "/")
        if caller == topic or not caller or "/" in caller or len(caller) > MAX_NAME_CHARS:
            return None
        return caller if text_problem(caller) is None else None

    @property
    def tasks_get(self) -> str:
        return f"{self.prefix}/tasks/get"

    def task_caller(self, topic: str) -> tuple[bool, str | None]:
        """Is `topic` a `tasks/get` one, and which caller its topic names (topic mode)."""
        if topic == self.tasks_get:
            return True, None
        if not topic.startswith(self.tasks_get + "/"):
            return False, None
        caller = topic[len(self.tasks_get) + 1 :]
        usable = len(caller) <= MAX_NAME_CHARS and text_problem(caller) is None
        return True, caller if usable and "/" not in caller else ""

    @property
    def dead(self) -> str:
        return f"{self.prefix}/dead"

    @property
    def statuses(self) -> str:
        """The filter for every status: what `toolbus status` subscribes to."""
        return f"{self.prefix}/status/#"

    def status(self, worker_id: str) -> str:
        return f"{self.prefix}/status/workers/{worker_id}"

    def server_status(self, server: str, worker_id: str) -> str:
        return f"{self.prefix}/status/servers/{server}/{worker_id}"

    def status_of(self, topic: str) -> tuple[Literal["worker", "server"], str, str] | None:
        """What a status topic is about: ("worker", worker_id, "") or ("server", server,
        worker_id); None for anything else under `status/` (e.g. the one-per-server
        topics of earlier versions, `status/servers/{name}`)."""
        kind, _, rest = topic.removeprefix(f"{self.prefix}/status/").partition("/")
        if not topic.startswith(f"{self.prefix}/status/") or not rest:
            return None
        if kind == "workers" and "/" not in rest:
            return ("worker", rest, "")
        server, _, worker_id = rest.rpartition("/")  # a worker id is one level, see Settings
        if kind == "servers" and server and worker_id:
            return ("server", server, worker_id)
        return None

    def subscriptions(self) -> tuple[str, ...]:
        # `call/#` also matches `call` itself (MQTT 3.1.1 §4.7.1.2).
        filters = (f"{self.call}/#", f"{self.tools}/#", f"{self.tasks_get}/#")
        if not self.shared_group:
            return filters
        return tuple(f"$share/{self.shared_group}/{f}" for f in filters)

    # Callers reuse their topics: each is judged once (bounded; Topics lives as long as
    # the worker, so holding `self` in the cache keeps nothing alive that would not be).
    @functools.lru_cache(maxsize=TOPIC_CACHE_SIZE)  # noqa: B019 -- see the comment above
    def route(self, topic: str) -> Route | str:
        """What a request topic names, or why it names nothing usable (a reason key)."""
        for base, list_tools in ((self.call, False), (self.tools, True)):
            if topic == base:
                return Route(list_tools)
            if topic.startswith(base + "/"):
                return self._levels(topic[len(base) + 1 :], list_tools)
        return "not_a_request_topic"

    def _levels(self, rest: str, list_tools: bool) -> Route | str:
        if self.caller_identity == "topic":
            caller, _, tool = rest.partition("/")
            if list_tools and tool:
                return "too_many_levels"
        elif list_tools:
            caller, tool = rest, ""
        else:
            caller, tool = "", rest
        for name in (caller, tool):
            if len(name) > MAX_NAME_CHARS:
                return "name_too_long"
            if text_problem(name) is not None:
                return "bad_character"
        if caller == "" and self.caller_identity == "topic":
            return "empty_level"
        return Route(list_tools, caller or None, tool, ambiguous="/" in tool and not caller)

    def caller_of(self, topic: str) -> str | None:
        """The caller a request topic names, even when its tool level is unusable: in
        `topic` mode the shipped ACL (`pattern write toolbus/call/%u/#`) ties everything
        under `call/{caller}/` to that login, so the refusal is answered under that
        caller's replies. None: no caller, or a caller level that is itself unusable
        (and `tools/{caller}/...`, which that ACL lets no caller publish)."""
        route = self.route(topic)
        if isinstance(route, Route):
            return route.caller
        if self.caller_identity != "topic" or not topic.startswith(self.call + "/"):
            return None
        caller = topic[len(self.call) + 1 :].partition("/")[0]
        usable = caller and len(caller) <= MAX_NAME_CHARS and text_problem(caller) is None
        return caller if usable else None

    def is_request(self, topic: str) -> bool:
        """Is `topic` one the worker takes requests on (well-formed or not)?"""
        return any(
            topic == base or topic.startswith(base + "/")
            for base in (self.call, self.tools, f"{self.prefix}/tasks")
        )

    def _is_ours(self, topic: str) -> bool:
        status = f"{self.prefix}/status"
        bases = (self.dead, status, self.cancel)
        return topic in bases or topic.startswith(tuple(base + "/" for base in bases))

    @functools.lru_cache(maxsize=TOPIC_CACHE_SIZE)  # noqa: B019 -- as for `route`
    def reply_problem(self, topic: str, caller: str | None) -> str | None:
        """Why a reply may not go to `topic` for `caller` (a reason key), or None."""
        if (problem := topic_problem(topic, max_bytes=MAX_REPLY_TOPIC_BYTES)) is not None:
            return problem
        # Whatever the prefixes allow, a reply must never become a request, a dead
        # letter or a status that operators and other workers read.
        if self.is_request(topic):
            return "request_topic"
        if self._is_ours(topic):
            return "worker_topic"
        if not any(topic.startswith(prefix) for prefix in self.reply_space(caller)):
            return "outside_prefixes"
        return None

    def reply_space(self, caller: str | None) -> tuple[str, ...]:
        """The prefixes `caller`'s replies may go under: its own level of each reply
        prefix when the topic names callers, the reply prefixes themselves otherwise."""
        if self.caller_identity != "topic":
            return self.reply_prefixes
        return tuple(f"{prefix}{caller or ANONYMOUS_CALLER}/" for prefix in self.reply_prefixes)

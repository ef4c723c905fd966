"""Channels and operations: the topic layout of `toolbus.wire.topics`, as AsyncAPI describes it.

The addresses come from `Topics` itself, built with `{prefix}` as its prefix and each
status method called with its own parameter names as placeholders, so a change to the
layout changes the document. The operations are the worker's: it receives requests
(and answers each on the caller's reply topic) and sends trace, dead-letter and status
messages.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

from toolbus.cli.asyncapi.messages import (
    cancel_message,
    operator_messages,
    reply_messages,
    request_messages,
    task_get_request,
    tools_request,
    trace_message,
)
from toolbus.config.settings import Settings
from toolbus.wire.topics import Topics

MESSAGES = "#/components/messages/"
PARAMETER_REFS = "#/components/parameters/"
_LAYOUT = Topics(prefix="{prefix}", shared_group="", reply_prefixes=())
_OPERATION_BINDINGS = "#/components/operationBindings/"
OPERATION_BINDINGS = {
    "request": {
        "mqtt": {
            "qos": 1,
            "messageExpiryInterval": {
                "type": "integer",
                "minimum": 1,
                "description": "Optional: when the caller stops waiting. It caps the call's "
                "deadline (time queued in the broker counts), and the reply expires when it "
                "would have. MQTT 3.1.1 callers give `deadline_ms` in the body instead.",
            },
            "bindingVersion": "0.2.0",
        }
    },
    "qos1": {"mqtt": {"qos": 1, "bindingVersion": "0.2.0"}},
    "retained": {
        "mqtt": {
            "qos": 1,
            "retain": True,
            "messageExpiryInterval": {
                "type": "integer",
                "minimum": 1,
                "description": "Every status expires: a worker's and its servers' after "
                "three `status_interval_s` (republished every interval while it runs), the "
                "last will after `session_expiry_s`. A status that is gone means a worker "
                "that is gone.",
            },
            "bindingVersion": "0.2.0",
        }
    },
}

PARAMETERS = {
    "prefix": {
        "description": "`topic_prefix`: one or more topic levels.",
        "default": Settings.model_fields["topic_prefix"].default,
    },
    "tool": {"description": "The tool's name (it may hold `/`, as MCP tools do)."},
    "caller": {
        "description": "The caller: with `caller_identity = topic` the broker's ACL ties "
        "it to the client's login (`pattern write {prefix}/call/%u/#`); with `claim` it "
        "is what the request says, and only when no tool has the name `{caller}/{tool}`.",
    },
    "worker_id": {"description": "The worker's id (`worker_id`), not its MQTT client ids."},
    "server": {"description": "The MCP server's name in `mcpServers`."},
    "reply_topic": {"description": "The reply topic of the call (Response Topic or `reply_to`)."},
}


def _template(method: Callable[..., str]) -> str:
    """What `method` makes of `{name}` placeholders for each of its parameters."""
    names = inspect.signature(method).parameters
    return method(*(f"{{{name}}}" for name in names))


def _channel(address: str | None, description: str, messages: dict[str, Any]) -> dict[str, Any]:
    channel: dict[str, Any] = {"address": address, "description": description}
    names = re.findall(r"\{(\w+)\}", address or "")
    unknown = [name for name in names if name not in PARAMETERS]
    if unknown:
        raise ValueError(f"describe the topic level(s) {unknown} in PARAMETERS")
    if names:
        channel["parameters"] = {name: {"$ref": PARAMETER_REFS + name} for name in names}
    channel["messages"] = {key: {"$ref": MESSAGES + key} for key in messages}
    return channel


def components() -> dict[str, Any]:
    """Every message, by key (`components/messages`); the key is its name too."""
    messages = {
        **request_messages(),
        "toolsRequest": tools_request(),
        "taskGetRequest": task_get_request(),
        **reply_messages(),
        "trace": trace_message(),
        "cancel": cancel_message(),
        **operator_messages(),
    }
    return {key: {"name": key, **message} for key, message in messages.items()}


def channels() -> dict[str, Any]:
    calls = request_messages()
    tools = {"toolsRequest": None}
    return {
        "call": _channel(_LAYOUT.call, "A call; the body names the tool.", calls),
        "callTool": _channel(
            f"{_LAYOUT.call}/{{tool}}",
            "A call to the tool the topic names (a body that names one must agree); with "
            "`caller_identity = claim`, the default.",
            calls,
        ),
        "callCaller": _channel(
            f"{_LAYOUT.call}/{{caller}}",
            "A call from the caller the topic names; the body names the tool. With "
            "`caller_identity = topic`, where the level after `call/` is always the caller.",
            calls,
        ),
        "callCallerTool": _channel(
            f"{_LAYOUT.call}/{{caller}}/{{tool}}",
            "A call from the caller the topic names, to the tool it names.",
            calls,
        ),
        "tools": _channel(_LAYOUT.tools, "A tools request.", tools),
        "toolsCaller": _channel(
            f"{_LAYOUT.tools}/{{caller}}", "A tools request: the tools that caller may use.", tools
        ),
        "tasksGet": _channel(
            _LAYOUT.tasks_get,
            "A tasks/get request; the body may name the caller (`caller_identity = claim`).",
            {"taskGetRequest": None},
        ),
        "tasksGetCaller": _channel(
            f"{_LAYOUT.tasks_get}/{{caller}}",
            "A tasks/get request from the caller the topic names (`caller_identity = topic`).",
            {"taskGetRequest": None},
        ),
        "reply": _channel(
            None,
            "The caller's reply topic: the request's Response Topic (MQTT v5, with its "
            "Correlation Data) or its `reply_to` (MQTT 3.1.1). A reply to a request with a "
            "deadline carries a Message Expiry Interval of what remains of it (at least 1 s).",
            reply_messages(),
        ),
        "trace": _channel(
            "{reply_topic}/trace",
            "A call's spans, after its reply, when the request asked (`publish_trace`, the "
            "user property `toolbus-publish-trace: 1`, or `publish_traces` for all).",
            {"trace": None},
        ),
        "cancel": _channel(
            _LAYOUT.cancel,
            "A caller's cancel of its call (`caller` in the body).",
            {"cancel": None},
        ),
        "cancelCaller": _channel(
            f"{_LAYOUT.cancel}/{{caller}}",
            "A cancel from the caller the topic names (`caller_identity = topic`: the ACL's "
            "`cancel/{caller}`).",
            {"cancel": None},
        ),
        "dead": _channel(_LAYOUT.dead, "Dead letters, for operators.", {"deadLetter": None}),
        "workerStatus": _channel(
            _template(_LAYOUT.status),
            "A worker's retained status.",
            {"workerStatus": None},
        ),
        "serverStatus": _channel(
            _template(_LAYOUT.server_status),
            "An MCP server's retained status.",
            {"serverStatus": None},
        ),
    }


def operations() -> dict[str, Any]:
    def answers(*keys: str) -> list[dict[str, str]]:
        return [{"$ref": f"#/channels/reply/messages/{key}"} for key in keys]

    replies = answers(*(key for key in reply_messages() if key != "toolsReply"))
    tools_replies = answers("reply", "toolsReply")
    task_answers = answers("taskState", "reply")
    reply_address = {
        "description": "The Response Topic (MQTT v5), else the body's `reply_to` (beside a "
        "provider's shape: `toolbus.reply_to`). Without one, a failed call is dead-lettered.",
        "location": "$message.payload#/reply_to",
    }

    def receive(channel: str, summary: str, keys: list[str], answers: list[Any]) -> Any:
        return {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{channel}"},
            "summary": summary,
            "description": "Workers subscribe with a shared subscription "
            "(`$share/{shared_group}/{prefix}/call/#` and `.../tools/#`, QoS 1): each "
            "request goes to one worker of the group, acknowledged once it is answered.",
            "bindings": {"$ref": _OPERATION_BINDINGS + "request"},
            "messages": [{"$ref": f"#/channels/{channel}/messages/{key}"} for key in keys],
            "reply": {
                "channel": {"$ref": "#/channels/reply"},
                "address": reply_address,
                "messages": answers,
            },
        }

    def send(channel: str, summary: str, key: str, bindings: str) -> Any:
        return {
            "action": "send",
            "channel": {"$ref": f"#/channels/{channel}"},
            "summary": summary,
            "bindings": {"$ref": _OPERATION_BINDINGS + bindings},
            "messages": [{"$ref": f"#/channels/{channel}/messages/{key}"}],
        }

    def cancel(channel: str) -> Any:
        return {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{channel}"},
            "summary": "Cancel a caller's call, if it runs here.",
            "description": "Every worker subscribes to `{prefix}/cancel/#` plainly (not "
            "shared), so the one running the call hears it. No reply: the call's own final "
            "reply says `cancelled`.",
            "bindings": {"$ref": _OPERATION_BINDINGS + "qos1"},
            "messages": [{"$ref": f"#/channels/{channel}/messages/cancel"}],
        }

    calls = list(request_messages())
    return {
        "receiveCall": receive("call", "Run the call(s) a message holds.", calls, replies),
        "receiveToolCall": receive("callTool", "Run a call to the named tool.", calls, replies),
        "receiveCallerCall": receive("callCaller", "Run a caller's call.", calls, replies),
        "receiveCallerToolCall": receive(
            "callCallerTool", "Run a named caller's call.", calls, replies
        ),
        "receiveToolsRequest": receive("tools", "List the tools.", ["toolsRequest"], tools_replies),
        "receiveCallerToolsRequest": receive(
            "toolsCaller", "List a caller's tools.", ["toolsRequest"], tools_replies
        ),
        "receiveCancel": cancel("cancel"),
        "receiveCallerCancel": cancel("cancelCaller"),
        "receiveTaskGet": receive(
            "tasksGet", "Tell a task's state.", ["taskGetRequest"], task_answers
        ),
        "receiveCallerTaskGet": receive(
            "tasksGetCaller", "Tell a caller's task's state.", ["taskGetRequest"], task_answers
        ),
        "sendTrace": send("trace", "Publish a call's spans.", "trace", "qos1"),
        "sendDeadLetter": send("dead", "Dead-letter a request.", "deadLetter", "qos1"),
        "sendWorkerStatus": send(
            "workerStatus", "Publish the worker's status.", "workerStatus", "retained"
        ),
        "sendServerStatus": send(
            "serverStatus", "Publish an MCP server's status.", "serverStatus", "retained"
        ),
    }

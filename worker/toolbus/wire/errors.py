"""The exception tree. Every failure a caller can see is one of these.

    ToolbusError                 (root; never raised itself)
    ├── BadRequest               bad_request
    ├── UnknownTool              unknown_tool
    ├── InvalidArguments         invalid_arguments
    ├── Forbidden                forbidden
    │   └── RequestRefused       forbidden: the broker refused to take the request
    ├── CallTimeout              timeout
    ├── Unavailable              unavailable
    ├── ToolFailed               tool_error
    ├── InternalError            internal
    ├── InDoubt                  in_doubt
    ├── RateLimited              rate_limited
    ├── ReplyNotKept             reply_not_kept
    ├── Cancelled                cancelled
    ├── UnknownTask              unknown_task
    ├── InputRequired            input_required
    ├── ApprovalRequired         approval_required
    ├── ContinuationInvalid      continuation_invalid
    └── ApprovalInvalid          approval_invalid

Each leaf carries the wire code it maps to, one to one, renders its own
wire body, and says what its code means without quoting any value (`summary`: what
spans record). A local tool may raise any of them to choose the code its caller sees.
Details become JSON values when the error is raised (a `datetime` its ISO text, a
set a list, anything else its `str()`), so building the reply cannot fail on them.
The client raises the same classes for a worker's error replies (`from_body`), so a
caller writes `except UnknownTool` and reads `.code`, `.details` and `.reply`.

    TimeoutError                 (Python's own)
    └── NoReply                  the client heard nothing: no worker answered in time
        └── NoWorker             not sent: the workers' statuses say none is online

`NoReply` is not a `ToolbusError`: no worker said anything, so there is no wire code
and no body to render. It is the requester's own deadline passing, which is what
`TimeoutError` means in asyncio; `except TimeoutError` catches it beside
`asyncio.timeout`. A worker that answered "too slow" raises `CallTimeout` instead.
"""

from __future__ import annotations

import base64
from typing import Any, ClassVar

from pydantic_core import to_jsonable_python

from toolbus.wire.asking import InputRequest
from toolbus.wire.contracts import ErrorBody, ErrorCode, Reply


class ToolbusError(Exception):
    code: ClassVar[ErrorCode]
    # What the code means, in words that hold no value of any call: what spans record
    # (the message may quote an argument, and a tool's text may hold anything).
    summary: ClassVar[str] = "the call was refused or failed"
    # False when the tool was certainly never asked (an MCP server's session was down when
    # the call came): its request id is left free to run again, not answered for good.
    reached_tool: bool = True

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = json_details(details)
        self.reply: Reply | None = None  # the worker's whole reply, when a client got one

    def body(self) -> ErrorBody:
        return ErrorBody(code=self.code, message=self.message, details=self.details)

    @property
    def id(self) -> str | None:
        """The id of the request this answers, when it came in a reply."""
        return self.reply.id if self.reply is not None else None

    @staticmethod
    def from_body(body: ErrorBody, *, reply: Reply | None = None) -> ToolbusError:
        """The error a worker answered, as the class of its code (`UnknownTool` for
        `unknown_tool`), with its message and details as sent, and its reply."""
        error = ERROR_CLASSES[body.code](body.message)
        error.details = dict(body.details)  # JSON already; a `message` key is no keyword
        error.reply = reply
        return error


class BadRequest(ToolbusError):
    code = ErrorCode.BAD_REQUEST
    summary = "the message could not be read as a request"


class UnknownTool(ToolbusError):
    code = ErrorCode.UNKNOWN_TOOL
    summary = "no tool by that name"


class InvalidArguments(ToolbusError):
    code = ErrorCode.INVALID_ARGUMENTS
    summary = "the arguments do not satisfy the tool's schema or guards"


class Forbidden(ToolbusError):
    code = ErrorCode.FORBIDDEN
    summary = "the request asked for what it may not have"


class RequestRefused(Forbidden):
    """Not sent: the broker refused to take the request (its PUBACK's MQTT v5 reason
    code 0x80 or above, 0x87 "not authorized" from an ACL), raised by the client, not
    answered by a worker: `reply` is None. Sending again cannot help until the ACL, the
    login, or the topic the client chose changes (under `caller_identity = "topic"` a
    login may publish only as its own caller). `details`: `topic`, `reason_code`."""

    summary = "the broker refused to take the request"


class CallTimeout(ToolbusError):
    code = ErrorCode.TIMEOUT
    summary = "the tool did not finish within its deadline"


class Unavailable(ToolbusError):
    code = ErrorCode.UNAVAILABLE
    summary = "the tool's backend cannot be reached, or the worker is stopping"


class ToolFailed(ToolbusError):
    code = ErrorCode.TOOL_ERROR
    summary = "the tool ran and failed"


class InternalError(ToolbusError):
    code = ErrorCode.INTERNAL
    summary = "a bug in the worker"


class InDoubt(ToolbusError):
    code = ErrorCode.IN_DOUBT
    summary = "a repeat of a call cut short, which may or may not have taken effect"


class RateLimited(ToolbusError):
    code = ErrorCode.RATE_LIMITED
    summary = "the caller is over its quota"


class ReplyNotKept(ToolbusError):
    code = ErrorCode.REPLY_NOT_KEPT
    summary = "a repeat of a call that ran, whose reply is no longer kept"


class Cancelled(ToolbusError):
    code = ErrorCode.CANCELLED
    summary = "the caller cancelled the call"


class UnknownTask(ToolbusError):
    code = ErrorCode.UNKNOWN_TASK
    summary = "no such task for this caller"


class InputRequired(ToolbusError):
    """`questions` (by key) and a stateless server's `state` stay with the worker: the
    caller gets the questions in `details`, with its token, never the server's state."""

    code = ErrorCode.INPUT_REQUIRED
    summary = "the tool asks its caller before it goes on"

    def __init__(
        self,
        message: str,
        *,
        questions: dict[str, InputRequest] | None = None,
        state: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message, **details)
        self.questions = questions or {}
        self.state = state


class ApprovalRequired(ToolbusError):
    code = ErrorCode.APPROVAL_REQUIRED
    summary = "the call waits for a person's approval; nothing ran"


class ContinuationInvalid(ToolbusError):
    code = ErrorCode.CONTINUATION_INVALID
    summary = "the continuation continues no call of this caller's"


class ApprovalInvalid(ToolbusError):
    code = ErrorCode.APPROVAL_INVALID
    summary = "the approval approves no such call of this caller's"


class NoReply(TimeoutError):
    """No reply arrived within the deadline, after every send (see the tree above); or
    only replies that each say their own delivery did not run, while another copy of the
    request went unanswered and may have run: what became of it is not known.

    `id` is the request's: sending it again with the same id later gets the worker's
    stored reply rather than a second run, while the workers remember it (`dedup_ttl_s`).
    `details`: `sends` (copies published) and `answered` (copies answered), when any
    were; `answer`: one such answer (a `Reply`), or None.
    """

    def __init__(
        self, message: str, *, id: str | None = None, answer: Any = None, **details: Any
    ) -> None:
        super().__init__(message)
        self.id = id
        self.answer = answer
        self.details: dict[str, Any] = json_details(details)


class NoWorker(NoReply):
    """Not sent: the workers' retained statuses say none is online (a client made with
    `require_worker=True`, as `toolbus call` is). Nothing was published, so nothing can
    run later; `details.workers`: how many worker statuses were heard (0: none at all).
    A `NoReply`, so code that handles "nobody answered" handles it too."""


def json_details(details: dict[str, Any]) -> dict[str, Any]:
    """Details as JSON values, whatever a tool passed: never a reply that cannot be built."""
    try:
        coerced = to_jsonable_python(_bytes_as_base64(details), fallback=str)
    except Exception:  # a value whose own serialization raises: keep its text
        return {str(key): _text(value) for key, value in details.items()}
    return coerced if isinstance(coerced, dict) else {"details": _text(details)}


def _bytes_as_base64(value: Any) -> Any:
    """Bytes anywhere in the details as standard base64 text, as dead letters carry them
    (pydantic's own bytes mode is the URL-safe alphabet)."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {key: _bytes_as_base64(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_bytes_as_base64(item) for item in value]
    return value


def _text(value: object) -> str:
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__}>"


ERROR_CLASSES: dict[ErrorCode, type[ToolbusError]] = {
    cls.code: cls for cls in ToolbusError.__subclasses__()
}

"""The exception tree. Every failure a caller can see is one of these.

    ToolbusError                 (root; never raised itself)
    ├── BadRequest               bad_request
    ├── UnknownTool              unknown_tool
    ├── InvalidArguments         invalid_arguments
    ├── Forbidden                forbidden
    ├── CallTimeout              timeout
    ├── Unavailable              unavailable
    ├── ToolFailed               tool_error
    └── InternalError            internal

Each leaf carries the wire code it maps to, one to one, and renders its own
wire body. A local tool may raise any of them to choose the code its caller sees.
"""

from __future__ import annotations

from typing import Any, ClassVar

from toolbus.contracts import ErrorBody, ErrorCode


class ToolbusError(Exception):
    code: ClassVar[ErrorCode]

    def __init__(self, message: str, **details: Any) -> None:
        # Details must be JSON values; `ErrorBody` checks them when the reply is built.
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def body(self) -> ErrorBody:
        return ErrorBody(code=self.code, message=self.message, details=self.details)


class BadRequest(ToolbusError):
    code = ErrorCode.BAD_REQUEST


class UnknownTool(ToolbusError):
    code = ErrorCode.UNKNOWN_TOOL


class InvalidArguments(ToolbusError):
    code = ErrorCode.INVALID_ARGUMENTS


class Forbidden(ToolbusError):
    code = ErrorCode.FORBIDDEN


class CallTimeout(ToolbusError):
    code = ErrorCode.TIMEOUT


class Unavailable(ToolbusError):
    code = ErrorCode.UNAVAILABLE


class ToolFailed(ToolbusError):
    code = ErrorCode.TOOL_ERROR


class InternalError(ToolbusError):
    code = ErrorCode.INTERNAL


ERROR_CLASSES: dict[ErrorCode, type[ToolbusError]] = {
    cls.code: cls for cls in ToolbusError.__subclasses__()
}

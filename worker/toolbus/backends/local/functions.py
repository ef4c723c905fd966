"""Local backend: async Python functions registered as tools.

    @tool
    async def echo(text: str) -> str:
        "Return the text unchanged."
        return text

The JSON schema comes from the type hints (through pydantic) unless one is given.

A tool asks its caller with `await toolbus.elicit(message, schema)` (answered only for a
caller that said `input: true`; declined for any other).
A tool reports progress with `toolbus.progress(done, total, message)` from anywhere in
its call (helpers included): the call's context is in a context variable while the
function runs, so its signature and schema stay plain. Outside a call it does nothing.
Other packages contribute tools through the `toolbus.tools` entry-point group:
each entry point names a `LocalTool` or an iterable of them.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import traceback
from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, create_model

from toolbus.config import NO_TOOL_SETTINGS, ToolSettings
from toolbus.tools.context import CallContext
from toolbus.tools.registry import LOCAL, Tool
from toolbus.wire.asking import ELICITATION, InputRequest
from toolbus.wire.contracts import ToolResult
from toolbus.wire.errors import ToolbusError, ToolFailed

log = logging.getLogger("toolbus.local")

ENTRY_POINT_GROUP = "toolbus.tools"

AsyncToolFn = Callable[..., Awaitable[Any]]

_CALL: ContextVar[CallContext | None] = ContextVar("toolbus_call", default=None)


def progress(progress: float, total: float | None = None, message: str | None = None) -> None:
    """Report the running call's progress to its caller (only if it asked; rate-limited,
    the last update before the reply always sent). A no-op outside a tool's call.
    `progress` should increase from one update to the next."""
    context = _CALL.get()
    if context is not None:
        context.progress(float(progress), None if total is None else float(total), message)


async def elicit(message: str, requested_schema: dict[str, Any]) -> dict[str, Any]:
    """Ask the running call's caller (MCP elicitation, form mode): its answer,
    `{"action": "accept", "content": {...}}`, or `{"action": "decline"}` when it cannot
    answer (it did not say `input: true`), did not within `input_timeout_s`, or the call
    ended. The caller sees `input_required`; the tool waits here meanwhile. Raises
    `ToolFailed` (`input_unrelayed`) when toolbus could not ask at all."""
    context = _CALL.get()
    question = InputRequest(
        method=ELICITATION,
        params={"mode": "form", "message": message, "requestedSchema": requested_schema},
    )
    answers = None if context is None else await context.ask({"elicitation": question})
    answer = None if answers is None else answers.get("elicitation")
    return answer if answer is not None else {"action": "decline"}


@dataclass(frozen=True, slots=True)
class LocalTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    fn: AsyncToolFn
    timeout_s: float | None = None

    async def __call__(self, **arguments: Any) -> Any:
        return await self.fn(**arguments)

    def to_tool(
        self, settings: ToolSettings = NO_TOOL_SETTINGS, *, log_arguments: bool = False
    ) -> Tool:
        """The tool as the pipeline sees it, with its resolved `[tools.NAME]` entry.

        A failure is logged with its stack; its message only with `log_arguments`, since
        exception messages often quote argument values (`KeyError('alice@example.com')`).
        """

        async def invoke(arguments: dict[str, Any], context: CallContext) -> ToolResult:
            token = _CALL.set(context)
            try:
                value = await self.fn(**arguments)
            except (ToolbusError, asyncio.CancelledError, GeneratorExit):
                raise  # our own errors; a timeout or shutdown; a closing coroutine
            except BaseException as exc:
                # A tool's `sys.exit()` or KeyboardInterrupt is its failure, not the worker's:
                # uncaught, either escapes the event loop and ends the process (and any other
                # BaseException ends the handler without an answer). SIGINT never raises one
                # here: the worker handles the signal itself.
                _log_failure(self.name, exc, with_message=log_arguments)
                raise ToolFailed(
                    f"{self.name} failed: {type(exc).__name__}: {exc}", exception=type(exc).__name__
                ) from exc
            finally:
                _CALL.reset(token)
            return to_result(value)

        return Tool(
            name=self.name,
            description=self.description,
            input_schema=self.input_schema,
            invoke=invoke,
            origin=LOCAL,
            rename_arguments=False,  # local tools name their own parameters
            timeout_s=self.timeout_s,
            settings=settings,
        )


def _log_failure(name: str, exc: BaseException, *, with_message: bool) -> None:
    fields = {"tool": name, "exception_type": type(exc).__name__}
    if with_message:
        log.error("local tool raised", exc_info=exc, extra=fields)
        return
    # Its message may quote the arguments: without log_arguments, only where it was raised.
    stack = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
    log.error("local tool raised", extra={**fields, "stack": stack})


@overload
def tool(fn: AsyncToolFn, /) -> LocalTool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    schema: dict[str, Any] | None = None,
    timeout_s: float | None = None,
) -> Callable[[AsyncToolFn], LocalTool]: ...
def tool(
    fn: AsyncToolFn | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    schema: dict[str, Any] | None = None,
    timeout_s: float | None = None,
) -> LocalTool | Callable[[AsyncToolFn], LocalTool]:
    """Make an async function a tool; use bare or with keyword options."""

    def wrap(func: AsyncToolFn) -> LocalTool:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"tool {func.__name__} must be an async function")
        return LocalTool(
            name=name or func.__name__,
            description=description or inspect.getdoc(func) or "",
            input_schema=schema if schema is not None else schema_from_hints(func),
            fn=func,
            timeout_s=timeout_s,
        )

    return wrap(fn) if fn is not None else wrap


def schema_from_hints(func: Callable[..., Any]) -> dict[str, Any]:
    # With the extras: `Annotated[str, Field(description=...)]` keeps its description
    # and bounds (without, the hints came back bare and the schema lost both).
    hints = get_type_hints(func, include_extras=True)
    fields: dict[str, Any] = {}
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    model = create_model(f"{func.__name__}_arguments", **fields)
    schema = model.model_json_schema()
    _drop_titles(schema)
    schema["additionalProperties"] = False
    return schema


def _drop_titles(node: Any) -> None:
    # Generated titles ("Text", "Tz") are noise in a definition a model reads.
    if isinstance(node, dict):
        node.pop("title", None)
        for key, value in node.items():
            if key != "properties":
                _drop_titles(value)
            else:
                for prop in value.values():
                    _drop_titles(prop)
    elif isinstance(node, list):
        for item in node:
            _drop_titles(item)


def to_result(value: Any) -> ToolResult:
    """A local function's return value as a wire result."""
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if value is None:
        return ToolResult(text="")
    if isinstance(value, str):
        return ToolResult(text=value)
    if isinstance(value, dict):
        return ToolResult(text=_TEXT.encode(value), structured=value)
    return ToolResult(text=_TEXT.encode(value), structured={"result": value})


# One encoder: `json.dumps` with any argument but the defaults builds a new one per call.
_TEXT = json.JSONEncoder(ensure_ascii=False)


def load_entry_points(group: str = ENTRY_POINT_GROUP) -> list[LocalTool]:
    """Tools contributed by installed packages; a broken entry point is logged and skipped."""
    found: list[LocalTool] = []
    for point in entry_points(group=group):
        try:
            loaded = point.load()
        except Exception:
            log.exception("entry point %s (%s) failed to load", point.name, point.value)
            continue
        if isinstance(loaded, LocalTool):
            items: Iterable[Any] = [loaded]
        elif isinstance(loaded, Iterable) and not isinstance(loaded, str | bytes):
            items = loaded
        else:
            items = [loaded]
        for item in items:
            if isinstance(item, LocalTool):
                found.append(item)
            else:
                log.warning("entry point %s gave %r, not a LocalTool: skipped", point.name, item)
    return found

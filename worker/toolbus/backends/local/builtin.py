"""The built-in tools: `datetime` and `echo`."""

from __future__ import annotations

from datetime import UTC
from datetime import datetime as dt
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import JsonValue

from toolbus.backends.local.functions import LocalTool, tool
from toolbus.wire.errors import InvalidArguments


@tool(name="datetime")
async def current_datetime(timezone: str | None = None) -> dict[str, str]:
    """Current date and time, in UTC or the given IANA time zone (e.g. Europe/Berlin)."""
    try:
        zone = ZoneInfo(timezone) if timezone else UTC
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArguments(
            f"unknown time zone {timezone!r}: use an IANA name such as Europe/Berlin",
            parameter="timezone",
        ) from None
    now = dt.now(zone)
    return {
        "iso": now.isoformat(),
        "timezone": str(zone),
        "date": now.date().isoformat(),
        "time": now.time().isoformat(timespec="seconds"),
        "weekday": now.strftime("%A"),
    }


@tool
async def echo(text: str, data: JsonValue = None) -> dict[str, JsonValue]:
    """Return the text (and optional data) unchanged; for testing a path end to end."""
    return {"text": text, "data": data}


BUILTIN_TOOLS: list[LocalTool] = [current_datetime, echo]

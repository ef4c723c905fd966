"""The errors the mcp SDK makes up in place of a server's answer are told by their code
and text (`convert.SDK_STAND_INS`): each text must still be what the SDK writes, or a
transport failure would pass for a server's answer (a probe would call the server there).
"""

from __future__ import annotations

import inspect

from mcp.client import streamable_http
from mcp.shared import jsonrpc_dispatcher

from toolbus.backends.mcp.convert import SDK_STAND_INS


def test_the_errors_told_from_a_servers_are_the_ones_the_sdk_makes_up() -> None:
    sources = "".join(inspect.getsource(m) for m in (streamable_http, jsonrpc_dispatcher))
    for _code, text in SDK_STAND_INS:
        assert text in sources, text

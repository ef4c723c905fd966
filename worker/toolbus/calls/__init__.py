"""Calls, the engine: what a call is and how it runs, whichever door it came through.

call (the engine's Call and its reply address), answer (caller, quota, dedup, the run),
running (a running call's home, the map a cancel finds), inflight (slots), quotas,
preparation, execute, invocation (deadline and cancel around the tool), replies, call_log,
startup.

May import: wire, config, observability, dedup, tools, normalization, backends.
"""

"""Calls: one message's path, decode -> answer (caller, quota, dedup) -> execute -> encode.

pipeline (the whole path, no broker needed), request_bounds, decode, addresses, inflight
(slots), together (many calls of one message), answer, quotas, preparation, execute, call_log,
encode.

May import: wire, config, observability, dedup, tools, normalization, backends.
"""

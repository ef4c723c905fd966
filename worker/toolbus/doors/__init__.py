"""Doors: how calls arrive and how their answers leave, each door beside the others.

A door turns its messages into the engine's `Call`s (calls/) and the engine's answers
back into its messages. Today one door: the envelope over MQTT (doors/envelope: our
JSON envelope and the AI SDKs' shapes, v5 properties and 3.1.1 body fields). A second
door (MCP over MQTT) is a sibling package here, never a branch inside the first.

May import: wire, transport, config, observability, dedup, tools, normalization, backends, calls.
"""

"""The client: asking the workers from outside.

client (toolbus.Client), requester (its connection), pool (the workers as their retained
statuses say), presence (whether any is online, before a request is sent).

May import: wire, transport, config, observability, dedup, tools, normalization, backends, calls
(today: wire and transport only).
"""

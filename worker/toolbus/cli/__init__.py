"""The command line: every `toolbus` subcommand and its views; the top layer.

main (the parser and dispatch), settings (flags > environment > files), values, ask
(call, tools), status, status_view, health, mappings, asyncapi/ (schemas --write/--check),
demo/ (demo-server), bench/ (toolbus bench).

May import: everything below it. Nothing imports it.
"""

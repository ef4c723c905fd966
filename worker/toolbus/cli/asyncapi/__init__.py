"""The AsyncAPI document of our MQTT interface (`docs/asyncapi.yaml`), generated from code.

`toolbus schemas --write` renders it beside `schemas/*.json`; `--check` fails when the
committed file differs from what the code makes.

wire       our wire models' schemas (`schemas/*.json`) as component schemas
providers  the AI providers' request, reply and tool-definition shapes, as JSON Schema
examples   example payloads of the requests
messages   every message on our topics, its MQTT v5 properties as bindings
channels   the topic layout (`toolbus.wire.topics`) as channels, and the worker's operations
document   the whole document, rendered as YAML
"""

from toolbus.cli.asyncapi.document import build, check, render, write

__all__ = ["build", "check", "render", "write"]

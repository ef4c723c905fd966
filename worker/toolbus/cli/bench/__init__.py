"""The broker benchmark: toolbus against its baselines, each responder its own process.

`toolbus bench` (see `run`, `report`) starts a private mosquitto (`mosquitto`), then
each responder in turn: the bare aiomqtt echo (`aiomqtt_echo`), `toolbus serve`
(`served`), the raw mcp SDK session (`raw_mcp`); a lean paho load generator
(`loadgen`) in its own process drives each at every in-flight level (`phases`), and
CPU per call comes from /proc (`cpu`). Tracing exports to a local sink (`span_sink`).
The load generator and the baselines are peers of the product (a client, a bare
responder, a raw SDK user), so they import paho, aiomqtt and mcp themselves.
"""

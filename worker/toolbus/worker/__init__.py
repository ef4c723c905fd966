"""The running worker: the process around the pipeline.

service (Worker: two connections, reconnect, drain), links, client_ids, publisher,
redeliveries, status (retained states), http (the /metrics, /healthz, /readyz listener),
wiring (settings and tools into a Worker), supervisor (serve --processes N), exit_codes.

May import: wire, transport, config, observability, dedup, tools, normalization, backends, calls.
"""

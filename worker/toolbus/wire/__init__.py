"""The wire: what crosses MQTT, as plain values and the rules for them.

contracts (the wire models), messages (Inbound/Outbound), topics, errors (one wire code each),
untrusted (caller strings made safe), broker (the broker URL), report (what normalization
changed, as the reply carries it), formats/ (the providers' shapes in and out), tasks.

May import: nothing of toolbus. Everything else may import it.
"""

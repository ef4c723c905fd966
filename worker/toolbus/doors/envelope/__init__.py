"""The envelope door: one MQTT message end to end, decode -> answer -> encode -> publish.

pipeline (the whole path, no broker needed), request_bounds, decode, addresses, together
(many calls of one message), encode.
"""

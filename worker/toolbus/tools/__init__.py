"""Tools: the registry every backend's tools join, the call's context, access and validation.

May import: the wire and the layer below it (transport, config, observability, dedup).
"""

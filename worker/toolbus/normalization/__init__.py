"""Normalization: what arrives becomes what the tool's schema declares.

shapes     what each tool's schema expects at every depth, built once per tool
normalize  argument keys to the schema's spelling, values to its shapes
guards     input limits around normalization; lenient arrays
limits     the limits in force at each level of a tool's arguments, built once
settled    the common call, recognised in one walk: nothing to normalize, no guard tripped
paths      the path guard: decoded, judged and anchored inside the allowed roots
strict     the `strict` guard preset: the parameter-mapping seed's rules
report     the changes a call went through, as cheap values
mappings   the same tables, rendered as Markdown (`toolbus mappings`)

May import: the wire, transport, config, observability, dedup and tools.
"""

"""The `toolbus` program's entry (its script and `python -m toolbus`): the command line,
with the cyclic garbage collector off while it starts.

A start imports some 700 modules and builds the worker: a heap of about 100 000 objects
that lives as long as the process. The collector, counting those allocations, ran two
full passes and many young ones over it during the imports alone (about 0.1 s of a
one-second start). It is off until the command has started (`cli.main` turns it back
on: `serve` once the worker is built, freezing that heap out of every later pass; any
other command once its arguments are read). Only here, where toolbus is the program:
a process that imports toolbus keeps its collector as it was.
"""

from __future__ import annotations

import gc


def main() -> int:
    gc.disable()
    from toolbus.cli.main import main as command_line  # noqa: PLC0415 -- after gc.disable(): the point

    return command_line()

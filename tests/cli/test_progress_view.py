"""`toolbus call --progress`'s view: a bar on a terminal, plain lines when piped."""

from __future__ import annotations

import io

from toolbus.cli.progress_view import ProgressView
from toolbus.wire.contracts import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_piped_each_update_is_a_plain_printable_line() -> None:
    out = io.StringIO()
    with ProgressView(out) as view:
        view(Progress(id="a", progress=1, total=4, message="one"))
        view(Progress(id="a", progress=2.5))
        view(Progress(id="a", progress=3, total=4, message="\x1b[2Jwiped"))
    assert out.getvalue().splitlines() == [
        "progress 1/4 one",
        "progress 2.5",
        "progress 3/4 \\u001b[2Jwiped",
    ]


def test_on_a_terminal_a_bar_is_drawn_and_cleared() -> None:
    out = Terminal()
    with ProgressView(out) as view:
        view(Progress(id="a", progress=1, total=4, message="working"))
        view(Progress(id="a", progress=4, total=4, message="done"))
    drawn = out.getvalue()
    assert "4/4" in drawn and "progress " not in drawn

"""The CLI's rich consoles: outside a terminal (a pipe, a log, CI) rich would cut every table at 80 columns."""

from __future__ import annotations

import os

from rich.console import Console

PIPE_WIDTH = 240  # columns of output that is not a terminal's (``COLUMNS`` still wins when set)


def make_console(*, stderr: bool = False) -> Console:
    """A Console whose tables keep their columns when the output is not a terminal."""
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console

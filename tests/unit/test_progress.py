"""Progress bars: drawn on a terminal, silent when piped or quiet."""

from __future__ import annotations

import io

from logstore.tools.progress import SILENT, Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_draws_on_a_terminal_and_ends_the_line():
    out = Terminal()
    with Progress("verify", 200, stream=out) as p:
        p.advance(100)
        p.advance(100)
    text = out.getvalue()
    assert text.startswith("\rverify") and "100.0%" in text and text.endswith("\n")


def test_silent_when_piped_or_quiet():
    piped = io.StringIO()
    with Progress("verify", 10, stream=piped) as p:
        p.advance(10)
    quiet = Terminal()
    with Progress("verify", 10, stream=quiet, enabled=False) as p:
        p.advance(10)
    assert piped.getvalue() == "" and quiet.getvalue() == ""
    SILENT.advance(5)
    assert SILENT.enabled is False


def test_restart_with_a_new_label():
    out = Terminal()
    p = Progress(stream=out)
    p.start("first", 1)
    p.advance(1)
    p.start("second", 1)
    p.advance(1)
    p.finish()
    assert out.getvalue().count("\n") == 2 and "second" in out.getvalue()

"""Progress bars: shown on a terminal with an ETA, lines printed meanwhile kept whole above them;
nothing on a pipe or with the flag off."""

import io
import sys

from ddtree_jax import progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_bar_on_a_terminal_shows_count_and_eta_and_keeps_printed_lines(monkeypatch):
    err, out = _Terminal(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", out)
    for i in progress.track(range(3), "steps"):
        print("line", i, "of", 3)
    print("after")
    assert out.getvalue() == "line 0 of 3\nline 1 of 3\nline 2 of 3\nafter\n"
    shown = err.getvalue()
    assert "steps" in shown and "3/3" in shown and "<" in shown     # tqdm's [elapsed<remaining]


def test_no_bar_on_a_pipe_or_with_the_flag_off(monkeypatch):
    for err, enabled in ((io.StringIO(), True), (_Terminal(), False)):
        out = io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        monkeypatch.setattr(sys, "stdout", out)
        with progress.bar(2, "steps", enabled) as b:
            print("x", end="")
            b.update(2)
        assert err.getvalue() == "" and out.getvalue() == "x"

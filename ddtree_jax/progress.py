"""Progress bars with an ETA for long runs (tqdm): training, data preparation, the benchmarks.

`bar(total, desc, enabled)` is a tqdm bar on standard error, shown only when `enabled` and
standard error is a terminal (tqdm's disable=None): logs and pipes get the printed lines alone.
While a bar is shown, whole lines printed to standard output go above it (tqdm.write) rather
than through it. `track(iterable, ...)` iterates with a bar; `flag()` defines the experiment
scripts' --progress flag (absl; --noprogress turns the bars off). tqdm is imported on first use.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterable, Iterator


class _LinesAbove:
    """A standard-output stand-in that hands each whole line to tqdm.write."""

    def __init__(self, file, write):
        self.file, self.write_line, self.pending = file, write, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.write_line(line, file=self.file)
        return len(text)

    def flush(self) -> None:
        self.file.flush()


@contextlib.contextmanager
def bar(total: int | None = None, desc: str = "", enabled: bool = True, initial: int = 0):
    """A tqdm bar of `total` steps (None: a count), from `initial`; see the module docstring."""
    from tqdm import tqdm

    b = tqdm(total=total, desc=desc, initial=initial, disable=None if enabled else True,
             file=sys.stderr, dynamic_ncols=True)
    try:
        if b.disable:
            yield b
        else:
            above = _LinesAbove(sys.stdout, tqdm.write)
            with contextlib.redirect_stdout(above):
                yield b
            if above.pending:
                tqdm.write(above.pending, file=above.file)
    finally:
        b.close()


def track(iterable: Iterable, desc: str = "", enabled: bool = True, total: int | None = None) -> Iterator:
    """Each item of `iterable`, with a bar of `total` steps (default: its len, where it has one)."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    with bar(total, desc, enabled) as b:
        for item in iterable:
            yield item
            b.update()


def flag():
    """The absl flag --progress (default on): the experiment scripts' switch for `bar`."""
    from absl import flags

    return flags.DEFINE_bool("progress", True, "progress bars with an ETA on standard error (shown "
                             "only on a terminal)")

"""Progress reporting for the tools, aware of where it writes.

On a terminal: a tqdm bar (redrawn in place). Anywhere else (a pipe, a file, a CI log),
or where tqdm is missing: a plain line every quarter of the way, never ``\\r`` frames.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from typing import TextIO

ProgressFn = Callable[[float, str], None]


def progress_bar(desc: str, stream: TextIO | None = None) -> ProgressFn:
    """A ``progress(fraction, message)`` callback (fraction in 0..1; 1 ends it)."""
    out = sys.stderr if stream is None else stream
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            return _tqdm_progress(tqdm, desc, out)
    return _line_progress(desc, out)


def _tqdm_progress(tqdm, desc: str, out: TextIO) -> ProgressFn:
    cols = shutil.get_terminal_size().columns
    bar = tqdm(total=1000, desc=desc, file=out, leave=True, ncols=cols if cols >= 40 else 80,
               bar_format="{desc}: {percentage:5.1f}%|{bar}| {elapsed} {postfix}")
    done = False

    def progress(frac: float, msg: str) -> None:
        nonlocal done
        if done:
            return
        bar.n = max(0, min(1000, round(frac * 1000)))
        bar.set_postfix_str(msg[:50], refresh=False)
        bar.refresh()
        if frac >= 1.0:
            done = True
            bar.close()
    return progress


def _line_progress(desc: str, out: TextIO) -> ProgressFn:
    next_step = 0.0

    def progress(frac: float, msg: str) -> None:
        nonlocal next_step
        if frac < next_step:
            return
        print(f"{desc}: {frac * 100:3.0f}% {msg}", file=out, flush=True)
        next_step = 2.0 if frac >= 1.0 else (int(frac * 4) + 1) / 4
    return progress
